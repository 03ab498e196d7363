"""Training speed of LoRA SFT micro-batches (05_sft): one conversation a micro-batch, four padded together, or packed
rows, with transformers' dense packed-sequence mask or with `conversation_attention`. Each variant runs forward and
backward (the action-only loss, as `ActionLoss`) over the same conversations and reports real tokens/s (padding not
counted), wall and CPU seconds and, on a GPU, peak memory. On a shared CPU machine, read the CPU seconds
(`--threads 1` keeps them steady). Weights are random: the speed of a pass does not depend on them, and no model
needs to travel. Models: `tiny` (05_sft's `tiny_model`), `smollm2` (SmolLM2-135M's shape, from the embedded
checkpoint's config), `qwen-shape` and `qwen1.5b-shape` (Qwen2.5-0.5B's and 1.5B's shapes, built from numbers).

    python benchmarks/bench_sft_packing.py --model tiny --rows outputs/nbtest-05/sft_demo/sft_train.jsonl --out /tmp/packing.json
    python benchmarks/bench_sft_packing.py --model qwen-shape --out benchmarks/results/sft_packing_qwen_shape.json   # on a GPU
    python benchmarks/bench_sft_packing.py --model qwen-shape --variants packed --base-dtype bfloat16 --out /tmp/packed_bf16.json   # the base in bf16
    python benchmarks/bench_sft_packing.py --model qwen1.5b-shape --variants packed --profile 2 --out /tmp/profiled.json   # where the time goes
    python benchmarks/bench_sft_packing.py --model qwen1.5b-shape --variants packed,packed_cuts_per_layer --out /tmp/cuts.json   # cuts read once a row or once a layer
    python benchmarks/bench_sft_packing.py --model qwen1.5b-shape --variants packed --base-dtype bfloat16 --lora-dtype base --out /tmp/lora_bf16.json   # LoRA in bf16 too
    python benchmarks/bench_sft_packing.py --model qwen1.5b-shape --variants packed --base-dtype bfloat16 --compile mlp --out /tmp/mlp_compiled.json   # fused elementwise work
"""
from __future__ import annotations
import argparse, json, time
from pathlib import Path

VARIANTS = ('one', 'padded4', 'packed_mask', 'packed')
PACKED_CUTS_PER_LAYER = 'packed_cuts_per_layer'  # `packed` as it was: every layer read the row's cuts from the device


QWEN_SHAPES = {'qwen-shape': dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
               'qwen1.5b-shape': dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12)}


def qwen_shape(name:str='qwen-shape'):
    "The configuration of a Qwen2.5-0.5B-sized (`qwen-shape`) or 1.5B-sized (`qwen1.5b-shape`) model."
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=151936, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                       tie_word_embeddings=True, **QWEN_SHAPES[name])


def model_config(name:str, scratch:Path):
    "The configuration of `name` (tiny, smollm2, qwen-shape) and a tokenizer folder, or None."
    from transformers import AutoConfig
    from shopping_grpo.model import materialize_model
    from shopping_grpo.sft import tiny_model
    if name in QWEN_SHAPES: return qwen_shape(name), None
    path = tiny_model(scratch/'tiny') if name == 'tiny' else materialize_model(name)
    return AutoConfig.from_pretrained(str(path)), str(path)


def synthetic_rows(n:int, lo:int, hi:int, seed:int=0, vocab:int=30000) -> list[dict]:
    "`n` rows of `lo`..`hi` tokens: a 1,000-token prompt, then 600-token rounds whose last 40 tokens are labelled."
    import random
    rng, rows = random.Random(seed), []
    for _ in range(n):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]
        rows.append(dict(input_ids=ids, labels=[t if i >= 1000 and i % 600 >= 560 else -100 for i, t in enumerate(ids)]))
    return rows


def micro_batches(variant:str, rows:list[dict], pack_tokens:int, pad_id:int):
    "The collated micro-batches of `variant` over `rows`."
    from shopping_grpo.sft import PadCollator, PackedCollator, pack_rows
    if variant == 'one': return [PadCollator(pad_id)([r]) for r in rows]
    if variant == 'padded4':
        order = sorted(rows, key=lambda r: len(r['input_ids']))  # like lengths together, as group_by_length does
        return [PadCollator(pad_id)(order[i:i + 4]) for i in range(0, len(order), 4)]
    return [PackedCollator()([p]) for p in pack_rows(rows, pack_tokens)]


def cuts_read(variant:str):
    "Where `variant` reads a packed row's cuts: `conversation_cuts` as it is (once a row), or once a layer for `packed_cuts_per_layer`."
    import contextlib
    from unittest import mock
    import shopping_grpo.sft as sft
    if variant != PACKED_CUTS_PER_LAYER: return contextlib.nullcontext()
    cached = sft.conversation_cuts
    def per_layer(position_ids):
        sft._CUTS.clear()
        return cached(position_ids)
    return mock.patch.object(sft, 'conversation_cuts', per_layer)


COMPILE = ('none', 'mlp', 'layers')  # what torch.compile fuses: nothing, each block's MLP (with its LoRA), or each whole block


def compiled(model, what:str):
    """`model` with each decoder block's MLP (`mlp`) or whole block (`layers`) compiled by torch.compile, shapes dynamic
    (a packed row's length changes from one micro-batch to the next); `conversation_attention`'s cuts break the graph."""
    if what == 'none': return model
    blocks = model.get_base_model().model.layers
    for block in blocks: (block.mlp if what == 'mlp' else block).compile(dynamic=True)
    return model


def timed_pass(model, batches, device:str) -> tuple[float, float]:
    "Wall and CPU seconds of forward and backward over `batches`, with the action-only loss."
    import torch
    from shopping_grpo.sft import ActionLoss
    loss_fn = ActionLoss(model.get_output_embeddings())
    if device == 'cuda': torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches:
        b = {k: v.to(device) if hasattr(v, 'to') else v for k, v in b.items()}
        labels = b.pop('labels')
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == 'cuda'):
            loss = loss_fn(model(**b), labels)
        loss.backward()
    if device == 'cuda': torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def profiled_pass(model, batches, device:str, top:int=12) -> dict:
    """One pass over `batches` under torch's profiler: how busy the device was (its kernels' time over the wall time,
    the gaps being where it waited for the CPU), the `top` operators by their own device time and, on a GPU, by their
    own CPU time (where the host spends the pass: launching, or waiting on a synchronisation)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    cuda = device == 'cuda'
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t0 = time.perf_counter()
        timed_pass(model, batches, device)
        wall = time.perf_counter() - t0
    from torch.autograd import DeviceType
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    rows = prof.key_averages()
    kernels = [e for e in rows if e.device_type == DeviceType.CUDA]  # a kernel's time is also its operator's: count it once
    events = sorted([e for e in rows if e.device_type != DeviceType.CUDA], key=own, reverse=True)  # the operators
    total = sum(own(e) for e in (kernels if cuda else events)) / 1e6  # seconds the device's kernels ran (on a CPU: the operators' own time)
    return dict(micro_batches=len(batches), wall_seconds=round(wall, 3), busy_seconds=round(total, 3),
                busy_share=round(total / wall, 3) if cuda else None,
                top=[dict(op=e.key[:80], seconds=round(own(e) / 1e6, 4), share=round(own(e) / 1e6 / total, 3), calls=e.count)
                     for e in events[:top]],
                top_cpu=[dict(op=e.key[:80], seconds=round(e.self_cpu_time_total / 1e6, 4), calls=e.count)
                         for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]] if cuda else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='tiny', choices=['tiny', 'smollm2', 'qwen2.5-0.5b', *QWEN_SHAPES])
    ap.add_argument('--rows', default=None, help="trajectory JSONL (04_collect's sft_train.jsonl); none: synthetic rows")
    ap.add_argument('--conversations', type=int, default=32, help='conversations per pass')
    ap.add_argument('--lengths', default='1000,7500', help='synthetic rows: shortest,longest (the Qwen reference: mean 4,029)')
    ap.add_argument('--max-len', type=int, default=8192)
    ap.add_argument('--pack-tokens', type=int, default=16384)
    ap.add_argument('--variants', default=','.join(VARIANTS))
    ap.add_argument('--repeats', type=int, default=2, help='timed passes per variant, after one untimed')
    ap.add_argument('--threads', type=int, default=None, help="CPU threads (torch's default: one per core)")
    ap.add_argument('--base-dtype', default='float32', choices=['float32', 'bfloat16'],
                    help="the frozen base weights, as 05_sft's base_dtype (bf16 autocast on a GPU either way)")
    ap.add_argument('--lora-dropout', type=float, default=0.05, help="05_sft's lora_dropout (0: PEFT skips the dropout)")
    ap.add_argument('--lora-dtype', default='float32', choices=['float32', 'base'],
                    help="the LoRA weights: float32 (as 05_sft: PEFT casts them up), or the base's dtype (no casts under autocast)")
    ap.add_argument('--compile', default='none', choices=COMPILE,
                    help="torch.compile each block's MLP or each whole block (the untimed first pass compiles)")
    ap.add_argument('--profile', type=int, default=0, help='also profile a pass over this many micro-batches of each variant')
    ap.add_argument('--scratch', default='outputs/bench-sft-packing')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from peft import LoraConfig, get_peft_model
    from shopping_grpo.records import package_versions
    from shopping_grpo.sft import SFTData, register_conversation_attention, model_flops_utilisation
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if a.threads: torch.set_num_threads(a.threads)
    cfg, tok_path = model_config(a.model, Path(a.scratch))
    if a.rows:
        rows = SFTData(a.rows, AutoTokenizer.from_pretrained(tok_path), a.max_len).rows[:a.conversations]
    else:
        rows = synthetic_rows(a.conversations, *map(int, a.lengths.split(',')), vocab=min(cfg.vocab_size, 30000))
    tokens = sum(len(r['input_ids']) for r in rows)
    res = dict(device=torch.cuda.get_device_name() if device == 'cuda' else f'cpu ({torch.get_num_threads()} threads)',
               model=a.model, rows=a.rows or f'synthetic {a.lengths}', conversations=len(rows), tokens=tokens,
               labelled=sum(l != -100 for r in rows for l in r['labels'][1:]), pack_tokens=a.pack_tokens, base_dtype=a.base_dtype,
               lora_dropout=a.lora_dropout, lora_dtype=a.lora_dtype if a.lora_dtype == 'float32' else a.base_dtype, compile=a.compile,
               versions=package_versions(('torch', 'transformers', 'peft')), variants={})
    for v in a.variants.split(','):
        attention = register_conversation_attention() if v in ('packed', PACKED_CUTS_PER_LAYER) else 'sdpa'
        torch.manual_seed(0)
        with torch.device(device): model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, a.base_dtype), attn_implementation=attention)
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=a.lora_dropout, target_modules='all-linear'),
                               autocast_adapter_dtype=a.lora_dtype == 'float32').train()
        model = compiled(model, a.compile)
        res['model_params'] = sum(p.numel() for p in model.parameters())  # as 05_sft counts them: base and LoRA
        batches = micro_batches(v, rows, a.pack_tokens, 0)
        with cuts_read(v):
            t0 = time.perf_counter()
            timed_pass(model, batches[:1] if a.compile == 'none' else batches, device)  # start-up (kernels, allocator, compiling) left out
            warmup = time.perf_counter() - t0
            if device == 'cuda': torch.cuda.reset_peak_memory_stats()
            seconds, cpu_seconds = min(timed_pass(model, batches, device) for _ in range(a.repeats))
        res['variants'][v] = dict(micro_batches=len(batches), seconds=round(seconds, 3), tokens_per_s=round(tokens / seconds),
                                  warmup_seconds=round(warmup, 1),
                                  cpu_seconds=round(cpu_seconds, 3), tokens_per_cpu_s=round(tokens / cpu_seconds),
                                  longest_micro_batch=max(b['input_ids'].numel() for b in batches),
                                  peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == 'cuda' else None,
                                  mfu=model_flops_utilisation(tokens / seconds, res['model_params'], res['device']))
        if a.profile:
            with cuts_read(v): res['variants'][v]['profile'] = profiled_pass(model, batches[:a.profile], device)
        print(v, json.dumps(res['variants'][v]), flush=True)
        del model, batches
        if device == 'cuda': torch.cuda.empty_cache()
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
