"""Calls of the slot decoder as a GRPO rollout makes them, on one GPU, with a Qwen2.5-0.5B-sized model (random weights,
output head scaled so that next-token distributions are peaked): 48 rows, a first call on 1,500-token prompts, then
seven turns that each append the 48 new tokens and a 400-token tool answer; each call's seconds, and one prefill of
400 new tokens on every row alone (the rest of a call is its 48 decode steps).

    python benchmarks/bench_decode_turns.py > benchmarks/results/decode_turns_qwen_shape.json
"""
import json, sys, time
from pathlib import Path
import torch
import shopping_grpo.generate as G
from transformers import AutoModelForCausalLM
sys.path.insert(0, str(Path(__file__).parent))
from bench_decode_step import Tok, qwen_shape


def main():
    cfg = qwen_shape()
    with torch.device('cuda'): m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad(): m.lm_head.weight.mul_(30)
    dec = G.SlotDecoder(model=m, tokenizer=Tok(), temperature=0.7, top_p=0.9, max_new_tokens=48, device='cuda',
                        rows=48, max_context=8192)
    g = torch.Generator().manual_seed(0)
    ctx = [torch.randint(0, 150000, (1500,), generator=g).tolist() for _ in range(48)]
    out = {}
    for turn in range(8):
        torch.cuda.synchronize(); t = time.time()
        o = dec(ctx); torch.cuda.synchronize(); dt = time.time() - t
        out[turn] = dict(call_s=round(dt, 3), longest=max(map(len, ctx)), prefilled=dec.prefilled)
        ctx = [c + x + [151645] + torch.randint(0, 150000, (400,), generator=g).tolist() for c, x in zip(ctx, o)]
    rows, starts = list(range(48)), [len(h) for h in dec.held]
    chunks = [torch.randint(0, 150000, (400,), generator=g).tolist() for _ in rows]
    torch.cuda.synchronize(); t = time.time()
    with torch.inference_mode(): dec._prefill(rows, chunks, starts)
    torch.cuda.synchronize(); out['prefill_48x400_s'] = round(time.time() - t, 3)
    print(json.dumps(out))


if __name__ == '__main__': main()
