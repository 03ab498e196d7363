"""The reference GRPO run on one GPU: online GRPO from the SFT model in the 20,000-product shop (06_grpo's recipe),
then the frozen 200-task benchmark for the SFT and the chosen GRPO model with the same token runner (one greedy
rollout per task) and their paired comparison (exact McNemar test on strict success). Writes small result files
under --out: grpo/{metrics.jsonl,summary.json,bench.json,val/}, eval/{sft,grpo}/summary.json, eval/compare/grpo_vs_sft.json.

    python scripts/reference_grpo.py outputs/reference-run/sft/merged --run outputs/reference-run --out outputs/reference

A run stopped by --time-budget-min (or killed) resumes from its last checkpoint when the same command is run again.
On the CPU, to check that it runs: --device cpu --steps 2 --tasks 4 --groups 2 --group-size 2 --micro-batch 2 --n-val 2 --n-eval 2 --n-products 3000
"""
from __future__ import annotations
import argparse, json, math, os, shutil, time
from pathlib import Path


def log(msg): print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('sft', help='start model: the SFT merged checkpoint (or any checkpoint path, or smollm2)')
    ap.add_argument('--run', default='outputs/reference-run', help='run folder: shop files, grpo/ and eval/ go here')
    ap.add_argument('--out', default='outputs/reference', help='folder for the small result files')
    ap.add_argument('--stages', default='grpo,eval_sft,eval_grpo,compare')
    ap.add_argument('--steps', type=int, default=50); ap.add_argument('--groups', type=int, default=8); ap.add_argument('--group-size', type=int, default=4)
    ap.add_argument('--micro-batch', type=int, default=8); ap.add_argument('--lr', type=float, default=2e-5)
    ap.add_argument('--val-every', type=int, default=10); ap.add_argument('--n-val', type=int, default=64)
    ap.add_argument('--max-turns', type=int, default=35); ap.add_argument('--max-new-tokens', type=int, default=128)
    ap.add_argument('--decoder', default='static', choices=['static', 'generate']); ap.add_argument('--resample-rounds', type=int, default=1)
    ap.add_argument('--tasks', type=int, default=0, help='use only this many grpo_train tasks (0: all)')
    ap.add_argument('--n-products', type=int, default=20_000); ap.add_argument('--n-eval', type=int, default=200); ap.add_argument('--eval-batch', type=int, default=32)
    ap.add_argument('--device', default='cuda', choices=['cuda', 'cpu']); ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--time-budget-min', type=float, default=0, help='stop training cleanly (with a checkpoint) after this many minutes; 0: no limit')
    return ap.parse_args()


def time_budget(minutes:float):
    "A callback that stops training with a checkpoint once `minutes` have passed."
    from transformers import TrainerCallback
    class Budget(TrainerCallback):
        t0 = time.time()
        def on_step_end(self, args, state, control, **kw):
            if minutes and time.time() - self.t0 > minutes * 60: control.should_training_stop = control.should_save = True
    return Budget()


def bench(metrics:list[dict], summary:dict) -> dict:
    "The speed figures of the run: medians over the steps after the first, and the time split."
    from shopping_grpo.grpo import median, time_share
    tr = [r for r in metrics if r['kind'] == 'train']; rest = tr[1:] or tr
    return dict(device=summary['device'], decoder=summary['recipe']['decoder'], steps=len(tr), episodes=summary['episodes'],
                episodes_per_step=summary['recipe']['groups'] * summary['recipe']['group_size'],
                **{k: median(rest, k) for k in ('episodes_per_s', 'tokens_per_s', 'step_s', 'gen_s', 'env_s', 'train_s', 'gpu_mem_gib')},
                time_share=time_share(tr), minutes=summary['minutes'])


def mcnemar(a:dict, b:dict) -> dict:
    "Exact McNemar test on strict success, paired by task: b wins where only b succeeds."
    ids = sorted(set(a) & set(b)); only_a = sum(a[t] and not b[t] for t in ids); only_b = sum(b[t] and not a[t] for t in ids)
    n, k = only_a + only_b, min(only_a, only_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return dict(n_tasks=len(ids), won=only_b, lost=only_a, p_value=round(p, 6))


def main():
    a = parse()
    if a.device == 'cpu': os.environ['CUDA_VISIBLE_DEVICES'] = ''  # before torch is imported
    import torch
    from shopping_grpo.reward import prepare_shop
    from shopping_grpo.agent import ChatRenderer, evaluate, read_records
    from shopping_grpo.grpo import grpo_recipe, train_grpo, read_metrics
    if a.device == 'cpu': torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    run, out, stages = Path(a.run), Path(a.out), a.stages.split(','); out.mkdir(parents=True, exist_ok=True)
    t0 = time.time(); shop = prepare_shop(run, a.n_products, 0, 1, 'en', progress=False); log(f'shop ready in {time.time() - t0:.0f}s')
    if a.tasks: shop.tasks['grpo_train'] = shop.tasks['grpo_train'][:a.tasks]
    grpo_dir = run/'grpo'
    if 'grpo' in stages:
        cfg = grpo_recipe('gpu', max_steps=a.steps, groups=a.groups, group_size=a.group_size, micro_batch=a.micro_batch, lr=a.lr, val_every=a.val_every,
                          n_val=a.n_val, max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, decoder=a.decoder, resample_rounds=a.resample_rounds, seed=a.seed)
        log(f'grpo: {cfg}')
        s = train_grpo(a.sft, shop, grpo_dir, cfg, 'en', callbacks=[time_budget(a.time_budget_min)])
        m = read_metrics(grpo_dir/'metrics.jsonl'); b = bench(m, s)
        (out/'grpo'/'val').mkdir(parents=True, exist_ok=True)
        shutil.copy(grpo_dir/'metrics.jsonl', out/'grpo'/'metrics.jsonl'); shutil.copy(grpo_dir/'summary.json', out/'grpo'/'summary.json')
        (out/'grpo'/'bench.json').write_text(json.dumps(b, indent=1))
        for v in (grpo_dir/'val').glob('step-*/summary.json'): shutil.copy(v, out/'grpo'/'val'/f'{v.parent.name}.json')
        log(f"grpo: {s['final_step']}/{a.steps} steps, chosen step {s['chosen_step']} {s['chosen']}, start {s['start']}, skipped {s['skipped_steps']}, {s['minutes']} min")
        log(f'bench: {b}')
        if s['final_step'] < a.steps: log('stopped before the last step (time budget): run the same command again to resume'); return
    from transformers import AutoTokenizer
    from shopping_grpo.generate import StaticDecoder, TransformersPolicy
    bench_tasks = shop.tasks['eval'][:a.n_eval]
    for name, path in [('sft', a.sft), ('grpo', grpo_dir/'merged')]:
        if f'eval_{name}' not in stages: continue
        t0 = time.time(); renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(path)), None, 'en')
        dec = (StaticDecoder if a.device == 'cuda' else TransformersPolicy)(str(path), temperature=0.0, max_new_tokens=a.max_new_tokens); dec.name = name
        s = evaluate(shop, bench_tasks, dec, run/'eval'/name, renderer=renderer, batch_size=a.eval_batch, progress=False, max_turns=a.max_turns,
                     max_new_tokens=a.max_new_tokens, config=dict(model=name, path=str(path), temperature=0.0, runner='token-lockstep', decoder=type(dec).__name__))
        s['generation'] = dict(tokens=dec.generated, seconds=round(dec.gen_seconds, 1), tokens_per_s=round(dec.generated / max(dec.gen_seconds, 1e-9)),
                               wall_minutes=round((time.time() - t0) / 60, 2))
        (out/'eval'/name).mkdir(parents=True, exist_ok=True); (out/'eval'/name/'summary.json').write_text(json.dumps(s, indent=1))
        log(f"eval {name}: strict {s['strict_success']} purchase {s['purchase_success']} reward {s['mean_reward']} gen {s['generation']}")
    if 'compare' in stages:
        recs = {n: read_records(run/'eval'/n/'trajectories.jsonl') for n in ('sft', 'grpo')}
        ok = {n: {t.task_id: bool(r[t.task_id]['strict_success']) if t.task_id in r else False for t in bench_tasks} for n, r in recs.items()}
        c = dict(mcnemar(ok['sft'], ok['grpo']), metric='strict_success', a='sft', b='grpo',
                 rate_sft=sum(ok['sft'].values()) / len(bench_tasks), rate_grpo=sum(ok['grpo'].values()) / len(bench_tasks))
        (out/'eval'/'compare').mkdir(parents=True, exist_ok=True); (out/'eval'/'compare'/'grpo_vs_sft.json').write_text(json.dumps(c, indent=1))
        log(f'paired: {c}')


if __name__ == '__main__': main()
