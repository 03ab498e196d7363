import torch, time, sys
from shopping_grpo.model import materialize_model
from shopping_grpo.generate import StaticDecoder, additive_mask
sys.path.insert(0, 'benchmarks'); from bench_generate import prompts
path = materialize_model('smollm2')
dec = StaticDecoder(path, max_new_tokens=128, device='cuda', cuda_graph=False); dec.end_id = -1
ctx = prompts(dec.tok, 256, 331)
print('attn impl', dec.model.config._attn_implementation)
s = dec._slot(256, 331 + 128)
with torch.inference_mode():
    logits, n = dec._prefill(s, ctx)
    for _ in range(3): dec._step(s)
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5): dec._step(s)
        torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
# time prefill alone
with torch.inference_mode():
    torch.cuda.synchronize(); t=time.time(); dec._prefill(s, ctx); torch.cuda.synchronize(); print('prefill s', time.time()-t)
    torch.cuda.synchronize(); t=time.time()
    for _ in range(20): dec._step(s)
    torch.cuda.synchronize(); print('eager step ms', (time.time()-t)/20*1000)
# sdpa variant
for impl in ['sdpa', 'eager']:
    try:
        dec.model.config._attn_implementation = impl
        with torch.inference_mode():
            torch.cuda.synchronize(); t=time.time()
            for _ in range(20): dec._step(s)
            torch.cuda.synchronize(); print(impl, 'step ms', (time.time()-t)/20*1000)
    except Exception as e: print(impl, 'failed', e)
