"""The embedded model, materialised and served by vLLM's OpenAI-compatible server, answers concurrent chat requests;
a process that runs a server and is told to terminate (SIGTERM) stops the server's whole process group first.

The served test is slow (about two minutes to start vLLM on two CPU cores) and needs the vLLM venv: `make vllm-env`
builds `.venv-vllm`, or $SHOPPING_GRPO_VLLM_PYTHON names another one; without it the test is skipped. The SIGTERM
tests use a stand-in server (a "python" that answers like vLLM and keeps a second process in its group).
"""
from __future__ import annotations
import json, os, signal, subprocess, sys, textwrap, time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
import pytest

from shopping_grpo.model import VLLMServer, materialize_model, vllm_python
from _helpers import stand_in_python

SEARCH = {'type': 'function', 'function': {'name': 'search', 'description': 'Search the shop for products.',
          'parameters': {'type': 'object', 'properties': {'query': {'type': 'string'}}, 'required': ['query']}}}
REQUESTS = [  # (system prompt, user message, tools)
    ('You are a helpful AI assistant named SmolLM, trained by Hugging Face', 'What is the capital of France?', None),
    ('You are a helpful AI assistant named SmolLM, trained by Hugging Face', 'Name three colours.', None),
    ('You are a careful shopping assistant.', 'Find me a red ceramic coffee mug under $15.', [SEARCH]),
    ('You are a careful shopping assistant.', 'I want running shoes, size 42.', [SEARCH]),
]


def group_alive(pid:int) -> bool:
    "Whether any process of process group `pid` is still running."
    try: os.killpg(pid, 0); return True
    except ProcessLookupError: return False


def ask(server:VLLMServer, system:str, user:str, tools):
    "One greedy chat completion through the openai client."
    return server.client(timeout=600).chat.completions.create(
        model=server.name, temperature=0, max_tokens=96, tools=tools,
        messages=[{'role': 'system', 'content': system}, {'role': 'user', 'content': user}])


@pytest.mark.slow
def test_vllm_serves_embedded_model_concurrently(tmp_path):
    py = vllm_python()
    if not py.exists(): pytest.skip(f"no vLLM python at {py}: run `make vllm-env`, or set SHOPPING_GRPO_VLLM_PYTHON")
    path = materialize_model('smollm2')
    assert (path/'model.safetensors').is_file() and (path/'materialized.json').is_file()

    with VLLMServer('smollm2', log=tmp_path/'vllm.log', progress=False) as server:
        assert server.base_url == f'http://127.0.0.1:{server.port}/v1'
        assert [m.id for m in server.client().models.list().data] == ['smollm2']
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(REQUESTS)) as ex: replies = list(ex.map(lambda r: ask(server, *r), REQUESTS))
        wall = time.monotonic() - t0
    assert not group_alive(server.proc.pid), "vLLM processes outlived stop()"
    print(f"\nvLLM started in {server.start_s} s; 4 concurrent requests answered in {wall:.1f} s")
    for r in replies: print(r.choices[0].finish_reason, repr(r.choices[0].message.content), r.choices[0].message.tool_calls)

    for (system, user, tools), r in zip(REQUESTS, replies):
        assert r.model == 'smollm2' and len(r.choices) == 1
        c = r.choices[0]; msg = c.message
        assert c.finish_reason in ('stop', 'tool_calls', 'length'), c.finish_reason
        assert 0 < r.usage.completion_tokens <= 96
        assert msg.role == 'assistant' and (msg.content or msg.tool_calls), r
        assert '<|im_end|>' not in (msg.content or '') and '<|im_start|>' not in (msg.content or '')
        for call in msg.tool_calls or []:  # parsed by the hermes parser from <tool_call>{...}</tool_call>
            assert tools and call.type == 'function' and call.function.name == 'search'
            assert isinstance(json.loads(call.function.arguments), dict)
    # <|im_end|> is the end of sequence: the greedy answer to a short question ends there, not at max_tokens
    assert replies[0].choices[0].finish_reason == 'stop' and 'Paris' in replies[0].choices[0].message.content


def holder(tmp_path, ready:bool=True) -> subprocess.Popen:
    "A Python process that opens a VLLMServer on the stand-in and waits, printing the server's pid when it has one."
    code = textwrap.dedent(f"""
        import sys, time
        from shopping_grpo.model import VLLMServer
        srv = VLLMServer('/no/model', python={str(stand_in_python(tmp_path, ready))!r}, log={str(tmp_path/'log.txt')!r},
                         timeout=120, progress=False)
        if {ready}:
            with srv:
                print(srv.proc.pid, flush=True)
                time.sleep(300)
        else:
            import threading
            threading.Thread(target=lambda: (time.sleep(3), print(srv.proc.pid, flush=True)), daemon=True).start()
            srv.start()
    """)
    return subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_gone(pgid:int, timeout:float=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid): return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize('ready', [True, False], ids=['serving', 'starting'])
def test_sigterm_stops_the_server_group(tmp_path, ready):
    "SIGTERM to a process holding a server (serving, or still waiting for it to answer) ends the server's group too."
    proc = holder(tmp_path, ready)
    try:
        pgid = int(proc.stdout.readline())
        assert group_alive(pgid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM  # terminated by the signal, as without a server
        assert wait_gone(pgid), f"server group {pgid} outlived its SIGTERMed owner"
    finally:
        if proc.poll() is None: proc.kill()
        proc.communicate()


def test_handler_is_restored_after_the_server_stops(tmp_path):
    "The handler is installed only while a server runs; the previous one is back afterwards."
    code = textwrap.dedent(f"""
        import signal
        from shopping_grpo.model import VLLMServer
        def mine(signum, frame): pass
        signal.signal(signal.SIGTERM, mine)
        with VLLMServer('/no/model', python={str(stand_in_python(tmp_path))!r}, log={str(tmp_path/'log.txt')!r},
                        timeout=120, progress=False) as srv:
            during = signal.getsignal(signal.SIGTERM) is mine
        print(during, signal.getsignal(signal.SIGTERM) is mine)
    """)
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ['False', 'True'], r.stderr
