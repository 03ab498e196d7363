"""The judged evaluation of the reference models on one GPU: rubrics curated by the embedded judge model (code's
rubric steps in where its answer fails validation twice), every benchmark trajectory of each reference model and of
the four reference shoppers judged by the same model through the judges' endpoint seam (`LocalEndpoint`: schema-guided
greedy decoding in-process), the four panels of each model, and how far the judge and the curator agree with what the
shop knows for certain (08_judge's `run_agreement`), with calibration flags.

With `--mode evidence` (the default) each requirement is asked on its evidence (08_judge's evidence judge: answer
probabilities from one forward pass, thresholds and worked examples from the reference shoppers' trajectories of the
first `--n-calibrate` training tasks), and the whole-trajectory call gives the five scores; the reference models'
trajectories, written before Reward v3's detail named the requirements met, are replayed on the shop to get that
truth (`with_requirement_truth`: the reward must come out the same). `--mode trajectory` is the earlier judge. Small result files go to --out:
run_<judge>.json (accounting and flags of the latest call, and every call's speed under `runs`: a rerun that adds a
model judges only what is new), agreement_<judge>.json, rubrics.jsonl.gz and, per model,
<model>/judge_summary.json and <model>/judgments.jsonl.gz.

    python scripts/reference_judge.py --judge qwen2.5-0.5b --run outputs/judge-run
A CPU check of the wiring (a small random model as the judge, 4 tasks, 2 models):
    python scripts/reference_judge.py --judge outputs/tiny --n-tasks 4 --n-calibrate 4 --rows 4 --models qwen-sft=outputs/reference/qwen/template/eval/sft --shoppers expert --device cpu --run outputs/judge-check --out outputs/judge-check/out
"""
from __future__ import annotations
import argparse, gzip, json, shutil, time
from pathlib import Path

MODELS = ('qwen-base=outputs/reference/qwen/template/eval/base,qwen-sft=outputs/reference/qwen/template/eval/sft,'
          'qwen-grpo=outputs/reference/qwen/grpo/eval/grpo,smollm2-sft=outputs/reference/eval/sft,'
          'smollm2-grpo=outputs/reference/eval/grpo')


def log(msg): print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--judge', default='qwen2.5-0.5b', help='embedded model name or checkpoint folder of the judge')
    ap.add_argument('--models', default=MODELS, help='NAME=FOLDER,...: folders holding trajectories.jsonl.gz')
    ap.add_argument('--shoppers', default='oracle,expert,heuristic,random', help="reference shoppers played here ('' none)")
    ap.add_argument('--curator', action=argparse.BooleanOptionalAction, default=True,
                    help='curate the rubrics with the judge model (else code rubrics)')
    ap.add_argument('--n-tasks', type=int, default=200)
    ap.add_argument('--rows', type=int, default=128, help='requests decoded together (decoder rows, judge threads)')
    ap.add_argument('--device', default=None)
    ap.add_argument('--mode', default='evidence', choices=('evidence', 'trajectory'),
                    help="evidence: each requirement on its evidence, calibrated on training tasks; trajectory: the earlier judge")
    ap.add_argument('--n-calibrate', type=int, default=100, help='training tasks the reference shoppers play to calibrate on')
    ap.add_argument('--run', default='outputs/judge-run')
    ap.add_argument('--out', default=None, help='default: outputs/reference/judge_evidence (evidence), outputs/reference/judge')
    ap.add_argument('--n-products', type=int, default=20_000)
    a = ap.parse_args()
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.evaluate import evaluate, scripted_policy
    from shopping_grpo.judge import run_judges, run_agreement, write_agreement, calibration_flags, read_rubrics
    from shopping_grpo.judge import JUDGE_PACKAGES, trajectories, with_requirement_truth, calibration_trajectories, calibrate_judge
    from shopping_grpo.local_endpoint import LocalEndpoint
    from shopping_grpo.records import write_atomic, package_versions
    evidence = a.mode == 'evidence'
    run = Path(a.run)
    out = Path(a.out or ('outputs/reference/judge_evidence' if evidence else 'outputs/reference/judge'))
    shop = prepare_shop(run/'shop', a.n_products, 0, 1, 'en', progress=False)
    tasks = shop.tasks['eval'][:a.n_tasks]
    ev = run/'eval'
    names = []
    for spec in filter(None, a.models.split(',')):
        name, src = spec.split('=')
        (ev/name).mkdir(parents=True, exist_ok=True)
        if not (ev/name/'trajectories.jsonl.gz').exists():  # read as it is (08_judge's `trajectories`)
            shutil.copy(Path(src)/'trajectories.jsonl.gz', ev/name/'trajectories.jsonl.gz')
        if (Path(src)/'summary.json').exists(): shutil.copy(Path(src)/'summary.json', ev/name/'summary.json')
        if evidence and not (ev/name/'trajectories.jsonl').exists():  # the truth of every requirement: replayed on the shop
            by_id = {t.task_id: t for t in shop.tasks['eval']}
            recs = [with_requirement_truth(r, shop, by_id[k]) for k, r in trajectories(ev/name).items() if k in by_id]
            write_atomic(ev/name/'trajectories.jsonl', ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in recs))
        names.append(name)
    for s in filter(None, a.shoppers.split(',')):
        evaluate(shop, tasks, scripted_policy(s, shop), ev/s, progress=False)
        names.append(s)
    log(f"judging {len(names)} models x {len(tasks)} tasks with {a.judge}")
    ep = LocalEndpoint(a.judge, rows=a.rows, device=a.device, name=Path(a.judge).name)
    t0, cal = time.time(), None
    if evidence:
        train = shop.tasks['sft'][:a.n_calibrate]
        cal = calibrate_judge(calibration_trajectories(shop, train, run/'judge_calibration'), train, ep,
                              ev/'judge_calibration.json', workers=a.rows, progress=False)
        log(f"calibrated in {time.time() - t0:.0f} s: {json.dumps(cal.fitted)}")
    summaries = run_judges(ev, tasks, names, curator=ep if a.curator else None, judge=ep, workers=a.rows,
                           progress=False, mode=a.mode, cal=cal)
    seconds = time.time() - t0
    eng = ep.engine  # None when there was nothing left to judge
    ep.close()
    log(f"judged in {seconds:.0f} s")
    agreement = run_agreement(ev, tasks, models=names, mode=a.mode)
    out.mkdir(parents=True, exist_ok=True)
    path = write_agreement(out, agreement, f'{ep.name}-evidence' if evidence else ep.name)
    flags = calibration_flags(summaries)
    made = dict(prompt_tokens=eng.prompt_tokens, answer_tokens=eng.answer_tokens, passes=eng.calls) if eng else \
        dict(prompt_tokens=0, answer_tokens=0, passes=0)
    call = dict(seconds=round(seconds, 1), models=names, **made,
                tokens_per_s=round((made['prompt_tokens'] + made['answer_tokens']) / seconds, 1))
    run_file = out/f'run_{path.stem[len("agreement_"):]}.json'
    runs = json.loads(run_file.read_text()).get('runs', []) if run_file.exists() else []
    res = dict(judge=ep.public(), mode=a.mode, models=names, n_tasks=len(tasks), runs=runs + [call],
               seconds=round(sum(r['seconds'] for r in runs + [call]), 1),
               judged={n: dict(valid=s['valid_judgments'], not_judged=s['not_judged'], reasons=s['not_judged_reasons'],
                               rubric_sources=s['rubric_sources']) for n, s in summaries.items()},
               flags=flags, agreement_file=path.name, versions=package_versions(JUDGE_PACKAGES + ('torch', 'transformers')))
    write_atomic(run_file, json.dumps(res, indent=1, ensure_ascii=False))
    with gzip.open(out/'rubrics.jsonl.gz', 'wt', encoding='utf-8') as f: f.write((ev/'rubrics.jsonl').read_text())
    if evidence: shutil.copy(ev/'judge_calibration.json', out/'judge_calibration.json')
    for n in names:
        (out/n).mkdir(exist_ok=True)
        shutil.copy(ev/n/'judge_summary.json', out/n/'judge_summary.json')
        for kind in ('judgments', 'evidence') if evidence else ('judgments',):
            with gzip.open(out/n/f'{kind}.jsonl.gz', 'wt', encoding='utf-8') as f: f.write((ev/n/f'{kind}.jsonl').read_text())
    headline = agreement.get('pooled_purchases' if evidence else 'pooled', {})
    log(json.dumps(dict(seconds=call['seconds'], requests=made, flags=flags, overall=headline.get('overall'),
                        by_kind={k: v['kappa'] for k, v in headline.get('by_kind', {}).items()},
                        task_level=agreement.get('pooled', {}).get('all_met_vs_strict'))))


if __name__ == '__main__': main()
