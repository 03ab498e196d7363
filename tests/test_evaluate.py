"""Evaluation (07_evaluate): a kill -9 mid-evaluation loses and duplicates no task, corrupt and torn lines are named,
counted and played again, a changed benchmark file stops an evaluation before it writes anything, and an endpoint that
is down leaves every task counted as not judged and the run resumable."""
from __future__ import annotations
from collections import Counter
import http.server, json, os, signal, subprocess, sys, threading, time, warnings
import pytest

from shopping_grpo.tasks import write_tasks
from shopping_grpo.model import free_port
from shopping_grpo.evaluate import evaluate_model, benchmark_tasks, task_strata, write_summary, BenchmarkMismatch, compare, check_no_retries
from _helpers import N_PRODUCTS, SEED, TASK_SEED, LANG, SIZES

WORKER = f'''
import sys, time
from shopping_grpo.shop import prepare_shop
from shopping_grpo.shoppers import OracleShopper
from shopping_grpo.policies import ShopperPolicy
from shopping_grpo.evaluate import evaluate_model
run, out, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
shop = prepare_shop(run, {N_PRODUCTS}, {SEED}, {TASK_SEED}, {LANG!r}, sizes={SIZES!r}, progress=False)
class Slow:
    name = 'oracle'
    def __init__(self): self.inner = ShopperPolicy(OracleShopper(shop.catalog))
    def fork(self): return Slow()
    def reset(self, task): self.inner.reset(task)
    def reply(self, ep): time.sleep(delay); return self.inner.reply(ep)
evaluate_model(shop, Slow(), out, workers=4, progress=False)
'''


def n_lines(path) -> int: return path.read_bytes().count(b'\n') if path.exists() else 0

def task_ids(path) -> list[str]:
    "Task ids of the readable lines of a trajectories file, in file order."
    out = []
    for line in path.read_bytes().split(b'\n'):
        try: out.append(json.loads(line)['task_id'])
        except ValueError: pass
    return out

def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob('*')) if p.is_file()}


def test_kill_9_mid_evaluation_then_resume(shop, shop_dir, tmp_path):
    "SIGKILL a real evaluation mid-run, tear its last write, rerun: every benchmark task exactly once, figures as a clean run."
    out = tmp_path/'run'; path = out/'eval'/'oracle'/'trajectories.jsonl'; ev = shop.tasks['eval']
    p = subprocess.Popen([sys.executable, '-c', WORKER, str(shop_dir), str(out), '0.03'], stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and n_lines(path) < 8 and p.poll() is None: time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL); p.wait()
    assert p.returncode == -signal.SIGKILL, p.stderr.read().decode()[-2000:]
    killed_at = n_lines(path); assert 8 <= killed_at < len(ev), killed_at  # it died mid-run
    assert not (out/'eval'/'oracle'/'summary.json').exists()
    written = path.read_bytes(); written = written[:written.rfind(b'\n') + 1]
    todo = next(t for t in ev if t.task_id not in task_ids(path))
    with open(path, 'ab') as f: f.write(f'{{"version": 2, "task_id": "{todo.task_id}", "policy": "oracle", "messages": [{{"role": "sys'.encode())
    r = subprocess.run([sys.executable, '-c', WORKER, str(shop_dir), str(out), '0'], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert sorted(task_ids(path)) == sorted(t.task_id for t in ev) and n_lines(path) == len(ev)  # none lost, none twice
    assert path.read_bytes().startswith(written) and (path.parent/'trajectories.jsonl.torn').exists()
    s = json.loads((out/'eval'/'oracle'/'summary.json').read_text())
    assert s['status'] == {'ok': len(ev)} and s['figures']['strict_success'] == 1.0 and s['records']['corrupt'] == s['records']['torn'] == []
    clean = evaluate_model(shop, 'oracle', tmp_path/'clean', progress=False)
    assert {k: v for k, v in clean['figures'].items()} == s['figures']


def test_corrupt_middle_and_torn_last_line(shop, tmp_path):
    "Both broken tasks are named in a warning, counted as failures in the denominator, then played again; the corrupt line is kept."
    s0 = evaluate_model(shop, 'oracle', tmp_path, 10, progress=False)
    assert s0['figures']['strict_success'] == 1.0
    d = tmp_path/'eval'/'oracle'; path = d/'trajectories.jsonl'; lines = path.read_text().splitlines()
    third, tenth = json.loads(lines[2])['task_id'], json.loads(lines[9])['task_id']
    path.write_text('\n'.join(lines[:2] + [lines[2][:150]] + lines[3:9]) + '\n' + lines[9][:200])
    tasks, ident = benchmark_tasks(shop, 10)
    with pytest.warns(UserWarning) as w: s = write_summary(d, tasks, ident, task_strata(shop, tasks))
    msgs = ' | '.join(str(x.message) for x in w)
    assert f'trajectories.jsonl:3: corrupt line, task {third}' in msgs and f'trajectories.jsonl:10: torn last line (a write that did not finish), task {tenth}' in msgs
    assert (s['status'], s['figures']['n_tasks'], s['figures']['n_episodes'], s['figures']['strict_success']) == ({'ok': 8, 'corrupt': 2}, 10, 8, 0.8)
    assert s['figures']['corrupt'] == 2 and s['records']['corrupt'] == [dict(line=3, task_id=third)] and s['records']['torn'] == [dict(line=10, task_id=tenth)]
    checks = [json.loads(l) for l in (d/'checks.jsonl').read_text().splitlines()]
    assert [c['task_id'] for c in checks] == [t.task_id for t in tasks] and {c['task_id'] for c in checks if c['status'] == 'corrupt'} == {third, tenth}
    with warnings.catch_warnings(): warnings.simplefilter('ignore'); s2 = evaluate_model(shop, 'oracle', tmp_path, 10, progress=False)
    assert s2['status'] == {'ok': 10} and s2['figures']['strict_success'] == 1.0
    assert sorted(task_ids(path)) == sorted(t.task_id for t in tasks)  # each task once among the readable lines
    assert path.read_text().splitlines()[2] == lines[2][:150] and (d/'trajectories.jsonl.torn').read_text() == lines[9][:200] + '\n'
    assert len(s2['records']['corrupt']) == 1 and s2['records']['torn'] == []


def test_changed_benchmark_refuses_and_writes_nothing(shop, tmp_path):
    data = tmp_path/'data'; h = write_tasks(data/'benchmark_en.jsonl', shop.tasks['eval'], shop.catalog)
    (data/'benchmark.sha256').write_text(json.dumps({'benchmark_en.jsonl': h}))
    run = tmp_path/'run'; s = evaluate_model(shop, 'oracle', run, 5, data=data, progress=False)
    assert (s['benchmark']['source'], s['benchmark']['benchmark_sha256'], s['benchmark_sha256']) == ('frozen', h, h)
    before = snapshot(run)
    text = (data/'benchmark_en.jsonl').read_text(); (data/'benchmark_en.jsonl').write_text(text.replace('"eval"', '"eval" ', 1))
    for model in ('oracle', 'random'):
        with pytest.raises(BenchmarkMismatch, match=r'benchmark_en\.jsonl has SHA-256 \w+, but .*benchmark\.sha256 records \w+: the frozen benchmark was changed'):
            evaluate_model(shop, model, run, 5, data=data, progress=False)
    assert snapshot(run) == before and not (run/'eval'/'random').exists()
    (data/'benchmark_en.jsonl').write_text(text)  # restored: evaluation goes on
    assert evaluate_model(shop, 'random', run, 5, data=data, progress=False)['figures']['n_tasks'] == 5


def test_one_summary_is_the_records(shop, tmp_path):
    "summary.json is written once, as returned; its figures are those recomputed by hand from the records, over all tasks."
    s = evaluate_model(shop, 'heuristic', tmp_path, 12, play=9, progress=False)  # 3 tasks not played: missing, still counted
    d = tmp_path/'eval'/'heuristic'
    recs, n = [json.loads(l) for l in (d/'trajectories.jsonl').read_text().splitlines()], 12
    assert {k: v for k, v in s.items() if k != 'wall_seconds'} == json.loads((d/'summary.json').read_text())
    assert (s['n_tasks'], s['figures']['n_tasks'], s['n_episodes'], s['figures']['n_episodes'], len(recs)) == (n, n, 9, 9, 9)
    for k in ('strict_success', 'purchase_success'): assert s[k] == s['figures'][k] == round(sum(r[k] for r in recs) / n, 4)
    assert s['done_rate'] == s['figures']['done_rate'] == round(sum(r['termination_reason'] in ('purchase', 'finish') for r in recs) / n, 4)
    assert s['mean_reward'] == round(sum(r['reward'] for r in recs) / n, 4) and abs(s['figures']['mean_reward'] - s['mean_reward']) < 1e-9
    assert s['mean_steps'] == round(sum(r['n_steps'] for r in recs) / len(recs), 2)
    assert s['outcomes'] == dict(Counter(r['reward_detail']['outcome'] for r in recs)) and s['status'] == {'ok': 9, 'missing': 3}
    calls = sum((Counter(r['tool_counts']) for r in recs), Counter())
    assert s['tool_mix'] == {k: round(v / sum(calls.values()), 4) for k, v in calls.items()}
    strata = {t.task_id: t.stratum for t in shop.tasks['eval'][:n]}
    assert s['by_stratum'] == {k: round(sum(r['strict_success'] for r in recs if strata[r['task_id']] == k) / list(strata.values()).count(k), 4)
                               for k in sorted(set(strata.values()))}
    assert (s['model'], s['policy']['kind'], s['config']['max_turns'], s['benchmark']['n_tasks'], len(s['task_ids'])) == ('heuristic', 'heuristic', 35, n, n)


class Prose(http.server.BaseHTTPRequestHandler):
    "An OpenAI-compatible chat endpoint that answers every request with prose (no tool call)."
    def log_message(self, *a): pass
    def do_GET(self): self._send({'object': 'list', 'data': [{'id': 'fake', 'object': 'model'}]})
    def do_POST(self):
        self.rfile.read(int(self.headers['Content-Length']))
        self._send(dict(id='x', object='chat.completion', created=0, model='fake', usage=dict(prompt_tokens=1, completion_tokens=1, total_tokens=2),
                        choices=[dict(index=0, message=dict(role='assistant', content='I would like to help.'), finish_reason='stop')]))
    def _send(self, obj):
        body = json.dumps(obj).encode(); self.send_response(200); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)


def test_endpoint_down_counted_then_resumed(shop, tmp_path, monkeypatch):
    "Every task of an endpoint that is down is recorded as not judged and stays in the denominator; the next run plays them again."
    port = free_port()  # nothing listens here yet
    monkeypatch.setenv('EVAL_TEST_KEY', 'sk-test-not-to-be-written')
    spec = dict(name='remote', kind='openai', path='fake', base_url=f'http://127.0.0.1:{port}/v1', api_key_env='EVAL_TEST_KEY', max_retries=0, timeout=2)
    with pytest.warns(UserWarning, match=rf'http://127.0.0.1:{port}/v1 does not answer'):
        s = evaluate_model(shop, spec, tmp_path, 6, max_turns=3, workers=3, progress=False)
    f = s['figures']
    assert (s['status'], f['n_tasks'], f['n_episodes'], f['not_judged'], f['strict_success'], f['mean_reward']) == ({'not_judged': 6}, 6, 6, 6, 0.0, 0.0)
    path = tmp_path/'eval'/'remote'/'trajectories.jsonl'
    assert [json.loads(l)['termination_reason'] for l in path.read_text().splitlines()] == ['generation_error'] * 6
    with pytest.raises(RuntimeError, match=r'6 of remote \(first: generation_error: .*\). Run the stage again'): check_no_retries(tmp_path, ['remote'])
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', port), Prose); srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.warns(UserWarning, match=r'6 episode\(s\) ended by an infrastructure failure are played again'):
            s2 = evaluate_model(shop, spec, tmp_path, 6, max_turns=3, workers=3, progress=False)
    finally: srv.shutdown(); srv.server_close()
    assert s2['status'] == {'ok': 6} and s2['figures']['malformed_per_episode'] == 3.0
    assert sorted(task_ids(path)) == [t.task_id for t in shop.tasks['eval'][:6]] and n_lines(path) == 6
    assert [json.loads(l)['termination_reason'] for l in (path.parent/'trajectories.retried.jsonl').read_text().splitlines()] == ['generation_error'] * 6
    assert check_no_retries(tmp_path, ['remote']) == 1  # the stage may now be recorded
    assert not any(b'sk-test-not-to-be-written' in v for v in snapshot(tmp_path).values())  # the key is never written


def test_compare_pairs_only_like_with_like(shop, tmp_path):
    evaluate_model(shop, 'oracle', tmp_path, 12, progress=False); evaluate_model(shop, 'heuristic', tmp_path, 12, progress=False)
    c = compare(tmp_path/'eval'/'oracle', tmp_path/'eval'/'heuristic')
    h = json.loads((tmp_path/'eval'/'heuristic'/'summary.json').read_text())['figures']['strict_success']
    assert c['won'] + c['tied'] == 12 and c['lost'] == 0 and abs(c['diff'] - (1 - h)) < 1e-9 and c['ci_low'] <= c['diff'] <= c['ci_high']
    assert c == compare(tmp_path/'eval'/'oracle', tmp_path/'eval'/'heuristic')  # fixed seed: the same numbers
    evaluate_model(shop, 'random', tmp_path/'other', 11, progress=False)
    with pytest.raises(ValueError, match=r'different task lists \(12 vs 11 tasks\)'): compare(tmp_path/'eval'/'oracle', tmp_path/'other'/'eval'/'random')


@pytest.mark.slow
def test_vllm_spec_end_to_end(shop, tmp_path):
    "A `vllm:` spec serves the embedded model with vLLM (CPU build on CPU machines), plays through its endpoint, and stops the server."
    from shopping_grpo.model import vllm_python
    if not vllm_python().exists(): pytest.skip('no vLLM venv: make vllm-env')
    s = evaluate_model(shop, 'base=vllm:smollm2', tmp_path, 2, max_turns=2, workers=2, max_new_tokens=32, progress=False)
    assert (s['figures']['n_tasks'], s['figures']['n_episodes'], s['policy']['kind'], s['config']['max_new_tokens']) == (2, 2, 'vllm', 32)
    assert s['status'].get('not_judged', 0) == 0  # the server answered every turn
    recs = [json.loads(l) for l in (tmp_path/'eval'/'base'/'trajectories.jsonl').read_text().splitlines()]
    assert all(r['n_turns'] == 2 or r['termination_reason'] in ('purchase', 'finish', 'repeat_loop', 'no_progress') for r in recs)
