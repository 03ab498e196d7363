"""What a slot-decoder decode step costs against the columns its attention reads, on one GPU: every row live, the
captured step of width W replayed, for several W, with a model of Qwen2.5-1.5B's (or 0.5B's) shape. A step's
attention reads W columns of every row whatever the row's own length (the mask hides the rest), so the widest live
row sets the cost of all; this measures how much of a step that is. Weights are random (no model needs to travel).

    python benchmarks/bench_decode_width.py --out benchmarks/results/decode_width_qwen1.5b_shape.json   # on a GPU
    python benchmarks/bench_decode_width.py --device cpu --layers 2 --rows 4 --widths 512,1024 --out /tmp/w.json   # CPU check
"""
from __future__ import annotations
import argparse, json, time
from bench_decode_step import Tok          # benchmarks/ is the script's folder: its neighbours import
from bench_sft_packing import QWEN_SHAPES, qwen_shape


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='qwen1.5b-shape', choices=list(QWEN_SHAPES))
    ap.add_argument('--rows', type=int, default=100, help="07_evaluate's eval_batch")
    ap.add_argument('--widths', default='1024,2048,4096,8192,16384', help='columns the step reads')
    ap.add_argument('--repeats', type=int, default=50)
    ap.add_argument('--device', default='cuda')
    ap.add_argument('--layers', type=int, default=None, help='decoder layers (fewer: a CPU check of the script)')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM
    import shopping_grpo.generate as G
    from shopping_grpo.records import package_versions, write_atomic
    cfg = qwen_shape(a.model)
    if a.layers: cfg.num_hidden_layers = a.layers
    widths = [int(w) for w in a.widths.split(',')]
    torch.manual_seed(0)
    with torch.device(a.device): model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    cuda = a.device.startswith('cuda')
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = dict(device=torch.cuda.get_device_name() if cuda else 'cpu', model=a.model, layers=cfg.num_hidden_layers,
               rows=a.rows, versions=package_versions(('torch', 'transformers')), widths={})
    dec = G.SlotDecoder(model=model, tokenizer=Tok(), max_new_tokens=1, device=a.device, rows=a.rows, max_context=max(widths))
    res['kv_gib'] = round(G.kv_bytes(cfg, a.rows, dec.L, torch.bfloat16) / 2**30, 2)
    with torch.inference_mode():
        dec._ensure()
        dec.live.fill_(True)
        for w in widths:
            dec.lens.fill_(w - 2)  # every row one column short of the scratch one: the step reads all w columns
            step = (dec.graphs.get(w) or dec._capture(w))[0].replay if cuda else (lambda: dec._step(w))
            step(); sync()
            t = time.perf_counter()
            for _ in range(a.repeats): step()
            sync()
            ms = (time.perf_counter() - t) / a.repeats * 1000
            res['widths'][w] = dict(ms_step=round(ms, 3), tokens_per_s=round(a.rows / ms * 1000))
            print(w, json.dumps(res['widths'][w]), flush=True)
    first = res['widths'][widths[0]]['ms_step']
    for w in widths: res['widths'][w]['against_first'] = round(res['widths'][w]['ms_step'] / first, 2)
    if a.out: write_atomic(a.out, json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == '__main__': main()
