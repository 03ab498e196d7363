"benchmarks/bench_engine_schedule.py's plan counts what the lockstep runner does over recorded episode shapes, by hand here."
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent/'benchmarks'))

SHAPES = [[3, [[5, 2], [3, 0]]],            # prompt of 3 ids; replies of 5 and 3 ids, the first answered by 2
          [4, [[2, 1], [4, 1], [1, 0]]]]    # three replies


def test_plan_counts_each_call_to_its_longest_reply():
    from bench_engine_schedule import lockstep_plan
    both = lockstep_plan(SHAPES, rows=2, max_context=100, max_new_tokens=128)
    # calls of 5, then max(3, 4), then 1 steps; the widest contexts 4, 3+5+2 and 4+2+1+4+1 ids, each plus its steps
    assert both == dict(episodes=2, reply_ids=15, calls=3, decode_steps=10, column_steps=5 * 9 + 4 * 14 + 1 * 13, ended_early=0)
    one = lockstep_plan(SHAPES, rows=1, max_context=100, max_new_tokens=128)
    assert (one['calls'], one['decode_steps']) == (5, 15)  # one episode at a time: every reply its own call


def test_plan_cuts_replies_and_ends_overflowing_episodes():
    from bench_engine_schedule import lockstep_plan
    assert lockstep_plan(SHAPES, rows=2, max_context=100, max_new_tokens=3)['decode_steps'] == 3 + 3 + 1
    short = lockstep_plan(SHAPES, rows=2, max_context=12, max_new_tokens=128)
    # before the second call the first episode would reach 10 + 3 ids, before the third the second 12 + 1: both end there
    assert (short['ended_early'], short['calls'], short['decode_steps']) == (2, 2, 5 + 4)
