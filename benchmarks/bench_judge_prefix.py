"""What sharing the start of a prompt saves the evidence judge: the same evidence questions of a published judge run
(the purchases of its models, asked as the judge asks them, with that run's worked examples), asked through one
`LocalEndpoint` with `share_prefix` off and then on, in the same process: ids computed, ids taken from a row's cache,
seconds, and the largest difference between the two runs' answer probabilities. Trajectories are asked many at a time
and each one's questions in turn, as `08_judge` asks them.

    python benchmarks/bench_judge_prefix.py --model qwen2.5-0.5b --device cpu --trajectories 16 --rows 8 \
        --out benchmarks/results/judge_prefix_qwen2.5-0.5b_cpu.json
"""
from __future__ import annotations
import argparse, json, platform, random, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/reference/h200-judge-1.5b', help='a published judge run (rubrics, calibration, trajectories)')
    ap.add_argument('--model', default='qwen2.5-0.5b'); ap.add_argument('--device', default=None)
    ap.add_argument('--trajectories', type=int, default=16, help='purchases asked about, drawn from every model of the run')
    ap.add_argument('--rows', type=int, default=8, help="the endpoint's rows, and trajectories asked at once")
    ap.add_argument('--seed', type=int, default=0); ap.add_argument('--out', default=None)
    a = ap.parse_args()
    from shopping_grpo.judge import (ANSWERS, evidence_questions, model_dirs, purchased_asin, question_messages,
                                     read_calibration, read_rubrics, trajectories)
    from shopping_grpo.local_endpoint import LocalEndpoint
    eval_dir = Path(a.run)/'eval'
    rubrics, cal = read_rubrics(eval_dir/'rubrics.jsonl.gz'), read_calibration(eval_dir/'judge_calibration.json')
    pool = [(d.name, k, r) for d in model_dirs(eval_dir) for k, r in sorted(trajectories(d).items()) if purchased_asin(r)]
    picked = random.Random(a.seed).sample(pool, min(a.trajectories, len(pool)))
    asked = [[question_messages(q, cal.examples) for q in evidence_questions(r, rubrics[k]) or []] for _, k, r in picked]
    words = [ANSWERS[v] for v in ('met', 'unmet', 'unclear')]
    runs = {}
    for share in (False, True):
        ep = LocalEndpoint(a.model, rows=a.rows, device=a.device, share_prefix=share).start()
        t0 = time.time()
        with ThreadPoolExecutor(a.rows) as ex:
            probs = list(ex.map(lambda qs: [ep.answer_probs(m, words) for m in qs], asked))
        seconds = time.time() - t0
        e = ep.engine
        runs['shared' if share else 'whole'] = dict(seconds=round(seconds, 1), prompt_tokens=e.prompt_tokens, prefilled_tokens=e.prefilled_tokens,
                                                    shared_tokens=e.shared_tokens, copied_tokens=e.copied_tokens, passes=e.calls, probs=probs)
        ep.close()
        print('shared' if share else 'whole', {k: v for k, v in runs['shared' if share else 'whole'].items() if k != 'probs'}, file=sys.stderr)
    w, s = runs['whole'], runs['shared']
    diff = max((abs(x - y) for pw, ps in zip(w['probs'], s['probs']) for qw, qs in zip(pw, ps) for x, y in zip(qw, qs)), default=0.0)
    out = dict(run=a.run, model=a.model, device=a.device or 'default', rows=a.rows, trajectories=len(picked),
               questions=sum(map(len, asked)), **{k: {x: v for x, v in r.items() if x != 'probs'} for k, r in runs.items()},
               computed_ratio=round(s['prefilled_tokens'] / w['prefilled_tokens'], 3), speedup=round(w['seconds'] / s['seconds'], 2),
               max_prob_difference=round(diff, 6), machine=platform.machine(), processor=platform.processor() or None)
    print(json.dumps(out, indent=1))
    if a.out: Path(a.out).write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
    main()
