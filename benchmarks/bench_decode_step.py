"""Where a decode step of the slot decoder goes, on one GPU, at the GRPO rollout's shape (48 rows, contexts of 2-4k
tokens) with a Qwen2.5-0.5B-sized model: the model's step (the captured graph replayed) against sampling at
temperature 0.7 and top-p 0.9, with the nucleus taken from a full sort of the vocabulary (the former `sample_next`)
or from the top 1,024 tokens (`nucleus`), and whole calls of 64 new tokens with each. Weights are random (no model
needs to travel); the output head is scaled so that next-token distributions are as peaked as a trained model's
(`--peak`), since a flat one would send every row to the full sort.

    python benchmarks/bench_decode_step.py --out benchmarks/results/decode_step_qwen_shape.json
"""
from __future__ import annotations
import argparse, json, time


def full_sort_sample(logits, temperature, top_p, generator=None):
    "The former sampler: the nucleus from a full sort of the vocabulary."
    import torch
    lp = torch.log_softmax(logits.float() / temperature, -1)
    srt, idx = lp.sort(-1, descending=True)
    drop = srt.exp().cumsum(-1) - srt.exp() > top_p
    lp = torch.log_softmax(lp.scatter(-1, idx, srt.masked_fill(drop, float('-inf'))), -1)
    tok = torch.multinomial(lp.exp(), 1, generator=generator)[:, 0]
    return tok, lp.gather(-1, tok[:, None])[:, 0]


class Tok:
    "The two things the decoder asks of a tokenizer."
    pad_token_id = 151643
    def convert_tokens_to_ids(self, t): return 151645


def qwen_shape(layers:int=24):
    "The configuration of a Qwen2.5-0.5B-sized model (untied output head, as the GGUF's)."
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rows', type=int, default=48); ap.add_argument('--steps', type=int, default=64)
    ap.add_argument('--peak', type=float, default=30.0, help='scale of the output head (peaked distributions)')
    ap.add_argument('--device', default='cuda')
    ap.add_argument('--layers', type=int, default=24, help='decoder layers (fewer: a CPU check of the script)')
    ap.add_argument('--out', default='benchmarks/results/decode_step_qwen_shape.json')
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM
    import shopping_grpo.generate as G
    from shopping_grpo.records import write_atomic
    cfg = qwen_shape(a.layers)
    torch.manual_seed(0)
    with torch.device(a.device): model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad(): model.lm_head.weight.mul_(a.peak)
    dec = G.SlotDecoder(model=model, tokenizer=Tok(), temperature=0.7, top_p=0.9, max_new_tokens=a.steps, device=a.device,
                        rows=a.rows, max_context=8192)
    g = torch.Generator().manual_seed(0)
    ctx = [torch.randint(0, 150000, (int(n),), generator=g).tolist() for n in torch.randint(2000, 4000, (a.rows,), generator=g)]
    cuda = a.device.startswith('cuda')
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = dict(device=torch.cuda.get_device_name() if cuda else 'cpu', rows=a.rows, new_tokens=a.steps, peak=a.peak)
    def call(sampler):
        G.sample_next = sampler
        dec.held = [None] * dec.rows  # every call prefills afresh: the same work each time
        sync(); t = time.time(); out = dec(ctx); sync()
        return time.time() - t, sum(map(len, out))
    new = G.sample_next  # the current sampler (nucleus from the top k); restored at the end
    call(new); call(full_sort_sample)  # warm-up: graph capture
    for name, s in (('nucleus_top_k', new), ('full_sort', full_sort_sample), ('nucleus_top_k_again', new)):
        sec, n = call(s)
        res[f'call_{name}'] = dict(seconds=round(sec, 3), tokens=n, tokens_per_s=round(n / sec))
    # the parts of one step: the graph alone, and each sampler alone on the step's logits
    width = dec._width(max(map(len, ctx)) + a.steps)
    if cuda: graph, logits = dec.graphs[width]
    else:
        class graph: replay = staticmethod(lambda: dec._step(width))
        logits = dec._step(width)
    def timed(f, n=50):
        sync(); t = time.time()
        for _ in range(n): f()
        sync(); return round((time.time() - t) / n * 1000, 3)
    with torch.inference_mode():
        res['ms_graph_step'] = timed(graph.replay)
        res['ms_sample_nucleus_top_k'] = timed(lambda: new(logits, 0.7, 0.9))
        res['ms_sample_full_sort'] = timed(lambda: full_sort_sample(logits, 0.7, 0.9))
        lp = torch.log_softmax(logits.float() / 0.7, -1)
        res['top_k_covers_share'] = round(float((lp.topk(1024, -1).values.exp().sum(-1) > 0.9).float().mean()), 3)
        res['top1_prob_median'] = round(float(lp.max(-1).values.exp().median()), 3)
    G.sample_next = new
    write_atomic(a.out, json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == '__main__': main()
