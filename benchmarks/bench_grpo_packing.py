"""Training speed of a GRPO step's loss passes (06_grpo): TRL's padded micro-batches (every episode padded to the
step's longest prompt and completion, as TRL lays out a generation batch) against `pack_episodes`, a micro-batch's
episodes end to end in one row. Each variant runs forward (TRL's fused head, log-probabilities of the completion's
tokens) and backward (their masked sum) over the same 32 synthetic episodes of a step and reports seconds, real
tokens/s (padding not counted), CPU seconds and, on a GPU, peak memory; the ratio is against the `one` variant measured
in the same run. Weights are random: the speed of a pass does not depend on them, and no model needs to travel.
Models: `tiny` (05_sft's `tiny_model`), `qwen-shape` (Qwen2.5-0.5B's shape, from numbers).

    python benchmarks/bench_grpo_packing.py --model tiny --threads 1 --out benchmarks/results/grpo_packing_tiny_cpu.json
    python benchmarks/bench_grpo_packing.py --model qwen-shape --out benchmarks/results/grpo_packing_qwen_shape.json   # on a GPU
"""
from __future__ import annotations
import argparse, contextlib, json, random, sys, time, types
from pathlib import Path

# variant -> (episodes a micro-batch, packed)
VARIANTS = {'one': (1, False), 'padded4': (4, False), 'packed4': (4, True), 'packed8': (8, True)}


def step_batch(episodes:int, prompts:tuple[int, int], completions:tuple[int, int], vocab:int, seed:int=0):
    "A step's episodes as TRL holds them: ids, attention mask and completion mask, prompts left- and completions right-padded."
    import torch
    rng = random.Random(seed)
    lens = [(rng.randint(*prompts), rng.randint(*completions)) for _ in range(episodes)]
    P, C = max(p for p, _ in lens), max(c for _, c in lens)
    ids, mask = torch.zeros(episodes, P + C, dtype=torch.long), torch.zeros(episodes, P + C, dtype=torch.long)
    for i, (p, c) in enumerate(lens):
        mask[i, P - p:P + c] = 1
        ids[i, P - p:P + c] = torch.tensor([rng.randrange(2, vocab) for _ in range(p + c)])
    return ids, mask, C


def timed_step(trainer_like, trainer_cls, model, ids, mask, C:int, micro:int, device:str) -> tuple[float, float]:
    "Wall and CPU seconds of a step's forward and backward passes, `micro` episodes a pass."
    import torch
    if device == 'cuda': torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for a in range(0, len(ids), micro):
        b_ids, b_mask = ids[a:a + micro].to(device), mask[a:a + micro].to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == 'cuda'):
            lp, _, _ = trainer_cls._get_per_token_logps_and_entropies(trainer_like, model, b_ids, b_mask, C, compute_entropy=True)
        scored = b_mask[:, -C:]
        (-(lp * scored).sum() / scored.sum()).backward()
    if device == 'cuda': torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='tiny', choices=['tiny', 'qwen-shape'])
    ap.add_argument('--episodes', type=int, default=32, help="a step's episodes (the gpu recipe: 8 groups of 4)")
    ap.add_argument('--prompts', default='1500,2200', help='prompt tokens: fewest,most (the system prompt and the request)')
    ap.add_argument('--completions', default='300,5500', help="completion tokens: fewest,most (the turns after the prompt)")
    ap.add_argument('--variants', default=','.join(VARIANTS))
    ap.add_argument('--repeats', type=int, default=2, help='timed steps per variant, after one untimed pass')
    ap.add_argument('--threads', type=int, default=None, help="CPU threads (torch's default: one per core)")
    ap.add_argument('--scratch', default='outputs/bench-grpo-packing')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head
    from shopping_grpo.records import package_versions
    from shopping_grpo.sft import tiny_model
    from shopping_grpo.grpo import shop_grpo_trainer
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_sft_packing import qwen_shape
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if a.threads: torch.set_num_threads(a.threads)
    cfg = qwen_shape() if a.model == 'qwen-shape' else AutoConfig.from_pretrained(str(tiny_model(Path(a.scratch)/'tiny')))
    ids, mask, C = step_batch(a.episodes, tuple(map(int, a.prompts.split(','))), tuple(map(int, a.completions.split(','))),
                              min(cfg.vocab_size, 30000))
    tokens = int(mask.sum())
    res = dict(device=torch.cuda.get_device_name() if device == 'cuda' else f'cpu ({torch.get_num_threads()} threads)',
               model=a.model, episodes=a.episodes, prompts=a.prompts, completions=a.completions, tokens=tokens,
               padded_tokens=ids.numel(), versions=package_versions(('torch', 'transformers', 'peft', 'trl')), variants={})
    for v in a.variants.split(','):
        micro, packed = VARIANTS[v]
        torch.manual_seed(0)
        with torch.device(device): model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device == 'cuda' else torch.float32)
        add_fused_lm_head(model, temperature=0.7, outputs=('log_probs', 'entropy'))
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules='all-linear')).train()
        trainer_like = types.SimpleNamespace(pack_episodes=packed, accelerator=types.SimpleNamespace(
            autocast=contextlib.nullcontext, is_main_process=True))
        cls = shop_grpo_trainer() if packed else GRPOTrainer
        timed_step(trainer_like, cls, model, ids[:micro], mask[:micro], C, micro, device)  # start-up left out
        if device == 'cuda': torch.cuda.reset_peak_memory_stats()
        seconds, cpu_seconds = min(timed_step(trainer_like, cls, model, ids, mask, C, micro, device) for _ in range(a.repeats))
        res['variants'][v] = dict(micro_batch=micro, packed=packed, passes=-(-a.episodes // micro), seconds=round(seconds, 3),
                                  tokens_per_s=round(tokens / seconds), cpu_seconds=round(cpu_seconds, 3),
                                  peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == 'cuda' else None)
        print(v, json.dumps(res['variants'][v]), flush=True)
        del model
        if device == 'cuda': torch.cuda.empty_cache()
    if 'one' in res['variants']:
        for r in res['variants'].values(): r['speedup_vs_one'] = round(res['variants']['one']['seconds'] / r['seconds'], 2)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
