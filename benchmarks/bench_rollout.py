"""Rollout speed inside a GRPO step: the lockstep static decoder (StaticDecoder, every context prefilled whole each
turn), the lockstep slot decoder (SlotDecoder, each episode keeps its KV cache) and the continuous-batching engine
(ContinuousDecoder, the episode loop inside the decoder: a turn starts as soon as its tool answer is in, a finished
episode's row takes the next episode), side by side in one process, on the same tasks, with the GRPO recipe's
sampling (06_grpo's `ShopRollout.sample`: a step's groups and its extra groups in one pass). The variants alternate
order step by step so that drift on the machine hits all of them. Per step: wall time of the rollout, time in the
decoder (`gen_s`), generated tokens, and tokens/s both over the decoder's time and over the rollout's wall time
(with the engine, the shop's work falls between its decode steps). Then greedy agreement of every variant with the
first on validation tasks, and the decoder gap (mean and largest absolute difference between the log-probabilities
a decoder reports for its tokens and the model's own forward pass, as the trainer computes them).

Where the decoder's time goes: milliseconds per decode step (the decoder's time over its decode steps; for the
engine a step is any pass that advances the writing rows, prefill included), split into the model's forward passes
and CUDA graph replays (`forward_s`, timed with a synchronisation on both sides of each, on the GPU) and the rest
(`host_s`: bookkeeping, masks, sampling, copies, waiting on the device). `--no-split` leaves the forward passes
untimed (no added synchronisation).

    python benchmarks/bench_rollout.py --model qwen2.5-0.5b --steps 3 --out benchmarks/results/rollout_speed_qwen_continuous.json
    python benchmarks/bench_rollout.py --smoke     # CPU, a small random model, one small step: under a minute
"""
from __future__ import annotations
import argparse, json, random, statistics, tempfile, time
from pathlib import Path

# the CPU smoke: a small random model whose replies vary (`talkative`), three steps of two groups of two, two short turns
SMOKE = dict(recipe=dict(groups=2, group_size=2, extra_groups=0, lockstep_batch=4, batch_multiple=4, max_turns=2,
                         max_new_tokens=8),
             steps=3, n_agree=2, n_gap=1, n_products=3000, run='outputs/bench-smoke',
             out='benchmarks/results/rollout_speed_smoke.json')


def load(a):
    "Model path, label, tokenizer, renderer and model: the named model, or in smoke mode a small random one on the CPU."
    import torch
    from transformers import AutoTokenizer, AutoModelForCausalLM
    from shopping_grpo.model import materialize_model, EMBEDDED_MODELS
    from shopping_grpo.episode import ChatRenderer, load_chat_template
    from shopping_grpo.grpo import load_policy_model
    if a.smoke:
        from shopping_grpo.sft import tiny_model
        from shopping_grpo.generate import talkative
        path = str(tiny_model(tempfile.mkdtemp()))
        tok = AutoTokenizer.from_pretrained(path)
        renderer = ChatRenderer(tok, load_chat_template(), 'en')
        model = talkative(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), renderer.end_id)
        return path, 'tiny (random, talkative)', renderer, model
    path = str(materialize_model(a.model))
    tok = AutoTokenizer.from_pretrained(path)
    m = EMBEDDED_MODELS.get(a.model)
    renderer = ChatRenderer(tok, load_chat_template() if m is not None and m.project_template else None, 'en')
    return path, a.label or a.model, renderer, load_policy_model(path).eval()


class ForwardClock:
    "Seconds inside the model's forward passes and CUDA graph replays, synchronised on both sides (not while capturing)."
    def __init__(self, model, cuda:bool):
        import torch
        self.seconds, self.t0, self.cuda = 0.0, None, cuda
        model.register_forward_pre_hook(lambda m, args: self.start())
        model.register_forward_hook(lambda m, args, out: self.stop())
        if cuda:
            replay = torch.cuda.CUDAGraph.replay
            def timed(g):
                self.start()
                try: return replay(g)
                finally: self.stop()
            torch.cuda.CUDAGraph.replay = timed
    def _sync(self) -> bool:
        import torch
        if not self.cuda: return True
        if torch.cuda.is_current_stream_capturing(): return False
        torch.cuda.synchronize()
        return True
    def start(self):
        if self.t0 is None and self._sync(): self.t0 = time.perf_counter()
    def stop(self):
        if self.t0 is not None and self._sync():
            self.seconds += time.perf_counter() - self.t0
            self.t0 = None


def decoder_of(rollout):
    "The decoder inside a rollout's policy (PaddedBatch wraps the static decoder)."
    return getattr(rollout.policy, 'policy', rollout.policy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='qwen2.5-0.5b', help='an embedded model name or a checkpoint folder')
    ap.add_argument('--label', default=None, help='name of the model in the results (default: --model)')
    ap.add_argument('--run', default='outputs/bench', help='shop folder (built when missing)')
    ap.add_argument('--steps', type=int, default=3, help='GRPO steps sampled with each decoder')
    ap.add_argument('--n-agree', type=int, default=32, help='validation tasks played greedily by every decoder')
    ap.add_argument('--n-gap', type=int, default=8, help='prompts the decoder gap is measured on')
    ap.add_argument('--variants', default='static,slot,continuous',
                    help='decoders to compare, the first being the reference: static, slot, continuous, generate')
    ap.add_argument('--recipe', default='{}', help='JSON overrides of the gpu recipe (groups, group_size, extra_groups, ...)')
    ap.add_argument('--n-products', type=int, default=20_000)
    ap.add_argument('--smoke', action='store_true', help='CPU check: a small random model, one small step, under a minute')
    ap.add_argument('--no-split', action='store_true', help='leave forward passes untimed (no added synchronisation)')
    ap.add_argument('--out', default='benchmarks/results/rollout_speed.json')
    a = ap.parse_args()
    if a.smoke:
        for k in ('steps', 'n_agree', 'n_gap', 'n_products', 'run'): setattr(a, k, SMOKE[k])
        a.recipe = json.dumps({**SMOKE['recipe'], **json.loads(a.recipe)})
        if a.out == ap.get_default('out'): a.out = SMOKE['out']
    import torch
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.model import model_identity
    from shopping_grpo.episode import TokenEpisode, Episode, run_episodes
    from shopping_grpo.grpo import grpo_recipe, ShopRollout, decoder_gap
    from shopping_grpo.records import write_atomic, package_versions
    t_start = time.time()
    sizes = dict(sft=20, grpo_train=40, grpo_val=max(20, a.n_agree), eval=20) if a.smoke else None
    shop = prepare_shop(a.run, a.n_products, 0, 1, 'en', progress=False, **({'sizes': sizes} if sizes else {}))
    cuda = torch.cuda.is_available() and not a.smoke
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    path, label, renderer, model = load(a)
    clock = None if a.no_split else ForwardClock(model, cuda)
    names = a.variants.split(',')
    over = json.loads(a.recipe)
    rollouts = {d: ShopRollout(shop, renderer, grpo_recipe('gpu', **{**over, 'decoder': d, 'merged_decode': False}),
                               shop.tasks['grpo_train']) for d in names}
    r0 = rollouts[names[0]].cfg
    played_recs = {d: [] for d in names}  # every episode a step plays (extra groups too), not only the kept ones
    for d, ro in rollouts.items():
        def capture(tasks, model, timing, key=None, play=ro.play, into=played_recs[d]):
            recs = play(tasks, model, timing, key)
            into.extend(recs)
            return recs
        ro.play = capture
    rng = random.Random(0)
    steps = {d: [] for d in names}
    for k in range(1, a.steps + 1):
        picked = rng.sample(shop.tasks['grpo_train'], r0.groups)
        prompts = [t.task_id for t in picked for _ in range(r0.group_size)]
        for d in (names if k % 2 else names[::-1]):
            played_recs[d].clear()
            sync()
            f0 = clock.seconds if clock else 0.0
            t0 = time.time()
            recs, st = rollouts[d].sample(prompts, model, k)
            sync()
            pol = decoder_of(rollouts[d])
            tokens = sum(r['n_generated'] for r in played_recs[d])  # what the model wrote (no padding rows)
            row = dict(step=k, rollout_s=round(time.time() - t0, 3), gen_s=round(st['gen_s'], 3),
                       env_s=round(st['env_s'], 3), episodes=st['episodes_played'], generated_tokens=tokens,
                       decoder_calls=st['decoder_calls'], decode_steps=st['decode_steps'],
                       mean_turns=statistics.mean(r['n_turns'] for r in played_recs[d]),
                       peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None)
            # generated tokens over the decoder's time, and over the rollout's wall time
            row['tokens_per_s'] = round(tokens / st['gen_s'], 1) if st['gen_s'] else None
            row['rollout_tokens_per_s'] = round(tokens / row['rollout_s'], 1)
            ms = lambda s: round(1000 * s / st['decode_steps'], 2) if st['decode_steps'] else None
            row['ms_per_step'] = ms(st['gen_s'])
            if clock:
                fwd = clock.seconds - f0
                row.update(forward_s=round(fwd, 3), host_s=round(st['gen_s'] - fwd, 3), forward_ms_per_step=ms(fwd),
                           host_ms_per_step=ms(st['gen_s'] - fwd))
            for f in ('prefilled', 'reused'):
                if hasattr(pol, f):
                    row[f] = getattr(pol, f)
                    setattr(pol, f, 0)
            steps[d].append(row)
            print(d, json.dumps(row), flush=True)
    med = lambda d, key: statistics.median(r[key] for r in steps[d])
    keys = ('rollout_s', 'gen_s', 'tokens_per_s', 'rollout_tokens_per_s', 'ms_per_step') + \
           (() if a.no_split else ('forward_ms_per_step', 'host_ms_per_step'))
    out = dict(model=label, model_identity=model_identity(path), smoke=a.smoke,
               device=torch.cuda.get_device_name() if cuda else 'cpu',
               recipe={k: getattr(r0, k) for k in ('group_size', 'groups', 'extra_groups', 'lockstep_batch',
                                                   'temperature', 'top_p', 'max_new_tokens', 'max_turns')},
               steps=steps, median={d: {k: med(d, k) for k in keys} for d in names},
               versions=package_versions(('torch', 'transformers', 'peft')))
    ref = names[0]
    ratio = lambda x, y: round(x / y, 2) if x and y else None
    out['speedup'] = {d: dict(vs=ref, gen_tokens_per_s=ratio(out['median'][d]['tokens_per_s'], out['median'][ref]['tokens_per_s']),
                              rollout_tokens_per_s=ratio(out['median'][d]['rollout_tokens_per_s'],
                                                         out['median'][ref]['rollout_tokens_per_s']),
                              rollout_s=ratio(out['median'][ref]['rollout_s'], out['median'][d]['rollout_s']),
                              gen_s=ratio(out['median'][ref]['gen_s'], out['median'][d]['gen_s']))
                      for d in names[1:]}
    # greedy agreement with the first variant, and the decoder gap, on validation tasks
    val = shop.tasks['grpo_val'][:a.n_agree]
    played, gap_ctx = {}, [TokenEpisode(Episode(shop.env(), t), renderer).prompt_ids for t in val[:a.n_gap]]
    for d in names:
        pol = rollouts[d].policy
        pol.temperature = 0.0
        played[d] = {r['task_id']: r['response_ids'] for r in run_episodes(
            shop, val, pol, renderer, batch_size=len(val), max_turns=r0.max_turns, max_context=r0.max_context,
            max_new_tokens=r0.max_new_tokens)}
        out.setdefault('decoder_gap', {})[d] = decoder_gap(model, pol, gap_ctx)
    out['greedy_agreement'] = {d: dict(vs=ref, tasks=len(val), identical_episodes=sum(played[d][k] == played[ref][k]
                                                                                      for k in played[ref]))
                               for d in names[1:]}
    out['seconds'] = round(time.time() - t_start, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ('median', 'speedup', 'decoder_gap', 'greedy_agreement', 'seconds')}, indent=1))


if __name__ == '__main__': main()
