"""How long an embedded model's first build takes on a machine, from its GGUF alone and with the head that
`pack-offline` ships beside it (config and fixed tokenizer read ahead), measured in the same run on the same file;
the two checkpoints are compared file by file. Every build is timed in a fresh process, alternating, so nothing one
build loaded or cached helps the next.

    python benchmarks/bench_materialize.py --model qwen2.5-0.5b --rounds 2 \
        --out benchmarks/results/materialize_qwen2.5-0.5b_cpu.json
"""
from __future__ import annotations
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

BUILD = '''
import sys, time
from pathlib import Path
from shopping_grpo.model import EMBEDDED_MODELS, _build_checkpoint, _wanted
m, gguf, out = EMBEDDED_MODELS[sys.argv[1]], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.time(); rec = _build_checkpoint(m, gguf, out, _wanted(m))
print(round(time.time() - t0, 2), rec['head'])
'''
HEAD = '''
import sys, time
from pathlib import Path
from shopping_grpo.model import EMBEDDED_MODELS, write_head
t0 = time.time(); write_head(EMBEDDED_MODELS[sys.argv[1]], Path(sys.argv[2]))
print(round(time.time() - t0, 2))
'''


def run(code:str, *args) -> list[str]:
    r = subprocess.run([sys.executable, '-c', code, *map(str, args)], capture_output=True, text=True)
    if r.returncode: raise RuntimeError(r.stderr[-2000:])
    return r.stdout.split()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default='qwen2.5-0.5b', help='an embedded model (its packages installed)')
    ap.add_argument('--rounds', type=int, default=2, help='builds of each kind, alternating')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    from shopping_grpo.model import model_gguf, head_dir, package_versions
    gguf = model_gguf(a.model)
    with tempfile.TemporaryDirectory(prefix='bench-materialize-') as tmp:
        tmp = Path(tmp)
        beside = tmp/'g'/gguf.name; beside.parent.mkdir(); beside.symlink_to(gguf)  # the same file, with a head beside it
        head_s = float(run(HEAD, a.model, beside)[0])
        times, outs = {'from the GGUF': [], 'with its head': []}, {}
        for r in range(a.rounds):
            for how, g in (('from the GGUF', gguf), ('with its head', beside)):
                out = tmp/f'{how} {r}'; out.mkdir()
                s, used = run(BUILD, a.model, g, out)
                assert used == str(how == 'with its head'), (how, used)
                times[how].append(float(s)); outs[how] = out
        files = sorted(p.name for p in outs['from the GGUF'].iterdir() if p.name != 'materialized.json')
        differ = [f for f in files if (outs['from the GGUF']/f).read_bytes() != (outs['with its head']/f).read_bytes()]
        head_bytes = sum(p.stat().st_size for p in head_dir(beside).iterdir())
    med = {k: statistics.median(v) for k, v in times.items()}
    res = dict(model=a.model, gguf_bytes=gguf.stat().st_size, rounds=a.rounds, seconds=times,
               median_seconds=med, speedup=round(med['from the GGUF'] / med['with its head'], 2),
               write_head_seconds=head_s, head_bytes=head_bytes, files_compared=files, files_differing=differ,
               machine=dict(cpus=os.cpu_count(), processor=platform.processor() or platform.machine(),
                            load_average=os.getloadavg()),
               versions=package_versions(('torch', 'transformers', 'tokenizers', 'gguf', 'shopping-grpo')),
               created=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))
    print(json.dumps(res, indent=1))
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1) + '\n')


if __name__ == '__main__':
    main()
