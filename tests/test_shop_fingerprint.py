"""The shop and the reference shoppers are what the committed fingerprint says: catalog, task and benchmark hashes,
and the oracle's, expert's, heuristic's and random shopper's summaries and records on the frozen benchmark. The records
hash leaves out the reward detail's requirement fields, which have their own hash: the scores are what they were before
the detail named the requirements met."""
from __future__ import annotations
import json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT/'outputs'/'history'/'shoppers'/'fingerprint_en.json'


def test_fingerprint_matches_reference(tmp_path):
    "Built from nothing in a fresh folder, under another hash seed, the fingerprint equals the committed one."
    out = tmp_path/'fingerprint_en.json'
    env = dict(os.environ, PYTHONHASHSEED='12345')  # set iteration order must not matter
    subprocess.run([sys.executable, str(ROOT/'scripts'/'shop_fingerprint.py'), str(tmp_path/'run'), str(out)], check=True, env=env, cwd=ROOT)
    got, want = json.loads(out.read_text()), json.loads(REFERENCE.read_text())
    assert got['catalog_sha256'] == want['catalog_sha256'] and got['benchmark'] == want['benchmark'] and got['tasks'] == want['tasks']
    for kind in want['shoppers']:
        assert got['shoppers'][kind]['summary'] == want['shoppers'][kind]['summary'], kind
        assert got['shoppers'][kind]['records_sha256'] == want['shoppers'][kind]['records_sha256'], kind
        assert got['shoppers'][kind]['requirements_sha256'] == want['shoppers'][kind]['requirements_sha256'], kind
    assert got == want
