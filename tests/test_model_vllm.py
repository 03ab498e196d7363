"""The embedded model, materialised and served by vLLM's OpenAI-compatible server, answers concurrent chat requests.

Slow (about two minutes to start vLLM on two CPU cores). Needs the vLLM venv: `make vllm-env` builds
`.venv-vllm`, or $SHOPPING_GRPO_VLLM_PYTHON names another one; without it the test is skipped.
"""
from __future__ import annotations
import json, os, time
from concurrent.futures import ThreadPoolExecutor
import pytest

from shopping_grpo.model import VLLMServer, materialize_model, vllm_python

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
