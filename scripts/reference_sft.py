"""The reference SFT run on one GPU: collect 1,000 accepted expert trajectories, LoRA SFT of the embedded SmolLM2
on 800 of them (validation on 200), then the frozen 200-task benchmark for the base and the SFT model with the
token-level runner (one rollout per task, temperature 0). Writes small result files under --out.

    python scripts/reference_sft.py --run outputs/reference-run --out outputs/reference
"""
from __future__ import annotations
import argparse, json, shutil, time
from pathlib import Path


def log(msg): print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/reference-run'); ap.add_argument('--out', default='outputs/reference')
    ap.add_argument('--target-accepted', type=int, default=1000); ap.add_argument('--n-train', type=int, default=800); ap.add_argument('--n-val', type=int, default=200)
    ap.add_argument('--epochs', type=float, default=3); ap.add_argument('--lr', type=float, default=1e-4); ap.add_argument('--batch-size', type=int, default=200); ap.add_argument('--max-new-tokens', type=int, default=128)
    ap.add_argument('--stages', default='collect,sft,eval_base,eval_sft'); ap.add_argument('--bring', default=None, help='folder for the small files to keep: fp16 adapter, compressed eval trajectories'); ap.add_argument('--workers', type=int, default=8)
    ap.add_argument('--n-eval', type=int, default=200); ap.add_argument('--sft-tasks', type=int, default=1500, help='size of the SFT task split (more tasks, more teacher data)'); ap.add_argument('--max-turns', type=int, default=35)
    ap.add_argument('--lora-r', type=int, default=None, help='LoRA rank (default: the gpu recipe\'s)'); ap.add_argument('--lora-alpha', type=int, default=None, help='LoRA alpha (default: the gpu recipe\'s)')
    a = ap.parse_args(); stages = a.stages.split(','); run, out = Path(a.run), Path(a.out); out.mkdir(parents=True, exist_ok=True)
    import torch
    from shopping_grpo.shop import prepare_shop, DEFAULT_SIZES
    from shopping_grpo.policies import ExpertPolicy
    from shopping_grpo.episode import ChatRenderer, load_chat_template
    from shopping_grpo.evaluate import evaluate
    from shopping_grpo.model import materialize_model
    from shopping_grpo.generate import StaticDecoder
    t0 = time.time(); shop = prepare_shop(run, 20_000, 0, 1, 'en', sizes=dict(DEFAULT_SIZES, sft=a.sft_tasks), progress=False); log(f'shop ready in {time.time() - t0:.0f}s')
    base = materialize_model('smollm2'); figures = {}
    if 'collect' in stages:
        from shopping_grpo.collect import collect, split_accepted, write_sft_split, load_trajectories
        t0 = time.time()
        audit = collect(shop, shop.tasks['sft'], ExpertPolicy(shop.catalog), run/'collect', workers=a.workers, target_accepted=a.target_accepted, progress=False)
        acc = load_trajectories(run/'collect'/'accepted.jsonl'); train, val = split_accepted(acc, a.n_train, a.n_val)
        write_sft_split(run/'collect', train, val, shop); figures['collect'] = dict(seconds=round(time.time() - t0, 1), accepted=audit['n_accepted'], acceptance_rate=audit['acceptance_rate'])
        shutil.copy(run/'collect'/'audit.json', out/'collect_audit.json'); log(f"collected: {figures['collect']}")
    sft_dir, merged = run/'sft', run/'sft'/'merged'
    if 'sft' in stages:
        from shopping_grpo.sft import SFTData, train_sft, merge_lora, sft_config
        from transformers import AutoTokenizer
        t0 = time.time(); torch.cuda.reset_peak_memory_stats(); tok = AutoTokenizer.from_pretrained(str(base))
        train, val = SFTData(run/'collect'/'sft_train.jsonl', tok, 8192), SFTData(run/'collect'/'sft_val.jsonl', tok, 8192)
        log(f'sft data: {train.counts} / {val.counts}')
        s = train_sft(base, train, val, sft_dir, sft_config('gpu', epochs=a.epochs, lr=a.lr, lora_r=a.lora_r, lora_alpha=a.lora_alpha,
                                                               pack_tokens=0, batch_size=4, grad_accum=4), progress=False)
        merge_lora(base, sft_dir/'adapter', merged)
        figures['sft'] = dict(seconds=round(time.time() - t0, 1), peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
        shutil.copy(sft_dir/'summary.json', out/'sft_summary.json'); log(f"sft: {figures['sft']} {json.dumps(s)[:400]}")
    from transformers import AutoTokenizer
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(base)), load_chat_template())
    bench = shop.tasks['eval'][:a.n_eval]
    for name, path in [('base', base), ('sft', merged)]:
        if f'eval_{name}' not in stages: continue
        t0 = time.time(); dec = StaticDecoder(path, temperature=0.0, max_new_tokens=a.max_new_tokens); dec.name = name
        s = evaluate(shop, bench, dec, run/'eval'/name, renderer=renderer, batch_size=a.batch_size, config=dict(model=name, temperature=0.0, runner='token-lockstep',
                     decoder='StaticDecoder+cuda_graph'), progress=False, max_turns=a.max_turns, max_new_tokens=a.max_new_tokens)
        s['generation'] = dict(tokens=dec.generated, seconds=round(dec.gen_seconds, 1), tokens_per_s=round(dec.generated / max(dec.gen_seconds, 1e-9)),
                               wall_minutes=round((time.time() - t0) / 60, 2))
        (out/'eval'/name).mkdir(parents=True, exist_ok=True); (out/'eval'/name/'summary.json').write_text(json.dumps(s, indent=1))
        log(f"eval {name}: strict {s['strict_success']} purchase {s['purchase_success']} reward {s['mean_reward']} gen {s['generation']}")
    (out/'run_figures.json').write_text(json.dumps(figures, indent=1))
    if a.bring: bring_back(run, out, Path(a.bring))


def bring_back(run:Path, out:Path, dest:Path):
    "Copy the small results worth keeping: the adapter in fp16, eval trajectories gzip-compressed, the summaries."
    import gzip, torch
    from safetensors.torch import load_file, save_file
    dest.mkdir(parents=True, exist_ok=True); ad = run/'sft'/'adapter'
    if (ad/'adapter_model.safetensors').exists():
        (dest/'adapter').mkdir(exist_ok=True); shutil.copy(ad/'adapter_config.json', dest/'adapter'/'adapter_config.json')
        save_file({k: v.half() for k, v in load_file(str(ad/'adapter_model.safetensors')).items()}, str(dest/'adapter'/'adapter_model.safetensors'))
    for p in (run/'eval').glob('*/trajectories.jsonl'):
        with open(p, 'rb') as f, gzip.open(dest/f'eval_{p.parent.name}_trajectories.jsonl.gz', 'wb') as g: shutil.copyfileobj(f, g)
    for p in out.rglob('*.json'): q = dest/'results'/p.relative_to(out); q.parent.mkdir(parents=True, exist_ok=True); shutil.copy(p, q)


if __name__ == '__main__': main()
