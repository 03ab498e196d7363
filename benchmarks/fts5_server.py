#!/usr/bin/env python
"""The HTTP benchmark's baseline server: `shopping-grpo serve-env`, with the shop's search backed by SQLite FTS5.

Same options as `serve-env` (those the benchmark uses); it loads the shop exactly as `shopping_grpo.server.serve`
does, swaps `shop.index` for `FTS5Index` (built next to the catalog if missing), and serves
`make_app(ShopService(shop))` under uvicorn.

    .venv/bin/python benchmarks/fts5_server.py --run outputs/bench/shop-20000 --port 5701
"""
import argparse, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # fts5_index
import uvicorn
from shopping_grpo.shop import prepare_shop
from shopping_grpo.server import ShopService, make_app
from fts5_index import FTS5Index, build_fts5, fts5_path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--host', default='127.0.0.1'); ap.add_argument('--port', type=int, default=5701)
    ap.add_argument('--run', default='outputs/bench/shop-20000'); ap.add_argument('--n-products', type=int, default=20_000)
    ap.add_argument('--seed', type=int, default=0); ap.add_argument('--max-slots', type=int, default=256)
    ap.add_argument('--lease-ttl', type=float, default=900.0)
    a = ap.parse_args()
    shop = prepare_shop(a.run, a.n_products, a.seed, lang='en', progress=False)     # as `serve` does (task_seed 1, default sizes)
    shop.index = FTS5Index(build_fts5(shop.catalog, fts5_path(Path(a.run)/'catalog', shop.catalog.sha256)))
    print(f'serving {a.run} (FTS5 search) on http://{a.host}:{a.port}/api/shop_agent', file=sys.stderr, flush=True)
    uvicorn.run(make_app(ShopService(shop, a.max_slots, a.lease_ttl)), host=a.host, port=a.port, log_level='warning')


if __name__ == '__main__':
    main()
