"""The GPU reference of an embedded model (default: Qwen2.5-0.5B): expert collection, LoRA SFT, and the frozen
benchmarks (template, free-form and hand-written wording) for the untrained and the trained model, with the teacher-forced
decisions of the trained one. One wording of the training requests per call; every stage resumes from what its
folder holds. Small result files go to --out (summaries, logs, compressed trajectories, the fp16 adapter in pieces).

    python scripts/reference_qwen.py --wording template --stages shop,collect,sft,eval,agree --run outputs/qwen --out outputs/qwen-out
    python scripts/reference_qwen.py --wording varied --stages shop,collect,sft,eval --run outputs/qwen --out outputs/qwen-out
    python scripts/reference_qwen.py --stages nonfinite --run outputs/qwen --out outputs/qwen-out  # SFT with accumulation 4
"""
from __future__ import annotations
import argparse, gzip, json, shutil, time, traceback
from pathlib import Path

STAGES = ('shop', 'collect', 'base', 'sft', 'eval', 'agree', 'nonfinite')
BF16_PEAK_FLOPS = 989e12  # dense bf16 of an H100/H200 SXM, the vendor's figure


def log(msg:str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def options():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='qwen2.5-0.5b', help='an embedded model name, a checkpoint or a Hub id')
    ap.add_argument('--wording', default='template', choices=['template', 'varied'], help='wording of the training requests')
    ap.add_argument('--run', default='outputs/qwen', help='work folder (one sub-folder per wording)')
    ap.add_argument('--out', default='outputs/qwen-out', help='folder for the small result files')
    ap.add_argument('--stages', default='shop,collect,base,sft,eval,agree', help=f'comma list of {", ".join(STAGES)}')
    ap.add_argument('--sft-tasks', type=int, default=1500, help='size of the SFT task split')
    ap.add_argument('--target-accepted', type=int, default=1200, help='accepted expert episodes to collect')
    ap.add_argument('--n-train', type=int, default=1000, help='training conversations')
    ap.add_argument('--n-val', type=int, default=100, help='validation conversations')
    ap.add_argument('--epochs', type=float, default=2)
    ap.add_argument('--lr', type=float, default=1e-4)
    ap.add_argument('--batch-size', type=int, default=4, help='conversations per micro-batch')
    ap.add_argument('--grad-accum', type=int, default=1, help='micro-batches per optimizer step')
    ap.add_argument('--pack-tokens', type=int, default=0, help='conversations packed into rows of this many tokens, '
                    'one row a micro-batch (needs --batch-size 1); 0: padded micro-batches, as the recorded runs')
    ap.add_argument('--max-len', type=int, default=8192, help='longest conversation trained on, in tokens')
    ap.add_argument('--benchmarks', default='template,freeform,human')
    ap.add_argument('--eval-batch', type=int, default=200, help='episodes in lockstep')
    ap.add_argument('--max-new-tokens', type=int, default=128)
    ap.add_argument('--n-agree', type=int, default=60, help='benchmark tasks whose expert episodes are teacher-forced')
    ap.add_argument('--workers', type=int, default=12)
    ap.add_argument('--device', default=None, help='cuda (default when there is one) or cpu (a dry run)')
    ap.add_argument('--n-eval', type=int, default=None, help='play only the first N benchmark tasks (a dry run)')
    ap.add_argument('--max-steps', type=int, default=-1, help='stop SFT after N optimizer steps (a dry run)')
    return ap.parse_args()


def keep(src, out:Path, name:str):
    "Copy a small result file to `out` (gzip for trajectories)."
    src = Path(src)
    if not src.exists(): return
    if src.suffix == '.jsonl' and src.stat().st_size > 1_000_000:
        with open(src, 'rb') as f, gzip.open(out/f'{name}.gz', 'wb') as g: shutil.copyfileobj(f, g)
    else: shutil.copy(src, out/name)


def the_shop(a, run:Path):
    from shopping_grpo.shop import prepare_shop, DEFAULT_SIZES
    t0 = time.time()
    shop = prepare_shop(run, 20_000, 0, 1, 'en', sizes=dict(DEFAULT_SIZES, sft=a.sft_tasks), progress=False,
                        wording=a.wording)
    log(f"shop ({a.wording} wording) ready in {time.time() - t0:.0f}s: {shop.tasks['sft'][0].instruction!r}")
    return shop


def stage_collect(a, shop, run:Path, out:Path):
    from shopping_grpo.policies import ExpertPolicy
    from shopping_grpo.collect import collect, split_accepted, write_sft_split, load_trajectories
    t0 = time.time()
    audit = collect(shop, shop.tasks['sft'], ExpertPolicy(shop.catalog), run/'collect', workers=a.workers,
                    target_accepted=a.target_accepted, progress=False)
    accepted = load_trajectories(run/'collect'/'accepted.jsonl')
    train, val = split_accepted(accepted, a.n_train, a.n_val)
    write_sft_split(run/'collect', train, val, shop)
    keep(run/'collect'/'audit.json', out, f'collect_audit_{a.wording}.json')
    log(f"collected {audit['n_accepted']} accepted in {time.time() - t0:.0f}s")


def stage_sft(a, run:Path, out:Path, base):
    from transformers import AutoTokenizer
    from shopping_grpo.records import write_atomic
    from shopping_grpo.sft import SFTData, train_sft, merge_lora, sft_config
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(base))
    train = SFTData(run/'collect'/'sft_train.jsonl', tok, a.max_len)
    val = SFTData(run/'collect'/'sft_val.jsonl', tok, a.max_len)
    log(f'sft rows: train {train.counts}, val {val.counts}')
    cfg = sft_config('gpu', epochs=a.epochs, lr=a.lr, batch_size=a.batch_size, grad_accum=a.grad_accum, max_len=a.max_len,
                     max_steps=a.max_steps, pack_tokens=a.pack_tokens)
    s = train_sft(base, train, val, run/'sft', cfg, progress=False)
    merge_lora(base, run/'sft'/'adapter', run/'sft'/'merged')
    n_params = parameters(run/'sft'/'merged')
    s['seconds_with_merge'] = round(time.time() - t0, 1)
    s['flops_convention'] = '6 x parameters x trained tokens/s against 989 TFLOP/s dense bf16'
    s['parameters'], s['mfu'] = n_params, round(6 * n_params * (s['tokens_per_s'] or 0) / BF16_PEAK_FLOPS, 4)
    write_atomic(run/'sft'/'summary.json', json.dumps(s, indent=1))
    keep(run/'sft'/'summary.json', out, f'sft_summary_{a.wording}.json')
    keep(run/'sft'/'log.jsonl', out, f'sft_log_{a.wording}.jsonl')
    save_adapter(run/'sft'/'adapter', out/f'adapter_{a.wording}')
    log(f"sft done in {time.time() - t0:.0f}s: {json.dumps({k: s.get(k) for k in ('epochs', 'tokens_per_s', 'peak_gpu_gib', 'train_seconds')})}")


def parameters(checkpoint:Path) -> int:
    "Number of weights in a checkpoint's safetensors files."
    import math
    from safetensors import safe_open
    n = 0
    for f in sorted(Path(checkpoint).glob('*.safetensors')):
        with safe_open(str(f), 'pt') as st: n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return n


def save_adapter(adapter:Path, dest:Path, piece:int=15 * 2**20):
    "The adapter in fp16, its weights split in pieces under 16 MiB (joined in file-name order)."
    import torch
    from safetensors.torch import load_file, save_file
    dest.mkdir(parents=True, exist_ok=True)
    weights = {k: v.to(torch.float16) for k, v in load_file(adapter/'adapter_model.safetensors').items()}
    save_file(weights, dest/'adapter_model.safetensors')
    data = (dest/'adapter_model.safetensors').read_bytes()
    (dest/'adapter_model.safetensors').unlink()
    for i in range(0, len(data), piece): (dest/f'adapter_model.safetensors.part{i // piece:02d}').write_bytes(data[i:i + piece])
    shutil.copy(adapter/'adapter_config.json', dest/'adapter_config.json')


def stage_eval(a, shop, run:Path, out:Path, models:dict):
    from shopping_grpo.evaluate import evaluate_model, eval_folder, write_comparison, compare_wordings
    for name, path in models.items():
        for bench in a.benchmarks.split(','):
            t0 = time.time()
            s = evaluate_model(shop, f'{name}=transformers:{path}', run, benchmark=bench, batch_size=a.eval_batch,
                               max_new_tokens=a.max_new_tokens, device=a.device, n_eval=a.n_eval, progress=False)
            folder = run/'eval'/eval_folder(name, bench)
            for f in ('summary.json', 'checks.jsonl', 'trajectories.jsonl'): keep(folder/f, out, f'{a.wording}_{folder.name}_{f}')
            log(f"{name} on {bench}: strict {s['strict_success']} purchase {s['purchase_success']} reward {s['mean_reward']} "
                f"outcomes {s['outcomes']} in {time.time() - t0:.0f}s")
        benches = a.benchmarks.split(',')
        for other in (b for b in benches if 'template' in benches and b != 'template'):  # each wording against the template one
            c = compare_wordings(run, name, other)
            log(f"{name} template vs {other}: {json.dumps({k: c.get(k) for k in ('a_value', 'b_value', 'won', 'lost', 'p_value')})}")
    if {'base', 'sft'} <= set(models):
        c = write_comparison(run, 'sft', 'base')
        log(f"sft vs base: {json.dumps({k: c.get(k) for k in ('a_value', 'b_value', 'won', 'lost', 'p_value')})}")
    for f in sorted((run/'eval'/'compare').glob('*.json')): keep(f, out, f'{a.wording}_compare_{f.name}')


def stage_agree(a, shop, run:Path, out:Path, merged:Path):
    from shopping_grpo.sft import expert_agreement
    res = expert_agreement(shop, merged, run/'agree', a.n_agree, a.device, a.workers)
    (out/f'agreement_{a.wording}.json').write_text(json.dumps(res, indent=1))
    log(f"agreement {res['agree']} over {res['turns']} turns in {res['minutes']} min")


def stage_nonfinite(a, run:Path, out:Path, base):
    "SFT with gradient accumulation 4 for a few steps, with autograd's anomaly detection: where a NaN comes from."
    import torch
    from transformers import AutoTokenizer
    from shopping_grpo.sft import SFTData, train_sft, sft_config, NonFiniteTraining
    tok = AutoTokenizer.from_pretrained(str(base))
    train = SFTData(run/'collect'/'sft_train.jsonl', tok, a.max_len)
    res = {}
    for name, accum, anomaly in (('accum4', 4, False), ('accum4_anomaly', 4, True), ('accum1', 1, False)):
        d = run/f'nonfinite-{name}'
        shutil.rmtree(d, ignore_errors=True)
        cfg = sft_config('gpu', batch_size=a.batch_size, grad_accum=accum, max_steps=3, max_len=a.max_len, pack_tokens=0)
        t0 = time.time()
        try:
            with torch.autograd.set_detect_anomaly(anomaly): s = train_sft(base, train, [], d, cfg, progress=False)
            res[name] = dict(finite=True, epochs=s['epochs'], seconds=round(time.time() - t0, 1))
        except NonFiniteTraining as e: res[name] = dict(finite=False, error=str(e), seconds=round(time.time() - t0, 1))
        except RuntimeError as e: res[name] = dict(finite=False, error=str(e)[-3000:], trace=traceback.format_exc()[-3000:])
        log(f"{name}: {json.dumps(res[name])[:600]}")
    (out/'nonfinite.json').write_text(json.dumps(res, indent=1))


def main():
    a = options()
    import torch
    a.device = a.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    stages = a.stages.split(',')
    if bad := set(stages) - set(STAGES): raise SystemExit(f"unknown stages {sorted(bad)}: use {', '.join(STAGES)}")
    run, out = Path(a.run)/a.wording, Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from shopping_grpo.model import materialize_model
    t0 = time.time()
    base = materialize_model(a.model)
    log(f'{a.model} materialised at {base} in {time.time() - t0:.0f}s')
    shop = the_shop(a, run)
    if 'collect' in stages: stage_collect(a, shop, run, out)
    if 'sft' in stages: stage_sft(a, run, out, base)
    models = ({'base': base} if 'base' in stages else {}) | ({'sft': run/'sft'/'merged'} if 'eval' in stages else {})
    if models: stage_eval(a, shop, run, out, models)
    if 'agree' in stages: stage_agree(a, shop, run, out, run/'sft'/'merged')
    if 'nonfinite' in stages: stage_nonfinite(a, run, out, base)
    log('done')


if __name__ == '__main__': main()
