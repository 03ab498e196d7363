"""Observation v2 on the wire: the same scripted episodes in-process, over our HTTP service and against a v2 fixture
server written from the schema's facts (`fixture_v2_server.py`) score the same; broken pages end as infrastructure.
"""
from __future__ import annotations
import pytest
from fastapi.testclient import TestClient

from shopping_grpo.env import ShopFault
from shopping_grpo.episode import run_message_episode
from shopping_grpo.policies import ShopperPolicy, ExpertPolicy
from shopping_grpo.server import (ShopService, ShopClient, ShopError, ShopProtocolError, RemoteShopEnv, make_app,
                                  from_v2, OBSERVATION_V2, HIDDEN_FIELDS)
from shopping_grpo.shoppers import HeuristicShopper, RandomShopper
from fixture_v2_server import FixtureServer, make_fixture_app

N_TASKS = 12
V2_FIELDS = {  # what v2 requires on each page type (selected_price: our shop always resolves a variant)
    'search_home': set(),
    'search_results': {'query', 'normalized_query', 'page', 'total_pages', 'total_results', 'rank_start', 'rank_end',
                       'products'},
    'product_detail': {'product', 'selected_options', 'available_options', 'selected_price'},
    'information_subpage': {'product', 'selected_options', 'available_options', 'selected_price', 'subpage', 'content'},
    'terminal': set()}
COMMON = {'observation_version', 'page_type', 'search_available', 'actions'}
RIDERS = {'step', 'max_steps', 'rating', 'message'}  # ours, under names v2 does not use
POLICIES = {'expert': lambda shop, k: ExpertPolicy(shop.catalog),
            'heuristic': lambda shop, k: ShopperPolicy(HeuristicShopper()),
            'random': lambda shop, k: ShopperPolicy(RandomShopper(seed=k))}
INFRA = ('env_error',)  # a shop that breaks the protocol is the shop's failure, recorded as such


def remote(app):
    "A `make_env` for the runner: `RemoteShopEnv` through `ShopClient` over `app`, and the client's TestClient."
    http = TestClient(app)
    return (lambda max_turns: RemoteShopEnv(ShopClient(client=http), max_turns)), http


@pytest.fixture(scope='module')
def ours(shop):
    make_env, http = remote(make_app(ShopService(shop)))
    return make_env, http


@pytest.fixture(scope='module')
def played(shop, ours):
    "(policy, task index) -> {way: trajectory record} for the three ways of playing."
    fixture = FixtureServer(shop)
    ways = dict(in_process=None, our_server=ours[0], fixture_server=remote(make_fixture_app(fixture))[0])
    out = {}
    for name, make in POLICIES.items():
        for k, task in enumerate(shop.tasks['eval'][:N_TASKS]):
            out[name, k] = {w: run_message_episode(shop, task, make(shop, k), make_env=env) for w, env in ways.items()}
    assert fixture.leases == {}, 'every finished episode gave its lease back'
    return out


OUTCOME = ('reward', 'reward_detail', 'termination_reason', 'infrastructure_invalid', 'steps', 'n_steps', 'n_turns')


def test_scripted_episodes_score_the_same_three_ways(played):
    assert len(played) == len(POLICIES)*N_TASKS
    for key, recs in played.items():
        base = recs['in_process']
        assert not base['infrastructure_invalid'] and base['reward_detail']['reward_valid'], key
        for way in ('our_server', 'fixture_server'):
            assert {f: recs[way][f] for f in OUTCOME} == {f: base[f] for f in OUTCOME}, (key, way)
    ends = {recs['in_process']['termination_reason'] for recs in played.values()}
    assert 'purchase' in ends and len(ends) >= 2, ends  # the episodes reach more than one kind of end


def test_observation_text_is_the_same_in_process_and_over_our_server(played):
    for key, recs in played.items():
        assert recs['our_server']['messages'] == recs['in_process']['messages'], key


def test_fixture_pages_read_alike_but_not_byte_for_byte(played):
    "Another v2 server's pages differ only where it sends less or writes v2 differently (README: Serving the shop)."
    recs = played['expert', 0]
    ours, theirs = recs['in_process']['messages'], recs['fixture_server']['messages']
    assert [m['role'] for m in ours] == [m['role'] for m in theirs] and ours != theirs
    for a, b in zip(ours, theirs):
        if a['role'] != 'tool':
            assert a == b  # the request, the home page and every call: the same
            continue
        a, b = a['content'].splitlines(), b['content'].splitlines()
        if a[0].startswith('[search_results]'):  # every column of a results row but the key attributes
            assert a[0] == b[0] and len(a) == len(b)  # the step counter is RemoteShopEnv's own, the same
            cols = lambda rows: [r.split('|')[:5] + r.split('|')[6:] for r in rows[3:-1]]
            assert cols(a) == cols(b) and [r.split('|')[5] for r in a[3:-1]] != [r.split('|')[5] for r in b[3:-1]]
        elif a[0].startswith('[product_detail]'):  # no rating in v2
            assert 'rating None' in b[2] and b[:2] + b[3:] == a[:2] + a[3:]
        elif a[0].startswith('[information_subpage]'):  # content as one text: one item
            assert a[0] == b[0] and a[-1] == b[-1] and a[2:-1] == b[2:3] + [f'- {x}' for x in b[3:-1]]
        else: assert a == b


def test_our_pages_are_v2(shop, ours):
    "Every page our server sent in a few episodes has v2's fields for its type and, beside them, only our riders."
    c = ShopClient(client=ours[1])
    for task in shop.tasks['eval'][:3]:
        pol = ExpertPolicy(shop.catalog)
        r = c.reset(task.task_id)
        pages, env_idx = [r['observation_state']], r['env_idx']
        pol.shopper.reset(task)
        state = from_v2(pages[0])
        while True:
            r = c.interact(env_idx, pol.shopper.act(state))
            pages.append(r['observation_state'])
            state = from_v2(r['observation_state'])
            if r['done']: break
        c.release(env_idx)
        for p in pages:
            need = COMMON | V2_FIELDS[p['page_type']]
            assert need <= set(p) and set(p) - need <= RIDERS, (p['page_type'], set(p) ^ need)
            assert p['observation_version'] == OBSERVATION_V2 and not set(p) & set(HIDDEN_FIELDS)
            if p['page_type'] == 'search_results':
                assert len(p['products']) <= 20 and all(len(x['key_attributes']) <= 10 for x in p['products'])
                assert [x['asin'] for x in p['products']] == [a for a in p['actions'] if a.startswith('B')]


def test_reset_by_integer_index_and_leases(shop, ours):
    c = ShopClient(client=ours[1])
    a, b = c.reset(3), c.reset(shop.tasks['eval'][3].task_id)
    assert a['task_id'] == b['task_id'] == shop.tasks['eval'][3].task_id
    assert a['observation_state'] == b['observation_state']
    end = c.interact(a['env_idx'], 'finish[nothing fits]')
    assert end['done'] and end['observation_state']['page_type'] == 'terminal'
    with pytest.raises(ShopError, match='episode has ended') as e: c.interact(a['env_idx'], 'search[x]')
    assert e.value.status == 400  # the lease is still held after the end: the slot answers, and refuses
    assert c.release(a['env_idx']) == dict(released=[a['env_idx']])
    with pytest.raises(ShopError, match='not leased') as e: c.release(a['env_idx'])
    assert e.value.status == 404
    c.release(b['env_idx'])


# ---------------------------------------------------------------- faults at the boundary

FAULT_FIELD = dict(version='observation_version', missing_field='search_available', not_actionable='products[0].asin')


@pytest.mark.parametrize('fault', list(FAULT_FIELD))
def test_a_broken_page_is_a_clear_error_naming_the_field(shop, fault):
    server = FixtureServer(shop, fault, fault_at=1)
    env = RemoteShopEnv(ShopClient(client=TestClient(make_fixture_app(server))))
    env.reset('', shop.tasks['eval'][0])
    with pytest.raises(ShopProtocolError) as e: env.step('search[comb]')
    assert e.value.field == FAULT_FIELD[fault] and repr(FAULT_FIELD[fault]) in str(e.value)
    assert isinstance(e.value, ShopFault) and env.log.steps == 0 and not env.done  # nothing of the episode changed


def test_a_broken_first_page_gives_the_lease_back(shop):
    server = FixtureServer(shop, 'version', fault_at=0)
    env = RemoteShopEnv(ShopClient(client=TestClient(make_fixture_app(server))))
    with pytest.raises(ShopProtocolError, match='observation_version'): env.reset('', shop.tasks['eval'][0])
    assert server.leases == {}


@pytest.mark.parametrize('fault', list(FAULT_FIELD))
@pytest.mark.parametrize('fault_at', [1, 3])
def test_a_broken_page_ends_the_episode_as_infrastructure(shop, fault, fault_at):
    server = FixtureServer(shop, fault, fault_at=fault_at)
    make_env, _ = remote(make_fixture_app(server))
    rec = run_message_episode(shop, shop.tasks['eval'][0], ExpertPolicy(shop.catalog), make_env=make_env)
    assert rec['termination_reason'] in INFRA and rec['infrastructure_invalid'] is True
    assert rec['reward_detail']['reward_valid'] is False and rec['reward_detail']['outcome'] == 'infrastructure'
    assert rec['reward'] == 0.0 and rec['n_steps'] >= fault_at - 1  # not_actionable: from the next page with products
    if fault != 'not_actionable': assert rec['n_steps'] == fault_at - 1
    assert [e['data']['reason'] for e in rec['events'] if e['kind'] == 'end'][:1] == [rec['termination_reason']]
    assert server.leases == {}
