"""Where a decode step of the continuous-batching engine (ContinuousDecoder) goes: a pool of rows playing synthetic
episodes (a ~2,000-token prompt, then turns whose answers add a few dozen tokens) with a small random model of
Qwen2.5-0.5B's shape (fewer layers, a smaller vocabulary on the CPU). Reports milliseconds per decode step and per
prefill pass, each split into the model's forward pass and everything else (bookkeeping, masks, sampling, copies),
timed with hooks around the model's forward (exact on the CPU, where a forward returns when it is done).

    python benchmarks/bench_engine_step.py --device cpu --rows 32 --out /tmp/engine_step.json   # benchmarks/results/engine_step_tiny_cpu.json
    git show 8a66f8f:shopping_grpo/generate.py > /tmp/generate_before.py    # the engine before its host-side work was cut
    python benchmarks/bench_engine_step.py --device cpu --rows 32 --module /tmp/generate_before.py --out /tmp/engine_step_before.json
    python benchmarks/bench_engine_step.py --device cuda --rows 48 --layers 24 --vocab 151936 --turns 8 --out benchmarks/results/engine_step_qwen_shape.json
"""
from __future__ import annotations
import argparse, json, random, time


class Tok:
    "The two things the decoder asks of a tokenizer."
    pad_token_id = 0
    def convert_tokens_to_ids(self, t): return 1


class FakeEpisode:
    "An episode that answers every reply with `answer` random ids, over `turns` turns."
    def __init__(self, i:int, prompt:int, answer:int, turns:int, vocab:int):
        self.rng, self.vocab, self.answer, self.left = random.Random(i), vocab, answer, turns
        self.ids, self.done, self.seed, self.failure = [self.rng.randrange(2, vocab) for _ in range(prompt)], False, i, None
    def context(self): return self.ids
    def feed(self, ids, lps):
        self.ids = self.ids + ids + [self.rng.randrange(2, self.vocab) for _ in range(self.answer)]
        self.left -= 1
        self.done = self.left <= 0
    def fail(self, reason, err): self.done, self.failure = True, f'{reason}: {err}'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', default='cpu')
    ap.add_argument('--rows', type=int, default=32)
    ap.add_argument('--episodes', type=int, default=None, help='default: rows')
    ap.add_argument('--prompt', type=int, default=2000)
    ap.add_argument('--answer', type=int, default=40)
    ap.add_argument('--turns', type=int, default=4)
    ap.add_argument('--max-new-tokens', type=int, default=32)
    ap.add_argument('--end-bias', type=float, default=3.0, help='raise the end token so replies end at varied lengths')
    ap.add_argument('--layers', type=int, default=2)
    ap.add_argument('--vocab', type=int, default=16384)
    ap.add_argument('--temperature', type=float, default=0.0)
    ap.add_argument('--threads', type=int, default=None)
    ap.add_argument('--module', default=None, help='a generate.py to take the engine from (an older one, to compare)')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from shopping_grpo.generate import ContinuousDecoder, talkative
    if a.module:
        import importlib.util
        spec = importlib.util.spec_from_file_location('engine_under_test', a.module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ContinuousDecoder = mod.ContinuousDecoder
    if a.threads: torch.set_num_threads(a.threads)
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=a.layers,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    dtype = torch.float32 if a.device == 'cpu' else torch.bfloat16
    model = talkative(Qwen2ForCausalLM(cfg).eval(), 1, std=0.05, end_bias=a.end_bias).to(a.device, dtype)
    eng = ContinuousDecoder(model=model, tokenizer=Tok(), temperature=a.temperature, top_p=0.9,
                            max_new_tokens=a.max_new_tokens, device=a.device, rows=a.rows, max_context=8192)
    sync = torch.cuda.synchronize if a.device.startswith('cuda') else (lambda: None)
    fwd = dict(decode=0.0, prefill=0.0, t0=0.0)
    def pre(m, args, kw):
        sync()
        fwd['t0'] = time.perf_counter()
    def post(m, args, kw, out):
        sync()
        fwd['prefill' if 'segments' in kw else 'decode'] += time.perf_counter() - fwd['t0']
    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    tm = dict(decode=0.0, prefill=0.0)
    calls = dict(decode=0, prefill=0)
    def timed(name, f):
        def g(*args, **kw):
            calls[name] += 1
            t0 = time.perf_counter()
            try: return f(*args, **kw)
            finally:
                sync()
                tm[name] += time.perf_counter() - t0
        return g
    eng._decode = timed('decode', eng._decode)
    eng._prefill_waiting = timed('prefill', eng._prefill_waiting)
    n = a.episodes or a.rows
    def play(seed_off):
        eps = [FakeEpisode(seed_off + i, a.prompt, a.answer, a.turns, a.vocab) for i in range(n)]
        t0 = time.perf_counter()
        for _ in eng.play(eps): pass
        return time.perf_counter() - t0, eps
    play(10_000)  # warm-up (allocations, first passes)
    for d in (fwd, tm, calls): d.update({k: 0 for k in d})
    eng.decode_steps, eng.prefill_passes, eng.generated = 0, 0, 0
    wall, eps = play(0)
    steps, passes = eng.decode_steps, eng.prefill_passes
    ms = lambda s, k: round(1000 * s / k, 2) if k else None
    n_dec, n_pre = calls['decode'], calls['prefill']  # decode steps alone; prefill calls (writing rows ride along)
    out = dict(device=a.device, module=a.module or 'shopping_grpo.generate', rows=a.rows, episodes=n, layers=a.layers, vocab=a.vocab, prompt=a.prompt,
               answer=a.answer, turns=a.turns, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
               threads=torch.get_num_threads(), wall_s=round(wall, 3), generated=eng.generated,
               steps=steps, decode_calls=n_dec, prefill_calls=n_pre, prefill_passes=passes,
               # a step: every writing row advances one token (a decode step alone, or a prefill call they ride in)
               ms_per_step=ms(tm['decode'] + tm['prefill'], steps),
               decode_ms=ms(tm['decode'], n_dec), decode_forward_ms=ms(fwd['decode'], n_dec),
               decode_host_ms=ms(tm['decode'] - fwd['decode'], n_dec),
               prefill_ms=ms(tm['prefill'], n_pre), prefill_forward_ms=ms(fwd['prefill'], n_pre),
               prefill_host_ms=ms(tm['prefill'] - fwd['prefill'], n_pre),
               forward_share=round((fwd['decode'] + fwd['prefill']) / (tm['decode'] + tm['prefill']), 3),
               other_ms_per_step=ms(wall - tm['decode'] - tm['prefill'], steps),
               fingerprint=hash(tuple(tuple(e.ids) for e in eps)) & 0xffffffff,
               failed=sum(e.failure is not None for e in eps), first_failure=next((e.failure for e in eps if e.failure), None))
    print(json.dumps(out, indent=1))
    if out['failed'] == n: raise SystemExit(f"every episode failed, nothing was timed: {out['first_failure']}")
    if a.out:
        with open(a.out, 'w') as f: f.write(json.dumps(out, indent=1))


if __name__ == '__main__': main()
