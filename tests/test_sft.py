"""LoRA SFT (05_sft) on the CPU: a tiny Llama with SmolLM2's tokenizer and chat template, trained a few steps on expert
trajectories: the loss falls, the adapter is written and reloads, a rerun resumes from the checkpoint, the merge generates."""
from __future__ import annotations
import json
import pytest
import torch

from shopping_grpo.policies import ExpertPolicy
from shopping_grpo.episode import run_message_episode, scripted_run, ChatRenderer, Episode, TokenEpisode
from shopping_grpo.records import append_record
from shopping_grpo.sft import SFTData, SFTConfig, sft_example, train_sft, merge_lora, action_loss, IGNORE


@pytest.fixture(scope='module')
def expert_files(shop, tmp_path_factory):
    "Expert trajectories of 8 SFT tasks as JSONL files (6 train, 2 val), as 04_collect writes them."
    d = tmp_path_factory.mktemp('collect'); tasks = shop.tasks['sft'][:8]
    for name, part in (('sft_train.jsonl', tasks[:6]), ('sft_val.jsonl', tasks[6:])):
        with open(d/name, 'w', encoding='utf-8') as f:
            for t in part: append_record(f, run_message_episode(shop, t, ExpertPolicy(shop.catalog)))
    return d/'sft_train.jsonl', d/'sft_val.jsonl'


@pytest.fixture(scope='module')
def tok(tiny):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny)


def test_rows_are_the_runner_stream(shop, tok):
    "Ids equal the TokenEpisode context; labels sit exactly on its response mask."
    r = ChatRenderer(tok, None, 'en')
    for t in shop.tasks['sft'][:3]:
        ex = sft_example(run_message_episode(shop, t, ExpertPolicy(shop.catalog))['messages'], r)
        te = scripted_run(shop, t, r)
        assert ex['input_ids'] == te.prompt_ids + te.response_ids
        assert [int(l != IGNORE) for l in ex['labels']] == [0]*len(te.prompt_ids) + te.response_mask


def test_train_resume_merge(tiny, expert_files, tok, tmp_path):
    from transformers import AutoModelForCausalLM
    from peft import PeftModel
    from shopping_grpo.generate import TransformersPolicy
    train, val = SFTData(expert_files[0], tok), SFTData(expert_files[1], tok)
    assert (len(train), len(val)) == (6, 2) and train.counts['over_length'] == 0
    rows, val = sorted(train.rows, key=lambda r: len(r['input_ids']))[:4], val.rows[:1]  # the shortest: attention cost grows with length squared
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    before, n = action_loss(base, rows, pad_id=tok.pad_token_id)
    cfg = SFTConfig(lr=2e-3, batch_size=2, grad_accum=1, max_steps=2, save_steps=1, warmup=0, lora_dropout=0.0)
    out = tmp_path/'sft'
    s1 = train_sft(tiny, rows, val, out, cfg, progress=False)
    assert s1['final_step'] == 2 and s1['resumed_from'] is None and (out/'checkpoint-2').is_dir()
    files = {p.name for p in (out/'adapter').iterdir()}
    assert {'adapter_config.json', 'adapter_model.safetensors'} <= files and (out/'adapter'/'adapter_model.safetensors').stat().st_size < 2**21
    # a rerun with a longer budget resumes at step 2 and continues the count
    s2 = train_sft(tiny, rows, val, out, {**vars(cfg), 'max_steps': 4}, progress=False)
    assert s2['resumed_from'].endswith('checkpoint-2') and s2['final_step'] == 4 and s2['steps'] == 4
    with pytest.raises(ValueError, match='other settings'): train_sft(tiny, rows, val, out, {**vars(cfg), 'lr': 1e-3}, progress=False)
    log = [json.loads(l) for l in (out/'log.jsonl').read_text().splitlines()]
    assert [r['step'] for r in log if r['kind'] == 'train'] == [1, 2, 3, 4]
    assert [r['step'] for r in log if r['kind'] == 'val'][0] == 0
    # the adapter reloads onto the base model and has lowered the loss on the training rows
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), out/'adapter')
    after, n2 = action_loss(tuned, rows, pad_id=tok.pad_token_id)
    assert n2 == n and after < before - 0.05, (before, after)
    # the merged checkpoint is the same model, carries the chat template, and generates
    merged = merge_lora(tiny, out/'adapter', out/'merged')
    m = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    assert abs(action_loss(m, rows, pad_id=tok.pad_token_id)[0] - after) < 1e-4
    from transformers import AutoTokenizer
    mtok = AutoTokenizer.from_pretrained(merged); assert mtok.chat_template == tok.chat_template
    assert json.loads((merged/'merged.json').read_text())['dtype'] == 'float32'
    ctx = sft_example(json.loads(expert_files[1].read_text().splitlines()[0])['messages'][:3], ChatRenderer(mtok, None, 'en'))['input_ids']
    new = TransformersPolicy(model=m, tokenizer=mtok, max_new_tokens=8, device='cpu')([ctx[:200]])[0]
    assert 1 <= len(new) <= 8
