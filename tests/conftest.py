"""Shared fixtures: one small shop (3000 products, seed 0, task seed 1) built once per test session in a temp dir."""
from __future__ import annotations
import pytest
from hypothesis import settings

from shopping_grpo.episode import run_message_episode
from shopping_grpo.policies import ShopperPolicy
from shopping_grpo.shop import prepare_shop
from shopping_grpo.shoppers import OracleShopper
from _helpers import N_PRODUCTS, SEED, TASK_SEED, LANG, SIZES

# Hypothesis: no per-example deadline (CI machines are slow and noisy); example counts are set per test.
settings.register_profile('shopping_grpo', deadline=None, print_blob=True)
settings.load_profile('shopping_grpo')


@pytest.fixture(scope='session')
def tiny(tmp_path_factory) -> str:
    "A randomly initialised 2-layer model of SmolLM2's architecture with its tokenizer and chat template (read only)."
    from shopping_grpo.sft import tiny_model
    return str(tiny_model(tmp_path_factory.mktemp('tiny')))


@pytest.fixture(scope='session')
def shop_dir(tmp_path_factory):
    "Run folder holding the session's small shop (catalog/, its index and tasks/)."
    d = tmp_path_factory.mktemp('shop') / 'run'
    prepare_shop(d, N_PRODUCTS, SEED, TASK_SEED, LANG, sizes=dict(SIZES), progress=False)
    return d


@pytest.fixture(scope='session')
def shop(shop_dir):
    "The session's `Shop` (reloaded from `shop_dir`: nothing is rebuilt)."
    return prepare_shop(shop_dir, N_PRODUCTS, SEED, TASK_SEED, LANG, sizes=dict(SIZES), progress=False)


@pytest.fixture(scope='session')
def all_tasks(shop):
    "Every task of every split, in split order."
    return [t for s in SIZES for t in shop.tasks[s]]


@pytest.fixture(scope='session')
def oracle_records(shop, all_tasks):
    "task_id -> the oracle's in-process trajectory record."
    return {t.task_id: run_message_episode(shop, t, ShopperPolicy(OracleShopper(shop.catalog))) for t in all_tasks}
