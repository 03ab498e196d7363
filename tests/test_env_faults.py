"""`ShopEnv` in-process: refused actions change nothing, episodes always end, and pages never leak the task's private facts."""
from __future__ import annotations
import copy, json, re, time
from dataclasses import asdict
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck, assume

from shopping_grpo.episode import run_message_episode
from shopping_grpo.policies import ShopperPolicy
from shopping_grpo.env import InvalidAction, render_state, parse_action, query_terms, NAV
from shopping_grpo.shoppers import RandomShopper

TERMINATIONS = {'purchase', 'finish', 'repeat_loop', 'no_progress', 'max_steps'}


def snapshot(env) -> dict:
    "Everything observable about an episode (and the internals that decide what comes next)."
    return copy.deepcopy(dict(state=env.state, log=asdict(env.log), stack=env.stack, selected=env.selected, done=env.done,
                              no_progress=env.no_progress, last=env.last, reward=env.reward))


@pytest.fixture(scope='module')
def page_prefixes(shop, oracle_records):
    "name -> (task, actions) that lead to one kind of page."
    task = shop.tasks['eval'][0]
    acts = [s['action'] for s in oracle_records[task.task_id]['steps']]
    search = next(a for a in acts if a.startswith('search['))
    to_target = acts[:acts.index(f'click[{task.facts.target_asin}]') + 1]
    env = shop.env(); env.reset(task.instruction, task); r = env.step(search)
    out = dict(home=[], results=[search], detail=to_target, subpage=to_target + ['click[reviews]'], finished=acts)
    if NAV['next'] in r.state['clickables']: out['results_page_2'] = [search, 'click[next >]']
    return {k: (task, v) for k, v in out.items()}


def only_long_terms(action) -> bool:
    "A search whose words are all 40+ characters long and 2+ in number (once crashed tantivy's query parser)."
    try: verb, arg = parse_action(action)
    except InvalidAction: return False
    terms = re.findall(r'[A-Za-z0-9]+', arg)
    return verb == 'search' and len(terms) >= 2 and all(len(t) >= 40 for t in terms)


def fresh_env(shop, task, actions):
    env = shop.env(); env.reset(task.instruction, task)
    for a in actions: env.step(a)
    return env


TOKENS = ['[', ']', '[[', ']]', '(', ')', '{', '}', ' ', '\n', '\t', '\\', 'click', 'search', 'finish', 'Action:', 'Thought:',
          'click[', 'search[', 'finish', 'buy now', 'next >', '< prev', 'back to search', 'features', '\x00', '\u200b', '字', '🛒']
bracket_soup = st.lists(st.sampled_from(TOKENS), max_size=40).map(''.join)
huge = st.tuples(st.sampled_from(['search[', 'click[', 'finish[', '', 'Action: click[', 'Thought: x\nAction: search[']),
                 st.integers(4097 - 8, 300_000), st.sampled_from(['a', ' ', '[', ']', '字', '\x00', 'buy now'])
                 ).map(lambda t: t[0] + t[2]*(t[1]//len(t[2]) + 1) + ']')
verb_any = st.tuples(st.sampled_from(['click[', 'CLICK [', ' click[', 'search[', 'Action: click[', 'click[[']),
                     st.text(max_size=200)).map(lambda t: t[0] + t[1] + ']')
not_text = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=50), st.lists(st.text(max_size=5), max_size=3),
                     st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
actions = st.one_of(st.text(max_size=300), bracket_soup, huge, verb_any, not_text)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(page=st.sampled_from(['home', 'results', 'results_page_2', 'detail', 'subpage', 'finished']), action=actions)
def test_refused_actions_change_nothing(shop, page_prefixes, page, action):
    if page not in page_prefixes: page = 'results'
    env = fresh_env(shop, *page_prefixes[page])
    before = snapshot(env)
    try: r = env.step(action)
    except InvalidAction as e:  # the only exception an action may raise
        msg = str(e)
        assert msg and len(msg) <= 1000, msg[:200]
        assert snapshot(env) == before
    else:
        assert not before['done'] and isinstance(r.text, str) and r.state is env.state


@pytest.mark.parametrize('query', ['x'*40 + ' ' + 'y'*40, 'a'*41 + ' ' + 'b'*300 + ' ' + 'c'*50], ids=['two_40', 'three_long'])
def test_search_of_only_very_long_words_is_not_a_crash(shop, page_prefixes, query):
    assert only_long_terms(f'search[{query}]')
    env = fresh_env(shop, *page_prefixes['home']); before = snapshot(env)
    try: r = env.step(f'search[{query}]')
    except InvalidAction: assert snapshot(env) == before
    else: assert r.state['page_type'] == 'search_results'


def test_search_of_one_very_long_word_is_fine(shop, page_prefixes):
    "The same words one at a time, or next to a normal word, search fine (the bug needs every word to be long)."
    for q in ['x'*40, 'z'*4000, 'lamp ' + 'x'*40 + ' ' + 'y'*40, 'x'*39 + ' ' + 'y'*39]:
        r = fresh_env(shop, *page_prefixes['home']).step(f'search[{q}]')
        assert r.state['page_type'] == 'search_results' and not r.done


def test_refused_actions_then_the_episode_goes_on(shop, page_prefixes, oracle_records):
    "Refused actions sprinkled through an oracle episode change neither its pages nor its reward."
    task, _ = page_prefixes['home']; rec = oracle_records[task.task_id]
    acts = [s['action'] for s in rec['steps']]
    bad = ['click[nowhere]', 'search[]', 'search[   ]', 'buy', 'click[' + 'x'*5000 + ']', None, 'click[]', '[]', 'finish']
    clean, noisy = shop.env(), shop.env()
    clean.reset(task.instruction, task); noisy.reset(task.instruction, task)
    for k, a in enumerate(acts):
        b = bad[k % len(bad)]
        with pytest.raises(InvalidAction): noisy.step(b)
        r1, r2 = clean.step(a), noisy.step(a)
        assert r1.state == r2.state and r1.text == r2.text
    assert r1.detail == r2.detail == rec['reward_detail']
    with pytest.raises(InvalidAction, match='episode has ended'): noisy.step('search[anything]')


@pytest.mark.parametrize('max_steps', [35, 6])
def test_random_episodes_always_end(shop, max_steps):
    "RandomShopper on 40 tasks: every episode ends, within max_steps actions, with a known reason and reward."
    t0 = time.monotonic()
    for k, task in enumerate(shop.tasks['eval'][:40]):
        env, pol = shop.env(max_steps), RandomShopper(seed=k)
        state = env.reset(task.instruction, task); pol.reset(task)
        for n in range(max_steps):
            state = env.step(pol.act(state)).state  # RandomShopper only proposes what the page allows
            if env.done: break
        assert env.done, f'{task.task_id}: not done after {max_steps} steps'
        assert env.log.steps <= max_steps and env.log.termination_reason in TERMINATIONS
        assert state['page_type'] == 'terminal' and -0.85 <= env.reward.reward <= 1.0
        rec = run_message_episode(shop, task, ShopperPolicy(RandomShopper(seed=k)), max_turns=max_steps)
        assert rec['n_steps'] + rec['n_invalid'] <= max_steps and len(rec['steps']) <= max_steps
        assert rec['termination_reason'] in TERMINATIONS and -0.85 <= rec['reward'] <= 1.0
        assert rec['reward_detail'] == env.reward.as_dict()  # same seed, same episode
    assert time.monotonic() - t0 < 60


def test_observations_never_leak_private_facts(shop, oracle_records):
    "Over full oracle episodes (every task), no observation text/state shows the instruction, task id, 'target' or a budget field."
    n = 0
    for task_id, rec in oracle_records.items():
        task = shop.task(task_id); f = task.facts
        env = shop.env(); states = [env.reset(task.instruction, task)]
        for s in rec['steps']: states.append(env.step(s['action']).state)
        assert env.done
        for st_ in states:
            blob, text = json.dumps(st_, ensure_ascii=False), render_state(st_)
            for out in (blob, text):
                assert task.instruction not in out
                assert task_id not in out
                assert 'target' not in out.lower()
                assert 'budget' not in out.lower()
            assert '"budget"' not in blob and '"facts"' not in blob and '"reward' not in blob
            assert set(st_) <= {'page_type', 'search_available', 'clickables', 'version', 'step', 'max_steps', 'query', 'page',
                                'n_pages', 'total', 'results', 'asin', 'title', 'brand', 'category', 'price', 'rating',
                                'options', 'section', 'content', 'message'}, sorted(st_)
            n += 1
    assert n > len(oracle_records)
