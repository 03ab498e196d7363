"""A shop server that speaks ShopSimulator's structured observation, `shopping-observation-v2`, written from the
schema's published facts and not from `shopping_grpo.server`: our `ShopEnv` is only its engine (what an action does,
when the episode ends, and the reward), and every page it answers is built here from the catalog and the engine's
page stack and chosen options.  It sends only v2's fields, none of ours (no `step`, `rating` or `message`), writes
key attributes one per item, capitalises sub-page names and sends a sub-page's content as one text, as another
server might.  Its product ids are its own, twelve digits drawn from a hash of the catalog's id (ShopSimulator's
form, and not the ten-digit ids of `serve-env`), and it reads a `click[<its id>]` back for the engine.

`refusal` is what a ShopSimulator client checks before it accepts a page (the version, the page type, product ids of
8 to 12 digits, at most 20 products, `actions` listing exactly the page's products); the fixture checks every page
it builds with it, and the conformance suite checks every page `serve-env` sends.  `fault` makes it answer one kind
of broken page from the `fault_at`-th interaction on.
"""
from __future__ import annotations
import hashlib, json, re
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

VERSION = 'shopping-observation-v2'
PAGE_SIZE = 20
SUBPAGES = ('description', 'features', 'reviews', 'attributes')
BACK, PREV, NEXT, BUY = 'back to search', '< prev', 'next >', 'buy now'
PAGE_TYPES = ('search_home', 'search_results', 'product_detail', 'information_subpage', 'terminal')
PRODUCT_ID = re.compile(r'\d{8,12}')
FAULTS = ('version', 'missing_field', 'not_actionable', 'webshop_id', 'too_many')


def product_ids(asins:list[str]) -> dict[str, str]:
    "The fixture's own product id of each catalog id: twelve digits from its hash, never starting with 0."
    ids = {a: str(10**11 + int(hashlib.sha256(a.encode()).hexdigest(), 16) % (9*10**11)) for a in asins}
    if len(set(ids.values())) != len(ids): raise ValueError('two products drew the same id; change the hash')
    return ids


def refusal(page) -> str|None:
    "Why a ShopSimulator client refuses `page`, or None when it accepts it."
    if not isinstance(page, dict): return 'the page is not an object'
    if page.get('observation_version') != VERSION: return f"observation_version is {page.get('observation_version')!r}"
    t, actions = page.get('page_type'), page.get('actions')
    if t not in PAGE_TYPES: return f'page_type is {t!r}'
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        return 'actions is not a list of strings'
    shown = [p.get('asin') if isinstance(p, dict) else None for p in page.get('products') or []]
    if t == 'search_results' and len(shown) > PAGE_SIZE: return f'{len(shown)} products on one page'
    if t in ('product_detail', 'information_subpage'):
        if not isinstance(page.get('product'), dict): return f'a {t} page without its product'
        if not (isinstance(page['product'].get('asin'), str) and PRODUCT_ID.fullmatch(page['product']['asin'])):
            return f"product id {page['product'].get('asin')!r}"
    for pid in shown:
        if not (isinstance(pid, str) and PRODUCT_ID.fullmatch(pid)): return f'product id {pid!r}'
    if len(set(shown)) != len(shown): return 'a product shown twice'
    values = {v for vs in (page.get('available_options') or {}).values() for v in vs}
    listed = [a for a in actions if PRODUCT_ID.fullmatch(a) and a not in values]
    if sorted(listed) != sorted(shown): return f'actions list products {listed[:3]}..., the page shows {shown[:3]}...'
    return None


def product(p:dict, pid:str) -> dict:
    "v2's product object of a catalog row; key attributes: material, then each option axis and its number of values."
    keys = [p['material'], *[f"{a['name']} x{len(a['values'])}" for a in p['axes'] or []]]
    return dict(asin=pid, title=p['title'], brand=p['brand'], category=p['category_name'], price=p['price'],
                key_attributes=[k for k in keys if k][:10])


def options(p:dict, chosen:dict) -> dict:
    "selected_options, available_options and the price of the variant (an axis not chosen: its first value)."
    price, selected = p['price'], {}
    for a in p['axes'] or []:
        i = a['value_keys'].index(chosen[a['key']]) if a['key'] in chosen else 0
        if a['key'] in chosen: selected[a['name']] = a['values'][i]
        if price is not None: price += a['deltas'][i]
    return dict(selected_options=selected, available_options={a['name']: list(a['values']) for a in p['axes'] or []},
                selected_price=None if price is None else round(price, 2))


def subpage_text(p:dict, name:str) -> str:
    lines = {'description': [p['description']], 'features': p['bullets'] or p['features'],
             'reviews': [f"{r['rating']}/5 {r['text']}" for r in p['reviews'] or []],
             'attributes': [f"{a['name']}: {a['value']}" for a in p['attributes'] or []]}[name]
    return '\n'.join(lines)


def page(env, ids:dict) -> dict:
    "The engine's current page as observation v2, with the fixture's product ids (`ids`: catalog id -> ours)."
    top, cat = env.stack[-1], env.catalog
    t = top['page_type']
    out = dict(observation_version=VERSION, page_type=t, search_available=t in ('search_home', 'search_results'),
               actions=[])
    if t == 'search_results':
        rows, pg = top['rows'], top['page']
        pages = max(1, -(-len(rows) // PAGE_SIZE))
        start = (pg - 1)*PAGE_SIZE
        window = rows[start:start + PAGE_SIZE]
        shown = [dict(rank=start + i + 1, **product(p, ids[p['asin']])) for i, p in enumerate(map(cat.product, window))]
        nav = [BACK] + ([PREV] if pg > 1 else []) + ([NEXT] if pg < pages else [])
        out.update(actions=nav + [p['asin'] for p in shown], query=top['query'],
                   normalized_query=' '.join(re.findall(r'[a-z0-9]+', top['query'].lower())), page=pg,
                   total_pages=pages, total_results=len(rows), rank_start=shown[0]['rank'] if shown else 0,
                   rank_end=shown[-1]['rank'] if shown else 0, products=shown)
    elif t in ('product_detail', 'information_subpage'):
        p = cat.by_asin(top['asin'])
        opts = options(p, env.selected.get(p['asin'], {}))
        out.update(product=product(p, ids[p['asin']]), **opts)
        if t == 'product_detail':
            values = [v for vs in opts['available_options'].values() for v in vs]
            out['actions'] = [BACK, PREV, *SUBPAGES, *values, BUY]
        else:
            out.update(actions=[BACK, PREV], subpage=top['section'].capitalize(),
                       content=subpage_text(p, top['section']))
    return out


def broken(state:dict, fault:str, ids:dict) -> dict:
    """`state` with one fault: an unknown version, a missing field, a product or option shown but not actionable, the
    catalog's own id in place of ours (in `products` and `actions` alike, or as the page's product), 21 products."""
    state = dict(state)
    if fault == 'version': state['observation_version'] = 'shopping-observation-v3'
    elif fault == 'missing_field': del state['search_available']
    elif fault == 'not_actionable' and state.get('products'):
        state['actions'] = [a for a in state['actions'] if a != state['products'][0]['asin']]
    elif fault == 'not_actionable' and state.get('available_options'):
        first = next(iter(state['available_options'].values()))[0]  # an option offered but not clickable
        state['actions'] = [a for a in state['actions'] if a != first]
    elif fault == 'webshop_id' and (state.get('products') or state.get('product')):
        catalog_id = {pid: a for a, pid in ids.items()}
        if state.get('products'):
            pid = state['products'][0]['asin']
            state['products'] = [dict(state['products'][0], asin=catalog_id[pid])] + state['products'][1:]
            state['actions'] = [catalog_id[pid] if a == pid else a for a in state['actions']]
        else: state['product'] = dict(state['product'], asin=catalog_id[state['product']['asin']])
    elif fault == 'too_many' and state.get('products'):  # products of other pages, up to 21 on this one
        others = [p for p in ids.values() if p not in state['actions']][:PAGE_SIZE + 1 - len(state['products'])]
        last = state['products'][-1]
        state['products'] = state['products'] + [dict(last, asin=pid, rank=last['rank'] + 1 + k) for k, pid in enumerate(others)]
        state['actions'] = state['actions'] + others
    return state


class FixtureServer:
    "Leases of engine envs behind ShopSimulator's protocol; pages in v2."
    def __init__(self, shop, fault:str|None=None, fault_at:int=1):
        if fault is not None and fault not in FAULTS: raise ValueError(f"fault must be one of {FAULTS}")
        self.shop, self.fault, self.fault_at = shop, fault, fault_at
        self.leases, self.next_idx, self.interactions = {}, 0, 0
        self.ids = product_ids(shop.catalog.asins)  # catalog id -> ours
        self.catalog_id = {pid: a for a, pid in self.ids.items()}

    def answer(self, env) -> dict:
        state = page(env, self.ids)
        if why := refusal(state): raise AssertionError(f'the fixture built a page a ShopSimulator client refuses: {why}')
        faulty = self.fault is not None and self.interactions >= self.fault_at
        return broken(state, self.fault, self.ids) if faulty else state

    def engine_action(self, text:str) -> str:
        "A client's action for the engine: a click on one of our product ids becomes a click on the catalog's id."
        return re.sub(r'click\[\s*(\d{8,12})\s*\]', lambda m: f'click[{self.catalog_id.get(m.group(1), m.group(1))}]', text)

    def handle(self, body:dict) -> tuple[int, dict]:
        act = body.get('action')
        if act == 'reset':
            task = self.shop.task(body['idx'])
            env = self.shop.env()
            env.reset(task.instruction, task)
            i, self.next_idx = self.next_idx, self.next_idx + 1
            self.leases[i] = env
            return 200, dict(env_idx=i, idx=body['idx'], instruction=f'Instruction: {task.instruction}',
                             message=f'Task {body["idx"]} started', observation_state=self.answer(env))
        i = body.get('env_idx')
        if i not in self.leases: return 404, dict(error=f'env_idx {i} is not leased')
        env = self.leases[i]
        if act == 'release_one':
            del self.leases[i]
            return 200, dict(released=[i])
        if act != 'interact': return 400, dict(error=f'unknown action {act!r}')
        try: r = env.step(self.engine_action(body['response']))
        except ValueError as e:  # the engine's refusal names clickables by the catalog's ids: ours on the wire
            return 400, dict(error=re.sub(r'\bB[0-9A-Z]{9}\b', lambda m: self.ids.get(m.group(0), m.group(0)), str(e)))
        self.interactions += 1
        state = self.answer(env)
        out = dict(done=r.done, env_idx=i, idx=f'slot-{i}', message='Continue interaction', reward=r.reward or 0.0,
                   instruction=json.dumps(state, ensure_ascii=False), observation_state=state)
        if r.done: out.update(reward_detail=r.detail, termination_reason=r.detail['termination_reason'],
                              reward_valid=r.detail['reward_valid'])
        return 200, out


def make_fixture_app(server:FixtureServer) -> FastAPI:
    "The fixture as an app at ShopSimulator's endpoint."
    app = FastAPI()

    @app.post('/api/shop_agent')
    async def shop_agent(request: Request):
        code, result = server.handle(json.loads(await request.body()))
        return JSONResponse(dict(result=result), code)
    return app
