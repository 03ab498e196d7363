"""Property tests of Reward v3 on random, valid episodes drawn from the session shop.

Episodes are built as the env would log them (`ShopEnv._buy` / `finish`): a bought product of the catalog with
option values of its own axes at the price `variant_price` gives, or a stop after some searches and opened products.
"""
from __future__ import annotations
import copy, math
import pytest
from hypothesis import given, settings, strategies as st, assume, event

from shopping_grpo.episode import run_message_episode
from shopping_grpo.policies import ShopperPolicy
from shopping_grpo.env import Catalog, EpisodeLog, SECTIONS, catalog_frame, variant_price
from shopping_grpo import reward as R
from shopping_grpo.reward import REWARDS, WEIGHTS, check_gates, partial_reward, resolved_options, score_episode, soft_match
from shopping_grpo.shoppers import RandomShopper, OracleShopper
from shopping_grpo.shop import prepare_shop
from _helpers import N_PRODUCTS, SEED, TASK_SEED, LANG, SIZES

LO, HI = -0.85, 1.0
AGENT_ENDS = ('purchase', 'finish', 'repeat_loop', 'no_progress', 'max_steps')   # the episode ended by the agent's actions
INFRA_ENDS = tuple(getattr(R, 'INFRA_REASONS', ()))                             # ended by infrastructure: scored 0, invalid
OUTCOMES = {'gold', 'alternative', 'partial', 'wrong_purchase', 'unverifiable', 'graceful_stop', 'early_abstain', 'repeat_loop',
            'max_steps'} | ({'infrastructure'} if INFRA_ENDS else set())
EXAMPLES = settings(max_examples=150, deadline=None)


class Pools:
    "Asins of the shop grouped the ways a buyer might stray from the target."
    def __init__(self, catalog:Catalog):
        df = catalog.df.select('asin', 'category', 'cluster')
        self.catalog, self.asins = catalog, df['asin'].to_list()
        self.by_cat, self.by_cluster = {}, {}
        for a, c, k in df.iter_rows():
            self.by_cat.setdefault(c, []).append(a); self.by_cluster.setdefault(k, []).append(a)

    def pick(self, data, target:str) -> str:
        if target not in self.catalog: return data.draw(st.sampled_from(self.asins), label='asin')
        p = self.catalog.by_asin(target)
        how = data.draw(st.sampled_from(['target', 'cluster', 'category', 'any']), label='bought')
        pool = dict(target=[target], cluster=self.by_cluster[p['cluster']], category=self.by_cat[p['category']], any=self.asins)[how]
        return data.draw(st.sampled_from(pool), label='asin')


@pytest.fixture(scope='module')
def pools(shop): return Pools(shop.catalog)


@pytest.fixture(scope='module')
def blanked(shop, all_tasks):
    "A catalog of task targets and their clusters where some products lack a price or a category (unverifiable gates)."
    cat, rows = shop.catalog, []
    clusters = {cat.by_asin(t.facts.target_asin)['cluster'] for t in all_tasks[::8]}
    for i, r in enumerate(cat.df.filter(cat.df['cluster'].is_in(list(clusters))).iter_rows(named=True)):
        if i % 3 == 1: r = dict(r, price=None)
        elif i % 3 == 2: r = dict(r, category='', category_name='')
        rows.append(r)
    c = Catalog(catalog_frame(rows), LANG)
    return c, Pools(c)


def draw_purchase(data, task, catalog:Catalog, pools:Pools) -> EpisodeLog:
    "An episode ending in `buy now` on a catalog product, with random option choices and pages read."
    asin = pools.pick(data, task.facts.target_asin); p = catalog.by_asin(asin)
    sel = {}
    if data.draw(st.booleans(), label='choose the task options'):
        sel.update({k: v for k, v in task.facts.options.items() if any(a['key'] == k and v in a['value_keys'] for a in p['axes'] or [])})
    for a in p['axes'] or []:
        if data.draw(st.booleans(), label=f"set {a['key']}"): sel[a['key']] = data.draw(st.sampled_from(a['value_keys']))
    log = EpisodeLog(opened=[asin], viewed=[(asin, s) for s in data.draw(st.lists(st.sampled_from(SECTIONS), max_size=3), label='read')])
    if sel: log.selected[asin] = dict(sel)
    log.steps = data.draw(st.integers(1, 35), label='steps')
    log.purchase = dict(asin=asin, selected=dict(sel), price=variant_price(p, sel), category=p['category'])
    log.termination_reason = 'purchase'
    return log


def draw_other(data, task, catalog:Catalog, pools:Pools) -> EpisodeLog:
    "An episode ending with finish[...] after searches and opened pages, or stopped by a rule."
    log = EpisodeLog(steps=data.draw(st.integers(0, 35)))
    log.queries = data.draw(st.lists(st.tuples(st.sampled_from(['lamp', 'Lamp', 'desk lamp', 'xyz', 'board game']), st.integers(0, 150)), max_size=4))
    log.opened = [pools.pick(data, task.facts.target_asin) for _ in range(data.draw(st.integers(0, 4)))]
    log.termination_reason = data.draw(st.sampled_from(['finish', 'finish', 'repeat_loop', 'no_progress', 'max_steps', *INFRA_ENDS]))
    if log.termination_reason == 'finish': log.finish_reason = 'nothing fits'
    return log


def check_detail(d, task, log):
    "The invariants every reward detail must satisfy."
    assert LO <= d.reward <= HI and math.isfinite(d.reward)
    assert d.outcome in OUTCOMES
    if log.termination_reason in AGENT_ENDS:  # an agent's episode is invalid only when a gate cannot be checked
        assert d.reward_valid == (d.outcome != 'unverifiable'), d
    else:
        assert log.termination_reason in INFRA_ENDS and d.outcome == 'infrastructure' and not d.reward_valid, d
    if not d.reward_valid: assert d.reward == 0.0
    if d.outcome == 'gold':
        assert log.purchase['asin'] == task.facts.target_asin and d.soft_score == 1.0 and all(d.evidence.values())
    if 'fail' in d.gates.values(): assert d.reward == REWARDS['wrong_purchase'] and d.outcome == 'wrong_purchase'
    if d.outcome == 'partial': assert 0 <= d.soft_score < 1 and d.reward == partial_reward(d.soft_score)
    elif d.outcome in REWARDS: assert d.reward == REWARDS[d.outcome]
    assert d.termination_reason == log.termination_reason


@EXAMPLES
@given(data=st.data())
def test_reward_invariants(shop, all_tasks, pools, blanked, data):
    task = data.draw(st.sampled_from(all_tasks), label='task')
    which = data.draw(st.sampled_from(['shop', 'blanked']), label='catalog')
    catalog, pl = (shop.catalog, pools) if which == 'shop' else blanked
    if which == 'blanked' or data.draw(st.booleans(), label='purchase'):
        log = draw_purchase(data, task, catalog, pl)
    else:
        log = draw_other(data, task, catalog, pl)
    d = score_episode(task, log, catalog)
    event(d.outcome)
    check_detail(d, task, log)


def buy(catalog, asin, sel=None, viewed=('features',)) -> EpisodeLog:
    p, sel = catalog.by_asin(asin), dict(sel or {})
    return EpisodeLog(opened=[asin], viewed=[(asin, v) for v in viewed], selected={asin: sel} if sel else {}, steps=6,
                      purchase=dict(asin=asin, selected=sel, price=variant_price(p, sel), category=p['category']),
                      termination_reason='purchase')


def test_every_outcome_is_reachable_and_consistent(shop, all_tasks, pools, blanked):
    "One hand-made episode per outcome, each meeting the invariants (so the properties above are not vacuous)."
    cat, got = shop.catalog, {}
    def score(task, log, catalog=cat):
        d = score_episode(task, log, catalog); check_detail(d, task, log); got.setdefault(d.outcome, d); return d
    for t in all_tasks:
        f = t.facts; p = cat.by_asin(f.target_asin)
        assert score(t, buy(cat, f.target_asin, f.options, ('features',))).outcome == 'gold'
        if f.features: assert score(t, buy(cat, f.target_asin, f.options, ())).outcome == 'alternative'
        other = next(a for a in pools.asins if cat.by_asin(a)['category'] != f.category)
        assert score(t, buy(cat, other)).outcome == 'wrong_purchase'
        if f.brand and f.budget is None:
            wrong = [a for a in pools.by_cat[f.category] if cat.by_asin(a)['brand_key'] != f.brand]
            if wrong: assert score(t, buy(cat, wrong[0])).outcome == 'partial'
        assert score(t, EpisodeLog(steps=1, finish_reason='x', termination_reason='finish')).outcome == 'early_abstain'
        misfits = [a for a in pools.by_cat[f.category] if a != f.target_asin][:2]
        if len(misfits) == 2:
            log = EpisodeLog(queries=[('a', 3), ('b', 5)], opened=misfits, steps=6, termination_reason='finish')
            assert score(t, log).outcome == 'graceful_stop'
        for why, outcome in [('repeat_loop', 'repeat_loop'), ('no_progress', 'repeat_loop'), ('max_steps', 'max_steps'),
                             *[(r, 'infrastructure') for r in INFRA_ENDS]]:
            assert score(t, EpisodeLog(steps=35, termination_reason=why)).outcome == outcome
    bl, bp = blanked
    for asin in bp.asins:
        t = next(x for x in all_tasks if x.facts.category == (cat.by_asin(asin)['category']))
        score(t, buy(bl, asin), bl)
    assert set(got) == OUTCOMES, sorted(set(OUTCOMES) - set(got))
    assert got['unverifiable'].reward_valid is False and got['unverifiable'].reward == 0.0


@EXAMPLES
@given(data=st.data())
def test_failed_gate_is_always_wrong_purchase(shop, all_tasks, pools, data):
    task = data.draw(st.sampled_from(all_tasks), label='task'); f = task.facts
    gate = data.draw(st.sampled_from(['category', 'budget']), label='gate')
    if gate == 'category':
        asin = data.draw(st.sampled_from([a for a in pools.asins[::7] if shop.catalog.by_asin(a)['category'] != f.category]), label='asin')
        p, sel = shop.catalog.by_asin(asin), {}
    else:
        assume(f.budget is not None)
        asin = data.draw(st.sampled_from(pools.by_cat[f.category]), label='asin'); p = shop.catalog.by_asin(asin)
        sel = {a['key']: a['value_keys'][max(range(len(a['deltas'])), key=a['deltas'].__getitem__)] for a in p['axes'] or []}
        assume(variant_price(p, sel) > f.budget)  # the dearest variant of a same-category product, over budget
    log = EpisodeLog(opened=[asin], viewed=[(asin, 'features')], selected={asin: sel} if sel else {}, steps=5,
                     purchase=dict(asin=asin, selected=sel, price=variant_price(p, sel), category=p['category']),
                     termination_reason='purchase')
    d = score_episode(task, log, shop.catalog)
    assert d.gates[gate] == 'fail' and check_gates(p, variant_price(p, sel), f)[gate] == 'fail'
    assert d.reward == -0.85 and d.outcome == 'wrong_purchase' and d.reward_valid


@EXAMPLES
@given(data=st.data())
def test_adding_a_matched_soft_requirement_never_lowers_S(shop, all_tasks, pools, data):
    task = data.draw(st.sampled_from(all_tasks), label='task')
    asin = pools.pick(data, task.facts.target_asin); p = shop.catalog.by_asin(asin)
    sel = {a['key']: data.draw(st.sampled_from(a['value_keys'])) for a in p['axes'] or [] if data.draw(st.booleans())}
    f = copy.deepcopy(task.facts)  # start from the task's facts with some soft requirements dropped, to make room
    if data.draw(st.booleans(), label='drop brand'): f.brand = None
    if data.draw(st.booleans(), label='drop model'): f.model = None
    f.features = data.draw(st.lists(st.sampled_from(f.features), unique=True), label='keep features') if f.features else []
    f.options = {k: v for k, v in f.options.items() if data.draw(st.booleans(), label=f'keep option {k}')}
    s, comp = soft_match(p, sel, f)
    for _ in range(data.draw(st.integers(1, 4), label='n additions')):
        opts = resolved_options(p, sel)
        can = (['brand'] if f.brand is None else []) + (['model'] if f.model is None and p['model'] else []) + \
              (['feature'] if set(p['feature_keys'] or []) - set(f.features) else []) + (['option'] if set(opts) - set(f.options) else [])
        if not can: break
        kind = data.draw(st.sampled_from(can), label='add')
        if kind == 'brand': f.brand = p['brand_key']
        elif kind == 'model': f.model = p['model']
        elif kind == 'feature': f.features = sorted(f.features + [data.draw(st.sampled_from(sorted(set(p['feature_keys']) - set(f.features))))])
        else:
            k = data.draw(st.sampled_from(sorted(set(opts) - set(f.options)))); f.options[k] = opts[k]
        s2, comp2 = soft_match(p, sel, f)
        event(kind)
        key = dict(feature='functions', option='options').get(kind, kind)
        assert key in comp2 and (comp2[key] == 1.0 if kind in ('brand', 'model') else comp2[key] >= comp.get(key, 0.0))
        assert s2 >= s - 1e-12, (kind, s, s2, comp, comp2)
        assert 0.0 <= s2 <= 1.0
        s, comp = s2, comp2


def test_soft_match_weights_and_partial_reward():
    "S is the weighted mean of the active components; partial rewards stay below the alternative's."
    assert math.isclose(sum(WEIGHTS.values()), 1.0)
    for k in range(101):
        s = k / 100
        assert -0.30 - 1e-12 <= partial_reward(s) <= 0.25 < REWARDS['alternative']
        if k: assert partial_reward(s) >= partial_reward((k - 1) / 100)


@EXAMPLES
@given(data=st.data())
def test_same_episode_same_detail(shop, all_tasks, pools, data):
    task = data.draw(st.sampled_from(all_tasks), label='task')
    log = draw_purchase(data, task, shop.catalog, pools) if data.draw(st.booleans()) else draw_other(data, task, shop.catalog, pools)
    d1, d2, d3 = score_episode(task, log, shop.catalog), score_episode(task, copy.deepcopy(log), shop.catalog), score_episode(task, log, shop.catalog)
    assert d1.as_dict() == d2.as_dict() == d3.as_dict()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_same_actions_same_detail_in_the_env(shop, all_tasks, data):
    "Replaying an episode's actions gives the same pages and the same reward detail."
    task = data.draw(st.sampled_from(all_tasks), label='task'); seed = data.draw(st.integers(0, 10**6), label='seed')
    a = run_message_episode(shop, task, ShopperPolicy(RandomShopper(seed))); b = run_message_episode(shop, task, ShopperPolicy(RandomShopper(seed)))
    assert a['steps'] == b['steps'] and a['reward_detail'] == b['reward_detail']
    assert a['n_invalid'] == 0  # RandomShopper only proposes what the page allows
    env = shop.env(); env.reset(task.instruction, task)
    for s in a['steps']: r = env.step(s['action'])
    assert env.done and r.detail == a['reward_detail']


def test_reloaded_shop_scores_identically(shop_dir, shop, oracle_records):
    "A shop loaded afresh from disk gives the same oracle episodes, detail for detail."
    again = prepare_shop(shop_dir, N_PRODUCTS, SEED, TASK_SEED, LANG, sizes=dict(SIZES), progress=False)
    for task_id, rec in oracle_records.items():
        r = run_message_episode(again, again.task(task_id), ShopperPolicy(OracleShopper(again.catalog)))
        assert r['steps'] == rec['steps'] and r['reward_detail'] == rec['reward_detail']

