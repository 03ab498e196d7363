"""Rollout speed inside a GRPO step: today's decoder (StaticDecoder, every context prefilled whole each turn) against
SlotDecoder (each episode keeps its KV cache), side by side in one process on one GPU, on the same tasks, with the
GRPO recipe's sampling (06_grpo's `ShopRollout.sample`: a step's groups and its extra groups in one lockstep pass).
The two alternate step by step so that drift on the machine hits both. Then greedy agreement of the two decoders on
validation tasks, and the decoder gap (mean and largest absolute difference between the log-probabilities a decoder
reports for its tokens and the model's own forward pass, as the trainer computes them).

    python benchmarks/bench_rollout.py --model qwen2.5-0.5b --steps 3 --out benchmarks/results/rollout_speed_qwen.json
"""
from __future__ import annotations
import argparse, json, random, statistics, time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='qwen2.5-0.5b', help='an embedded model name or a checkpoint folder')
    ap.add_argument('--label', default=None, help='name of the model in the results (default: --model)')
    ap.add_argument('--run', default='outputs/bench', help='shop folder (built when missing)')
    ap.add_argument('--steps', type=int, default=3, help='GRPO steps sampled with each decoder')
    ap.add_argument('--n-agree', type=int, default=32, help='validation tasks played greedily by both decoders')
    ap.add_argument('--variants', default='static,slot', help="decoders to compare: static (today's), slot")
    ap.add_argument('--recipe', default='{}', help='JSON overrides of the gpu recipe (a CPU check: small groups, turns)')
    ap.add_argument('--n-products', type=int, default=20_000)
    ap.add_argument('--out', default='benchmarks/results/rollout_speed.json')
    a = ap.parse_args()
    import torch
    from transformers import AutoTokenizer
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.model import materialize_model, model_identity
    from shopping_grpo.episode import ChatRenderer, TokenEpisode, Episode, load_chat_template, run_lockstep
    from shopping_grpo.grpo import grpo_recipe, ShopRollout, load_policy_model, decoder_gap
    from shopping_grpo.records import write_atomic, package_versions
    from shopping_grpo.model import EMBEDDED_MODELS
    shop = prepare_shop(a.run, a.n_products, 0, 1, 'en', progress=False)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    over = json.loads(a.recipe)
    path = str(materialize_model(a.model))
    tok = AutoTokenizer.from_pretrained(path)
    m = EMBEDDED_MODELS.get(a.model)
    renderer = ChatRenderer(tok, load_chat_template() if m is not None and m.project_template else None, 'en')
    model = load_policy_model(path).eval()
    names = a.variants.split(',')
    rollouts = {d: ShopRollout(shop, renderer, grpo_recipe('gpu', **{**over, 'decoder': d, 'merged_decode': False}), shop.tasks['grpo_train'])
                for d in names}
    r0 = rollouts[names[0]].cfg
    rng = random.Random(0)
    steps = {d: [] for d in names}
    for k in range(1, a.steps + 1):
        picked = rng.sample(shop.tasks['grpo_train'], r0.groups)
        prompts = [t.task_id for t in picked for _ in range(r0.group_size)]
        for d in (names if k % 2 else names[::-1]):
            sync()
            t0 = time.time()
            recs, st = rollouts[d].sample(prompts, model, k)
            sync()
            pol = getattr(rollouts[d].policy, 'policy', rollouts[d].policy)  # the decoder inside PaddedBatch
            row = dict(step=k, rollout_s=round(time.time() - t0, 2), gen_s=round(st['gen_s'], 2),
                       env_s=round(st['env_s'], 2), episodes=st['episodes_played'],
                       generated_tokens=sum(r['n_generated'] for r in recs),
                       decoder_calls=st['decoder_calls'], mean_turns=statistics.mean(r['n_turns'] for r in recs),
                       peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None)
            row['tokens_per_s'] = round(pol.generated / pol.gen_seconds, 1) if pol.gen_seconds else None
            pol.generated, pol.gen_seconds = 0, 0.0
            for f in ('prefilled', 'reused'):
                if hasattr(pol, f):
                    row[f] = getattr(pol, f)
                    setattr(pol, f, 0)
            steps[d].append(row)
            print(d, json.dumps(row), flush=True)
    med = lambda d, key: statistics.median(r[key] for r in steps[d])
    out = dict(model=a.label or a.model, model_identity=model_identity(path), device=torch.cuda.get_device_name() if cuda else 'cpu',
               recipe={k: getattr(r0, k) for k in ('group_size', 'groups', 'extra_groups', 'lockstep_batch',
                                                   'temperature', 'top_p', 'max_new_tokens', 'max_turns')},
               steps=steps, median={d: dict(rollout_s=med(d, 'rollout_s'), gen_s=med(d, 'gen_s'),
                                             tokens_per_s=med(d, 'tokens_per_s')) for d in names},
               versions=package_versions(('torch', 'transformers', 'peft')))
    if len(names) == 2:
        a_, b_ = names
        out['speedup'] = dict(gen_tokens_per_s=round(out['median'][b_]['tokens_per_s'] / out['median'][a_]['tokens_per_s'], 2),
                              rollout_s=round(out['median'][a_]['rollout_s'] / out['median'][b_]['rollout_s'], 2),
                              gen_s=round(out['median'][a_]['gen_s'] / out['median'][b_]['gen_s'], 2))
    # greedy agreement and decoder gap on validation tasks
    val = shop.tasks['grpo_val'][:a.n_agree]
    played = {}
    for d in names:
        pol = rollouts[d].policy
        pol.temperature = 0.0
        played[d] = {r['task_id']: r['response_ids'] for r in run_lockstep(
            shop, val, pol, renderer, d, batch_size=len(val), max_turns=r0.max_turns, max_context=r0.max_context,
            max_new_tokens=r0.max_new_tokens)}
        ctx = [TokenEpisode(Episode(shop.env(), t), renderer).prompt_ids for t in val[:8]]
        out.setdefault('decoder_gap', {})[d] = decoder_gap(model, pol, ctx)
    if len(names) == 2:
        same = sum(played[names[0]][k] == played[names[1]][k] for k in played[names[0]])
        out['greedy_agreement'] = dict(tasks=len(val), identical_episodes=same)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ('median', 'speedup', 'decoder_gap', 'greedy_agreement') if k in out}, indent=1))


if __name__ == '__main__': main()
