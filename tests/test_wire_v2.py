"""Observation v2 on the wire: the same scripted episodes in-process, over our HTTP service and against a v2 fixture
server written from the schema's facts (`fixture_v2_server.py`) score the same; every page our server sends passes a
ShopSimulator client's checks (product ids of 8 to 12 digits, `actions` listing exactly the page's products, at most
20 products, the version, the page types); broken pages end as infrastructure.
"""
from __future__ import annotations
import json, re
from collections import Counter
import pytest
from fastapi.testclient import TestClient

from shopping_grpo.env import ShopFault, PAGE_TYPES
from shopping_grpo.episode import run_message_episode
from shopping_grpo.policies import ShopperPolicy, ExpertPolicy
from shopping_grpo.server import (ShopService, ShopClient, ShopError, ShopProtocolError, RemoteShopEnv, WireIds,
                                  make_app, from_v2, OBSERVATION_V2, HIDDEN_FIELDS, PRODUCT_ID)
from shopping_grpo.shoppers import HeuristicShopper, RandomShopper
from fixture_v2_server import FixtureServer, make_fixture_app, refusal, broken, page as fixture_page, FAULTS

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
CATALOG_ID = re.compile(r'\bB[0-9A-Z]{9}\b')  # the catalog's own (WebShop-style) product id


class Recorder:
    "The HTTP client `ShopClient` posts through, keeping every answer's `result`."
    def __init__(self, http): self.http, self.answers = http, []
    def post(self, *args, **kw):
        r = self.http.post(*args, **kw)
        self.answers.append(r.json().get('result', {}))
        return r


def remote(app, ids:WireIds|None=None):
    "A `make_env` for the runner (`RemoteShopEnv` over `app`, reading product ids back with `ids`) and its recorder."
    rec = Recorder(TestClient(app))
    return (lambda max_turns: RemoteShopEnv(ShopClient(client=rec), max_turns, ids)), rec


def swap_ids(x, table:dict, pattern:re.Pattern):
    "`x` (messages: lists, dicts, strings) with every product id that `pattern` finds and `table` knows swapped."
    if isinstance(x, str): return pattern.sub(lambda m: table.get(m.group(0), m.group(0)), x)
    if isinstance(x, list): return [swap_ids(v, table, pattern) for v in x]
    if isinstance(x, dict): return {k: swap_ids(v, table, pattern) for k, v in x.items()}
    return x


def strings(x) -> list[str]:
    "Every string inside `x`."
    if isinstance(x, str): return [x]
    return [s for v in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else []) for s in strings(v)]


@pytest.fixture(scope='module')
def ours(shop):
    return make_app(ShopService(shop))


@pytest.fixture(scope='module')
def wire(shop, ours):
    "The ways of playing over HTTP: our server read back into the catalog's ids, our server and the fixture as sent."
    fixture = FixtureServer(shop)
    ways = dict(our_server=remote(ours, WireIds.of(shop.catalog)), our_server_wire_ids=remote(ours),
                fixture_server=remote(make_fixture_app(fixture)))
    return ways, fixture


@pytest.fixture(scope='module')
def played(shop, wire):
    "(policy, task index) -> {way: trajectory record} for the four ways of playing."
    ways, fixture = wire
    makers = dict(in_process=None, **{w: make for w, (make, _) in ways.items()})
    out = {}
    for name, make in POLICIES.items():
        for k, task in enumerate(shop.tasks['eval'][:N_TASKS]):
            out[name, k] = {w: run_message_episode(shop, task, make(shop, k), make_env=env) for w, env in makers.items()}
    assert fixture.leases == {}, 'every finished episode gave its lease back'
    return out


OUTCOME = ('reward', 'reward_detail', 'termination_reason', 'infrastructure_invalid', 'steps', 'n_steps', 'n_turns')


def test_scripted_episodes_score_the_same_every_way(played, shop):
    assert len(played) == len(POLICIES)*N_TASKS
    ids = WireIds.of(shop.catalog)
    for key, recs in played.items():
        base = recs['in_process']
        assert not base['infrastructure_invalid'] and base['reward_detail']['reward_valid'], key
        assert {f: recs['our_server'][f] for f in OUTCOME} == {f: base[f] for f in OUTCOME}, key
        for way in ('our_server_wire_ids', 'fixture_server'):  # the same, but a click names the wire's id
            got = {f: recs[way][f] for f in OUTCOME if f != 'steps'}
            assert got == {f: base[f] for f in OUTCOME if f != 'steps'}, (key, way)
            assert len(recs[way]['steps']) == len(base['steps']), (key, way)
    ends = {recs['in_process']['termination_reason'] for recs in played.values()}
    assert 'purchase' in ends and len(ends) >= 2, ends  # the episodes reach more than one kind of end


def test_observation_text_is_the_same_in_process_and_over_our_server(played):
    for key, recs in played.items():
        assert recs['our_server']['messages'] == recs['in_process']['messages'], key


def test_without_the_catalog_the_model_reads_the_wire_ids(played, shop):
    "Read as sent, our server's episodes are the in-process ones word for word, each catalog id written as its wire id."
    ids = WireIds.of(shop.catalog)
    to_wire = {a: ids.wire(a) for a in shop.catalog.asins}
    for key, recs in played.items():
        theirs = recs['our_server_wire_ids']['messages']
        assert theirs == swap_ids(recs['in_process']['messages'], to_wire, CATALOG_ID), key
        assert not [t for t in strings(theirs[2:]) if CATALOG_ID.search(t)], key  # past the system prompt and the request


def test_every_page_our_server_sent_passes_a_shopsimulator_client(played, wire, shop):
    "100% of the pages `serve-env` sent in the conformance episodes (3 shoppers x 12 tasks, both ways) pass a client's checks."
    ways, _ = wire
    answers = ways['our_server'][1].answers + ways['our_server_wire_ids'][1].answers
    pages = [a['observation_state'] for a in answers if 'observation_state' in a]
    refused = [(p['page_type'], refusal(p)) for p in pages if refusal(p)]
    kinds = Counter(p['page_type'] for p in pages)
    print(f'\n{len(pages)} pages from serve-env, {len(refused)} refused; by type: {dict(kinds)}')
    assert refused == [] and set(kinds) == set(PAGE_TYPES) and len(pages) >= 2*len(played)
    texts = [a.get('instruction', '') + a.get('observation', '') for a in answers]
    assert not [t for t in texts if CATALOG_ID.search(t)], 'a page text named a product by the catalog id'
    shown = {p['asin'] for pg in pages for p in pg.get('products', [])}
    assert shown and all(PRODUCT_ID.fullmatch(x) and WireIds.of(shop.catalog).asin(x) for x in shown)


def test_the_client_check_refuses_each_broken_page(shop):
    "Every fault the fixture can inject is refused by a ShopSimulator client's checks and by `from_v2` alike."
    fixture = FixtureServer(shop)
    env = shop.env()
    env.reset('', shop.tasks['eval'][0])
    env.step('search[comb]')
    results = fixture_page(env, fixture.ids)
    env.step(f"click[{env.state['results'][0]['asin']}]")
    detail = fixture_page(env, fixture.ids)
    for fault in FAULTS:
        for good in (results, detail):
            bad = broken(good, fault, fixture.ids)
            if bad == good: continue  # this fault has nothing to break on this page
            client_sees = fault != 'missing_field' and not (fault == 'not_actionable' and good is detail)
            assert bool(refusal(bad)) == client_sees, (fault, good['page_type'])  # from_v2 checks fields and options too
            with pytest.raises(ShopProtocolError): from_v2(bad)


def test_fixture_pages_read_alike_but_not_byte_for_byte(played, wire):
    "Another v2 server's pages differ only where it sends less or writes v2 differently (nbs/02a_server.ipynb: Serving the shop)."
    _, fixture = wire
    recs = played['expert', 0]
    ours = recs['in_process']['messages']
    theirs = swap_ids(recs['fixture_server']['messages'], fixture.catalog_id, re.compile(r'\b\d{12}\b'))
    assert [m['role'] for m in ours] == [m['role'] for m in theirs] and ours != theirs
    assert recs['fixture_server']['messages'] != theirs  # the fixture's own ids were read as sent
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
    c = ShopClient(client=TestClient(ours))
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
            assert refusal(p) is None, refusal(p)
            if p['page_type'] == 'search_results':
                assert len(p['products']) <= 20 and all(len(x['key_attributes']) <= 10 for x in p['products'])
                assert [x['asin'] for x in p['products']] == [a for a in p['actions'] if PRODUCT_ID.fullmatch(a)]


def test_reset_by_integer_index_and_leases(shop, ours):
    c = ShopClient(client=TestClient(ours))
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

FAULT_FIELD = dict(version='observation_version', missing_field='search_available', not_actionable='products[0].asin',
                   webshop_id='products[0].asin', too_many='products')
ON_RESULTS_ONLY = ('not_actionable', 'too_many')  # faults that wait for a page with products (not_actionable: or options)


@pytest.mark.parametrize('fault', list(FAULT_FIELD))
def test_a_broken_page_is_a_clear_error_naming_the_field(shop, fault):
    server = FixtureServer(shop, fault, fault_at=1)
    env = RemoteShopEnv(ShopClient(client=TestClient(make_fixture_app(server))))
    env.reset('', shop.tasks['eval'][0])
    with pytest.raises(ShopProtocolError) as e: env.step('search[comb]')
    assert e.value.field == FAULT_FIELD[fault] and repr(FAULT_FIELD[fault]) in str(e.value)
    assert isinstance(e.value, ShopFault) and env.log.steps == 0 and not env.done  # nothing of the episode changed


def test_a_foreign_id_read_with_our_catalog_is_a_clear_error(shop):
    "A client told that the server holds our catalog, facing another server's ids, stops at the first product named."
    server = FixtureServer(shop)
    env = RemoteShopEnv(ShopClient(client=TestClient(make_fixture_app(server))), ids=WireIds.of(shop.catalog))
    env.reset('', shop.tasks['eval'][0])
    with pytest.raises(ShopProtocolError, match='is no product of the catalog') as e: env.step('search[comb]')
    assert e.value.field == 'products[0].asin' and env.log.steps == 0


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
    policy = ShopperPolicy(HeuristicShopper())  # it goes back to the results after each candidate: pages of every kind
    rec = run_message_episode(shop, shop.tasks['eval'][0], policy, make_env=make_env)
    assert rec['termination_reason'] in INFRA and rec['infrastructure_invalid'] is True
    assert rec['reward_detail']['reward_valid'] is False and rec['reward_detail']['outcome'] == 'infrastructure'
    assert rec['reward'] == 0.0 and rec['n_steps'] >= fault_at - 1  # some faults wait for a page they can break
    if fault not in ON_RESULTS_ONLY: assert rec['n_steps'] == fault_at - 1
    assert [e['data']['reason'] for e in rec['events'] if e['kind'] == 'end'][:1] == [rec['termination_reason']]
    assert server.leases == {}
