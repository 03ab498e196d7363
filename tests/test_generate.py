"""The slot decoder and the continuous engine (03b_generate) against the static decoder on whole shop episodes: the
runners play the same tasks with each, greedily, with fewer rows than tasks so that rows are freed and refilled
mid-run; every record must be identical, while the slot decoder and the engine prefill only what is new. Sampled, the
engine's episodes depend on their own seeds only. A small random model keeps it cheap on a CPU."""
from __future__ import annotations
import pytest

from shopping_grpo.episode import ChatRenderer, load_chat_template, run_lockstep


@pytest.fixture(scope='module')
def tiny_lm(tiny):
    "The session's small random model, loaded, and its tokenizer."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(tiny)


def play(shop, tasks, decoder, renderer):
    recs = run_lockstep(shop, tasks, decoder, renderer, 'tiny', batch_size=4, max_turns=4, max_context=4096,
                        max_new_tokens=12)
    return {r['task_id']: r for r in recs}


def test_slot_decoder_plays_the_same_episodes(shop, tiny_lm):
    from shopping_grpo.generate import StaticDecoder, SlotDecoder
    model, tok = tiny_lm
    renderer = ChatRenderer(tok, load_chat_template())
    tasks = shop.tasks['eval'][:7]
    static = StaticDecoder(model=model, tokenizer=tok, max_new_tokens=12, device='cpu', bucket=512)
    slot = SlotDecoder(model=model, tokenizer=tok, max_new_tokens=12, device='cpu', rows=4, max_context=4096,
                       bucket=512)
    a, b = play(shop, tasks, static, renderer), play(shop, tasks, slot, renderer)
    assert set(a) == set(b) == {t.task_id for t in tasks}
    for k in a:
        for f in ('prompt_ids', 'response_ids', 'response_mask', 'turn_spans', 'messages', 'reward', 'termination_reason'):
            assert a[k][f] == b[k][f], (k, f)
        assert max(abs(x - y) for x, y in zip(a[k]['logprobs'], b[k]['logprobs'])) < 1e-3
    assert max(r['n_turns'] for r in b.values()) >= 3  # episodes ran several turns: the cache was reused
    assert slot.reused > 2 * slot.prefilled


def test_slot_decoder_refuses_what_does_not_fit(tiny_lm):
    from shopping_grpo.generate import SlotDecoder
    model, tok = tiny_lm
    dec = SlotDecoder(model=model, tokenizer=tok, max_new_tokens=8, device='cpu', rows=2, max_context=64)
    with pytest.raises(ValueError, match='rows'): dec([[1, 2], [3, 4], [5, 6]])
    with pytest.raises(ValueError, match='exceeds 64'): dec([list(range(10, 70))])
    assert [len(x) <= 8 for x in dec([[1, 2, 3], [4, 5]])] == [True, True]  # the decoder still works after a refusal


def talkative_lm(tiny, end_id):
    "The session's small random model, made to talk: greedy replies that follow the context and end at different lengths."
    import torch
    from transformers import AutoModelForCausalLM
    from shopping_grpo.generate import talkative
    return talkative(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval(), end_id)


def records(runner, shop, tasks, policy, renderer, **kw):
    return {r['task_id']: r for r in runner(shop, tasks, policy, renderer, 'tiny', **kw)}


@pytest.mark.parametrize('room', [40, 150])  # context room past the shortest prompt: 0-1 turns, or 3-4
def test_continuous_engine_plays_the_same_episodes(shop, tiny, tiny_lm, room):
    """The continuous engine on 3 rows against the static decoder in lockstep, greedily, on 8 tasks (rows are taken
    again): every record the same, though replies end at different lengths and episodes at different turns."""
    from shopping_grpo.episode import run_continuous, TokenEpisode, Episode
    from shopping_grpo.generate import StaticDecoder, ContinuousDecoder
    _, tok = tiny_lm
    renderer = ChatRenderer(tok, load_chat_template())
    model = talkative_lm(tiny, renderer.end_id)
    tasks = shop.tasks['eval'][:8]
    ctx = min(len(TokenEpisode(Episode(shop.env(), t), renderer).prompt_ids) for t in tasks) + room
    kw = dict(max_turns=4, max_context=ctx, max_new_tokens=12)
    static = StaticDecoder(model=model, tokenizer=tok, max_new_tokens=12, device='cpu')
    engine = ContinuousDecoder(model=model, tokenizer=tok, max_new_tokens=12, device='cpu', rows=3, max_context=ctx,
                               bucket=64, prefill_tokens=1500)
    a = records(run_lockstep, shop, tasks, static, renderer, batch_size=8, **kw)
    b = records(run_continuous, shop, tasks, engine, renderer, **kw)
    assert set(a) == set(b) == {t.task_id for t in tasks}
    for k in a:
        for f in ('prompt_ids', 'response_ids', 'response_mask', 'turn_spans', 'messages', 'events', 'reward',
                  'termination_reason', 'n_turns', 'flags'):
            assert a[k][f] == b[k][f], (k, f)
        assert max((abs(x - y) for x, y in zip(a[k].get('logprobs', []), b[k].get('logprobs', []))), default=0) < 1e-4
    lengths = {e - s for r in b.values() for s, e in r['turn_spans']}
    assert len(lengths) > 3 and min(lengths) < 12 and max(lengths) == 12  # replies end early, and at the limit
    turns = sorted(r['n_turns'] for r in b.values())
    assert turns[0] < turns[-1] if room == 150 else (turns[0], turns[-1]) == (0, 1)
    assert engine.decode_steps > 0 and engine.prefill_passes > 0


def test_continuous_engine_draws_belong_to_episodes(shop, tiny, tiny_lm):
    """Sampled (temperature 0.7, top-p 0.9), each episode's tokens come from its own seed: 2 rows or 5, tasks in order
    or reversed, every episode the same."""
    from shopping_grpo.episode import run_continuous
    from shopping_grpo.generate import ContinuousDecoder
    _, tok = tiny_lm
    renderer = ChatRenderer(tok, load_chat_template())
    model = talkative_lm(tiny, renderer.end_id)
    tasks = shop.tasks['eval'][:3] * 2  # each task twice: copies of a task draw differently
    runs = []
    for rows, order in ((2, 1), (5, -1)):
        engine = ContinuousDecoder(model=model, tokenizer=tok, max_new_tokens=12, device='cpu', rows=rows,
                                   max_context=4096, temperature=0.7, top_p=0.9, seed=1)
        recs = run_continuous(shop, tasks[::order], engine, renderer, 'tiny', max_turns=3, max_context=4096,
                              max_new_tokens=12)
        by = {}
        for r in recs: by.setdefault(r['task_id'], []).append(r['response_ids'])
        runs.append({k: sorted(v) for k, v in by.items()})
    assert runs[0] == runs[1]
    assert all(v[0] != v[1] for v in runs[0].values())  # the two copies of a task were sampled apart
