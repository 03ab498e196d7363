"""The slot decoder (03b_generate) against the static decoder on whole shop episodes: the lockstep runner plays the same
tasks with both, greedily, with fewer rows than tasks so that rows are freed and refilled mid-run; every record must be
identical, while the slot decoder prefills only what is new. A small random model keeps it cheap on a CPU."""
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
