"""LoRA SFT (05_sft) on the CPU: a tiny Llama with SmolLM2's tokenizer and chat template, trained a few steps on expert
trajectories: the loss falls, the adapter is written and reloads, a rerun resumes from the checkpoint, the merge generates."""
from __future__ import annotations
import json
import pytest
import torch

from shopping_grpo.policies import ExpertPolicy
from shopping_grpo.episode import run_message_episode, scripted_run, ChatRenderer, Episode, TokenEpisode
from shopping_grpo.records import append_record
from shopping_grpo.sft import (SFTData, SFTConfig, sft_example, train_sft, merge_lora, action_loss, IGNORE, ActionLoss,
                               PadCollator, PackedCollator, packed_row, register_conversation_attention)


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


def test_packed_step_is_the_unpacked_step(tiny, expert_files, tok, tmp_path):
    "One optimizer step over four conversations, packed in one row or one a micro-batch: same loss, tokens, adapter."
    from safetensors.torch import load_file
    rows = sorted(SFTData(expert_files[0], tok).rows, key=lambda r: len(r['input_ids']))[:4]
    same = dict(lr=1e-3, batch_size=1, max_steps=1, warmup=0, lora_dropout=0.0)
    runs = {name: train_sft(tiny, rows, [], tmp_path/name, SFTConfig(**same, **cfg), progress=False)
            for name, cfg in (('one_by_one', dict(grad_accum=4)), ('packed', dict(grad_accum=1, pack_tokens=16384)))}
    assert runs['packed']['packing'] == dict(conversations=4, packed_rows=1, fill=runs['packed']['packing']['fill'])
    logs = {name: [json.loads(l) for l in (tmp_path/name/'log.jsonl').read_text().splitlines()] for name in runs}
    step = {name: next(r for r in log if r['kind'] == 'train') for name, log in logs.items()}
    assert step['packed']['tokens'] == step['one_by_one']['tokens'] == sum(len(r['input_ids']) for r in rows)
    assert step['packed']['labelled_tokens'] == step['one_by_one']['labelled_tokens']
    assert abs(step['packed']['loss'] - step['one_by_one']['loss']) < 1e-5
    adapters = {name: load_file(tmp_path/name/'adapter'/'adapter_model.safetensors') for name in runs}
    for k, v in adapters['one_by_one'].items(): assert torch.allclose(adapters['packed'][k], v, rtol=1e-4, atol=1e-5), k


def adapter_step(model, batches, labelled=None):
    "Loss of collated micro-batches accumulated as Trainer does, and the gradient of every adapter weight."
    loss_fn, total = ActionLoss(model.get_output_embeddings()), 0.0
    model.zero_grad()
    for b in batches:
        b = dict(b); labels = b.pop('labels')
        on_device = {k: v.to(model.device) if hasattr(v, 'to') else v for k, v in b.items()}
        loss = loss_fn(model(**on_device), labels.to(model.device), labelled)
        loss.backward(); total += loss.item()
    return total, {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_packed_row_on_gpu(tiny, expert_files, tok):
    "On a GPU too, a packed row under conversation attention gives sdpa's loss and adapter gradients, one at a time."
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    rows = sorted(SFTData(expert_files[0], tok).rows, key=lambda r: len(r['input_ids']))[:4]
    def lora(attention):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation=attention)
        return get_peft_model(m, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules='all-linear',
                                            init_lora_weights=False)).cuda()
    labelled = sum(l != IGNORE for r in rows for l in r['labels'][1:])
    one = adapter_step(lora('sdpa'), [PadCollator(tok.pad_token_id)([r]) for r in rows], labelled)
    packed = adapter_step(lora(register_conversation_attention()), [PackedCollator()([packed_row(rows)])])
    assert abs(packed[0] - one[0]) < 1e-4
    for n, g in one[1].items(): assert torch.allclose(packed[1][n], g, rtol=1e-3, atol=1e-5), n
