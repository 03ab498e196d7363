#!/usr/bin/env python
"""Speed benchmark of the simulated shop: build time, search latency, and env steps/s in-process and over HTTP.

Ours (tantivy `SearchIndex`) is measured against a baseline, SQLite FTS5 BM25 over the same fields and
weights (`fts5_index.py`), in the same run, on the same catalogs, queries and tasks:

1. build   catalog (English only) and index build time per catalog size, cold; goal: < 60 s at 20k.
2. search  p50/p99 latency of `search(query)` (top 150), warm, per size and engine; goal: ours p99 <= 20 ms at 1M.
3. env     in-process `ShopEnv` steps/s: `OracleShopper` episodes over the eval tasks via `run_message_episode`.
4. http    steps/s through the ShopSimulator HTTP protocol, N concurrent clients replaying oracle episodes
           against `shopping-grpo serve-env` (ours) and `fts5_server.py` (baseline), on loopback.

Run from the repository root:  .venv/bin/python benchmarks/bench_shop.py
Relative paths (--out, --run-root) are taken from the repository root. Catalogs above --cold-max products are
built once and cached under --run-root (their build times are those measured when they were built).
"""
from __future__ import annotations
import argparse, cProfile, gc, io, json, os, platform, pstats, random, resource, shutil, socket, sqlite3
import subprocess, sys, threading, time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))   # fts5_index

from shopping_grpo.episode import run_message_episode
from shopping_grpo.policies import ShopperPolicy
from shopping_grpo.env import INDEX_VERSION, TOP_K, Catalog, SearchIndex, build_catalog
from shopping_grpo.records import write_atomic
from shopping_grpo.shop import DEFAULT_SIZES, Shop, prepare_shop
from shopping_grpo.shoppers import OracleShopper
from shopping_grpo.records import package_versions, code_sha256
from fts5_index import FTS5Index, build_fts5, fts5_path

ENGINES = ('ours', 'fts5')
README_START, README_END = '<!-- figures:start -->', '<!-- figures:end -->'
DEFAULT_OUT = 'benchmarks/results/shop_speed.json'


# ---------------------------------------------------------------------------------------------- helpers

def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

def peak_rss_mb() -> float:
    "Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

def rss_mb() -> float:
    "Current resident memory of this process."
    return round(int(Path('/proc/self/statm').read_text().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20, 1)

def dir_mb(path) -> float:
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.rglob('*') if f.is_file()]
    return round(sum(f.stat().st_size for f in files) / 2**20, 1)

def latency_stats(ms: list[float]) -> dict:
    "p50/p90/p99/max/mean of latencies in milliseconds."
    a = np.asarray(ms)
    return dict(n=len(a), p50_ms=round(float(np.percentile(a, 50)), 3), p90_ms=round(float(np.percentile(a, 90)), 3),
                p99_ms=round(float(np.percentile(a, 99)), 3), max_ms=round(float(a.max()), 3), mean_ms=round(float(a.mean()), 3))

def busy_note(cpu: dict) -> str:
    "A warning for a log line when other processes used the CPUs during the window."
    return f"  [other processes used {cpu['other_cores']:.1f} cores]" if cpu['other_cores'] >= 0.2 else ''

def ratio(a, b):
    return round(a / b, 2) if a and b else None

def cpu_seconds(pid: int) -> float:
    "User + system CPU time of process `pid`."
    f = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')

class CpuMeter:
    """System-wide CPU use over a measured window, split into ours and everybody else's. The machine may be shared:
    `other_cores` > 0 means other processes competed with the benchmark for the CPUs during that window."""
    @staticmethod
    def _system():
        f = [int(x) for x in Path('/proc/stat').read_text().split('\n', 1)[0].split()[1:]]
        return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf('SC_CLK_TCK'), f[7] / os.sysconf('SC_CLK_TCK')   # busy, steal
    def __init__(self, pids=()):
        self.pids = [os.getpid(), *pids]
        self.wall, (self.busy, self.steal), self.own = time.perf_counter(), self._system(), self._own()
    def _own(self): return sum(cpu_seconds(p) for p in self.pids)
    def stop(self) -> dict:
        wall = time.perf_counter() - self.wall; busy, steal = self._system(); own = self._own() - self.own
        return dict(own_cores=round(own / wall, 2), other_cores=round(max(0.0, (busy - self.busy) - own) / wall, 2),
                    steal_cores=round((steal - self.steal) / wall, 2))

LIBRARY_MODULES = ('env', 'tasks', 'reward', 'server', 'cli')   # the modules this benchmark runs
SERVED_BY = ('shopping_grpo', 'polars', 'tantivy', 'numpy', 'fastapi', 'uvicorn', 'httpx')  # packages whose versions count

def library_hash() -> str:
    "A short hash of the source of the modules this benchmark runs (`records.code_sha256`): did they change during a run?"
    return code_sha256(LIBRARY_MODULES)[:12]

def machine_info() -> dict:
    "What the figures were measured on."
    cpu = next((l.split(':', 1)[1].strip() for l in Path('/proc/cpuinfo').read_text().splitlines() if l.startswith('model name')), platform.processor())
    mem = next(int(l.split()[1]) for l in Path('/proc/meminfo').read_text().splitlines() if l.startswith('MemTotal'))
    git = lambda *a: subprocess.run(['git', *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return dict(git_commit=git('rev-parse', '--short', 'HEAD'), library_modified=bool(git('status', '--porcelain', *[f'shopping_grpo/{m}.py' for m in LIBRARY_MODULES])),
                library_hash=library_hash(),
                cpu_count=os.cpu_count(), cpus_usable=len(os.sched_getaffinity(0)), cpu_model=cpu, mem_gib=round(mem / 2**20, 1),
                platform=platform.platform(), python=platform.python_version(), loadavg_start=os.getloadavg(),
                versions={**package_versions(SERVED_BY), 'sqlite': sqlite3.sqlite_version})


# ---------------------------------------------------------------------------------------------- 1. build

def heartbeat(what: str, every: float = 30.0) -> threading.Event:
    "Log that `what` is still running every `every` seconds, until the returned event is set."
    done, t0 = threading.Event(), time.time()
    def beat():
        while not done.wait(every): log(f"  ... {what}: {time.time() - t0:.0f}s, RSS {rss_mb():,.0f} MB")
    threading.Thread(target=beat, daemon=True).start(); return done

def build_worker(n: int, seed: int, out_dir: Path, result: Path):
    "Cold build of one catalog size (run in a child process, so its peak memory is its own and is given back)."
    out_dir = Path(out_dir); shutil.rmtree(out_dir, ignore_errors=True)
    big, meter, code = n >= 200_000, CpuMeter(), machine_info()   # the code this build ran (as imported now)
    # progress=False: with progress=True, build_catalog drops every 50k-row chunk whose tqdm update redraws the bar
    # (`if not bar.update(...)` in its comprehension), so large catalogs come out short. A heartbeat stands in for the bar.
    beat = heartbeat(f"building catalog {n:,}") if big else threading.Event()
    c, t = time.process_time(), time.perf_counter()
    build_catalog(out_dir, n, seed, langs=('en',), progress=False)
    catalog_s, catalog_cpu_s = time.perf_counter() - t, time.process_time() - c
    beat.set(); log(f"  catalog {n:,}: {catalog_s:.1f}s, peak RSS {peak_rss_mb():,.0f} MB")
    t = time.perf_counter(); cat = Catalog.load(out_dir, 'en'); load_s = time.perf_counter() - t
    if len(cat) != n: raise RuntimeError(f"build_catalog(n={n:,}) wrote {len(cat):,} products")
    c, t = time.process_time(), time.perf_counter(); SearchIndex(cat, out_dir/'index', progress=big)
    index_s, index_cpu_s = time.perf_counter() - t, time.process_time() - c
    log(f"  tantivy index {n:,}: {index_s:.1f}s")
    t = time.perf_counter(); path = build_fts5(cat, fts5_path(out_dir, cat.sha256), progress=log if big else None); fts5_s = time.perf_counter() - t
    log(f"  fts5 index {n:,}: {fts5_s:.1f}s")
    res = dict(n=n, rows=len(cat), seed=seed, catalog_s=round(catalog_s, 2), load_s=round(load_s, 2), index_s=round(index_s, 2),
               catalog_plus_index_s=round(catalog_s + load_s + index_s, 2), fts5_index_s=round(fts5_s, 2),
               catalog_cpu_s=round(catalog_cpu_s, 2), index_cpu_s=round(index_cpu_s, 2),   # CPU time: robust to other load
               parquet_mb=dir_mb(out_dir/'catalog_en.parquet'), index_mb=dir_mb(out_dir/'index'), fts5_mb=dir_mb(path),
               peak_rss_mb=peak_rss_mb(), cpu=meter.stop(), catalog_sha256=cat.sha256, index_version=INDEX_VERSION, fts5_file=path.name,
               git_commit=code['git_commit'], library_hash=code['library_hash'], measured_at=datetime.now(timezone.utc).isoformat(timespec='seconds'))
    write_atomic(result, json.dumps(res, indent=1))

def cached_build(n: int, args) -> dict|None:
    "The recorded build of size `n` if it is still what this code would build (same seed, index version, field weights)."
    out_dir = args.run_root/f'catalog-{n}'; times = out_dir/'build_times.json'
    if not times.exists(): return None
    b = json.loads(times.read_text()); sha = b.get('catalog_sha256', '')
    ok = b.get('seed') == args.seed and b.get('rows') == n and b.get('index_version') == INDEX_VERSION \
         and (out_dir/'index'/f"{sha[:16]}-en-v{INDEX_VERSION}"/'READY').exists() \
         and b.get('fts5_file') == fts5_path(out_dir, sha).name and (out_dir/b['fts5_file']).exists()
    return b if ok else None

def ensure_built(n: int, args) -> dict:
    "Build times of catalog size `n`: measured now (cold) for small sizes, else those recorded when it was cached."
    out_dir = args.run_root/f'catalog-{n}'
    if n > args.cold_max and not args.rebuild and (b := cached_build(n, args)):
        log(f"catalog {n:,}: reusing the cached build in {out_dir} (measured {b['measured_at']})")
        return dict(b, cached=True)
    log(f"catalog {n:,}: cold build of catalog, tantivy index and FTS5 index in a child process ...")
    subprocess.run([sys.executable, __file__, '--build-worker', str(n), '--seed', str(args.seed), '--run-root', str(args.run_root)], check=True)
    return dict(json.loads((out_dir/'build_times.json').read_text()), cached=False)


# ---------------------------------------------------------------------------------------------- 2. search

QUERY_MIX = dict(instruction=0.30, brand_category=0.25, category_features=0.25, model_category=0.10, title=0.10)

def make_queries(shop: Shop, n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (kind, query) pairs a shopper or agent would type, from the shop's eval and sft tasks and their target products:
    the request verbatim, brand + category, category + feature words, model + category, and a product title."""
    rng = random.Random(seed); tasks = shop.tasks['eval'] + shop.tasks['sft']; rng.shuffle(tasks)
    kinds = [k for k, share in QUERY_MIX.items() for _ in range(round(n * share))][:n]
    kinds += ['instruction'] * (n - len(kinds)); rng.shuffle(kinds)
    out = []
    for kind, task in zip(kinds, tasks * (n // len(tasks) + 1)):
        p = shop.catalog.by_asin(task.facts.target_asin); cat = p['category_name']
        feats = [p['features'][p['feature_keys'].index(k)] for k in task.facts.features] or rng.sample(p['features'], 2)
        out.append((kind, dict(instruction=task.instruction, brand_category=f"{p['brand']} {cat}",
                               category_features=' '.join([cat, *feats]), model_category=f"{p['model']} {cat}",
                               title=p['title'])[kind]))
    return out

def time_search(index, queries: list[str], warmup: int) -> tuple[list[float], list[float], list[list[int]]]:
    """Wall latency (ms), CPU time of this thread (ms) and results of `index.search` on each query, after `warmup`
    untimed queries. CPU time leaves out time spent waiting for a CPU, so it holds up on a shared machine."""
    for q in queries[:warmup]: index.search(q)
    gc.collect(); ms, cpu, results = [], [], []
    for q in queries:
        c, t = time.thread_time_ns(), time.perf_counter_ns(); rows = index.search(q)
        ms.append((time.perf_counter_ns() - t) / 1e6); cpu.append((time.thread_time_ns() - c) / 1e6); results.append(rows)
    return ms, cpu, results

def bench_search(n: int, index: dict, queries: list[tuple[str, str]], warmup: int) -> dict:
    "Latency of both engines on the same queries, and how much their top 20 agree."
    qs = [q for _, q in queries]; out, res = {}, {}
    for name in ENGINES:
        meter = CpuMeter(); ms, cpu, res[name] = time_search(index[name], qs, warmup)
        p99_of = lambda kind: latency_stats([m for m, (k, _) in zip(ms, queries) if k == kind])['p99_ms']
        out[name] = dict(latency_stats(ms), cpu_p50_ms=round(float(np.percentile(cpu, 50)), 3),
                         cpu_p99_ms=round(float(np.percentile(cpu, 99)), 3), cpu=meter.stop(),
                         p99_ms_by_kind={kind: p99_of(kind) for kind in QUERY_MIX},
                         mean_results=round(float(np.mean([len(r) for r in res[name]])), 1))
        log(f"  search {n:,} {name:>4}: p50 {out[name]['p50_ms']:.2f} ms  p99 {out[name]['p99_ms']:.2f} ms  "
            f"max {out[name]['max_ms']:.2f} ms{busy_note(out[name]['cpu'])}")
    out['overlap_top20'] = round(float(np.mean([len(set(a[:20]) & set(b[:20])) / max(1, min(20, len(a), len(b)))
                                                for a, b in zip(res['ours'], res['fts5'])])), 3)
    out['p99_ratio_fts5_over_ours'] = ratio(out['fts5']['p99_ms'], out['ours']['p99_ms'])
    return out


# ---------------------------------------------------------------------------------------------- 3. env in-process

class TimedIndex:
    "Wraps a search index to add up the time spent in `search` (the rest of a step is the env and the policy)."
    def __init__(self, index): self.index, self.seconds, self.calls = index, 0.0, 0
    def search(self, query, k=TOP_K):
        t = time.perf_counter(); r = self.index.search(query, k); self.seconds += time.perf_counter() - t; self.calls += 1
        return r

def bench_env(shop: Shop, index: dict, tasks: list, rounds: int, warmup: int, label: str,
              max_seconds: float|None = None) -> tuple[dict, dict]:
    """Env steps/s of the oracle over `tasks` with each engine as the shop's search (rounds alternate the engines);
    also each engine's oracle action lists, for the HTTP replay. A pass stops early, after the episode that crosses
    `max_seconds`, so a slow engine on a big catalog does not take an hour (`episodes` says how many ran)."""
    own, oracle, res, actions = shop.index, OracleShopper(shop.catalog), {}, {}
    try:
        for name in ENGINES:                                     # warm both: caches, lazily built structures
            shop.index = index[name]
            for t in tasks[:warmup]: run_message_episode(shop, t, ShopperPolicy(oracle))
        runs = {name: [] for name in ENGINES}
        for _ in range(rounds):
            for name in ENGINES:
                shop.index = timed = TimedIndex(index[name]); gc.collect(); meter = CpuMeter()
                c0, t0, recs = time.process_time(), time.perf_counter(), []
                for t in tasks:
                    recs.append(run_message_episode(shop, t, ShopperPolicy(oracle)))
                    if max_seconds and time.perf_counter() - t0 > max_seconds: break
                dt, cpu_s = time.perf_counter() - t0, time.process_time() - c0
                steps = sum(len(r['steps']) for r in recs)
                runs[name].append(dict(seconds=dt, cpu_s=cpu_s, steps=steps, search_s=timed.seconds, searches=timed.calls, recs=recs, cpu=meter.stop()))
        for name in ENGINES:
            rs = sorted(runs[name], key=lambda r: r['steps'] / r['seconds']); med = rs[len(rs) // 2]; recs = med['recs']
            res[name] = dict(episodes=len(recs), steps=med['steps'], seconds=round(med['seconds'], 3),
                             steps_per_s=round(med['steps'] / med['seconds'], 1),
                             all_rounds_steps_per_s=[round(r['steps'] / r['seconds'], 1) for r in runs[name]],
                             ms_per_step=round(1e3 * med['seconds'] / med['steps'], 3),
                             cpu_ms_per_step=round(1e3 * med['cpu_s'] / med['steps'], 3),
                             search_share=round(med['search_s'] / med['seconds'], 3),
                             ms_per_search=round(1e3 * med['search_s'] / max(1, med['searches']), 3),
                             searches_per_episode=round(med['searches'] / len(recs), 2),
                             mean_steps=round(med['steps'] / len(recs), 2),
                             strict_success=round(float(np.mean([r['strict_success'] for r in recs])), 3),
                             cpu=med['cpu'])
            actions[name] = [[s['action'] for s in r['steps'] if 'error' not in s] for r in recs]
            log(f"  env {label} {name:>4}: {res[name]['steps_per_s']:,.0f} steps/s over {len(recs)} episodes ({res[name]['ms_per_step']:.2f} ms/step, "
                f"search {100 * res[name]['search_share']:.0f}%), oracle strict success {res[name]['strict_success']:.2f}{busy_note(med['cpu'])}")
        res['ratio_ours_over_fts5'] = ratio(res['ours']['steps_per_s'], res['fts5']['steps_per_s'])
    finally: shop.index = own
    return res, actions

def profile_env(shop: Shop, tasks: list, top: int = 25) -> list[dict]:
    "Where in-process env time goes with our index: the top functions of a cProfile run, by own time."
    oracle = OracleShopper(shop.catalog); pr = cProfile.Profile()
    pr.enable(); [run_message_episode(shop, t, ShopperPolicy(oracle)) for t in tasks]; pr.disable()
    st = pstats.Stats(pr, stream=io.StringIO()); total = st.total_tt
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [dict(function=f"{Path(f).name}:{line}({fn})", calls=nc, own_s=round(tt, 3), cum_s=round(ct, 3),
                 own_share=round(tt / total, 3)) for (f, line, fn), (cc, nc, tt, ct, _) in rows]


# ---------------------------------------------------------------------------------------------- 4. HTTP

def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def start_server(cmd: list[str], port: int, log_path: Path, timeout: float = 300) -> subprocess.Popen:
    "Start a shop server on loopback and wait until /api/health answers."
    import httpx
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log_path, 'w'), stderr=subprocess.STDOUT)
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None: raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f'http://127.0.0.1:{port}/api/health', timeout=2).json().get('ok'): return proc
        except (httpx.HTTPError, ValueError): pass
        time.sleep(0.5)
    stop_server(proc); raise TimeoutError(f"server not healthy after {timeout}s; see {log_path}")

def stop_server(proc: subprocess.Popen):
    if proc.poll() is None:
        proc.terminate()
        try: proc.wait(20)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()

def drive_http(url: str, episodes: list[tuple[int, list[str]]], clients: int, seconds: float, max_steps: int,
               warmup_s: float, server_pid: int) -> dict:
    """`clients` threads, each looping: reset a task, replay its actions, release. Steps (interact calls) finished
    within the measured window count; the window is `seconds` long or ends at `max_steps`, after `warmup_s`."""
    import httpx
    from shopping_grpo.server import ShopClient, ShopError
    stop, measuring = threading.Event(), threading.Event()
    steps, eps, errors, lat = [0]*clients, [0]*clients, [0]*clients, [[] for _ in range(clients)]

    def worker(k: int):
        c, i = ShopClient(url, timeout=120), k
        try:
            while not stop.is_set():
                idx, acts = episodes[i % len(episodes)]; i += clients
                try: env = c.reset(idx)['env_idx']
                except (ShopError, httpx.HTTPError): errors[k] += 1; time.sleep(0.1); continue
                try:
                    for a in acts:
                        t = time.perf_counter(); r = c.interact(env, a); dt = time.perf_counter() - t
                        if measuring.is_set(): steps[k] += 1; lat[k].append(dt * 1e3)
                        if r['done'] or stop.is_set(): break
                    else: errors[k] += 1                      # every recorded oracle episode ends the episode
                    if measuring.is_set(): eps[k] += 1
                except (ShopError, httpx.HTTPError): errors[k] += 1
                finally:
                    try: c.release(env)
                    except (ShopError, httpx.HTTPError): errors[k] += 1
        finally: c.http.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(clients)]
    for t in threads: t.start()
    time.sleep(warmup_s)
    cpu0, self0, meter = cpu_seconds(server_pid), cpu_seconds(os.getpid()), CpuMeter([server_pid])
    measuring.set(); t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and sum(steps) < max_steps: time.sleep(0.05)
    measuring.clear(); dt = time.perf_counter() - t0; cpu = meter.stop()
    cpu1, self1 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
    n = sum(steps); stop.set()
    for t in threads: t.join(60)
    return dict(clients=clients, seconds=round(dt, 2), steps=n, steps_per_s=round(n / dt, 1), episodes=sum(eps),
                errors=sum(errors), step_latency=latency_stats([x for l in lat for x in l]) if n else None,
                server_cpu_util=round((cpu1 - cpu0) / dt, 2), server_cpu_ms_per_step=round(1e3 * (cpu1 - cpu0) / max(1, n), 3),
                client_cpu_ms_per_step=round(1e3 * (self1 - self0) / max(1, n), 3), client_cpu_util=round((self1 - self0) / dt, 2), cpu=cpu)

def bench_http(args, shop_dir: Path, n: int, shop: Shop, actions: dict) -> dict:
    "HTTP steps/s of `shopping-grpo serve-env` (ours) and of the same app over the FTS5 baseline."
    import httpx
    want = [t.task_id for t in shop.tasks['eval']]
    cmds = dict(ours=[str(Path(sys.executable).parent/'shopping-grpo'), 'serve-env'],
                fts5=[sys.executable, str(HERE/'fts5_server.py')])
    out = {}
    for name in ENGINES:
        port = free_port()
        cmd = cmds[name] + ['--host', '127.0.0.1', '--port', str(port), '--run', str(shop_dir), '--n-products', str(n), '--seed', str(args.seed)]
        t0 = time.time(); proc = start_server(cmd, port, args.run_root/f'server-{name}.log'); startup = time.time() - t0
        try:
            served = [t['task_id'] for t in httpx.get(f'http://127.0.0.1:{port}/api/tasks', timeout=30).json()['tasks']]
            if served != want: raise RuntimeError(f"the {name} server serves other eval tasks than the benchmark's shop")
            episodes = list(enumerate(actions[name]))        # (eval index, the oracle's actions with this engine)
            out[name] = dict(drive_http(f'http://127.0.0.1:{port}', episodes, args.clients, args.http_seconds,
                                        args.http_max_steps, args.http_warmup, proc.pid), startup_s=round(startup, 1))
        finally: stop_server(proc)
        r = out[name]
        log(f"  http {name:>4}: {r['steps_per_s']:,.0f} steps/s with {r['clients']} clients, step p50 {r['step_latency']['p50_ms']:.1f} ms "
            f"p99 {r['step_latency']['p99_ms']:.1f} ms, server CPU {r['server_cpu_util']:.2f} cores, errors {r['errors']}{busy_note(r['cpu'])}")
    out['ratio_ours_over_fts5'] = ratio(out['ours']['steps_per_s'], out['fts5']['steps_per_s'])
    return out


# ---------------------------------------------------------------------------------------------- report

def table(res: dict) -> str:
    "The figures as a Markdown table."
    f = lambda x, d=1: '-' if x is None else f"{x:,.{d}f}"
    rows = ["| figure | ours (tantivy) | baseline (SQLite FTS5) | ours, x faster |", "|---|---:|---:|---:|"]
    for n, b in res['build'].items():
        note = ' (cached build)' if b.get('cached') else ''
        rows.append(f"| build {int(n):,}: catalog (en) + index, s{note} | {f(b['catalog_s'])} + {f(b['index_s'])} = {f(b['catalog_plus_index_s'])} "
                    f"| {f(b['catalog_s'])} + {f(b['fts5_index_s'])} | {f(ratio(b['fts5_index_s'], b['index_s']), 2)} (index) |")
        if 'catalog_cpu_s' in b:
            rows.append(f"| build {int(n):,}: CPU s, catalog + index | {f(b['catalog_cpu_s'])} + {f(b['index_cpu_s'])} | | |")
    for n, s in res['search'].items():
        for p, what in (('p50', 'p50 ms'), ('p99', 'p99 ms'), ('cpu_p99', 'p99 CPU-time ms')):
            rows.append(f"| search {int(n):,}: {what} | {f(s['ours'][p + '_ms'], 2)} | {f(s['fts5'][p + '_ms'], 2)} "
                        f"| {f(ratio(s['fts5'][p + '_ms'], s['ours'][p + '_ms']))} |")
        rows.append(f"| search {int(n):,}: share of top 20 both engines return | {s['overlap_top20']:.2f} | | |")
    for n, e in res['env'].items():
        rows.append(f"| env in-process {int(n):,}: steps/s | {f(e['ours']['steps_per_s'], 0)} | {f(e['fts5']['steps_per_s'], 0)} "
                    f"| {f(e['ratio_ours_over_fts5'], 2)} |")
        rows.append(f"| env in-process {int(n):,}: CPU ms per step | {f(e['ours']['cpu_ms_per_step'], 3)} | {f(e['fts5']['cpu_ms_per_step'], 3)} "
                    f"| {f(ratio(e['fts5']['cpu_ms_per_step'], e['ours']['cpu_ms_per_step']), 2)} |")
    if h := res.get('http'):
        rows.append(f"| HTTP {int(h['n_products']):,}, {h['ours']['clients']} clients: steps/s | {f(h['ours']['steps_per_s'], 0)} "
                    f"| {f(h['fts5']['steps_per_s'], 0)} | {f(h['ratio_ours_over_fts5'], 2)} |")
        rows.append(f"| HTTP {int(h['n_products']):,}: server CPU ms per step | {f(h['ours']['server_cpu_ms_per_step'], 3)} "
                    f"| {f(h['fts5']['server_cpu_ms_per_step'], 3)} | {f(ratio(h['fts5']['server_cpu_ms_per_step'], h['ours']['server_cpu_ms_per_step']), 2)} |")
    g = {k: {True: 'met', False: 'NOT met', None: 'not measured'}[v] for k, v in res['goals'].items()}
    rows += ['', f"Goals: build 20k < 60 s: **{g['build_20k_under_60s']}**; ours p99 <= 20 ms at 1M: **{g['search_p99_1m_at_most_20ms']}**. "
             f"Run took {res['runtime_s']:.0f} s on {res['machine']['cpu_count']} CPUs ({res['machine']['cpu_model']}), {res['finished_at']}; "
             f"other processes used up to {res['contention']['max_other_cores']:.1f} cores during a measured window; "
             f"code {res['machine']['git_commit']}{' + local changes' if res['machine']['library_modified'] else ''}."]
    if res.get('library_changed_during_run'): rows.append("\n**The library's source changed during this run: the figures mix code versions.**")
    return '\n'.join(rows)

def walk(d: dict, path: str = ''):
    "(path, dict) of every dict nested in `d` that has a 'cpu' entry."
    for k, v in d.items():
        if isinstance(v, dict):
            if 'cpu' in v: yield f"{path}/{k}/cpu", v
            yield from walk(v, f"{path}/{k}")

def update_readme(text: str):
    "Put the latest figures between the markers of benchmarks/README.md, if it has them."
    p = HERE/'README.md'
    if not p.exists(): return
    s = p.read_text()
    if README_START in s and README_END in s:
        head, rest = s.split(README_START, 1); tail = rest.split(README_END, 1)[1]
        p.write_text(f"{head}{README_START}\n{text}\n{README_END}{tail}")


# ---------------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--sizes', default='20000,1000000', help='catalog sizes for build and search, comma-separated')
    ap.add_argument('--queries', type=int, default=300, help='search queries per size and engine')
    ap.add_argument('--out', default=DEFAULT_OUT, help='results JSON (the README figures are updated only for this default)')
    ap.add_argument('--run-root', default='outputs/bench', help='catalogs, indexes and the shop live (and are cached) here')
    ap.add_argument('--shop-size', type=int, default=20_000, help='catalog size of the shop whose tasks drive env and HTTP')
    ap.add_argument('--seed', type=int, default=0, help='catalog seed (tasks use task_seed 1, as serve-env does)')
    ap.add_argument('--cold-max', type=int, default=100_000, help='sizes up to this are rebuilt cold on every run; larger ones are cached')
    ap.add_argument('--rebuild', action='store_true', help='rebuild every size, cached or not')
    ap.add_argument('--warmup', type=int, default=20, help='untimed warm-up queries / episodes per engine')
    ap.add_argument('--env-rounds', type=int, default=3, help='timed passes over the eval tasks per engine (median reported)')
    ap.add_argument('--env-seconds-large', type=float, default=60.0,
                    help='at sizes other than the shop\'s: one pass per engine, cut after this many seconds')
    ap.add_argument('--clients', type=int, default=32, help='concurrent HTTP clients')
    ap.add_argument('--http-seconds', type=float, default=20.0, help='measured HTTP window per engine')
    ap.add_argument('--http-warmup', type=float, default=3.0, help='seconds of HTTP load before the window opens')
    ap.add_argument('--http-max-steps', type=int, default=200_000, help='end the HTTP window early after this many steps')
    ap.add_argument('--no-http', action='store_true', help='skip the HTTP benchmark')
    ap.add_argument('--no-profile', action='store_true', help='skip the cProfile of in-process env steps')
    ap.add_argument('--build-worker', type=int, help=argparse.SUPPRESS)   # internal: cold build of one size
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(',')]
    args.run_root, args.out = [p if p.is_absolute() else ROOT/p for p in (Path(args.run_root), Path(args.out))]
    return args

def main(argv=None):
    args = parse_args(argv)
    if args.build_worker:
        return build_worker(args.build_worker, args.seed, args.run_root/f'catalog-{args.build_worker}',
                            args.run_root/f'catalog-{args.build_worker}'/'build_times.json')
    t_start = time.time(); args.run_root.mkdir(parents=True, exist_ok=True)
    res = dict(benchmark='shop_speed', version=1, started_at=datetime.now(timezone.utc).isoformat(timespec='seconds'),
               machine=machine_info(), config={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != 'build_worker'},
               build={}, search={}, env={})
    log(f"machine: {res['machine']['cpu_count']} CPUs, {res['machine']['mem_gib']} GiB, python {res['machine']['python']}")

    # 1. build: each size cold in a child process (or its cached build)
    for n in args.sizes: res['build'][str(n)] = ensure_built(n, args)

    # the shop whose tasks drive queries, env and HTTP: exactly what `serve-env` loads (both languages, default task sizes)
    shop_dir = args.run_root/f'shop-{args.shop_size}'; fresh = not (shop_dir/'catalog'/'manifest.json').exists()
    t = time.perf_counter()
    shop = prepare_shop(shop_dir, args.shop_size, args.seed, task_seed=1, lang='en', sizes=DEFAULT_SIZES, progress=False)
    shop_fts5 = FTS5Index(build_fts5(shop.catalog, fts5_path(shop_dir/'catalog', shop.catalog.sha256)))
    res['shop'] = dict(n_products=args.shop_size, dir=str(shop_dir), prepare_s=round(time.perf_counter() - t, 2), reused=not fresh,
                       eval_tasks=len(shop.tasks['eval']))
    log(f"shop {args.shop_size:,}: {'reused' if not fresh else 'prepared'} in {res['shop']['prepare_s']:.1f}s")
    queries = make_queries(shop, args.queries, args.seed)
    res['queries'] = dict(n=len(queries), mix=QUERY_MIX, examples=[q for _, q in queries[:8]])

    # 2. search latency per size, and 3. env steps/s at sizes other than the shop's (on the same catalog, while loaded)
    for n in args.sizes:
        d = args.run_root/f'catalog-{n}'; t = time.perf_counter()
        cat = Catalog.load(d, 'en'); index = dict(ours=SearchIndex(cat, d/'index'), fts5=FTS5Index(fts5_path(d, cat.sha256)))
        log(f"search {n:,}: loaded catalog and both indexes in {time.perf_counter() - t:.1f}s (RSS {rss_mb():,.0f} MB)")
        res['search'][str(n)] = dict(bench_search(n, index, queries, args.warmup), load_s=round(time.perf_counter() - t, 2))
        if n != args.shop_size:
            # the catalog of a seed is a prefix of every larger one, so the shop's eval targets exist here too
            tasks = [x for x in shop.tasks['eval'] if x.facts.target_asin in cat]
            big = Shop(cat, index['ours'], dict(eval=tasks))
            res['env'][str(n)], _ = bench_env(big, index, tasks, 1, min(args.warmup, 5), f'{n:,}', args.env_seconds_large)
            del big
        del cat, index; Catalog.product.cache_clear(); gc.collect()   # the lru_cache on Catalog.product holds the catalog

    # 3. env steps/s in-process on the shop, and the oracle's actions for the HTTP replay
    log(f"env {args.shop_size:,}: {len(shop.tasks['eval'])} oracle episodes x {args.env_rounds} rounds per engine ...")
    res['env'][str(args.shop_size)], actions = bench_env(shop, dict(ours=shop.index, fts5=shop_fts5), shop.tasks['eval'],
                                                         args.env_rounds, args.warmup, f'{args.shop_size:,}')
    if not args.no_profile:
        res['env_profile'] = profile_env(shop, shop.tasks['eval'])
        log("  env profile (own time): " + ', '.join(f"{p['function']} {100 * p['own_share']:.0f}%" for p in res['env_profile'][:6]))

    # 4. HTTP
    if not args.no_http:
        log(f"http {args.shop_size:,}: {args.clients} clients, {args.http_seconds:.0f}s per engine ...")
        res['http'] = dict(bench_http(args, shop_dir, args.shop_size, shop, actions), n_products=args.shop_size)

    # 5. results
    b20, s1m = res['build'].get('20000'), res['search'].get('1000000')
    res['goals'] = dict(build_20k_under_60s=b20['catalog_plus_index_s'] < 60 if b20 else None,
                        search_p99_1m_at_most_20ms=s1m['ours']['p99_ms'] <= 20 if s1m else None)
    windows = [(k, v['cpu']) for k, v in walk(res) if not v.get('cached')]   # this run's windows (not a cached build's)
    res['contention'] = dict(max_other_cores=max(c['other_cores'] for _, c in windows), max_steal_cores=max(c['steal_cores'] for _, c in windows),
                             loadavg_end=os.getloadavg())
    if (h := library_hash()) != res['machine']['library_hash']:
        res['library_changed_during_run'] = h
        log(f"WARNING: the library's source changed during the run ({res['machine']['library_hash']} -> {h}); "
            "the HTTP servers may have run newer code than the in-process stages. Rerun for consistent figures.")
    res['peak_rss_mb'] = peak_rss_mb(); res['runtime_s'] = round(time.time() - t_start, 1)
    res['finished_at'] = datetime.now(timezone.utc).isoformat(timespec='seconds')
    args.out.parent.mkdir(parents=True, exist_ok=True); write_atomic(args.out, json.dumps(res, indent=1))
    text = table(res)
    if args.out == ROOT/DEFAULT_OUT: update_readme(text)   # only runs that write the official results update the README
    print('\n' + text + f"\n\nresults: {args.out}")

if __name__ == '__main__':
    main()
