"""LoRA SFT on one GPU: the seed recipe (05_sft) over collected expert trajectories, timed, with peak memory, the merge,
and a teacher-forced check of the merged model's actions against the teacher's.

For each `--variants` entry (batch size x gradient accumulation) a fresh run trains `--epochs` epochs and reports
tokens/s, minutes and peak GPU memory. The first variant's adapter is merged (fp32) and its validation loss is
recomputed from the merged checkpoint loaded in fp32 and in bf16 (what a server loads). Then, on `--match-rows`
validation conversations, every assistant turn is generated greedily from the exact context the runner would
give (teacher forcing) by the base and the merged model; a turn matches when its ids equal the teacher's.

    python benchmarks/bench_sft.py --train outputs/collect-smoke/collect/sft_train.jsonl --val outputs/collect-smoke/collect/sft_val.jsonl
"""
from __future__ import annotations
import argparse, json, shutil, time
from pathlib import Path


def turn_contexts(rows:list[dict], ignore:int=-100) -> list[tuple[list[int], list[int]]]:
    "(context, teacher turn ids) for every labelled span of every row."
    out = []
    for r in rows:
        ids, lab, i = r['input_ids'], r['labels'], 0
        while i < len(lab):
            if lab[i] == ignore: i += 1; continue
            j = i
            while j < len(lab) and lab[j] != ignore: j += 1
            out.append((ids[:i], ids[i:j])); i = j
    return out


def turn_match(policy, pairs, batch:int=32) -> float:
    "Share of turns whose greedy generation equals the teacher's ids."
    order = sorted(range(len(pairs)), key=lambda k: len(pairs[k][0])); hits = 0
    for s in range(0, len(order), batch):
        chunk = [pairs[k] for k in order[s:s + batch]]
        hits += sum(g == t for g, (_, t) in zip(policy([c for c, _ in chunk]), chunk))
    return hits / max(len(pairs), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--train', required=True); ap.add_argument('--val', required=True)
    ap.add_argument('--model', default='smollm2'); ap.add_argument('--run', default='outputs/bench-sft')
    ap.add_argument('--epochs', type=float, default=3); ap.add_argument('--variants', default='4x4,8x2:1', help='BxG[:epochs], comma-separated; the first is merged and checked')
    ap.add_argument('--match-rows', type=int, default=40); ap.add_argument('--out', default='benchmarks/results/sft_speed.json')
    a = ap.parse_args()
    import torch
    from shopping_grpo.records import package_versions
    from transformers import AutoTokenizer, AutoModelForCausalLM
    from shopping_grpo.model import materialize_model
    from shopping_grpo.sft import SFTData, train_sft, merge_lora, sft_config, action_loss
    from shopping_grpo.generate import TransformersPolicy
    run = Path(a.run); run.mkdir(parents=True, exist_ok=True); dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    base = materialize_model(a.model); tok = AutoTokenizer.from_pretrained(str(base))
    t0 = time.time(); train, val = SFTData(a.train, tok, 8192), SFTData(a.val, tok, 8192)  # .gz files are read as they are
    res = dict(device=torch.cuda.get_device_name() if dev == 'cuda' else 'cpu',
               versions=package_versions(('torch', 'transformers', 'peft')),
               data=dict(train=train.counts, val=val.counts, build_seconds=round(time.time() - t0, 1)), runs=[])
    print(json.dumps(res['data']), flush=True)
    for v in a.variants.split(','):
        shape, _, ep = v.partition(':'); b, g = map(int, shape.split('x')); out = run/f'sft-{shape}'; shutil.rmtree(out, ignore_errors=True)
        s = train_sft(base, train, val, out, sft_config('gpu', pack_tokens=0, batch_size=b, grad_accum=g, epochs=float(ep or a.epochs)), progress=False)
        r = dict(variant=v, batch_size=b, grad_accum=g, steps=s['final_step'], epochs=s['epochs'], tokens_per_s=s['tokens_per_s'],
                 train_minutes=round(s['train_seconds'] / 60, 2), minutes=s['minutes'], peak_gpu_gib=s['peak_gpu_gib'])
        res['runs'].append(r); print(json.dumps(r), flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(res, indent=1))
    first = run/f"sft-{a.variants.split(',')[0].partition(':')[0]}"
    t0 = time.time(); merged = merge_lora(base, first/'adapter', first/'merged'); merge_s = time.time() - t0
    losses = {}
    for dt in ('float32', 'bfloat16'):
        m = AutoModelForCausalLM.from_pretrained(str(merged), dtype=getattr(torch, dt)).to(dev)
        losses[dt] = round(action_loss(m, val.rows, 8, pad_id=tok.pad_token_id)[0], 5); del m
    res['merge'] = dict(seconds=round(merge_s, 1), adapter_val_loss=round(res['runs'][0]['epochs'][-1]['val_loss'], 5),
                        merged_val_loss=losses, bytes=sum(f.stat().st_size for f in merged.iterdir()))
    print(json.dumps(res['merge']), flush=True)
    pairs = turn_contexts(val.rows[:a.match_rows]); t0 = time.time()
    res['teacher_forced'] = dict(rows=min(a.match_rows, len(val)), turns=len(pairs))
    for name, path in (('base', base), ('sft', merged)):
        pol = TransformersPolicy(path, max_new_tokens=96, device=dev)
        res['teacher_forced'][name] = round(turn_match(pol, pairs), 4); del pol
    res['teacher_forced']['seconds'] = round(time.time() - t0, 1)
    print(json.dumps(res['teacher_forced']), flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
