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
    ap.add_argument('--n-tasks', type=int, default=200, help='the expert plays the first N benchmark tasks; the model replays them'); ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    a = ap.parse_args()
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.sft import expert_agreement
    shop = prepare_shop(a.run, 20_000, 0, 1, 'en', progress=False)
    res = expert_agreement(shop, a.model, a.run, a.n_tasks, a.device, a.workers, progress=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    log(f"{res['turns']} turns, {res['agree']} agree; {a.out}")


if __name__ == '__main__': main()
