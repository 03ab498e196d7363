"""Catalog and task generation are pure functions of their seeds, and a catalog that does not match its manifest is refused."""
from __future__ import annotations
import json, shutil
import pytest

from shopping_grpo.env import LANGS, Catalog, build_catalog
from shopping_grpo.records import sha256_file
from shopping_grpo.tasks import make_tasks, write_tasks, read_tasks

N = 500
TASK_SIZES = dict(sft=10, grpo_train=8, grpo_val=3, eval=5)


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    "Catalogs of 500 products: seed 0 twice (different folders) and seed 1."
    root = tmp_path_factory.mktemp('catalogs')
    return {name: (root/name, build_catalog(root/name, N, seed, progress=False)) for name, seed in [('a', 0), ('b', 0), ('c', 1)]}


def test_same_seed_byte_identical(built):
    (da, ma), (db, mb) = built['a'], built['b']
    assert da != db and ma['files'] == mb['files'] and ma['config'] == mb['config'] == dict(n=N, seed=0, langs=list(LANGS), version=1)
    assert sorted(ma['files']) == [f'catalog_{lg}.parquet' for lg in sorted(LANGS)]
    for f, h in ma['files'].items():
        assert (da/f).read_bytes() == (db/f).read_bytes()
        assert sha256_file(da/f) == sha256_file(db/f) == h
    assert json.loads((da/'manifest.json').read_text())['files'] == json.loads((db/'manifest.json').read_text())['files']


def test_different_seed_differs(built):
    (da, ma), (dc, mc) = built['a'], built['c']
    assert mc['config']['seed'] == 1
    for f in ma['files']:
        assert ma['files'][f] != mc['files'][f] and (da/f).read_bytes() != (dc/f).read_bytes()
    ca, cc = Catalog.load(da, 'en'), Catalog.load(dc, 'en')
    assert len(ca) == len(cc) == N and ca.df['title'].to_list() != cc.df['title'].to_list()


def test_rebuild_reuses_a_matching_catalog(built):
    "A second build_catalog on the same folder and config keeps the files (same manifest, same bytes)."
    da, ma = built['a']
    before = {f: (da/f).stat().st_mtime_ns for f in ma['files']}
    assert build_catalog(da, N, 0, progress=False) == ma
    assert {f: (da/f).stat().st_mtime_ns for f in ma['files']} == before


@pytest.mark.parametrize('lang', LANGS)
def test_make_tasks_deterministic(built, tmp_path, lang):
    (da, _), (db, _) = built['a'], built['b']
    ca, cb = Catalog.load(da, lang), Catalog.load(db, lang)
    t1, t2 = make_tasks(ca, TASK_SIZES, seed=1), make_tasks(cb, TASK_SIZES, seed=1)
    assert {s: len(v) for s, v in t1.items()} == TASK_SIZES
    assert {s: [t.as_dict() for t in v] for s, v in t1.items()} == {s: [t.as_dict() for t in v] for s, v in t2.items()}
    h1 = write_tasks(tmp_path/'one.jsonl', t1['eval'], ca); h2 = write_tasks(tmp_path/'two.jsonl', t2['eval'], cb)
    assert h1 == h2 and (tmp_path/'one.jsonl').read_bytes() == (tmp_path/'two.jsonl').read_bytes()
    assert [t.as_dict() for t in read_tasks(tmp_path/'one.jsonl', ca)] == [t.as_dict() for t in t1['eval']]
    t3 = make_tasks(ca, TASK_SIZES, seed=2)
    assert [t.as_dict() for s in t1 for t in t1[s]] != [t.as_dict() for s in t3 for t in t3[s]]
    # targets of different splits come from different clusters
    cl = {s: {ca.by_asin(t.facts.target_asin)['cluster'] for t in v} for s, v in t1.items()}
    assert all(not (cl[a] & cl[b]) for a in cl for b in cl if a < b)


def test_catalog_load_refuses_a_corrupted_parquet(built, tmp_path):
    da, ma = built['a']
    bad = tmp_path/'corrupt'; shutil.copytree(da, bad)
    Catalog.load(bad, 'en')  # the intact copy loads
    f = bad/'catalog_en.parquet'; raw = bytearray(f.read_bytes()); raw[len(raw)//2] ^= 0x01; f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r'catalog_en\.parquet does not match its manifest hash'):
        Catalog.load(bad, 'en')
    Catalog.load(bad, 'zh')  # the other language's file is untouched and still loads
    # a tampered manifest is refused the same way
    m = json.loads((bad/'manifest.json').read_text()); m['files']['catalog_zh.parquet'] = '0'*64
    (bad/'manifest.json').write_text(json.dumps(m))
    with pytest.raises(ValueError, match='does not match its manifest hash'): Catalog.load(bad, 'zh')
    with pytest.raises(FileNotFoundError, match="no 'fr' catalog"): Catalog.load(bad, 'fr')
    # build_catalog notices the mismatch and regenerates the same bytes
    assert build_catalog(bad, N, 0, progress=False)['files'] == ma['files']
    assert (bad/'catalog_en.parquet').read_bytes() == (da/'catalog_en.parquet').read_bytes()
