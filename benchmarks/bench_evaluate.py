"""Evaluation speed: benchmark tasks per minute through `evaluate_model` (07_evaluate), for the embedded SmolLM2 served by
vLLM (the CPU build on CPU machines) at 16 concurrent episodes, and for the scripted oracle in-process.

    python benchmarks/bench_evaluate.py --tasks 16 --concurrency 16 --max-new-tokens 128 --out benchmarks/results/evaluate_speed.json

The served model plays the frozen benchmark's first `--tasks` tasks with the full protocol (temperature 0, 35 turns);
the untrained model rarely calls a tool, so most turns run to the token limit: the figure is close to the worst case
per task. Results (with machine load, vLLM start time, generated tokens) go to `--out`.
"""
from __future__ import annotations
import argparse, json, os, platform, tempfile, time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/bench', help='run folder holding (or receiving) the 20,000-product shop')
    ap.add_argument('--tasks', type=int, default=16); ap.add_argument('--concurrency', type=int, default=16)
    ap.add_argument('--max-new-tokens', type=int, default=128); ap.add_argument('--max-turns', type=int, default=35)
    ap.add_argument('--model', default='smollm2', help="served checkpoint: 'smollm2' (the embedded default) or a path")
    ap.add_argument('--no-vllm', action='store_true', help='only the in-process figure')
    ap.add_argument('--out', default='benchmarks/results/evaluate_speed.json')
    a = ap.parse_args()
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.records import package_versions
    from shopping_grpo.policies import OpenAIChatPolicy
    from shopping_grpo.evaluate import evaluate_model, benchmark_tasks, task_strata
    shop = prepare_shop(a.run, 20_000, 0, 1, 'en', progress=False); work = Path(tempfile.mkdtemp(prefix='bench-evaluate-'))
    tasks, ident = benchmark_tasks(shop); strata = task_strata(shop, tasks)
    res = dict(machine=dict(cpus=os.cpu_count(), python=platform.python_version(), load_before=os.getloadavg()), benchmark=ident,
               versions=package_versions(('shopping_grpo', 'polars', 'openai', 'scipy', 'statsmodels')))
    t0 = time.perf_counter(); s = evaluate_model(shop, 'oracle', work, workers=4, strata=strata, progress=False); dt = time.perf_counter() - t0
    res['oracle_in_process'] = dict(tasks=len(tasks), workers=4, seconds=round(dt, 2), tasks_per_minute=round(len(tasks) / dt * 60, 1),
                                    strict_success=s['figures']['strict_success'])
    print(json.dumps(res, indent=1), flush=True)
    if not a.no_vllm:
        from shopping_grpo.model import VLLMServer
        with VLLMServer(a.model, name='base') as srv:
            pol = OpenAIChatPolicy('base', srv.base_url, max_tokens=a.max_new_tokens, timeout=1800, name='base')
            t0 = time.perf_counter()
            s = evaluate_model(shop, pol, work, a.tasks, max_turns=a.max_turns, workers=a.concurrency, strata=strata.head(a.tasks), progress=True)
            dt = time.perf_counter() - t0
        f = s['figures']
        res['vllm'] = dict(model=a.model, tasks=a.tasks, concurrency=a.concurrency, max_new_tokens=a.max_new_tokens, max_turns=a.max_turns,
                           start_s=srv.start_s, seconds=round(dt, 1), tasks_per_minute=round(a.tasks / dt * 60, 3),
                           generated_tokens=pol.completion_tokens, tokens_per_s=round(pol.completion_tokens / dt, 1),
                           calls_per_episode=f['calls_per_episode'], malformed_per_episode=f['malformed_per_episode'], strict_success=f['strict_success'],
                           not_judged=f['not_judged'], load_after=os.getloadavg())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(res, indent=1) + '\n'); print(json.dumps(res, indent=1))


if __name__ == '__main__': main()
