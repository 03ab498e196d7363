"""The shop's HTTP service against real `shopping-grpo serve-env` (uvicorn) processes on 127.0.0.1.

The servers serve the session shop's run folder (3000 products, seed 0, its own small task files) and are
always stopped by their own pid.  Requests that once crashed a handler keep their regression tests below.
"""
from __future__ import annotations
import inspect, os, re, socket, subprocess, sys, threading, time
from pathlib import Path
import httpx
import pytest

from _helpers import N_PRODUCTS, SEED, SIZES, as_json

STARTUP_S, STOP_S = 90.0, 15.0
CLI = Path(sys.executable).with_name('shopping-grpo')  # the console script of this venv


def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


class Server:
    "One `serve-env` process: started on a free port, health-checked, always stopped by its own pid."
    def __init__(self, run_dir, log_dir, *args):
        self.run_dir, self.log_dir, self.args, self.proc = Path(run_dir), Path(log_dir), list(args), None

    def cmd(self, port):
        return [str(CLI), 'serve-env', '--port', str(port), '--run', str(self.run_dir), '--n-products', str(N_PRODUCTS),
                       '--seed', str(SEED), *self.args]

    def start(self, timeout:float=STARTUP_S) -> 'Server':
        "Start and wait for GET /api/health; raises with the server's log if it dies or never answers."
        for attempt in range(3):  # a new port if another process grabbed ours in between
            self.port = free_port(); self.url = f'http://127.0.0.1:{self.port}'
            self.log = self.log_dir/f'server-{self.port}.log'
            env = dict(os.environ, PYTHONUNBUFFERED='1')
            with open(self.log, 'wb') as out:
                self.proc = subprocess.Popen(self.cmd(self.port), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None: break
                try:
                    if httpx.get(self.url + '/api/health', timeout=2, trust_env=False).status_code == 200: return self
                except httpx.TransportError: pass
                time.sleep(0.1)
            self.stop()
            if 'address already in use' not in self.log_text().lower(): break
        raise RuntimeError(f"server did not come up (rc={self.proc.returncode}):\n{self.log_text()[-3000:]}")

    def log_text(self) -> str: return self.log.read_text(errors='replace') if self.log.exists() else ''

    def stop(self):
        "SIGTERM our own process, then SIGKILL if it lingers."
        if self.proc is None or self.proc.poll() is not None: return
        self.proc.terminate()
        try: self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired: self.proc.kill(); self.proc.wait(STOP_S)

    def client(self, timeout:float=30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)


def pages_v2(shop, task, actions) -> tuple[list[dict], object]:
    "The pages the server sends for `actions` played in-process (v2, after reset and each step), and the last step."
    from shopping_grpo.server import page_v2
    env = shop.env()
    env.reset(task.instruction, task)
    pages, r = [as_json(page_v2(env))], None
    for a in actions:
        r = env.step(a)
        pages.append(as_json(page_v2(env)))
    return pages, r


def task_files(run_dir) -> dict:
    return {p.name: p.read_bytes() for p in sorted((Path(run_dir)/'tasks').iterdir())}


@pytest.fixture(scope='module')
def server(shop_dir, tmp_path_factory):
    "The main server: CLI defaults (host, max_slots, lease_ttl); `tasks_before` is the run's task files before it started."
    s = Server(shop_dir, tmp_path_factory.mktemp('logs')); s.tasks_before = task_files(shop_dir)
    try: yield s.start()
    finally: s.stop()


@pytest.fixture(scope='module')
def small_server(shop_dir, tmp_path_factory):
    "A server with a 4-slot pool and 1-second idle leases."
    s = Server(shop_dir, tmp_path_factory.mktemp('logs'), '--max-slots', '4', '--lease-ttl', '1')
    try: yield s.start()
    finally: s.stop()


@pytest.fixture
def http(server):
    with server.client() as c: yield c


def post(c:httpx.Client, body=None, content:bytes|None=None) -> httpx.Response:
    if content is not None: return c.post('/api/shop_agent', content=content, headers={'content-type': 'application/json'})
    return c.post('/api/shop_agent', json=body)


def ok(r:httpx.Response) -> dict:
    assert r.status_code == 200, r.text[:500]
    return r.json()['result']


def error_of(r:httpx.Response, status:int) -> str:
    "The error message of a refused request, checking the status and the `{'result': {'error': ...}}` shape."
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers['content-type'].startswith('application/json')
    body = r.json()
    assert set(body) == {'result'} and set(body['result']) == {'error'}, body
    msg = body['result']['error']
    assert isinstance(msg, str) and 10 <= len(msg) <= 1000, msg
    return msg


# ---------------------------------------------------------------- the default binding

def listening_addresses(port:int) -> set[str]:
    "Local IPv4/IPv6 addresses (hex, as in /proc/net/tcp*) with a LISTEN socket on `port`."
    out = set()
    for f in ('/proc/net/tcp', '/proc/net/tcp6'):
        if not os.path.exists(f): continue
        for line in Path(f).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(':')
            if int(p, 16) == port and state == '0A': out.add(addr)
    return out


def test_cli_default_host_is_loopback():
    from shopping_grpo.cli import serve_env
    from shopping_grpo.server import serve
    assert inspect.signature(serve_env).parameters['host'].default.default == '127.0.0.1'
    assert inspect.signature(serve).parameters['host'].default == '127.0.0.1'


def test_server_binds_loopback_by_default(server):
    "The main server is started without --host: it must listen on 127.0.0.1 only."
    assert '--host' not in server.cmd(server.port)
    if not os.path.exists('/proc/net/tcp'): pytest.skip('needs /proc/net/tcp (Linux)')
    assert listening_addresses(server.port) == {'0100007F'}  # 127.0.0.1, and no 0.0.0.0 / :: socket


def test_serving_leaves_the_run_as_it_is(server, shop_dir, shop):
    "serve-env loads the run's own task files (not DEFAULT_SIZES) and rewrites nothing."
    assert task_files(shop_dir) == server.tasks_before
    with server.client() as c:
        for split, n in SIZES.items():
            got = c.get('/api/tasks', params=dict(split=split)).json()['tasks']
            assert [t['task_id'] for t in got] == [t.task_id for t in shop.tasks[split]] and len(got) == n


def test_health_and_tasks(http):
    h = http.get('/api/health').json()
    assert h['ok'] is True and h['products'] == N_PRODUCTS and len(h['catalog_sha256']) == 64 and h['max_slots'] == 256
    r = http.get('/api/tasks', params=dict(split='eval')).json()
    assert len(r['tasks']) == SIZES['eval'] and all(set(t) == {'task_id', 'instruction'} for t in r['tasks'])
    assert error_of(http.get('/api/tasks', params=dict(split='nope')), 404).startswith('unknown split')


# ---------------------------------------------------------------- refused requests

def _session(http, shop, oracle_records):
    """A session of eval task 0 standing on its target's product page; the actions that got it there (in-process: the
    catalog's ids; sent to the server: the wire's, as a ShopSimulator client sends them)."""
    from shopping_grpo.server import WireIds
    ids, task = WireIds.of(shop.catalog), shop.tasks['eval'][0]
    acts = [s['action'] for s in oracle_records[task.task_id]['steps']]
    prefix = acts[:next(i for i, a in enumerate(acts) if a == f'click[{task.facts.target_asin}]') + 1]
    res = ok(post(http, dict(action='reset', idx=task.task_id)))
    for a in prefix:
        sent = re.sub(r'B[0-9A-Z]{9}', lambda m: ids.wire(m.group(0)) if m.group(0) in shop.catalog else m.group(0), a)
        last = ok(post(http, dict(action='interact', env_idx=res['env_idx'], response=sent)))
    assert last['observation_state']['page_type'] == 'product_detail'
    assert last['observation_state']['product']['asin'] == ids.wire(task.facts.target_asin)
    return task, res['env_idx'], prefix, last


BIG = 'search[' + 'a'*(1 << 20) + ']'
BAD = {  # name: (body or raw bytes builder taking env_idx, status, words the message must contain)
    'malformed_json':      (lambda i: b'{"action": "interact", "env_idx": %d, "response": ' % i, 400, 'malformed JSON'),
    'empty_body':          (lambda i: b'', 400, 'malformed JSON'),
    'invalid_utf8':        (lambda i: b'{"action": "interact", "env_idx": %d, "response": "click[\xff\xfe\xc3]"}' % i, 400, 'not valid UTF-8'),
    'non_object_list':     (lambda i: [dict(action='interact', env_idx=i, response='click[features]')], 400, 'JSON object'),
    'non_object_string':   (lambda i: 'click[features]', 400, 'JSON object'),
    'non_object_number':   (lambda i: 42, 400, 'JSON object'),
    'non_object_null':     (lambda i: b'null', 400, 'JSON object'),
    'unknown_action':      (lambda i: dict(action='teleport', env_idx=i, response='click[features]'), 400, 'unknown action'),
    'missing_action':      (lambda i: dict(env_idx=i, response='click[features]'), 400, 'unknown action'),
    'reset_without_idx':   (lambda i: dict(action='reset'), 400, "needs 'idx'"),
    'reset_unknown_task':  (lambda i: dict(action='reset', idx='no-such-task'), 404, 'unknown task id'),
    'reset_index_range':   (lambda i: dict(action='reset', idx=10**6), 404, 'out of range'),
    'interact_no_response': (lambda i: dict(action='interact', env_idx=i), 400, "needs 'response'"),
    'response_not_text':   (lambda i: dict(action='interact', env_idx=i, response=['click[features]']), 400, "needs 'response'"),
    'interact_no_env_idx': (lambda i: dict(action='interact', response='click[features]'), 400, 'env_idx must be an integer'),
    'env_idx_not_int':     (lambda i: dict(action='interact', env_idx=str(i), response='click[features]'), 400, 'env_idx must be an integer'),
    'env_idx_bool':        (lambda i: dict(action='interact', env_idx=True, response='click[features]'), 400, 'env_idx must be an integer'),
    'unknown_env_idx':     (lambda i: dict(action='interact', env_idx=10**9 + i, response='click[features]'), 404, 'not leased'),
    'not_on_page':         (lambda i: dict(action='interact', env_idx=i, response='click[definitely not on this page]'), 400, 'not clickable'),
    'unparseable':         (lambda i: dict(action='interact', env_idx=i, response='buy it now please'), 400, 'cannot parse'),
    'search_on_detail':    (lambda i: dict(action='interact', env_idx=i, response='search[anything]'), 400, 'search is not available'),
    'action_1mb':          (lambda i: dict(action='interact', env_idx=i, response=BIG), 400, 'limit is 4096'),
    'body_over_2mb':       (lambda i: dict(action='interact', env_idx=i, response=BIG*2), 413, 'exceeds'),
}


@pytest.mark.parametrize('name', list(BAD))
def test_refused_request_leaves_session_unchanged(name, server, http, shop, oracle_records):
    task, i, prefix, before = _session(http, shop, oracle_records)
    make, status, words = BAD[name]
    body = make(i)
    r = post(http, content=body) if isinstance(body, bytes) else post(http, body)
    assert words in error_of(r, status)
    # the session is untouched: the next valid action gives what it gives in-process without the refused request
    after = ok(post(http, dict(action='interact', env_idx=i, response='click[features]')))
    pages, _ = pages_v2(shop, task, prefix + ['click[features]'])
    assert after['observation_state'] == pages[-1]
    assert after['observation_state']['step'] == before['observation_state']['step'] + 1
    back = ok(post(http, dict(action='interact', env_idx=i, response='click[< prev]')))
    assert back['observation_state'] == before['observation_state'] | dict(step=len(prefix) + 2)
    assert server.proc.poll() is None and http.get('/api/health').json()['ok']
    ok(post(http, dict(action='release_one', env_idx=i)))


def test_released_and_finished_sessions(http, shop, oracle_records):
    task, a, prefix, before = _session(http, shop, oracle_records)  # an open session that must not notice the others
    other = shop.tasks['eval'][1]
    i = ok(post(http, dict(action='reset', idx=other.task_id)))['env_idx']
    assert ok(post(http, dict(action='release_one', env_idx=i))) == dict(released=[i])
    assert 'not leased' in error_of(post(http, dict(action='interact', env_idx=i, response='search[x]')), 404)
    assert 'not leased' in error_of(post(http, dict(action='release_one', env_idx=i)), 404)
    # a finished episode refuses further actions but stays leased until released
    j = ok(post(http, dict(action='reset', idx=other.task_id)))['env_idx']
    end = ok(post(http, dict(action='interact', env_idx=j, response='finish[nothing]')))
    assert end['done'] is True and end['reward_detail']['outcome'] == 'early_abstain' and end['reward_valid'] is True
    assert 'episode has ended' in error_of(post(http, dict(action='interact', env_idx=j, response='search[x]')), 400)
    ok(post(http, dict(action='release_one', env_idx=j)))
    pages, _ = pages_v2(shop, task, prefix + ['click[features]'])
    assert ok(post(http, dict(action='interact', env_idx=a, response='click[features]')))['observation_state'] == pages[-1]
    ok(post(http, dict(action='release_one', env_idx=a)))


# ---------------------------------------------------------------- hostile requests that once crashed a handler

def _survives(server):
    "The process is alive and answers on a fresh connection (after a 500, uvicorn drops the kept-alive one)."
    assert server.proc.poll() is None
    with server.client() as c: assert c.get('/api/health').json()['ok']


@pytest.mark.parametrize('idx', [[0], {'task': 0}], ids=['list', 'object'])
def test_reset_with_unhashable_idx_is_a_clear_4xx(server, http, idx):
    r = post(http, dict(action='reset', idx=idx))
    try: error_of(r, 400)
    finally: _survives(server)


def test_reset_with_unicode_digit_idx_is_a_clear_4xx(server, http):
    r = post(http, dict(action='reset', idx='²'))
    try: assert r.status_code in (400, 404) and 'error' in r.json()['result']
    finally: _survives(server)


def test_deeply_nested_json_is_a_clear_4xx(server, http):
    r = post(http, content=b'[' * 100_000 + b']' * 100_000)
    try: error_of(r, 400)
    finally: _survives(server)


def test_search_of_only_very_long_words_is_a_clear_answer(server, shop):
    with server.client() as c:
        i = ok(post(c, dict(action='reset', idx=0)))['env_idx']
        try:
            r = post(c, dict(action='interact', env_idx=i, response='search[' + 'x'*40 + ' ' + 'y'*40 + ']'))
            assert r.status_code in (200, 400) and r.headers['content-type'].startswith('application/json'), (r.status_code, r.text[:200])
        finally:
            _survives(server)
            with server.client() as c2: post(c2, dict(action='release_one', env_idx=i))


def test_server_survives_the_500s(server, shop):
    "Whatever the requests above get, the process keeps serving sessions."
    for kw in (dict(json=dict(action='reset', idx=[0])), dict(json=dict(action='reset', idx='²')), dict(content=b'[' * 100_000)):
        with server.client() as c:
            try: c.post('/api/shop_agent', **kw)
            except httpx.TransportError: pass
    _survives(server)
    with server.client() as c:
        i = ok(post(c, dict(action='reset', idx=0)))['env_idx']
        assert ok(post(c, dict(action='interact', env_idx=i, response='search[lamp]')))['observation_state']['page_type'] == 'search_results'
        ok(post(c, dict(action='release_one', env_idx=i)))


# ---------------------------------------------------------------- slots and leases

def test_pool_exhaustion_is_a_clear_503(small_server, shop):
    ids = [t.task_id for t in shop.tasks['eval'][:5]]
    with small_server.client() as c:
        for attempt in range(3):  # the lease TTL is 1 s: redo if this machine stalled long enough to expire one
            ok(post(c, dict(action='release_all'))); t0 = time.monotonic()
            got = [ok(post(c, dict(action='reset', idx=t)))['env_idx'] for t in ids[:4]]
            r = post(c, dict(action='reset', idx=ids[4]))
            if time.monotonic() - t0 < 0.8: break
        msg = error_of(r, 503)
        assert 'all 4 slots are leased' in msg
        assert c.get('/api/health').json()['leases'] == 4
        # releasing one frees a slot at once
        ok(post(c, dict(action='release_one', env_idx=got[0])))
        ok(post(c, dict(action='reset', idx=ids[4])))
        ok(post(c, dict(action='release_all')))


def test_idle_leases_expire(small_server, shop):
    ids = [t.task_id for t in shop.tasks['eval'][:5]]
    with small_server.client() as c:
        ok(post(c, dict(action='release_all')))
        old = [ok(post(c, dict(action='reset', idx=t)))['env_idx'] for t in ids[:4]]
        time.sleep(1.6)
        new = ok(post(c, dict(action='reset', idx=ids[4])))['env_idx']  # expiry runs on reset and frees the idle four
        assert new not in old and c.get('/api/health').json()['leases'] == 1
        assert 'expired' in error_of(post(c, dict(action='interact', env_idx=old[0], response='search[x]')), 404)
        ok(post(c, dict(action='interact', env_idx=new, response='search[lamp]')))
        assert ok(post(c, dict(action='release_all')))['released'] == [new]


# ---------------------------------------------------------------- concurrency

N_SESSIONS, SESSION_TIMEOUT_S = 64, 90.0


def test_concurrent_sessions_do_not_cross_talk(server, shop, all_tasks, oracle_records):
    tasks = all_tasks[::len(all_tasks) // N_SESSIONS][:N_SESSIONS]
    assert len({t.task_id for t in tasks}) == N_SESSIONS
    plans = {}
    for t in tasks:
        rec = oracle_records[t.task_id]; acts = [s['action'] for s in rec['steps']]
        assert all('error' not in s for s in rec['steps']) and rec['termination_reason'] in ('purchase', 'finish')
        pages, last = pages_v2(shop, t, acts)
        assert last.detail == rec['reward_detail']
        plans[t.task_id] = (acts, pages, as_json(rec['reward_detail']))

    barrier, results, errors = threading.Barrier(N_SESSIONS, timeout=30), {}, {}

    def play(task_id):
        try:
            acts, states, detail = plans[task_id]
            with server.client(timeout=30) as c:
                barrier.wait()
                res = ok(post(c, dict(action='reset', idx=task_id)))
                assert res['task_id'] == task_id and res['observation_state'] == states[0]
                seen = []
                for a in acts:
                    seen.append(ok(post(c, dict(action='interact', env_idx=res['env_idx'], response=a))))
                results[task_id] = (res['env_idx'], seen)
        except Exception as e: errors[task_id] = repr(e)[:500]

    threads = [threading.Thread(target=play, args=(t.task_id,), daemon=True) for t in tasks]
    t0 = time.monotonic()
    for th in threads: th.start()
    for th in threads: th.join(max(0.1, SESSION_TIMEOUT_S - (time.monotonic() - t0)))
    assert not any(th.is_alive() for th in threads), 'sessions did not finish in time'
    assert not errors, errors
    try:
        assert len({i for i, _ in results.values()}) == N_SESSIONS
        for task_id, (i, seen) in results.items():
            acts, states, detail = plans[task_id]
            assert [s['observation_state'] for s in seen] == states[1:], task_id
            assert all(s['env_idx'] == i for s in seen)
            assert [s['done'] for s in seen] == [False]*(len(acts) - 1) + [True]
            assert seen[-1]['reward_detail'] == detail and seen[-1]['reward'] == detail['reward']
    finally:
        with server.client() as c:
            for i, _ in results.values(): ok(post(c, dict(action='release_one', env_idx=i)))
