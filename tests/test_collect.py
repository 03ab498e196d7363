"""Teacher collection (04_collect): a kill -9 mid-run loses and duplicates nothing, the accepted set does not depend on
concurrency or interruptions, bad trajectory files are refused with file and line, a failing teacher endpoint is counted
and rejected without stopping the run, and an authentication failure stops it keeping what was written."""
from __future__ import annotations
import dataclasses, http.server, json, os, random, signal, subprocess, sys, threading, time, types
import pytest

from shopping_grpo.policies import ExpertPolicy, OpenAIChatPolicy
from shopping_grpo.episode import run_message_episode
from shopping_grpo.collect import (collect, load_trajectories, split_accepted, write_sft_split, check_disjoint, rejection)
from _helpers import N_PRODUCTS, SEED, TASK_SEED, LANG, SIZES

WORKER = f'''
import sys, time
from shopping_grpo.shop import prepare_shop
from shopping_grpo.policies import ExpertPolicy
from shopping_grpo.collect import collect
run, out, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
shop = prepare_shop(run, {N_PRODUCTS}, {SEED}, {TASK_SEED}, {LANG!r}, sizes={SIZES!r}, progress=False)
class Slow:
    name = 'expert'
    def __init__(self): self.inner = ExpertPolicy(shop.catalog)
    def fork(self): return Slow()
    def reset(self, task): self.inner.reset(task)
    def reply(self, ep): time.sleep(delay); return self.inner.reply(ep)
collect(shop, shop.tasks['sft'], Slow(), out, workers=4, progress=False, lang={LANG!r})
'''


def n_lines(path) -> int: return path.read_bytes().count(b'\n') if path.exists() else 0


def test_kill_9_mid_run_then_resume(shop, shop_dir, tmp_path):
    "SIGKILL a real collection process mid-run, tear its last write, rerun: every task once, accepted set as a clean run."
    out = tmp_path/'killed'; raw = out/'raw.jsonl'; sft = shop.tasks['sft']
    p = subprocess.Popen([sys.executable, '-c', WORKER, str(shop_dir), str(out), '0.03'], stderr=subprocess.PIPE)
    deadline = time.time() + 40
    while time.time() < deadline and n_lines(raw) < 8 and p.poll() is None: time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL); p.wait()
    assert p.returncode == -signal.SIGKILL, p.stderr.read().decode()[-2000:]
    killed_at = n_lines(raw); assert 8 <= killed_at < len(sft), killed_at  # it really died mid-run
    assert not (out/'accepted.jsonl').exists(); written = raw.read_bytes(); written = written[:written.rfind(b'\n') + 1]  # whole lines
    # an interrupted write of a task that had not finished: half a record, no newline
    have = {r['task_id'] for r in load_trajectories(raw, sft, torn_ok=True)}
    todo = next(t for t in sft if t.task_id not in have)
    with open(raw, 'ab') as f: f.write(json.dumps(run_message_episode(shop, todo, ExpertPolicy(shop.catalog), LANG)).encode()[:300])
    with pytest.raises(ValueError, match=r'raw.jsonl:\d+: torn last line'): load_trajectories(raw, sft)

    r = subprocess.run([sys.executable, '-c', WORKER, str(shop_dir), str(out), '0'], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    recs = load_trajectories(raw, sft)  # refuses duplicates and torn lines
    assert sorted(x['task_id'] for x in recs) == sorted(t.task_id for t in sft)
    assert n_lines(raw) == len(sft) and (out/'raw.jsonl.torn').exists()
    assert raw.read_bytes().startswith(written)  # what was written before the kill is kept as it was

    clean = collect(shop, sft, ExpertPolicy(shop.catalog), tmp_path/'clean', workers=1, progress=False, lang=LANG)
    audit = json.loads((out/'audit.json').read_text())
    ids = lambda d: [x['task_id'] for x in load_trajectories(d/'accepted.jsonl', sft)]
    assert ids(out) == ids(tmp_path/'clean') and len(ids(out)) == clean['n_accepted'] > 0
    assert audit['sha256']['accepted_content'] == clean['sha256']['accepted_content']
    assert audit['n_raw'] == audit['n_considered'] == len(sft)


class Flaky:
    "The expert, except: prose only on every third task, a timeout on every fifth, random slowness everywhere."
    def __init__(self, catalog, name='flaky'): self.catalog, self.name, self.inner = catalog, name, ExpertPolicy(catalog)
    def fork(self): return type(self)(self.catalog, self.name)
    def reset(self, task): self.inner.reset(task); self.n = int(task.task_id.split('-')[-1])
    def reply(self, ep):
        time.sleep(random.random()*0.004)
        if self.n % 5 == 4: raise TimeoutError('the endpoint timed out')
        return 'Let me think about it.' if self.n % 3 == 2 else self.inner.reply(ep)


def test_failing_teacher_is_counted_and_rejected(shop, tmp_path):
    ts = shop.tasks['sft'][:15]
    a = collect(shop, ts, Flaky(shop.catalog), tmp_path, workers=3, progress=False, lang=LANG)
    fine = [t for t in ts if int(t.task_id[-5:]) % 5 != 4 and int(t.task_id[-5:]) % 3 != 2]  # the expert's own result decides these
    expert_ok = sum(rejection(run_message_episode(shop, t, ExpertPolicy(shop.catalog), LANG)) is None for t in fine)
    assert (a['n_raw'], a['n_considered'], a['n_accepted']) == (15, 15, expert_ok)
    assert (a['rejections']['flag:no_call'], a['rejections']['infrastructure:generation_error']) == (4, 3)
    assert sum(a['rejections'].values()) == 15 - expert_ok
    assert a['infrastructure_invalid'] == 3 and a['flags']['policy_error'] == 3
    acc = load_trajectories(tmp_path/'accepted.jsonl', shop.tasks['sft'])
    assert all(rejection(r) is None and r['strict_success'] for r in acc)


def test_accepted_set_independent_of_concurrency(shop, tmp_path):
    sft = shop.tasks['sft']
    runs = [collect(shop, sft, Flaky(shop.catalog), tmp_path/f'w{w}', workers=w, target_accepted=20, progress=False, lang=LANG) for w in (1, 3, 8)]
    assert len({a['sha256']['accepted_content'] for a in runs}) == 1
    assert {(a['n_considered'], a['n_accepted'], a['target_reached']) for a in runs} == {(runs[0]['n_considered'], 20, True)}
    assert all(a['n_raw'] >= a['n_considered'] for a in runs)
    # a rerun with a larger target continues from raw.jsonl and extends the same prefix
    more = collect(shop, sft, Flaky(shop.catalog), tmp_path/'w3', workers=3, target_accepted=25, progress=False, lang=LANG)
    first = [r['task_id'] for r in load_trajectories(tmp_path/'w1'/'accepted.jsonl')]
    assert [r['task_id'] for r in load_trajectories(tmp_path/'w3'/'accepted.jsonl')][:20] == first and more['n_accepted'] == 25


def test_bad_trajectory_files(shop, tmp_path):
    sft = shop.tasks['sft']; rec = run_message_episode(shop, sft[0], ExpertPolicy(shop.catalog), LANG)
    line = json.dumps(rec) + '\n'
    (tmp_path/'torn.jsonl').write_text(line + line.replace(sft[0].task_id, sft[1].task_id)[:120])
    with pytest.raises(ValueError, match=r'torn\.jsonl:2: torn last line'): load_trajectories(tmp_path/'torn.jsonl', sft)
    (tmp_path/'v7.jsonl').write_text(line + json.dumps({**rec, 'task_id': sft[1].task_id, 'version': 7}) + '\n')
    with pytest.raises(ValueError, match=r'v7\.jsonl:2: trajectory version 7'): load_trajectories(tmp_path/'v7.jsonl')
    with pytest.raises(ValueError, match=r"v7\.jsonl:1: task 'sft-00000' is not in the task list"): load_trajectories(tmp_path/'v7.jsonl', shop.tasks['eval'])
    # collect refuses such a raw.jsonl before writing anything, and leaves it as it was
    out = tmp_path/'out-v7'; out.mkdir(); (out/'raw.jsonl').write_bytes(before := (tmp_path/'v7.jsonl').read_bytes())
    with pytest.raises(ValueError, match=r'raw\.jsonl:2: trajectory version 7'):
        collect(shop, sft, ExpertPolicy(shop.catalog), out, progress=False, lang=LANG)
    assert (out/'raw.jsonl').read_bytes() == before and not (out/'accepted.jsonl').exists()
    (tmp_path/'remade.jsonl').write_text(json.dumps({**rec, 'instruction': 'Find me a lamp.'}) + '\n')
    with pytest.raises(ValueError, match=r"remade\.jsonl:1: task 'sft-00000' has another request"): load_trajectories(tmp_path/'remade.jsonl', sft)
    out = tmp_path/'other-split'; out.mkdir(); (out/'raw.jsonl').write_text(line)
    with pytest.raises(ValueError, match='is not in the task list'):
        collect(shop, shop.tasks['grpo_train'], ExpertPolicy(shop.catalog), out, progress=False, lang=LANG)
    assert (out/'raw.jsonl').read_text() == line


def test_split_is_deterministic_and_held_out_splits_are_refused(shop, tmp_path):
    sft = shop.tasks['sft']
    a = collect(shop, sft, ExpertPolicy(shop.catalog), tmp_path, workers=4, target_accepted=40, progress=False, lang=LANG)
    acc = load_trajectories(tmp_path/'accepted.jsonl', sft)
    tr, va = split_accepted(acc, 30, 10, seed=3)
    assert (tr, va) == split_accepted(acc[::-1], 30, 10, seed=3) and not {r['task_id'] for r in tr} & {r['task_id'] for r in va}
    s = write_sft_split(tmp_path, tr, va, shop, seed=3)
    assert json.loads((tmp_path/'audit.json').read_text())['sft_split'] == s and len(load_trajectories(tmp_path/'sft_val.jsonl', sft)) == 10
    with pytest.raises(ValueError, match='40 accepted episodes'): split_accepted(acc, 35, 10)
    with pytest.raises(ValueError, match='held-out tasks'): check_disjoint(tr + [dict(task_id=shop.tasks['eval'][0].task_id)], shop)
    # the same target under another id in a held-out split: refused by cluster
    leaky = types.SimpleNamespace(catalog=shop.catalog, by_id=shop.by_id,
                                  tasks={**shop.tasks, 'eval': [dataclasses.replace(shop.by_id[tr[0]['task_id']], task_id='eval-x', split='eval')]})
    with pytest.raises(ValueError, match='clusters of held-out splits'): check_disjoint(tr, leaky)
    for s_ in ('grpo_train', 'grpo_val', 'eval'): assert not {t.task_id for t in shop.tasks[s_]} & {r['task_id'] for r in acc}


class FakeTeacher(http.server.BaseHTTPRequestHandler):
    "An OpenAI-compatible endpoint that fails in the way the request's task asks for."
    modes: dict = {}
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        mode = next((m for ins, m in self.modes.items() if body['messages'][1]['content'].startswith(ins)), 'prose')
        if mode == 'timeout': time.sleep(1.0)
        if mode == 'auth': return self._send(401, json.dumps({'error': {'message': 'bad key', 'type': 'invalid_request_error'}}))
        if mode == 'error': return self._send(500, '{"error": {"message": "boom"}}')
        if mode == 'garbage': return self._send(200, 'this is not json {{{')
        msg = dict(role='assistant', content='I would like to help.')  # prose, no tool call
        self._send(200, json.dumps(dict(id='x', object='chat.completion', created=0, model='fake', choices=[dict(index=0, message=msg, finish_reason='stop')],
                                         usage=dict(prompt_tokens=1, completion_tokens=1, total_tokens=2))))
    def _send(self, code, text):
        try: self.send_response(code); self.send_header('Content-Type', 'application/json'); self.end_headers(); self.wfile.write(text.encode())
        except (BrokenPipeError, ConnectionResetError): pass  # the client gave up (timeout)


@pytest.fixture
def teacher():
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), FakeTeacher); srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{srv.server_address[1]}/v1'
    srv.shutdown(); srv.server_close()


def test_teacher_endpoint_timeouts_and_garbage(shop, tmp_path, teacher):
    ts = shop.tasks['sft'][:4]
    FakeTeacher.modes = {t.instruction: m for t, m in zip(ts, ['timeout', 'garbage', 'error', 'prose'])}
    pol = OpenAIChatPolicy('fake', teacher, api_key_env='NO_SUCH_KEY_VAR', max_retries=0, timeout=0.3, lang=LANG)
    a = collect(shop, ts, pol, tmp_path, workers=4, max_turns=3, progress=False, lang=LANG)
    assert (a['n_raw'], a['n_accepted']) == (4, 0)
    assert a['rejections'] == {'infrastructure:generation_error': 3, 'flag:no_call': 1}
    by = {r['task_id']: r for r in load_trajectories(tmp_path/'raw.jsonl', ts)}
    assert by[ts[3].task_id]['flags'] == {'no_call': 3} and all(by[t.task_id]['termination_reason'] == 'generation_error' for t in ts[:3])


def test_auth_failure_stops_and_keeps_what_was_written(shop, tmp_path, teacher):
    ts = shop.tasks['sft'][:6]
    class Locked(Flaky):
        def reply(self, ep):
            if self.n >= 3: raise PermissionError(f'the endpoint {teacher} refused the key in $OPENAI_API_KEY (401)')
            return self.inner.reply(ep)
    def as_teacher(p): p.model, p.base_url = 'fake', teacher; return p  # the same settings as the endpoint's policy below
    with pytest.raises(PermissionError, match=r'the 3 finished episodes are kept in .*raw\.jsonl\. Fix the key and rerun'):
        collect(shop, ts, as_teacher(Locked(shop.catalog, 'teacher')), tmp_path, workers=1, progress=False, lang=LANG)
    assert [r['task_id'] for r in load_trajectories(tmp_path/'raw.jsonl', ts)] == [t.task_id for t in ts[:3]]
    FakeTeacher.modes = {t.instruction: 'auth' for t in ts}  # the real client against a 401: the same stop
    with pytest.raises(PermissionError, match='refused the key'):
        collect(shop, ts, OpenAIChatPolicy('fake', teacher, max_retries=0, timeout=2, lang=LANG, name='teacher'), tmp_path, workers=2, progress=False, lang=LANG)
    assert n_lines(tmp_path/'raw.jsonl') == 3
    with pytest.raises(ValueError, match="other settings {'max_turns': \\(35, 20\\)}"):  # a rerun with other settings is refused
        collect(shop, ts, as_teacher(Flaky(shop.catalog, 'teacher')), tmp_path, max_turns=20, progress=False, lang=LANG)
    a = collect(shop, ts, as_teacher(Flaky(shop.catalog, 'teacher')), tmp_path, workers=2, progress=False, lang=LANG)  # the rerun completes
    assert a['n_raw'] == 6 and sorted(r['task_id'] for r in load_trajectories(tmp_path/'raw.jsonl', ts)) == [t.task_id for t in ts]


def test_expert_searches_only_with_words_it_has_seen(shop):
    "Every word of every expert query is in the request or on a page shown before it (checked on every split)."
    from shopping_grpo.collect import ungrounded
    bad = {t.task_id: u for s in SIZES for t in shop.tasks[s] if (u := ungrounded(run_message_episode(shop, t, ExpertPolicy(shop.catalog), LANG)))}
    assert not bad, f'{len(bad)} episodes search with unseen words, e.g. {list(bad.items())[:3]}'


def test_episodes_of_an_older_shop_are_set_aside(shop, tmp_path):
    "After the shop's code or catalog changed, old episodes move to stale/ untouched and collection starts afresh."
    ts = shop.tasks['sft'][:6]
    collect(shop, ts, ExpertPolicy(shop.catalog), tmp_path, progress=False, lang=LANG)
    before = (tmp_path/'raw.jsonl').read_bytes(); pin = json.loads((tmp_path/'run.json').read_text())
    (tmp_path/'run.json').write_text(json.dumps({**pin, 'code_sha256': 'older'}))
    with pytest.warns(UserWarning, match='code_sha256 changed since its files were made'):
        a = collect(shop, ts, ExpertPolicy(shop.catalog), tmp_path, progress=False, lang=LANG)
    [old] = list((tmp_path/'stale').glob('*/raw.jsonl'))
    assert old.read_bytes() == before and a['n_raw'] == 6 and json.loads((tmp_path/'run.json').read_text()) == pin
