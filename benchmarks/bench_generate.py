"""Generated tokens/s of the local token policies on one GPU (or the CPU, for a smoke check).

Measures, in one run and on the same prompts: plain `model.generate` (dynamic cache), `StaticDecoder` without a
CUDA graph, and `StaticDecoder` with its decode step captured as a CUDA graph (with transformers' stock attention,
which copies the KV cache per step for grouped-query attention, and with `grouped_sdpa`, which does not), at each batch size. Every call
generates exactly `--new` tokens per row (the end token is disabled), after one warm-up call per variant.
Also checks that greedy outputs of the graph decoder agree with `generate`.

    python benchmarks/bench_generate.py --batches 64,256 --prompt-len 331 --new 128 --out benchmarks/results/generate_speed.json
"""
from __future__ import annotations
import argparse, json, platform, statistics, time


def prompts(tok, n:int, length:int) -> list[list[int]]:
    "`n` realistic shop prompts of exactly `length` tokens (a system prompt and a page, cut), each slightly different."
    text = ("You are a careful shopping assistant. Results for \"wooden comb gift box\": "
            + " ".join(f"{i}|B00{i:07d}|{19 + i}.9|Lumora|comb|sandalwood; colour x3|Lumora LM-{i} wooden comb, anti-static" for i in range(60)))
    ids = tok.encode(text, add_special_tokens=False)
    return [(ids[i % 7:] + ids)[:length] for i in range(n)]


def timed(policy, ctx, repeats:int) -> list[float]:
    import torch
    out = []
    for _ in range(repeats):
        if torch.cuda.is_available(): torch.cuda.synchronize()
        t0 = time.perf_counter(); policy(ctx)
        if torch.cuda.is_available(): torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='smollm2', help="'smollm2' (the embedded default) or a model path")
    ap.add_argument('--batches', default='64,256'); ap.add_argument('--prompt-len', type=int, default=331)
    ap.add_argument('--new', type=int, default=128); ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--variants', default='generate,static,graph_stock,graph'); ap.add_argument('--out', default='benchmarks/results/generate_speed.json')
    a = ap.parse_args()
    import torch, transformers
    from shopping_grpo.model import materialize_model
    from shopping_grpo.generate import TransformersPolicy, StaticDecoder
    path = materialize_model(a.model); dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    plain = TransformersPolicy(path, max_new_tokens=a.new, device=dev)  # stock attention, its own copy of the model
    tok = plain.tok
    stock = StaticDecoder(path, max_new_tokens=a.new, device=dev, grouped_attention=False).model   # for the graph without grouped attention
    fast = StaticDecoder(path, max_new_tokens=a.new, device=dev).model                              # grouped attention
    make = dict(generate=lambda: plain,
                static=lambda: StaticDecoder(model=fast, tokenizer=tok, max_new_tokens=a.new, device=dev, cuda_graph=False),
                graph_stock=lambda: StaticDecoder(model=stock, tokenizer=tok, max_new_tokens=a.new, device=dev, cuda_graph=True, grouped_attention=False),
                graph=lambda: StaticDecoder(model=fast, tokenizer=tok, max_new_tokens=a.new, device=dev, cuda_graph=True))
    res = dict(device=torch.cuda.get_device_name() if dev == 'cuda' else platform.processor() or 'cpu', torch=torch.__version__,
               transformers=transformers.__version__, prompt_len=a.prompt_len, new_tokens=a.new, runs=[])
    for b in map(int, a.batches.split(',')):
        ctx = prompts(tok, b, a.prompt_len)
        for v in a.variants.split(','):
            if v.startswith('graph') and dev != 'cuda': continue
            pol = make[v](); pol.end_id = -1  # never stop early: every row makes exactly `new` tokens
            if dev == 'cuda': torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter(); pol(ctx); warm = time.perf_counter() - t0
            ts = timed(pol, ctx, a.repeats); med = statistics.median(ts)
            r = dict(variant=v, batch=b, tokens_per_s=round(b * a.new / med), seconds=[round(t, 3) for t in ts], warmup_s=round(warm, 2),
                     peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == 'cuda' else None)
            res['runs'].append(r); print(json.dumps(r), flush=True)
    # agreement of greedy outputs: graph (or static) decoder vs generate, 8 rows x 48 tokens
    ctx = prompts(tok, 8, a.prompt_len); plain.max_new_tokens = 48; plain.end_id = tok.convert_tokens_to_ids('<|im_end|>')
    fast = make['graph' if dev == 'cuda' else 'static'](); fast.max_new_tokens = 48
    ref, got = plain(ctx), fast(ctx)
    same = sum(x == y for r_, g in zip(ref, got) for x, y in zip(r_, g)) / max(1, sum(min(len(r_), len(g)) for r_, g in zip(ref, got)))
    res['greedy_agreement'] = round(same, 4); res['greedy_identical_rows'] = sum(r_ == g for r_, g in zip(ref, got))
    base = {r['batch']: r['tokens_per_s'] for r in res['runs'] if r['variant'] == 'generate'}
    for r in res['runs']: r['speedup_vs_generate'] = round(r['tokens_per_s'] / base[r['batch']], 2)
    from shopping_grpo.records import write_atomic
    write_atomic(a.out, json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != 'runs'}))
    for r in res['runs']: print(f"{r['variant']:9s} batch {r['batch']:4d}: {r['tokens_per_s']:8d} tok/s  x{r['speedup_vs_generate']}  peak {r['peak_gib']} GiB")


if __name__ == '__main__': main()
