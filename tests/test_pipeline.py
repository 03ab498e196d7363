"`shopping-grpo pipeline` resumes: a rerun skips unchanged stages by their recorded keys, a changed parameter reruns from there."
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, '-c', 'from shopping_grpo.cli import app; app()']


def run_pipeline(profile, run, stages='00_env,01_tasks'):
    r = subprocess.run(CLI + ['pipeline', '--profile', str(profile), '--run', str(run), '--stages', stages], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def test_rerun_skips_unchanged_stages_and_reruns_after_a_change(tmp_path):
    prof = tmp_path/'tiny.yaml'; run = tmp_path/'run'
    prof.write_text("n_products: 1500\nseed: 0\ntask_seed: 1\nlang: en\nsplit_sizes: {sft: 10, grpo_train: 10, grpo_val: 5, eval: 10}\n")
    first = run_pipeline(prof, run); led1 = json.loads((run/'pipeline.json').read_text())
    assert set(led1) == {'00_env', '01_tasks'} and 'skipped' not in first
    second = run_pipeline(prof, run)
    assert second.count('skipped') == 2 and json.loads((run/'pipeline.json').read_text()) == led1
    prof.write_text(prof.read_text().replace('task_seed: 1', 'task_seed: 2'))  # only the second stage reads it
    third = run_pipeline(prof, run); led3 = json.loads((run/'pipeline.json').read_text())
    assert '[1/2 00_env] unchanged' in third and 'skipped' in third.split('01_tasks]')[0] and third.count('skipped') == 1
    assert led3['00_env'] == led1['00_env'] and led3['01_tasks']['key'] != led1['01_tasks']['key']


def test_a_stage_older_than_an_earlier_one_runs_again(tmp_path):
    "A stage run again alone (as 06_grpo after a seeded run's 07_evaluate) makes every later stage's outputs stale."
    prof = tmp_path/'tiny.yaml'; run = tmp_path/'run'
    prof.write_text("n_products: 1500\nseed: 0\ntask_seed: 1\nlang: en\nsplit_sizes: {sft: 10, grpo_train: 10, grpo_val: 5, eval: 10}\n")
    run_pipeline(prof, run)
    r = subprocess.run(CLI + ['pipeline', '--profile', str(prof), '--run', str(run), '--stages', '00_env', '--force'],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    led = json.loads((run/'pipeline.json').read_text())
    assert led['00_env']['seq'] > led['01_tasks']['seq']
    again = run_pipeline(prof, run)
    assert '[1/2 00_env] unchanged' in again and '[2/2 01_tasks] older than 00_env' in again
    led2 = json.loads((run/'pipeline.json').read_text())
    assert led2['01_tasks']['key'] == led['01_tasks']['key'] and led2['01_tasks']['seq'] > led2['00_env']['seq']
    assert run_pipeline(prof, run).count('skipped') == 2


def test_unknown_stage_is_refused_before_anything_runs(tmp_path):
    r = subprocess.run(CLI + ['pipeline', '--run', str(tmp_path/'run'), '--stages', '00_env,nope'], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and 'no stage notebook' in r.stderr and not (tmp_path/'run'/'pipeline.json').exists()


def test_a_checkout_without_a_committed_input_is_refused_before_anything_runs(tmp_path):
    "A stage that reads a committed file the checkout lacks stops the pipeline before its first stage, not inside that stage."
    lacking = ("import shopping_grpo.cli as c; "
               "c.committed_inputs = lambda st: ['outputs/reference/gone/collect/audit.json'] if st == '04_collect' else []; c.app()")
    r = subprocess.run([sys.executable, '-c', lacking, 'pipeline', '--run', str(tmp_path/'run'), '--stages', '00_env,04_collect'],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and 'outputs/reference/gone/collect/audit.json' in r.stderr
    assert not (tmp_path/'run'/'pipeline.json').exists()


def test_cpu_threads_cap_the_stage_kernels_and_the_ledger_says_so(tmp_path):
    prof = tmp_path/'tiny.yaml'; run = tmp_path/'run'
    prof.write_text("n_products: 1500\nseed: 0\nlang: en\n")
    r = subprocess.run(CLI + ['pipeline', '--profile', str(prof), '--run', str(run), '--stages', '00_env', '--cpu-threads', '1'],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((run/'pipeline.json').read_text())['00_env']['cpu_threads'] == 1
    bad = subprocess.run(CLI + ['pipeline', '--run', str(tmp_path/'bad'), '--stages', '00_env', '--cpu-threads', '-2'],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode != 0 and '--cpu-threads' in bad.stderr and not (tmp_path/'bad'/'pipeline.json').exists()


def test_a_kernel_papermill_starts_inherits_the_capped_thread_pools(tmp_path):
    "What `pipeline --cpu-threads` relies on: the stage kernel reads the caps from the environment it is started with."
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, torch\nprint('threads', torch.get_num_threads(), os.environ['POLARS_MAX_THREADS'])")])
    nbformat.write(nb, tmp_path/'probe.ipynb')
    code = ("import os, papermill as pm\nfrom shopping_grpo.cli import thread_env\nos.environ.update(thread_env(1))\n"
            f"pm.execute_notebook({str(tmp_path/'probe.ipynb')!r}, {str(tmp_path/'out.ipynb')!r}, kernel_name='python3', progress_bar=False)")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = nbformat.read(tmp_path/'out.ipynb', 4).cells[0].outputs[0]['text']
    assert out.strip() == 'threads 1 1', out


def test_a_runs_wording_survives_the_stages_after_01_tasks(tmp_path):
    """02_reward and 02c_shoppers play a few of the run's tasks; the task files keep, byte for byte, the wording 01_tasks
    wrote (a demonstration once rewrote a mixed run's files in the template wording, and 04_collect collected on them)."""
    prof = tmp_path/'mixed.yaml'; run = tmp_path/'run'
    prof.write_text("n_products: 1500\nseed: 0\ntask_seed: 1\nlang: en\nwording: mixed\nn_eval: 10\n"
                    "split_sizes: {sft: 80, grpo_train: 40, grpo_val: 20, eval: 10}\n")
    run_pipeline(prof, run)
    written = {p.name: p.read_bytes() for p in (run/'tasks').glob('*.jsonl')}
    sft = [json.loads(l) for l in written['sft_en.jsonl'].decode().splitlines()[1:]]
    assert len(sft) == 80 and 0 < sum('wording' in t for t in sft) < 80  # about half reworded
    run_pipeline(prof, run, '00_env,01_tasks,02_reward,02c_shoppers')
    assert {p.name: p.read_bytes() for p in (run/'tasks').glob('*.jsonl')} == written


def test_a_detached_pipeline_outlives_its_command_and_watch_follows_it(tmp_path):
    """`pipeline --detach` returns while its stage still runs, a second start in the same run folder is refused, and
    `watch --wait` waits for the end and reports it finished, with the stage in the ledger and the log's closing line."""
    import time
    prof = tmp_path/'tiny.yaml'; run = tmp_path/'run'
    prof.write_text("n_products: 1500\nseed: 0\nlang: en\n")
    start = CLI + ['pipeline', '--profile', str(prof), '--run', str(run), '--stages', '00_env', '--detach']
    t0 = time.time()
    r = subprocess.run(start, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and 'started in the background' in r.stderr, r.stderr[-2000:]
    assert not (run/'pipeline.json').exists()  # returned before the stage finished
    again = subprocess.run(start, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert again.returncode != 0 and 'already running' in again.stderr
    w = subprocess.run(CLI + ['watch', str(run), '--wait', '500'], capture_output=True, text=True, cwd=ROOT, timeout=600)
    out = w.stdout.splitlines()
    assert w.returncode == 0 and out[0].startswith('finished (pid ') and out[1].startswith('stages done: 00_env'), w.stdout
    assert set(json.loads((run/'pipeline.json').read_text())) == {'00_env'}
    log = (run/'pipeline.log').read_text()
    assert log.count('== pipeline started ') == 1 and 'pipeline done in' in log and time.time() - t0 < 600
