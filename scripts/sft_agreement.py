"""How a trained model departs from the teacher, turn by turn, on the frozen benchmark (05_sft's `turn_agreement`):
the expert plays the benchmark tasks, the model replays its accepted episodes under teacher forcing, and the
agreement by decision goes to one JSON file.

    python scripts/sft_agreement.py outputs/reference-run/sft/merged --run outputs/agreement --out outputs/reference/sft/agreement.json
"""
from __future__ import annotations
import argparse, json, time
from pathlib import Path


def log(msg): print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('model', help='checkpoint path (a merged SFT model) or smollm2')
    ap.add_argument('--run', default='outputs/agreement', help='folder for the shop and the expert episodes')
    ap.add_argument('--out', default='outputs/agreement/agreement.json')
    ap.add_argument('--n-tasks', type=int, default=200, help='replay the expert episodes of the first N benchmark tasks (all 200 are played)'); ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.policies import ExpertPolicy
    from shopping_grpo.collect import collect, load_trajectories
    from shopping_grpo.model import materialize_model
    from shopping_grpo.sft import turn_agreement, agreement_table
    run, t0 = Path(a.run), time.time()
    shop = prepare_shop(run, 20_000, 0, 1, 'en', progress=False); tasks = shop.tasks['eval']
    collect(shop, tasks, ExpertPolicy(shop.catalog), run/'collect', workers=a.workers, progress=False)
    recs = load_trajectories(run/'collect'/'accepted.jsonl'); log(f'{len(recs)} expert episodes accepted of {len(tasks)} tasks')
    first = {t.task_id for t in tasks[:a.n_tasks]}; recs = [r for r in recs if r['task_id'] in first]
    path = str(materialize_model(a.model)); tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(a.device)
    rows = turn_agreement(model, tok, recs, progress=True); table = agreement_table(rows)
    res = dict(model=a.model, tasks=a.n_tasks, episodes=len(recs), turns=len(rows), agree=round(sum(r['departure'] == 'same' for r in rows) / max(1, len(rows)), 3),
               minutes=round((time.time() - t0) / 60, 2), table=table.to_dicts())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(res, indent=1))
    log(f"{res['turns']} turns, {res['agree']} agree; {a.out}")
    print(table)


if __name__ == '__main__': main()
