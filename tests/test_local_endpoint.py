"""The embedded model as the judges' endpoint (08a_local_endpoint) under the judging run of 08_judge: many threads at
once, every answer schema-valid, a prompt that does not fit counted as not judged (the run goes on), and a model
that cannot load failing the caller at once rather than hanging it; the evidence judge's answer probabilities read off
the same rows. A small random model keeps it cheap."""
from __future__ import annotations
import json
import pytest

from shopping_grpo.judge import code_rubric, judge_model, read_records, judge_evidence, evidence_questions, Calibration


def judged(shop, oracle_records, tiny, tmp_path, n:int, workers:int, **endpoint):
    "The oracle's first `n` benchmark episodes judged by a `LocalEndpoint`: the run's account, judgments, endpoint."
    from shopping_grpo.local_endpoint import LocalEndpoint
    tasks = shop.tasks['eval'][:n]
    d = tmp_path/'model'
    d.mkdir()
    (d/'trajectories.jsonl').write_text(''.join(json.dumps(oracle_records[t.task_id]) + '\n' for t in tasks))
    ep = LocalEndpoint(tiny, device='cpu', max_free_tokens=6, **endpoint)
    run = judge_model(d, tasks, {t.task_id: code_rubric(t) for t in tasks}, ep, workers=workers, progress=False)
    ep.close()
    return run, read_records(d/'judgments.jsonl'), ep


def test_every_answer_is_a_valid_judgment(shop, oracle_records, tiny, tmp_path):
    run, js, ep = judged(shop, oracle_records, tiny, tmp_path, 6, 6, rows=3, max_context=8192)
    assert run['recorded'] == {'judged': 6} and set(js) == {t.task_id for t in shop.tasks['eval'][:6]}
    assert all(j['judge']['base_url'] == 'local' and j['attempts'] == 1 for j in js.values())
    assert ep.engine.calls > 0 and ep.engine.prompt_tokens > 6 * 500


def test_the_evidence_judge_reads_answer_probabilities(shop, oracle_records, tiny, tmp_path):
    "Every question of every purchase asked at once through the decoder's rows; each answer a probability per word."
    from shopping_grpo.local_endpoint import LocalEndpoint
    tasks = shop.tasks['eval'][:4]
    rubrics = {t.task_id: code_rubric(t) for t in tasks}
    d = tmp_path/'model'
    d.mkdir()
    (d/'trajectories.jsonl').write_text(''.join(json.dumps(oracle_records[t.task_id]) + '\n' for t in tasks))
    ep = LocalEndpoint(tiny, device='cpu', rows=4, max_context=2048)
    run = judge_evidence(d, tasks, rubrics, ep, Calibration(), workers=4, progress=False)
    ep.close()
    recs = read_records(d/'evidence.jsonl')
    assert run['recorded'] == {'judged': 4} and ep.engine.answer_tokens == 0  # nothing generated: one pass per question
    for k, r in recs.items():
        assert set(r['answers']) == {q.requirement for q in evidence_questions(oracle_records[k], rubrics[k])}
        assert all(set(p) == {'met', 'unmet', 'unclear'} and 0 < sum(p.values()) <= 1 + 1e-6 for p in r['answers'].values())


def test_a_prompt_that_does_not_fit_is_not_judged(shop, oracle_records, tiny, tmp_path):
    run, js, _ = judged(shop, oracle_records, tiny, tmp_path, 2, 2, rows=2, max_context=256)
    assert run['recorded'] == {'not_judged': 2}
    assert all(j['reason'].startswith('request refused') and 'does not fit' in j['reason'] for j in js.values())


def test_a_model_that_cannot_load_fails_the_caller(tmp_path):
    from shopping_grpo.local_endpoint import LocalEndpoint
    ep = LocalEndpoint(str(tmp_path/'no-such-model'), rows=1, device='cpu')
    with pytest.raises((OSError, ValueError)): ep.chat([dict(role="user", content="hi")])


def test_a_request_that_cannot_be_decoded_fails_alone(tiny):
    from concurrent.futures import ThreadPoolExecutor
    from shopping_grpo.local_endpoint import LocalEndpoint
    ep = LocalEndpoint(tiny, rows=2, max_context=1024, device='cpu', max_free_tokens=4)
    good = dict(type='object', properties=dict(ok=dict(type='boolean')))
    nothing = dict(type='array', items=dict(type='string', enum=[]), minItems=1)
    empty = dict(type='object', properties=dict(events=nothing))
    msgs = [dict(role='user', content='hi')]
    with ThreadPoolExecutor(2) as ex:
        bad, fine = ex.submit(ep.chat, msgs, empty), ex.submit(ep.chat, msgs, good)
        with pytest.raises(ValueError, match='empty enum'): bad.result()
        assert json.loads(fine.result()) in (dict(ok=True), dict(ok=False))
    ep.close()
    ep.close()  # twice is harmless


def test_a_failed_or_closed_engine_answers_unavailable(tiny):
    from shopping_grpo.judge import Unavailable
    from shopping_grpo.local_endpoint import LocalEndpoint
    ep = LocalEndpoint(tiny, rows=1, max_context=1024, device='cpu', max_free_tokens=4).start()
    def broken(*a, **kw): raise RuntimeError('the device is gone')
    ep.engine.dec._prefill = broken
    msgs = [dict(role='user', content='hi')]
    with pytest.raises(Unavailable, match='the device is gone'): ep.chat(msgs)
    with pytest.raises(Unavailable, match='stopped'): ep.chat(msgs)  # the engine is down: no caller hangs
    ep.close()
    with pytest.raises(Unavailable, match='closed'): ep.chat(msgs)


def test_a_curator_quotes_only_the_request(shop, tiny):
    "The curation schema offers spans of the request as quotes: even a random model's quotes are in it and name their candidate."
    from concurrent.futures import ThreadPoolExecutor
    from shopping_grpo.judge import curate
    from shopping_grpo.local_endpoint import LocalEndpoint
    ep = LocalEndpoint(tiny, rows=4, max_context=4096, device='cpu', max_free_tokens=4)
    with ThreadPoolExecutor(4) as ex: rubrics = list(ex.map(lambda t: curate(t, ep), shop.tasks['eval'][:4]))
    ep.close()
    errors = [e for r in rubrics for e in r.curation.get('errors', [])]
    assert not [e for e in errors if 'not in the request' in e or 'does not name' in e or 'refused' in e]
    for r in rubrics:
        for q in r.requirements: assert q.quote.lower() in r.request.lower()
