"""Model passes of the schema decoder (08a_local_endpoint's `SchemaDecoder`) over a judge run's recorded answers: a
pass for every token of a choice (`force_choices=False`, the path before) against a pass only where the choice's
remaining options still differ (`force_choices=True`). Every judged trajectory of `<run>/eval/<model>/judgments.jsonl.gz`
is replayed through `walk` with the judge model's tokenizer: code's text costs no pass; a choice costs a pass per
token of the option chosen, or per token at which the options it could still be differ; a free string a pass per
token and one to close it. No model runs, so the counts are exact for the recorded answers and the tokenizer; the
passes of a batch of rows are what a judging run waits on, one decoder step each. The same answers without their
requirements' verdicts are replayed through the schema of the scores-only call (`judgment_schema(..., verdicts=False)`),
which is all the whole-trajectory call asks for when the evidence judge gives the verdicts: its passes, had the judge
written the same scores, category and summary.

    python benchmarks/bench_schema_passes.py --run outputs/reference/h200 --out benchmarks/results/schema_passes_h200.json
"""
from __future__ import annotations
import argparse, gzip, json, sys, time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace


def choice_passes(options:list[list[int]], chosen:int) -> tuple[int, int]:
    "Passes to write option `chosen` of `options` (token ids): one a token, and one a token where the options still differ."
    path, every, forced_path = options[chosen], len(options[chosen]), 0
    live = list(options)
    for d, t in enumerate(path):
        if len({o[d] for o in live if len(o) > d}) > 1: forced_path += 1
        live = [o for o in live if len(o) > d and o[d] == t]
    return every, forced_path


def replay(text:str, schema:dict, ids) -> Counter:
    "Passes of the answer `text` to `schema`, by path and by the answer's top-level key."
    from shopping_grpo.local_endpoint import walk
    g, pos, send, out, part = walk(schema), 0, None, Counter(), 'structure'
    while True:
        try: step = g.send(send)
        except StopIteration: break
        send = None
        if step[0] == 'text':
            if not text.startswith(step[1], pos): raise ValueError(f"the answer departs from the schema at {pos}: {text[pos:pos + 40]!r}")
            pos += len(step[1])
            if step[1].endswith('": ') and text[:pos].count('{') - text[:pos].count('}') == 1:  # a top-level key
                part = step[1].strip(', ').split('"')[1]
        elif step[0] == 'choose':
            hits = [k for k, o in enumerate(step[1]) if text.startswith(o, pos)]
            if len(hits) != 1: raise ValueError(f"no single option of {step[1][:4]}... at {pos}: {text[pos:pos + 40]!r}")
            every, forced = choice_passes([ids(o) for o in step[1]], hits[0])
            out[f'{part}:every'] += every
            out[f'{part}:forced'] += forced
            pos += len(step[1][hits[0]])
            send = hits[0]
        elif step[0] == 'free':
            end = text.index('"', pos)
            n = len(ids(text[pos:end])) + 1  # its tokens, then the one that closes it
            out[f'{part}:every'] += n
            out[f'{part}:forced'] += n
            send, pos = text[pos:end], end
        else: raise ValueError(f"a judgment has no {step[0]} step")
    if pos != len(text): raise ValueError(f"the answer goes on past the schema: {text[pos:pos + 40]!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/reference/h200', help='a run folder (or its published copy) with eval/<model>/judgments.jsonl.gz')
    ap.add_argument('--tokenizer', default=None, help="the judge model's tokenizer (default: the judge the records name)")
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    from functools import lru_cache
    from shopping_grpo.judge import judgment_schema
    from shopping_grpo.model import load_tokenizer
    eval_dir, t0 = Path(a.run)/'eval', time.time()
    opener = lambda p: gzip.open(p, 'rt') if p.suffix == '.gz' else open(p)
    models, judge = {}, None
    for jf in sorted(eval_dir.glob('*/judgments.jsonl*')):
        trajs = {r['task_id']: [e['id'] for e in r['events']]
                 for r in map(json.loads, opener(next(jf.parent.glob('trajectories.jsonl*'))))}
        judged = [r for r in map(json.loads, opener(jf)) if r.get('status') == 'judged']
        models[jf.parent.name] = (judged, trajs)
        judge = judge or next((r['judge']['model'] for r in judged), None)
    tok = load_tokenizer(a.tokenizer or judge)
    ids = lru_cache(None)(lambda s: tuple(tok.encode(s, add_special_tokens=False)))
    per, total, scores_total = {}, Counter(), Counter()
    passes = lambda c, how: sum(v for k, v in c.items() if k.endswith(f':{how}'))  # 'every' or 'forced', over every part
    for name, (judged, trajs) in models.items():
        c, s, n = Counter(), Counter(), 0
        for r in judged:
            j = r['judgment']
            rubric = SimpleNamespace(requirements=[SimpleNamespace(id=k) for k in j['requirements']])
            c += replay(json.dumps(j, ensure_ascii=False), judgment_schema(rubric, trajs[r['task_id']]), ids)
            scores_only = {k: v for k, v in j.items() if k != 'requirements'}
            s += replay(json.dumps(scores_only, ensure_ascii=False), judgment_schema(rubric, trajs[r['task_id']], verdicts=False), ids)
            n += 1
        every, forced = passes(c, 'every'), passes(c, 'forced')
        per[name] = dict(answers=n, passes_every_token=every, passes_forced=forced, ratio=round(every / max(forced, 1), 3),
                         passes_scores_only=passes(s, 'forced'))
        total += c
        scores_total += s
        print(name, json.dumps(per[name]), file=sys.stderr)
    parts = sorted({k.split(':')[0] for k in total})
    every, forced, so = passes(total, 'every'), passes(total, 'forced'), passes(scores_total, 'forced')
    out = dict(run=a.run, judge=judge, tokenizer=a.tokenizer or judge, answers=sum(m['answers'] for m in per.values()),
               passes_every_token=every, passes_forced=forced, ratio=round(every / max(forced, 1), 3),
               by_part={p: dict(every_token=total[f'{p}:every'], forced=total[f'{p}:forced']) for p in parts},
               scores_only=dict(passes_forced=so,
                                ratio_to_forced=round(forced / max(so, 1), 3), ratio_to_every_token=round(every / max(so, 1), 3)),
               models=per, seconds=round(time.time() - t0, 1))
    print(json.dumps({k: v for k, v in out.items() if k != 'models'}, indent=1))
    if a.out: Path(a.out).write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
    main()
