"""Judgments per minute of the trajectory judge served by vLLM (the embedded SmolLM2 on CPU by default).

Plays the oracle and the heuristic shopper on `--tasks` evaluation tasks of a small shop, freezes the code rubrics,
serves the model with vLLM, then judges both models' trajectories with `--workers` concurrent requests, once per
concurrency level. Reports wall time, judgments per minute and the share of answers that passed validation.

    python benchmarks/bench_judge.py --tasks 16 --workers 4,16 --out benchmarks/results/judge_speed.json
"""
from __future__ import annotations
import argparse, json, os, platform, shutil, tempfile, time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='smollm2', help="'smollm2' (the embedded default) or a model path")
    ap.add_argument('--base-url', default=None, help='judge an already served endpoint instead of starting vLLM')
    ap.add_argument('--served-name', default='smollm2-judge'); ap.add_argument('--tasks', type=int, default=16)
    ap.add_argument('--workers', default='4,16'); ap.add_argument('--products', type=int, default=3000)
    ap.add_argument('--out', default='benchmarks/results/judge_speed.json')
    a = ap.parse_args()
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.shoppers import HeuristicShopper
    from shopping_grpo.evaluate import evaluate
    from shopping_grpo.policies import ExpertPolicy, ShopperPolicy
    from shopping_grpo.judge import Endpoint, freeze_rubrics, judge_model, judge_summary
    work = Path(tempfile.mkdtemp(prefix='bench-judge-'))
    shop = prepare_shop(work/'run', a.products, 0, 1, 'en', sizes=dict(sft=10, grpo_train=10, grpo_val=10, eval=a.tasks), progress=False)
    tasks = shop.tasks['eval'][:a.tasks]
    for pol in (ExpertPolicy(shop.catalog), ShopperPolicy(HeuristicShopper())): evaluate(shop, tasks, pol, work/'played'/pol.name, progress=False)
    rubrics = freeze_rubrics(tasks, work/'rubrics.jsonl', progress=False)

    def measure(ep) -> list[dict]:
        rows = []
        for w in map(int, a.workers.split(',')):
            d = work/f'w{w}'; t0 = time.time(); n = valid = 0
            for m in ('oracle', 'heuristic'):
                (d/m).mkdir(parents=True); shutil.copy(work/'played'/m/'trajectories.jsonl', d/m/'trajectories.jsonl')
                judge_model(d/m, tasks, rubrics, ep, workers=w, progress=False)
                s = judge_summary(d/m, tasks, rubrics, ep); n += s['n_tasks']; valid += s['valid_judgments']
            sec = time.time() - t0
            rows.append(dict(workers=w, judgments=n, seconds=round(sec, 1), judgments_per_min=round(60*n/sec, 2), valid_share=round(valid/n, 4)))
            print(rows[-1], flush=True)
        return rows

    t0 = time.time()
    if a.base_url: rows, start = measure(Endpoint(a.served_name, a.base_url)), None
    else:
        from shopping_grpo.model import VLLMServer
        with VLLMServer(a.model, name=a.served_name, progress=False) as llm: start = round(time.time() - t0, 1); rows = measure(Endpoint(llm.name, llm.base_url))
    res = dict(model=a.model, tasks_per_model=a.tasks, models=['oracle', 'heuristic'], server_start_s=start, runs=rows,
               machine=dict(cpus=os.cpu_count(), platform=platform.platform(), load_avg_1m_at_end=round(os.getloadavg()[0], 2)))
    from shopping_grpo.records import write_atomic
    write_atomic(a.out, json.dumps(res, indent=1) + '\n')
    print(json.dumps(res, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__': main()
