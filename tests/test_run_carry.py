"""A run carried to another machine (`pack-run`, `unpack-run`): merged checkpoints come back from their adapters with
the same weights, a GRPO model merged onto the run's own SFT model is remade after it, and the pipeline on the new
machine skips every stage the ledger records."""
from __future__ import annotations
import json, shutil, subprocess, sys
from pathlib import Path
import pytest
from typer.testing import CliRunner

from shopping_grpo.cli import app, pack_run, unpack_run, carried_files, seed_run


def adapter(base:str, out:Path, seed:int) -> Path:
    "A LoRA adapter on `base` with random (non-zero) weights, saved under `out`."
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    m = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                       LoraConfig(r=4, lora_alpha=8, target_modules=['q_proj', 'v_proj'], init_lora_weights=False))
    m.save_pretrained(out)
    return out


def weights(path:Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(next(path.glob('*.safetensors'))))


@pytest.fixture
def trained_run(tmp_path, tiny):
    "A run folder holding an SFT adapter merged onto the tiny base and a GRPO adapter merged onto that SFT model."
    from shopping_grpo.sft import merge_lora
    run = tmp_path/'machine-a'/'run'
    (run/'notebooks').mkdir(parents=True)
    (run/'pipeline.json').write_text('{}')
    merge_lora(tiny, adapter(tiny, run/'sft'/'adapter', 1), run/'sft'/'merged')
    merge_lora(str(run/'sft'/'merged'), adapter(str(run/'sft'/'merged'), run/'grpo'/'adapter', 2), run/'grpo'/'merged')
    return run


@pytest.mark.parametrize('adapter_dtype', [None, 'float16'])
def test_merged_checkpoints_are_remade_in_order_with_the_same_weights(trained_run, tmp_path, adapter_dtype):
    files = [str(p) for p in carried_files(trained_run)]
    assert 'sft/merged/merged.json' in files and not any(f.endswith('.safetensors') and '/merged/' in f for f in files)
    man = pack_run(trained_run, tmp_path/'pack', piece_mb=0.005, adapter_dtype=adapter_dtype)
    assert len(man['pieces']) >= 2  # the adapters do not fit one piece
    back = unpack_run(tmp_path/'pack', tmp_path/'machine-b'/'run', progress=False)
    new = tmp_path/'machine-b'/'run'
    assert back['merged'] == [str(new/'sft'/'merged'), str(new/'grpo'/'merged')]  # the SFT base first
    for m in ('sft', 'grpo'):
        a, b = weights(trained_run/m/'merged'), weights(new/m/'merged')
        assert a.keys() == b.keys(), m
        if adapter_dtype is None: assert all((a[k] == b[k]).all() for k in a), m  # the adapter as written: the same weights
        else:  # a halved adapter: the same weights to float16's precision of the LoRA update
            assert all(torch_allclose(a[k], b[k]) for k in a), m
            assert {v.dtype for v in weights(new/m/'adapter').values()} == {torch_dtype('float16')}
    assert json.loads((new/'grpo'/'merged'/'merged.json').read_text())['base'] == str(new/'sft'/'merged')


def torch_dtype(name:str):
    import torch
    return getattr(torch, name)


def torch_allclose(a, b) -> bool:
    import torch
    return torch.allclose(a, b, rtol=1e-3, atol=1e-3 * float(a.abs().max()))  # float16 keeps 11 bits


def test_an_adapter_that_is_not_the_merged_ones_is_refused(trained_run, tmp_path):
    (trained_run/'grpo'/'adapter'/'adapter_model.safetensors').write_bytes(b'not the adapter')
    pack_run(trained_run, tmp_path/'pack', piece_mb=0.005, adapter_dtype=None)
    with pytest.raises(ValueError, match='is not the adapter'):
        unpack_run(tmp_path/'pack', tmp_path/'machine-b'/'run', progress=False)
    with pytest.raises(ValueError, match='not a readable adapter'):  # halving it needs a readable file
        pack_run(trained_run, tmp_path/'pack-half', piece_mb=0.005)
    assert not list((tmp_path/'pack-half').glob('run.tgz.*'))


def test_a_missing_piece_changes_nothing(trained_run, tmp_path):
    man = pack_run(trained_run, tmp_path/'pack', piece_mb=0.005)
    (tmp_path/'pack'/man['pieces'][-1]['name']).unlink()
    with pytest.raises(FileNotFoundError, match='send it again'):
        unpack_run(tmp_path/'pack', tmp_path/'machine-b'/'run', progress=False)
    assert not any((tmp_path/'machine-b'/'run').iterdir())


def test_the_pipeline_on_the_next_machine_skips_what_the_ledger_records(tmp_path):
    "A stage run on one machine, carried by pack-run/unpack-run to a run folder elsewhere, is skipped there."
    profile = tmp_path/'tiny.yaml'
    profile.write_text('n_products: 3000\nseed: 0\nlang: en\n')
    first = CliRunner().invoke(app, ['pipeline', '--profile', str(profile), '--run', str(tmp_path/'a'), '--stages', '00_env'])
    assert first.exit_code == 0, first.output
    assert CliRunner().invoke(app, ['pack-run', str(tmp_path/'a'), str(tmp_path/'pack')]).exit_code == 0
    assert CliRunner().invoke(app, ['unpack-run', str(tmp_path/'pack'), str(tmp_path/'b')]).exit_code == 0
    assert not (tmp_path/'b'/'catalog').exists()  # remade from the seed by the stages that need it
    again = CliRunner().invoke(app, ['pipeline', '--profile', str(profile), '--run', str(tmp_path/'b'), '--stages', '00_env'])
    assert again.exit_code == 0 and '00_env] unchanged since' in again.output, again.output


def test_a_published_run_gives_back_its_models(trained_run, tmp_path, tiny):
    "The published adapters, restored and merged in order onto the base, make the run's models again (to float16's precision)."
    from shopping_grpo.cli import publish_run, restore_adapter
    from shopping_grpo.sft import merge_lora
    man = publish_run(trained_run, tmp_path/'published', piece_mb=0.002)
    assert man['missing_adapters'] == [] and all(f['bytes'] <= 16 * 2**20 for f in man['files'] if 'pieces' not in f)
    sft = merge_lora(tiny, restore_adapter(tmp_path/'published', 'sft/adapter', tmp_path/'a'/'sft'), tmp_path/'m'/'sft')
    grpo = merge_lora(str(sft), restore_adapter(tmp_path/'published', 'grpo/adapter', tmp_path/'a'/'grpo'), tmp_path/'m'/'grpo')
    a, b = weights(trained_run/'grpo'/'merged'), weights(grpo)
    assert a.keys() == b.keys() and all(torch_allclose(a[k], b[k]) for k in a)


def test_a_run_seeded_from_a_published_one_holds_its_models(trained_run, tmp_path):
    "seed-run joins the published adapters into a new run and merges them in order: the run's models again, to float16's precision."
    from shopping_grpo.cli import publish_run
    (trained_run/'sft'/'summary.json').write_text('{"final_step": 7}')
    publish_run(trained_run, tmp_path/'published', piece_mb=0.002)
    r = CliRunner().invoke(app, ['seed-run', str(tmp_path/'published'), str(tmp_path/'seeded')])
    assert r.exit_code == 0, r.output
    new = tmp_path/'seeded'
    assert json.loads((new/'sft'/'summary.json').read_text()) == {'final_step': 7}
    assert json.loads((new/'grpo'/'merged'/'merged.json').read_text())['base'] == str((new/'sft'/'merged').resolve())  # inside the new run
    for m in ('sft', 'grpo'):
        a, b = weights(trained_run/m/'merged'), weights(new/m/'merged')
        assert a.keys() == b.keys() and all(torch_allclose(a[k], b[k]) for k in a), m
    with pytest.raises(KeyError, match='publishes no adapter'):
        seed_run(tmp_path/'published', tmp_path/'other', ('ppo/adapter',), progress=False)


def test_a_run_seeded_from_an_sft_only_publication_takes_its_sft_model(trained_run, tmp_path):
    "A publication of a run that stopped after SFT lists its GRPO adapter as missing; seed-run takes what it holds and merges it."
    from shopping_grpo.cli import publish_run
    shutil.rmtree(trained_run/'grpo')
    man = publish_run(trained_run, tmp_path/'published', piece_mb=0.002)
    assert man['missing_adapters'] == ['grpo/adapter']
    r = CliRunner().invoke(app, ['seed-run', str(tmp_path/'published'), str(tmp_path/'seeded')])
    assert r.exit_code == 0, r.output
    a, b = weights(trained_run/'sft'/'merged'), weights(tmp_path/'seeded'/'sft'/'merged')
    assert a.keys() == b.keys() and all(torch_allclose(a[k], b[k]) for k in a)
    assert not (tmp_path/'seeded'/'grpo').exists()
