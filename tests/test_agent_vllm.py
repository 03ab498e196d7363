"""The agent loop end to end on CPU: the real SmolLM2 served by vLLM, the openai client, and the shop behind a real uvicorn process."""
from __future__ import annotations
import subprocess, sys, time
from pathlib import Path
import httpx, pytest

pytestmark = pytest.mark.slow


def _vllm_python_or_skip():
    from shopping_grpo.model import vllm_python
    try: p = vllm_python()
    except Exception as e: pytest.skip(f'no vLLM environment ({e}); run `make vllm-env`')
    if not Path(p).exists(): pytest.skip(f'no vLLM python at {p}; run `make vllm-env`')


@pytest.fixture(scope='module')
def served_shop(tmp_path_factory):
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.model import free_port
    run = tmp_path_factory.mktemp('shop')
    shop = prepare_shop(run, 3000, 0, 1, 'en', sizes=dict(sft=10, grpo_train=10, grpo_val=10, eval=10), progress=False)
    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent/'shopping-grpo'), 'serve-env', '--port', str(port), '--run', str(run), '--n-products', '3000'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try: httpx.get(f'http://127.0.0.1:{port}/api/health', timeout=2).raise_for_status(); break
            except httpx.HTTPError: time.sleep(0.2)
        else: pytest.fail('the shop server did not start')
        yield shop, f'http://127.0.0.1:{port}'
    finally: proc.terminate(); proc.wait(10)


def test_base_model_episodes_over_http(served_shop):
    _vllm_python_or_skip()
    from shopping_grpo.model import VLLMServer
    from shopping_grpo.server import ShopClient
    from shopping_grpo.policies import OpenAIChatPolicy
    from shopping_grpo.server import RemoteShopEnv, WireIds
    from shopping_grpo.evaluate import evaluate
    from shopping_grpo.records import read_records
    shop, url = served_shop; client = ShopClient(url); tasks = shop.tasks['eval'][:3]
    with VLLMServer('smollm2', name='smollm2-test', extra_args=['--enforce-eager']) as llm:
        pol = OpenAIChatPolicy(model=llm.name, base_url=llm.base_url, max_tokens=96, name='base')
        out = Path(shop.catalog.sha256[:8]); import tempfile; out = Path(tempfile.mkdtemp())/'base'
        s = evaluate(shop, tasks, pol, out, workers=3, max_turns=4, make_env=lambda m: RemoteShopEnv(client, m, WireIds.of(shop.catalog)), progress=False)
    recs = read_records(out/'trajectories.jsonl')
    assert set(recs) == {t.task_id for t in tasks} and s['n_tasks'] == 3 and s['n_episodes'] == 3
    assert pol.completion_tokens > 0
    for r in recs.values():
        assert r['termination_reason'] in ('purchase', 'finish', 'max_steps', 'repeat_loop', 'no_progress')
        roles = [m['role'] for m in r['messages']]
        assert roles[:2] == ['system', 'user'] and roles[-1] == 'assistant' and 1 <= r['n_turns'] <= 4
        assert all(a == 'assistant' for a in roles[2::2]) and all(b in ('tool', 'user') for b in roles[3::2])
        assert [e['id'] for e in r['events'] if e['kind'] == 'action'] == [f'a{i:04d}' for i in range(1, 1 + sum(e['kind'] == 'action' for e in r['events']))]
        assert isinstance(r['reward'], float) and r['reward_detail']['termination_reason'] == r['termination_reason']
    assert client.http.get('/api/health').json()['leases'] == 0  # every lease was released
