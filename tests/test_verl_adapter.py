"""veRL's checkpoint of a LoRA policy trained on two GPUs, made the way its FSDP workers make it: two processes of a
gloo group, each saving its shard of every LoRA tensor as a DTensor (`model_world_size_2_rank_R.pt`). `verl_adapter`
(06a_verl) must join the shards into the very tensors that were split, and the PEFT adapter it writes must give the
trained model back. On the CPU, in the project's own environment."""
from __future__ import annotations
import json, os
from pathlib import Path
import pytest
import torch
import torch.multiprocessing as mp
from shopping_grpo.verl_loop import verl_adapter


def tiny_lora(tiny:Path):
    "A tiny causal LM with a non-zero LoRA adapter (as if trained), the same on every call."
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    lm = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32),
                        LoraConfig(r=4, lora_alpha=8, target_modules='all-linear', task_type='CAUSAL_LM'))
    for n, w in lm.named_parameters():
        if 'lora_' in n: torch.nn.init.normal_(w, std=0.05)
    return lm.eval()


def save_shard(rank:int, world:int, tiny:str, actor:str, init:str):
    "One rank of the group: its Shard(0) piece of each LoRA tensor, saved as a DTensor the way veRL saves its shards."
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    dist.init_process_group('gloo', init_method=init, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh('cpu', (world,), mesh_dim_names=('fsdp',))
        full = {k: v for k, v in tiny_lora(Path(tiny)).state_dict().items() if 'lora_' in k}
        torch.save({k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()},
                   Path(actor)/f'model_world_size_{world}_rank_{rank}.pt')
    finally: dist.destroy_process_group()


def test_two_gpu_checkpoint_joins_into_the_trained_adapter(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from shopping_grpo.sft import tiny_model
    tiny = tiny_model(tmp_path/'tiny', hidden=48)  # 48 rows over 2 ranks, and the r=4 LoRA A matrices: 2 rows each
    actor = tmp_path/'run'/'verl'/'checkpoints'/'global_step_10'/'actor'
    actor.mkdir(parents=True)
    mp.spawn(save_shard, args=(2, str(tiny), str(actor), f'file://{tmp_path/"rendezvous"}'), nprocs=2, join=True)
    (actor/'fsdp_config.json').write_text(json.dumps(dict(FSDP_version=2, world_size=2)))
    (actor/'lora_train_meta.json').write_text(json.dumps(dict(r=4, lora_alpha=8, task_type='CAUSAL_LM')))
    one = torch.load(actor/'model_world_size_2_rank_1.pt', weights_only=False)
    trained = tiny_lora(tiny)
    full = {k: v for k, v in trained.state_dict().items() if 'lora_' in k}
    assert all(one[k].to_local().shape[0] < v.shape[0] for k, v in full.items())  # each file holds a part only

    adapter = verl_adapter(tmp_path/'run', str(tiny))
    from safetensors.torch import load_file
    saved = load_file(str(adapter/'adapter_model.safetensors'))
    assert {k.replace('.default.weight', '.weight') for k in full} == set(saved)
    assert all(torch.equal(saved[k.replace('.default.weight', '.weight')], v) for k, v in full.items())
    back = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32), str(adapter)).eval()
    x = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad(): assert torch.allclose(back(x).logits, trained(x).logits, atol=1e-6)
    assert json.loads((adapter/'source.json').read_text())['world_size'] == 2
