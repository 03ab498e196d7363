"""How well a judge model tells the requirements that hold from those that do not, per requirement kind, on the
evidence questions of a published judge run's purchases, as the judge asks them now (with the line code computes for a
budget, brand or model question unless `--without-checks`) and with the worked examples that run showed. For a sample of up to `--per-truth` questions of each kind and truth, the model's yes share
P(yes) / (P(yes) + P(no)) is ranked against the shop's truth (ROC AUC: 0.5 is a coin, 1 a perfect order), beside the
AUC of the run's own judge on the very same questions, read from its stored answers. A kind ranked barely better than
a coin cannot reach a kappa of 0.6 with any threshold. Nothing is fitted, so nothing is tuned on the benchmark.

    python benchmarks/bench_judge_separability.py --model smollm2 --device cpu --per-truth 20 \
        --out benchmarks/results/judge_separability_smollm2.json
"""
from __future__ import annotations
import argparse, json, platform, random, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def brief(kind:dict) -> dict:
    "A kind's figures without its per-question answers, as printed."
    return {x: v for x, v in kind.items() if x != 'asked'}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/reference/h200', help='a published run with eval/<model>/evidence.jsonl.gz')
    ap.add_argument('--model', default='smollm2', help='the judge model to measure (an embedded name or a checkpoint)')
    ap.add_argument('--device', default=None, help='cuda or cpu (default: cuda when there is one)')
    ap.add_argument('--per-truth', type=int, default=20, help='questions of each kind and truth (met, unmet) in the sample')
    ap.add_argument('--seed', type=int, default=0); ap.add_argument('--rows', type=int, default=16)
    ap.add_argument('--workers', type=int, default=16, help='questions in flight (the endpoint batches them)')
    ap.add_argument('--without-checks', action='store_true', help="ask budget, brand and model questions without the line code computes (CHECKS)")
    ap.add_argument('--kinds', default=None, help='comma-separated requirement kinds to ask (default: every kind)')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    from shopping_grpo.judge import (ANSWERS, KINDS, evidence_questions, model_dirs, purchased_asin, question_messages,
                                     ranking_auc, read_calibration, read_rubrics, requirement_truth, trajectories, yes_share)
    from shopping_grpo.local_endpoint import LocalEndpoint
    from shopping_grpo.records import read_records
    eval_dir, t0 = Path(a.run)/'eval', time.time()
    rubrics, cal = read_rubrics(eval_dir/'rubrics.jsonl.gz'), read_calibration(eval_dir/'judge_calibration.json')
    groups, run_judges = {}, set()  # (kind, truth) -> [(question, the run's judge's answer probabilities)]; the models it asked
    for d in model_dirs(eval_dir):
        recs, stored = trajectories(d), read_records(d/'evidence.jsonl.gz')
        for k, e in sorted(stored.items()):
            if e['status'] != 'judged' or not purchased_asin(recs[k]): continue
            truth = requirement_truth(recs[k], rubrics[k])
            for q in evidence_questions(recs[k], rubrics[k], not a.without_checks) or []:
                if truth[q.requirement] is not None and q.requirement in e['answers']:
                    groups.setdefault((q.kind, truth[q.requirement]), []).append((q, e['answers'][q.requirement]))
        run_judges |= {e['judge']['model'] for e in stored.values()}
    rng = random.Random(a.seed)
    sample = {g: rng.sample(xs, min(a.per_truth, len(xs))) for g, xs in sorted(groups.items())}
    if a.kinds: sample = {g: xs for g, xs in sample.items() if g[0] in a.kinds.split(',')}  # drawn as for every kind
    judge = LocalEndpoint(a.model, rows=a.rows, device=a.device)
    words = [ANSWERS[v] for v in ('met', 'unmet', 'unclear')]
    asked = [(g, q, ref) for g, xs in sample.items() for q, ref in xs]
    t1 = time.time()
    with ThreadPoolExecutor(a.workers) as ex:
        probs = list(ex.map(lambda x: judge.answer_probs(question_messages(x[1], cal.examples), words), asked))
    ask_s = time.time() - t1
    judge.close()
    kinds = {}
    for k in KINDS:
        rows = [(dict(zip(('met', 'unmet', 'unclear'), p)), g[1], ref) for (g, q, ref), p in zip(asked, probs) if g[0] == k]
        if not rows: continue
        kinds[k] = dict(questions=len(rows), unmet=sum(not t for _, t, _ in rows),
                        auc=ranking_auc([(yes_share(p), t) for p, t, _ in rows]),
                        auc_run_judge=ranking_auc([(yes_share(ref), t) for _, t, ref in rows]),
                        asked=[[round(yes_share(p), 4), t] for p, t, _ in rows])  # per question, in the sample's order: (yes share, truth)
        print(k, json.dumps(brief(kinds[k])), file=sys.stderr)
    pooled = [(yes_share(dict(zip(('met', 'unmet', 'unclear'), p))), g[1]) for (g, _, _), p in zip(asked, probs)]
    out = dict(run=a.run, model=a.model, device=a.device or 'default', run_judge=', '.join(sorted(run_judges)),
               per_truth=a.per_truth, seed=a.seed, kinds_asked=a.kinds or 'all', checks=not a.without_checks, questions=len(asked), available={f'{k}:{t}': len(v) for (k, t), v in groups.items()},
               auc=ranking_auc(pooled), kinds=kinds, ask_seconds=round(ask_s, 1), seconds=round(time.time() - t0, 1),
               machine=platform.machine(), processor=platform.processor() or None)
    print(json.dumps({k: v for k, v in out.items() if k != 'available'} | {'kinds': {k: brief(d) for k, d in kinds.items()}}, indent=1))
    if a.out: Path(a.out).write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
    main()
