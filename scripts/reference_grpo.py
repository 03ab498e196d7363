"""The reference GRPO run on one GPU: online GRPO from the SFT model in the 20,000-product shop (06_grpo's recipe) with
one step-credit variant (--credit: episode = plain GRPO, spa = progress estimates, steps = same-page step groups;
06c_step_credit), then the frozen 200-task benchmark for the SFT and the chosen GRPO model with the same token runner
(one greedy rollout per task, 07_evaluate's hard checks and figures) and paired comparisons (07_evaluate's
write_comparison: exact McNemar on strict success, bootstrap intervals) against SFT and against every other variant
already evaluated in the run folder. The variants share seeds, tasks, steps and evaluation; each trains into
run/<variant>/ and evaluates into run/eval/<variant>/, where the variant is `grpo` for plain GRPO and `grpo_spa`,
`grpo_steps` for the others. Small result files under --out: <variant>/{metrics.jsonl,summary.json,bench.json,val/},
eval/{sft,<variant>}/{summary.json,checks.jsonl}, eval/compare/<variant>_vs_*.json.

    python scripts/reference_grpo.py outputs/reference-run/sft/merged --run outputs/reference-run --out outputs/reference --credit spa

A run stopped by --time-budget-min still exports its best validated checkpoint and is evaluated (its summary's
final_step says how far it got); a stopped or killed run resumes from its last checkpoint when the same command is run
again on the same machine.
Each evaluation also keeps its trajectories gzipped in --out (eval/<name>/trajectories.jsonl.gz, with run.json); a later
session on a fresh machine, given the same --out, puts them back into run/eval/ first, so variants trained in different
sessions are still paired.
On the CPU, to check that it runs (the static decoder is for CUDA: on the CPU it attends over the whole 8k cache; a tiny model, e.g. shopping_grpo.sft.tiny_model('outputs/tiny'), as the start model):
--device cpu --decoder generate --steps 2 --tasks 4 --groups 2 --group-size 2 --micro-batch 2 --n-val 2 --n-eval 2 --n-products 3000 --max-turns 3 --max-new-tokens 16
--split-sizes '{"sft": 60, "grpo_train": 40, "grpo_val": 20, "eval": 40}'
Rollouts follow 06_grpo's GPU recipe: the step's groups and --extra-groups more are played in one lockstep pass and the
first that vary are kept; they decode a merged copy of the model (--no-merged-decode: the LoRA model itself). bench.json
adds the medians of episodes played, decoder calls and decode steps per step, which compare sampling forms without timing.
"""
from __future__ import annotations
import argparse, gzip, json, os, shutil, time
from pathlib import Path


def log(msg): print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse():
    import shopping_grpo.step_credit  # registers the step-credit variants with the engine
    from shopping_grpo.grpo import CREDITS
    from shopping_grpo.reward import TRAINING_REWARDS
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('sft', help='start model: the SFT merged checkpoint (or any checkpoint path, or smollm2)')
    ap.add_argument('--run', default='outputs/reference-run', help='run folder: shop files, grpo/ and eval/ go here')
    ap.add_argument('--out', default='outputs/reference', help='folder for the small result files')
    ap.add_argument('--stages', default='grpo,eval_sft,eval_grpo,compare')
    recipe = "default: 06_grpo's GPU recipe"  # the recipe knobs left unset come from grpo_recipe('gpu')
    ap.add_argument('--steps', type=int, default=None, help=f'training steps ({recipe})')
    ap.add_argument('--groups', type=int, default=None, help=f'tasks a step ({recipe})')
    ap.add_argument('--group-size', type=int, default=None, help=f'episodes a task ({recipe})')
    ap.add_argument('--micro-batch', type=int, default=None, help=f'episodes a forward/backward pass ({recipe})')
    ap.add_argument('--lr', type=float, default=None, help=f'learning rate ({recipe})')
    ap.add_argument('--val-every', type=int, default=None, help=f'steps between validations ({recipe})')
    ap.add_argument('--n-val', type=int, default=None, help=f'validation tasks ({recipe})')
    ap.add_argument('--max-turns', type=int, default=None, help=f'turns an episode ({recipe})')
    ap.add_argument('--max-new-tokens', type=int, default=None, help=f'tokens a turn ({recipe})')
    ap.add_argument('--decoder', default=None, choices=['continuous', 'slot', 'static', 'generate'],
                    help=f'rollout decoder ({recipe})')
    ap.add_argument('--merged-decode', action=argparse.BooleanOptionalAction, default=None,
                    help=f'decode rollouts with a merged copy of the model ({recipe})')
    ap.add_argument('--extra-groups', type=int, default=None,
                    help=f'dynamic sampling: extra groups played in the same lockstep pass ({recipe})')
    ap.add_argument('--resample-rounds', type=int, default=None,
                    help=f'dynamic sampling, second-pass form: extra lockstep passes for flat groups ({recipe})')
    ap.add_argument('--lockstep-batch', type=int, default=None,
                    help=f'episodes decoded together at most: groups + extra groups, times the group size ({recipe})')
    ap.add_argument('--tasks', type=int, default=0, help='use only this many grpo_train tasks (0: all)')
    ap.add_argument('--split-sizes', type=json.loads, default=None, help='task split sizes as JSON (a small shop); default: 01_tasks sizes')
    ap.add_argument('--n-products', type=int, default=20_000); ap.add_argument('--n-eval', type=int, default=200); ap.add_argument('--eval-batch', type=int, default=32)
    ap.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    ap.add_argument('--seed', type=int, default=None, help=f'training seed ({recipe})')
    ap.add_argument('--reward', default=None, choices=list(TRAINING_REWARDS), help=f'training reward ({recipe})')
    ap.add_argument('--credit', default='episode', choices=list(CREDITS), help='step credit: plain GRPO, progress estimates, same-page step groups')
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
    c = summary['recipe']
    return dict(device=summary['device'], decoder=c['decoder'], merged_decode=c['merged_decode'], extra_groups=c['extra_groups'],
                resample_rounds=c['resample_rounds'], steps=len(tr), episodes=summary['episodes'], episodes_per_step=c['groups'] * c['group_size'],
                **{k: median(rest, k) for k in ('episodes_per_s', 'tokens_per_s', 'step_s', 'gen_s', 'env_s', 'train_s', 'gpu_mem_gib',
                                                 'episodes_played', 'decoder_calls', 'decode_steps')},
                time_share=time_share(tr), minutes=summary['minutes'])


def variant_name(credit:str, reward:str|None=None) -> str:
    "The run folder and evaluation name of a variant: plain GRPO on Reward v3 is `grpo`; others add credit and reward."
    return '_'.join(['grpo'] + ([credit] if credit != 'episode' else []) + ([reward] if reward not in (None, 'v3') else []))


def evaluate_checkpoint(shop, name:str, path:str, run:Path, a) -> dict:
    "Greedy benchmark episodes of checkpoint `path` into run/eval/<name>/ with 07_evaluate's checks and summary (resumes by task)."
    from transformers import AutoTokenizer
    from shopping_grpo.episode import ChatRenderer
    from shopping_grpo.generate import StaticDecoder, TransformersPolicy
    from shopping_grpo.evaluate import as_spec, benchmark_tasks, eval_settings, evaluate, prepare_folder
    tasks, ident = benchmark_tasks(shop, a.n_eval); spec = as_spec(f'{name}=transformers:{path}', max_new_tokens=a.max_new_tokens)
    settings, out, t0 = eval_settings(spec, ident, shop, a.max_turns), run/'eval'/name, time.time(); prepare_folder(out, settings)
    dec = (StaticDecoder if a.device == 'cuda' else TransformersPolicy)(path, temperature=0.0, max_new_tokens=a.max_new_tokens); dec.name = name
    s = evaluate(shop, tasks, dec, out, renderer=ChatRenderer(AutoTokenizer.from_pretrained(path), None, 'en'), batch_size=a.eval_batch,
                 progress=False, max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, config=settings, ident=ident,
                 spec=spec.public())
    return s | dict(generation=dict(tokens=dec.generated, seconds=round(dec.gen_seconds, 1), tokens_per_s=round(dec.generated / max(dec.gen_seconds, 1e-9)),
                                    wall_minutes=round((time.time() - t0) / 60, 2), decoder=type(dec).__name__))


EVAL_FILES = ('summary.json', 'checks.jsonl', 'run.json')

def keep_eval(run:Path, out:Path, name:str, summary:dict):
    "An evaluation's small files and its gzipped trajectories, copied to out/eval/<name>/."
    d = out/'eval'/name; d.mkdir(parents=True, exist_ok=True)
    (d/'summary.json').write_text(json.dumps(summary, indent=1))
    for f in EVAL_FILES[1:]: shutil.copy(run/'eval'/name/f, d/f)
    with open(run/'eval'/name/'trajectories.jsonl', 'rb') as f, gzip.open(d/'trajectories.jsonl.gz', 'wb') as g: shutil.copyfileobj(f, g)


def restore_evals(run:Path, out:Path):
    "Evaluations an earlier session kept in out/ put back into run/eval/ (a fresh machine has none), so every variant can be paired."
    for z in sorted(out.glob('eval/*/trajectories.jsonl.gz')):
        d = run/'eval'/z.parent.name
        if (d/'trajectories.jsonl').exists() or not all((z.parent/f).exists() for f in EVAL_FILES): continue
        d.mkdir(parents=True, exist_ok=True)
        for f in EVAL_FILES: shutil.copy(z.parent/f, d/f)
        with gzip.open(z, 'rb') as g, open(d/'trajectories.jsonl', 'wb') as f: shutil.copyfileobj(g, f)
        log(f'restored {d} from {z.parent}')


def main():
    a = parse()
    if a.device == 'cpu': os.environ['CUDA_VISIBLE_DEVICES'] = ''  # before torch is imported
    import torch
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.grpo import grpo_recipe, train_grpo, read_metrics, CREDITS
    from shopping_grpo.model import materialize_model
    from shopping_grpo.evaluate import write_comparison
    if a.device == 'cpu': torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    run, out, stages = Path(a.run), Path(a.out), a.stages.split(','); out.mkdir(parents=True, exist_ok=True)
    t0 = time.time(); shop = prepare_shop(run, a.n_products, 0, 1, 'en', sizes=a.split_sizes, progress=False); log(f'shop ready in {time.time() - t0:.0f}s')
    if a.tasks: shop.tasks['grpo_train'] = shop.tasks['grpo_train'][:a.tasks]
    restore_evals(run, out)
    variant = variant_name(a.credit, a.reward); grpo_dir, res = run/variant, out/variant
    cfg = grpo_recipe('gpu', max_steps=a.steps, groups=a.groups, group_size=a.group_size, micro_batch=a.micro_batch, lr=a.lr,
                      val_every=a.val_every, n_val=a.n_val, max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, decoder=a.decoder,
                      resample_rounds=a.resample_rounds, extra_groups=a.extra_groups, merged_decode=a.merged_decode,
                      lockstep_batch=a.lockstep_batch, seed=a.seed, credit=a.credit, reward=a.reward)
    a.max_turns, a.max_new_tokens = cfg.max_turns, cfg.max_new_tokens  # the benchmark plays with the recipe's limits
    if 'grpo' in stages:
        log(f'{variant}: {cfg}')
        s = train_grpo(a.sft, shop, grpo_dir, cfg, 'en', callbacks=[time_budget(a.time_budget_min)])
        m = read_metrics(grpo_dir/'metrics.jsonl'); b = bench(m, s)
        (res/'val').mkdir(parents=True, exist_ok=True)
        for f in ('metrics.jsonl', 'summary.json', 'credit.json'):
            if (grpo_dir/f).exists(): shutil.copy(grpo_dir/f, res/f)
        (res/'bench.json').write_text(json.dumps(b, indent=1))
        for v in (grpo_dir/'val').glob('step-*/summary.json'): shutil.copy(v, res/'val'/f'{v.parent.name}.json')
        log(f"{variant}: {s['final_step']}/{cfg.max_steps} steps, chosen step {s['chosen_step']} {s['chosen']}, start {s['start']}, skipped {s['skipped_steps']}, {s['minutes']} min")
        log(f'bench: {b}')
        if s['final_step'] < cfg.max_steps: log(f"stopped by the time budget after {s['final_step']} of {cfg.max_steps} steps: evaluating the best validated checkpoint")
    for stage, name, path in [('eval_sft', 'sft', a.sft), ('eval_grpo', variant, grpo_dir/'merged')]:
        if stage not in stages: continue
        s = evaluate_checkpoint(shop, name, str(materialize_model(str(path))), run, a); keep_eval(run, out, name, s)
        log(f"eval {name}: {s['figures']} generation {s['generation']}")
    if 'compare' in stages:
        (out/'eval'/'compare').mkdir(parents=True, exist_ok=True)
        others = ['sft', *[variant_name(c) for c in CREDITS if variant_name(c) != variant]]  # plain GRPO is one of them
        for other in others:
            if not (run/'eval'/other/'checks.jsonl').exists(): continue
            try: c = write_comparison(run, variant, other)
            except ValueError as e: log(f'{variant} vs {other}: not comparable ({e})'); continue
            shutil.copy(run/'eval'/'compare'/f'{variant}_vs_{other}.json', out/'eval'/'compare'/f'{variant}_vs_{other}.json')
            log(f"{variant} vs {other}: won {c['won']} lost {c['lost']} p {c['p_value']} strict {c['a_value']} vs {c['b_value']} "
                f"(diff {c['diff']}, CI {c['ci_low']}..{c['ci_high']}); mean reward diff {c['mean_reward']['diff']}")


if __name__ == '__main__': main()
