"""How the decoders spend a GPU on a recorded evaluation: its episodes replayed, turn by turn, with the token counts
they had (each reply as long as the model's was, each tool answer as long as the shop's), by the slot decoder in
lockstep (what the h200 profiles play with) and by the continuous engine with its waiting rows prefilled at once
(`prefill_every=0`) or together every k decode steps, in one process. A model of Qwen2.5-1.5B's shape with random
weights writes the tokens (no model needs to travel); the replies end where the recorded ones did.

    # the shapes, once, from a run's trajectories and the model's tokenizer (any Hugging Face tokenizer folder):
    python benchmarks/bench_engine_schedule.py shapes --tokenizer /path/to/qwen2.5-1.5b \\
        --out benchmarks/results/engine_shapes_grounded.json \\
        outputs/reference/h200-1.5b-mixed-reasons-wide-grounded/eval/sft{,@freeform,@human}/trajectories.jsonl.gz
    python benchmarks/bench_engine_schedule.py play --every 0,4,8,16 --out benchmarks/results/engine_schedule_h100.json   # GPU
    .venv/bin/python benchmarks/bench_engine_schedule.py play --device cpu --layers 1 --episodes 12 --rows 4 --every 0,4 --scale 0.05 --out /tmp/s.json
    # what the lockstep runner would do over the first N episodes (calls, decode steps, column-steps), no GPU:
    .venv/bin/python benchmarks/bench_engine_schedule.py plan --episodes 60,200,600 --out benchmarks/results/engine_plan_grounded.json
"""
from __future__ import annotations
import argparse, gzip, json, random, time
from bench_decode_step import Tok          # benchmarks/ is the script's folder: its neighbours import
from bench_sft_packing import QWEN_SHAPES, qwen_shape

def episode_shapes(paths, tokenizer) -> list:
    """Each recorded episode as [prompt ids, [[reply ids, answer ids], ...]], counted as the runner renders them
    (`ChatRenderer`: the prompt with the tools' schemas and the generation header, each tool answer as the ids that
    follow the reply's end token up to the next header; a reply is its text's ids and the end token)."""
    from shopping_grpo.episode import ChatRenderer
    r = ChatRenderer(tokenizer)
    out = []
    for p in paths:
        for line in gzip.open(p, 'rt'):
            ms = json.loads(line)['messages']
            turns = []
            for m in ms[2:]:
                if m['role'] == 'assistant': turns.append([len(r.ids(m['content'])) + 1, 0])
                elif turns: turns[-1][1] += len(r.delta(m))
            out.append([len(r.ids(r.text(ms[:2], gen=True))), turns])
    return out


class Replay:
    "A recorded episode's shape played again: random ids for its prompt and answers, its replies' recorded lengths."
    def __init__(self, i:int, prompt:int, turns:list, vocab:int):
        self.rng, self.vocab, self.turns, self.seed = random.Random(i), vocab, turns, i
        self.ids, self.t, self.failure = self._ids(prompt), 0, None
    def _ids(self, n): return [self.rng.randrange(2, self.vocab) for _ in range(n)]
    @property
    def done(self): return self.t >= len(self.turns) or self.failure is not None
    def reply_length(self): return self.turns[self.t][0]
    def context(self): return self.ids
    def feed(self, ids, lps):
        self.ids = self.ids + list(ids) + self._ids(self.turns[self.t][1])
        self.t += 1
        if self.t < len(self.turns) and not self.turns[self.t - 1][1]: self.t = len(self.turns)  # no answer: it ended
    def fail(self, reason, err): self.failure = f'{reason}: {err}'


def scripted(cls):
    "`cls` (a decoder) whose rows end each reply at its episode's recorded length, and never before."
    class Scripted(cls):
        def _pick(self, logits, rows):
            toks, lps = super()._pick(logits, rows)
            for j, r in enumerate(rows):
                end = len(self.reply[r]) + 1 >= self.episode[r].reply_length()
                toks[j] = self.end_id if end else (toks[j] if toks[j] != self.end_id else self.end_id + 1)
            return toks, lps
    return Scripted


def play_lockstep(dec, episodes, rows, max_context):
    """The lockstep runner (`run_lockstep`): up to `rows` live episodes, every one's turn in one call, which runs to the
    longest recorded reply of the call (the batch waits for its slowest reply; each reply is cut at its own length
    after the call); an episode that ends gives its place to the next one before the next call. Returns `episodes`."""
    queue, live = list(episodes)[::-1], []
    while queue or live:
        while queue and len(live) < rows: live.append(queue.pop())
        for e in live:
            if len(e.context()) + e.reply_length() > max_context: e.fail('context', 'overflow')
        live = [e for e in live if not e.done]
        if not live: continue
        dec.max_new_tokens = max(e.reply_length() for e in live)
        outs = dec([e.context() for e in live])
        for e, o in zip(live, outs): e.feed(o[:e.reply_length() - 1] + [dec.end_id], None)
        live = [e for e in live if not e.done]
    return episodes


def cut_shapes(shapes, max_new_tokens:int, scale:float=1.0) -> list:
    """Recorded episode shapes as they are played: each count scaled by `scale` (then at least 2 ids; a turn without an
    answer keeps none) and each reply cut at `max_new_tokens`."""
    sc = (lambda n: n) if scale == 1.0 else (lambda n: max(2, round(n * scale)))
    return [[sc(p), [[min(sc(r), max_new_tokens), sc(t) if t else 0] for r, t in turns]] for p, turns in shapes]


def lockstep_plan(shapes, rows:int, max_context:int, max_new_tokens:int) -> dict:
    """What `play_lockstep` does over recorded episode shapes, counted without a model: its calls, the decode steps they
    run (each call to its longest reply), and the column-steps (each call's steps times the widest context it reads,
    which a decode step's cost grows with)."""
    class Count:
        end_id = 1
        def __init__(self): self.calls, self.steps, self.column_steps = 0, 0, 0
        def __call__(self, contexts):
            self.calls += 1; self.steps += self.max_new_tokens
            self.column_steps += self.max_new_tokens * (max(map(len, contexts)) + self.max_new_tokens)
            return [[2] * self.max_new_tokens for _ in contexts]
    shapes = cut_shapes(shapes, max_new_tokens)
    c = Count()
    eps = play_lockstep(c, [Replay(i, p, turns, 1000) for i, (p, turns) in enumerate(shapes)], rows, max_context)
    return dict(episodes=len(eps), reply_ids=sum(t[0] for e in shapes for t in e[1]), calls=c.calls, decode_steps=c.steps,
                column_steps=c.column_steps, ended_early=sum(e.failure is not None for e in eps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    s = sub.add_parser('shapes')
    s.add_argument('trajectories', nargs='+')
    s.add_argument('--tokenizer', required=True)
    s.add_argument('--out', required=True)
    p = sub.add_parser('play')
    p.add_argument('--shapes', default='benchmarks/results/engine_shapes_grounded.json')
    p.add_argument('--model', default='qwen1.5b-shape', choices=list(QWEN_SHAPES))
    p.add_argument('--rows', type=int, default=100, help="07_evaluate's eval_batch")
    p.add_argument('--every', default='0,8', help='the engine\'s prefill_every values to time')
    p.add_argument('--lockstep', default='yes', choices=('yes', 'no'), help='time the slot decoder in lockstep too')
    p.add_argument('--episodes', type=int, default=None, help='the first N recorded episodes (default: all)')
    p.add_argument('--scale', type=float, default=1.0, help='token counts scaled by this (a CPU check)')
    p.add_argument('--max-context', type=int, default=16384)
    p.add_argument('--max-new-tokens', type=int, default=128)
    p.add_argument('--device', default='cuda')
    p.add_argument('--layers', type=int, default=None, help='decoder layers (fewer: a CPU check of the script)')
    p.add_argument('--out', default=None)
    q = sub.add_parser('plan', help='count what the lockstep runner would do over the first N episodes, for each N (no model, no GPU)')
    q.add_argument('--shapes', default='benchmarks/results/engine_shapes_grounded.json')
    q.add_argument('--episodes', default='60,200,600', help='comma-separated Ns')
    q.add_argument('--rows', type=int, default=100)
    q.add_argument('--max-context', type=int, default=16384)
    q.add_argument('--max-new-tokens', type=int, default=128)
    q.add_argument('--out', default=None, help='also write the counts here, as JSON')
    a = ap.parse_args()
    if a.cmd == 'shapes':
        from transformers import AutoTokenizer
        shapes = episode_shapes(a.trajectories, AutoTokenizer.from_pretrained(a.tokenizer))
        from shopping_grpo.records import write_atomic
        write_atomic(a.out, json.dumps(dict(sources=a.trajectories, episodes=shapes)))
        print(len(shapes), 'episodes;', sum(t[0] for e in shapes for t in e[1]), 'reply ids')
        return
    if a.cmd == 'plan':
        shapes = json.load(open(a.shapes))['episodes']
        plans = [lockstep_plan(shapes[:n], a.rows, a.max_context, a.max_new_tokens) for n in map(int, a.episodes.split(','))]
        for x in plans: print(json.dumps(x))
        if a.out:
            from shopping_grpo.records import write_atomic
            write_atomic(a.out, json.dumps(dict(shapes=a.shapes, rows=a.rows, max_context=a.max_context,
                                                max_new_tokens=a.max_new_tokens, plans=plans), indent=1))
        return
    import torch
    from transformers import AutoModelForCausalLM
    import shopping_grpo.generate as G
    from shopping_grpo.records import package_versions, write_atomic
    shapes = cut_shapes(json.load(open(a.shapes))['episodes'][:a.episodes], a.max_new_tokens, a.scale)
    cfg = qwen_shape(a.model)
    if a.layers: cfg.num_hidden_layers = a.layers
    torch.manual_seed(0)
    with torch.device(a.device): model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    cuda = a.device.startswith('cuda')
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = dict(device=torch.cuda.get_device_name() if cuda else 'cpu', model=a.model, layers=cfg.num_hidden_layers,
               rows=a.rows, episodes=len(shapes), scale=a.scale, versions=package_versions(('torch', 'transformers')),
               reply_ids=sum(t[0] for e in shapes for t in e[1]), runs={})
    episodes = lambda: [Replay(i, p, turns, cfg.vocab_size) for i, (p, turns) in enumerate(shapes)]
    kw = dict(model=model, tokenizer=Tok(), max_new_tokens=a.max_new_tokens, device=a.device, rows=a.rows,
              max_context=a.max_context)

    def ready(dec):
        "`dec` with its cache allocated and, on CUDA, every width's graph captured before the clock starts."
        t = time.perf_counter()
        dec._ensure()
        if cuda:
            for w in range(dec.bucket, a.max_context + dec.bucket, dec.bucket): dec._capture(min(w, dec.L))
        print(f'{type(dec).__name__}: cache and graphs ready in {time.perf_counter() - t:.1f} s (not timed)', flush=True)
        return dec

    def timed(name, play, dec):
        sync(); t = time.perf_counter()
        eps = play()
        sync(); sec = time.perf_counter() - t
        r = dict(seconds=round(sec, 2), ended_early=sum(e.failure is not None for e in eps),
                 decode_steps=getattr(dec, 'decode_steps', None), prefill_passes=getattr(dec, 'prefill_passes', None))
        r['reply_ids_per_s'] = round(res['reply_ids'] / sec)
        res['runs'][name] = r
        base = res['runs'].get('slot lockstep') or next(iter(res['runs'].values()))
        for x in res['runs'].values(): x['speedup'] = round(base['seconds'] / x['seconds'], 2)
        if a.out: write_atomic(a.out, json.dumps(res, indent=1))  # after each run: a command stopped at its limit keeps what it timed
        print(name, json.dumps(r), flush=True)

    with torch.inference_mode():
        if a.lockstep == 'yes':  # the baseline first
            dec = ready(G.SlotDecoder(**kw))
            timed('slot lockstep', lambda: play_lockstep(dec, episodes(), a.rows, a.max_context), dec)
            dec.release(); del dec
        for every in map(int, a.every.split(',')):
            dec = ready(scripted(G.ContinuousDecoder)(**kw, prefill_every=every))
            timed(f'continuous prefill_every={every}', lambda: list(dec.play(episodes())), dec)
            dec.release(); del dec
    print(json.dumps(res, indent=1))

if __name__ == '__main__': main()
