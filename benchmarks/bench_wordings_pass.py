"""Evaluation of one model on the benchmark's three wordings (template, free-form, written by hand): one pass of the
model per wording, as 07_evaluate played them until now, against one pass over all three (`evaluate_benchmarks`: the
model loads once and the engine's rows take episodes of every wording, so one wording's slowest episodes overlap the
others'). Both in the same run, into fresh folders; reports wall seconds, the ratio, and each folder's strict success
(the episodes are the same up to the order of sums in batched decoding).

    python benchmarks/bench_wordings_pass.py --model tiny --tasks 6 --out /tmp/wordings_tiny.json            # CPU check
    python benchmarks/bench_wordings_pass.py --model RUN/sft/merged --tasks 200 --rows 100 --max-context 16384 \\
        --max-new-tokens 256 --out benchmarks/results/wordings_pass_h100.json                                 # on a GPU
"""
from __future__ import annotations
import argparse, json, tempfile, time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/bench', help='run folder holding (or receiving) the 20,000-product shop')
    ap.add_argument('--model', default='tiny', help="a merged checkpoint folder, or 'tiny' (05_sft's tiny_model, on the CPU)")
    ap.add_argument('--tasks', type=int, default=200); ap.add_argument('--rows', type=int, default=100)
    ap.add_argument('--max-context', type=int, default=8192); ap.add_argument('--max-new-tokens', type=int, default=256)
    ap.add_argument('--max-turns', type=int, default=35)
    ap.add_argument('--order', default='apart,together', help='which pass runs first (a warm disk cache favours the second)')
    ap.add_argument('--out', default='benchmarks/results/wordings_pass.json')
    a = ap.parse_args()
    import torch
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.sft import tiny_model
    from shopping_grpo.records import package_versions, read_records
    from shopping_grpo.evaluate import evaluate_benchmarks, benchmark_tasks, task_strata, eval_folder, BENCHMARKS
    shop, work = prepare_shop(a.run, 20_000, 0, 1, 'en', progress=False), Path(tempfile.mkdtemp(prefix='bench-wordings-'))
    model = tiny_model(work/'tiny') if a.model == 'tiny' else Path(a.model)
    tasks, ident = benchmark_tasks(shop, a.tasks); strata = task_strata(shop, tasks)
    cuda = torch.cuda.is_available()
    kw = dict(n_eval=a.tasks, max_turns=a.max_turns, batch_size=a.rows, strata=strata, progress=True, max_context=a.max_context,
              max_new_tokens=a.max_new_tokens, decoder='continuous', device='cuda' if cuda else 'cpu')
    spec = f'model=transformers:{model}'
    res = dict(model=str(a.model), device=torch.cuda.get_device_name() if cuda else 'cpu', tasks=a.tasks, rows=a.rows,
               max_context=a.max_context, max_new_tokens=a.max_new_tokens, benchmarks=list(BENCHMARKS), benchmark=ident,
               versions=package_versions(('shopping_grpo', 'torch', 'transformers')))
    recs = {}
    for how in a.order.split(','):
        t0 = time.perf_counter()
        if how == 'apart': s = {b: evaluate_benchmarks(shop, spec, work/how, (b,), **kw)[b] for b in BENCHMARKS}
        else: s = evaluate_benchmarks(shop, spec, work/how, BENCHMARKS, **kw)
        recs[how] = {b: read_records(work/how/'eval'/eval_folder('model', b)/'trajectories.jsonl') for b in BENCHMARKS}
        res[how] = dict(seconds=round(time.perf_counter() - t0, 1), strict={b: v['figures']['strict_success'] for b, v in s.items()},
                        generated_tokens={b: sum(r['n_generated'] for r in rs.values()) for b, rs in recs[how].items()})
        print(how, json.dumps(res[how]), flush=True)
    res['speedup'] = round(res['apart']['seconds'] / res['together']['seconds'], 3)
    res['same_episodes'] = {b: sum(r['response_ids'] == recs['together'][b][k]['response_ids'] for k, r in recs['apart'][b].items())
                            for b in BENCHMARKS}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(res, indent=1) + '\n')
    print(json.dumps({k: res[k] for k in ('device', 'apart', 'together', 'speedup', 'same_episodes')}, indent=1))


if __name__ == '__main__': main()
