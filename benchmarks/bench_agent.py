"""Speed of the agent loop: expert episodes/s in-process (message and token level) and, with --vllm, generated
tokens/s of vLLM (CPU build on CPU machines) driving 16 concurrent episodes of the untrained SmolLM2.

    python benchmarks/bench_agent.py --tasks 200 [--vllm --vllm-tasks 16] --out benchmarks/results/agent_speed.json
"""
from __future__ import annotations
import argparse, json, os, platform, time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--run', default='outputs/bench'); ap.add_argument('--tasks', type=int, default=200)
    ap.add_argument('--vllm', action='store_true'); ap.add_argument('--vllm-tasks', type=int, default=16); ap.add_argument('--concurrency', type=int, default=16)
    ap.add_argument('--out', default='benchmarks/results/agent_speed.json')
    a = ap.parse_args()
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.records import package_versions
    from shopping_grpo.policies import ExpertPolicy, OpenAIChatPolicy
    from shopping_grpo.episode import run_message_episode, ChatRenderer, load_chat_template, scripted_run
    from shopping_grpo.evaluate import evaluate
    from shopping_grpo.model import load_tokenizer
    shop = prepare_shop(a.run, 20_000, 0, 1, 'en', progress=False); tasks = shop.tasks['eval'][:a.tasks]
    res = dict(machine=dict(cpus=os.cpu_count(), python=platform.python_version(), load=os.getloadavg()), versions=package_versions())
    t0 = time.perf_counter(); recs = [run_message_episode(shop, t, ExpertPolicy(shop.catalog)) for t in tasks]; dt = time.perf_counter() - t0
    res['expert_message_loop'] = dict(episodes=len(recs), episodes_per_s=round(len(recs) / dt, 1), steps_per_s=round(sum(r['n_steps'] for r in recs) / dt, 1),
                                      strict_success=sum(r['strict_success'] for r in recs) / len(recs))
    renderer = ChatRenderer(load_tokenizer(), load_chat_template())
    t0 = time.perf_counter(); tes = [scripted_run(shop, t, renderer) for t in tasks[:50]]; dt = time.perf_counter() - t0
    res['expert_token_loop'] = dict(episodes=len(tes), episodes_per_s=round(len(tes) / dt, 1),
                                    mean_tokens=round(sum(len(te.prompt_ids) + len(te.response_ids) for te in tes) / len(tes)))
    print(json.dumps(res, indent=1), flush=True)
    if a.vllm:
        from shopping_grpo.model import VLLMServer
        import tempfile
        with VLLMServer('smollm2', name='smollm2-bench') as llm:
            pol = OpenAIChatPolicy(model=llm.name, base_url=llm.base_url, max_tokens=256, name='base')
            t0 = time.perf_counter()
            s = evaluate(shop, tasks[:a.vllm_tasks], pol, Path(tempfile.mkdtemp())/'base', workers=a.concurrency, progress=True)
            dt = time.perf_counter() - t0
        res['vllm_cpu'] = dict(tasks=a.vllm_tasks, concurrency=a.concurrency, start_s=round(llm.start_s or 0, 1), seconds=round(dt, 1),
                               generated_tokens=pol.completion_tokens, tokens_per_s=round(pol.completion_tokens / dt, 1),
                               tasks_per_minute=round(a.vllm_tasks / dt * 60, 2), strict_success=s['strict_success'])
    from shopping_grpo.records import write_atomic
    write_atomic(a.out, json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == '__main__': main()
