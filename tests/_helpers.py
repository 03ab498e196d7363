"""Helpers shared by the test modules (plain functions, imported as `_helpers`)."""
from __future__ import annotations
import copy, json

N_PRODUCTS, SEED, TASK_SEED, LANG = 3000, 0, 1, 'en'   # the session shop (see conftest.py)
SIZES = dict(sft=60, grpo_train=40, grpo_val=20, eval=40)


def replay(shop, task, actions):
    "Observation states (reset state first) and the final step result of `actions` played in-process."
    env = shop.env(); states = [copy.deepcopy(env.reset(task.instruction, task))]; r = None
    for a in actions:
        r = env.step(a); states.append(copy.deepcopy(r.state))
    return states, r, env


def as_json(x):
    "`x` as it comes back from a JSON round trip."
    return json.loads(json.dumps(x))
