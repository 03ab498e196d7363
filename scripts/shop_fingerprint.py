"""The shop's fingerprint: catalog, task and benchmark hashes, and the reference shoppers' summaries and records on the
frozen benchmark, without what varies from run to run (seconds, package versions, code hashes).

A change that should not touch the shop or its scoring (a redesign, a speed-up) leaves it byte-identical:

    .venv/bin/python scripts/shop_fingerprint.py outputs/fingerprint outputs/fingerprint/fingerprint_en.json
    diff outputs/history/shoppers/fingerprint_en.json outputs/fingerprint/fingerprint_en.json

`tests/test_shop_fingerprint.py` runs this comparison.

The records hash covers every field of a record as Reward v3 wrote it before its detail named the requirements met
(`REQUIREMENT_FIELDS`: which features and options the product bought has and lacks, brand and model); those fields
have a hash of their own, `requirements_sha256`, so adding them left `records_sha256`, and with it every reward,
outcome and soft-match component of the reference shoppers, unchanged.
"""
from __future__ import annotations
import hashlib, json, sys
from pathlib import Path
from shopping_grpo.shop import prepare_shop
from shopping_grpo.evaluate import evaluate_model
from shopping_grpo.records import data_dir, sha256_file
from shopping_grpo.reward import REQUIREMENT_FIELDS

SHOPPERS = ('oracle', 'expert', 'heuristic', 'random')
VOLATILE = {'seconds', 'wall_seconds', 'versions', 'code_sha256', 'trajectories_sha256', 'checks_sha256', 'finished_at'}

def stable(x):
    "`x` without the keys that vary from run to run."
    if isinstance(x, dict): return {k: stable(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list): return [stable(v) for v in x]
    return x

def scored(rec:dict) -> dict:
    "`rec` with its reward detail as it was before the detail named the requirements met."
    d = {k: v for k, v in rec['reward_detail'].items() if k not in REQUIREMENT_FIELDS}
    return {**rec, 'reward_detail': d}

def requirements(rec:dict) -> list:
    "A record's task id and the requirement fields of its reward detail."
    return [rec['task_id'], {k: rec['reward_detail'].get(k) for k in REQUIREMENT_FIELDS}]

def sha256_json(x) -> str: return hashlib.sha256(json.dumps(x, sort_keys=True).encode()).hexdigest()

def fingerprint(run_dir, lang:str='en') -> dict:
    "Hashes of the shop's files and the reference shoppers' stable summaries and records, built in `run_dir`."
    run_dir = Path(run_dir); shop = prepare_shop(run_dir, lang=lang, progress=False)
    out = dict(catalog_sha256=shop.catalog.sha256,
               tasks={p.name: sha256_file(p) for p in sorted((run_dir/'tasks').glob(f'*_{lang}.jsonl'))},
               benchmark={p.name: sha256_file(p) for p in sorted(data_dir().glob('benchmark_*.jsonl'))}, shoppers={})
    for kind in SHOPPERS:
        summary = evaluate_model(shop, kind, run_dir, progress=False, workers=1)
        lines = (run_dir/'eval'/kind/'trajectories.jsonl').read_text(encoding='utf-8').splitlines()
        recs = sorted((stable(json.loads(l)) for l in lines), key=lambda r: r['task_id'])
        out['shoppers'][kind] = dict(summary=stable(summary), checks_sha256=sha256_file(run_dir/'eval'/kind/'checks.jsonl'),
                                     records_sha256=sha256_json([scored(r) for r in recs]),
                                     requirements_sha256=sha256_json([requirements(r) for r in recs]))
    return out

if __name__ == '__main__':
    if len(sys.argv) < 3: sys.exit('usage: shop_fingerprint.py RUN_DIR OUT_JSON [LANG]')
    fp = fingerprint(sys.argv[1], *sys.argv[3:])
    Path(sys.argv[2]).parent.mkdir(parents=True, exist_ok=True)
    Path(sys.argv[2]).write_text(json.dumps(fp, indent=1, sort_keys=True, ensure_ascii=False) + '\n')
