"""The report of 09_report in a real browser: Debian's Chromium, headless, driven by Playwright.

A small run is evaluated (scripted shoppers on a few tasks of a small shop, through 07_evaluate), one of its
episodes is judged through 08_judge's code (with a written answer in place of a judge model), and the report is built. The tests open its pages from disk
(file:// URLs, no server, no network) and check that every chart is drawn with a size, that no page raises a
JavaScript error, that every link leads to a page, and that the trajectory viewer changes task when asked.
"""
import json, shutil, time
from pathlib import Path
import pytest
from _helpers import CHROMIUM, NO_CHROMIUM, launched_chromium, open_page

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
sync_api = pytest.importorskip('playwright.sync_api', reason='playwright (the Python package) is not installed')
N_TASKS = 6


def judge_files(run_dir, tasks, model:str) -> str:
    """Judge files written by 08_judge's own code: frozen code rubrics, one judgment of `model`'s first episode, every model's summary.

    Only the judge's answer is written here (no judge model runs in this test); 08_judge validates it and records it as
    `judge_record` does, so `judge_summary` counts it as current and draws panels B and C from it."""
    from shopping_grpo.judge import freeze_rubrics, check_judgment, prompt_sha256, event_ids, judge_summary, SCORES
    ev = Path(run_dir)/'eval'; rubrics = freeze_rubrics(tasks[:2], ev/'rubrics.jsonl', progress=False)
    rec = json.loads((ev/model/'trajectories.jsonl').read_text().splitlines()[0]); rub = rubrics[rec['task_id']]
    obs = [e['id'] for e in rec['events'] if e['kind'] == 'observation']
    answer = dict(requirements={r.id: dict(verdict='met', events=[obs[0]]) if i == 0 else dict(verdict='unmet', events=[obs[-1]]) for i, r in enumerate(rub.requirements)},
                  scores={k: 1 for k in SCORES}, error_category='none', summary='Checked the first result only.')
    j = check_judgment(json.dumps(answer), rub, event_ids(rec))
    record = dict(version=1, task_id=rec['task_id'], model=model, judge=dict(model='judge-under-test'), rubric_sha256=rub.sha256,
                  prompt_sha256=prompt_sha256(rec, rub), status='judged', judgment=j.model_dump(), attempts=1, seconds=0.0)
    (ev/model/'judgments.jsonl').write_text(json.dumps(record) + '\n')
    for m in ('oracle', 'heuristic', 'random'): judge_summary(ev/m, tasks, rubrics, None)
    return rec['task_id']


@pytest.fixture(scope='module')
def report(tmp_path_factory):
    "A report of a small evaluated run, with one judged episode; its folder and the judged task."
    from shopping_grpo.shop import prepare_shop
    from shopping_grpo.evaluate import evaluate_model, benchmark_tasks, task_strata, write_comparison
    from shopping_grpo.report import build_report
    run = tmp_path_factory.mktemp('run')
    shop = prepare_shop(run, 1000, 0, 1, 'en', sizes={'sft': 10, 'grpo_train': 5, 'grpo_val': 5, 'eval': N_TASKS}, progress=False)
    tasks, _ = benchmark_tasks(shop, N_TASKS); strata = task_strata(shop, tasks)
    for m in ('oracle', 'heuristic', 'random'): evaluate_model(shop, m, run, N_TASKS, strata=strata, progress=False)
    for m in ('oracle', 'random'): write_comparison(run, m, 'heuristic', n_resamples=500)
    judged = judge_files(run, tasks, 'heuristic')
    t0 = time.time(); made = build_report(run); print(f"report built in {time.time() - t0:.1f} s: {sum(made['files'].values()) / 1e3:.0f} kB")
    return run/'report', judged, made


@pytest.fixture(scope='module')
def browser():
    yield from launched_chromium(sync_api)


def chart_sizes(page) -> list[tuple[float, float]]:
    "Width and height of every chart the page draws."
    return [(b['width'], b['height']) for b in (s.bounding_box() for s in page.locator('figure svg.marks').all())]


def test_charts_render(report, browser):
    out, _, made = report; errors = []
    want = {'compare.html': 10, 'model-heuristic.html': 8, 'model-oracle.html': 6}  # compare: panels A-D, outcomes, strata, steps, tools, won/lost, differences
    for name, n in want.items():
        page = open_page(browser, out/name, errors)
        sizes = chart_sizes(page)
        assert len(sizes) >= n, f'{name}: {len(sizes)} charts drawn, expected at least {n}'
        assert all(w > 50 and h > 30 for w, h in sizes), f'{name}: a chart without size: {sizes}'
        assert page.locator('figure').count() == len(sizes)
        page.close()
    assert not errors, errors
    for svg in (out/'img').glob('*.svg'): assert svg.read_text().startswith('<svg'), svg
    assert {'img/all-panel-a.svg', 'img/all-panel-b.svg', 'img/all-panel-c.svg', 'img/pairs-won-lost.svg'} <= set(made['files'])


def test_judge_panels_and_absent_stages(report, browser):
    out, _, _ = report; errors = []
    page = open_page(browser, out/'compare.html', errors)
    panels = page.locator('.panel').all()
    assert [p.locator('h3').inner_text()[:2] for p in panels] == ['A.', 'B.', 'C.', 'D.']
    assert all(p.locator('svg.marks').count() == 1 for p in panels)  # B and C from the heuristic's judge summary
    assert 'oracle: 0 of 6 tasks validly judged' in panels[1].inner_text()  # the others say why they have none
    assert page.locator('.flag').count() == 0  # one judged episode: nothing to flag the judge for
    assert 'No SFT or GRPO logs in this run.' in page.inner_text('main')
    index = open_page(browser, out/'index.html', errors).inner_text('main')
    assert '06_grpo: no GRPO per-step metrics (grpo/metrics.jsonl)' in index
    assert not errors, errors


def test_a_flagged_judge_is_shown_in_its_panels(report, browser, tmp_path):
    "A judge that ranks the random shopper above the oracle is flagged, in red, in panels B and C (and not in A or D)."
    run = report[0].parent; shutil.copytree(run/'eval', tmp_path/'eval'); errors = []
    judged = json.loads((run/'eval'/'heuristic'/'judge_summary.json').read_text())
    for m, all_met in (('oracle', 0.0), ('random', 1.0)):
        s = json.loads(json.dumps(judged)); s['model'] = m; s['panels']['B_rubric']['all_met_of_judged'] = all_met
        (tmp_path/'eval'/m/'judge_summary.json').write_text(json.dumps(s))
    from shopping_grpo.report import build_report
    build_report(tmp_path, images=False)
    page = open_page(browser, tmp_path/'report'/'compare.html', errors)
    panels = page.locator('.panel').all()
    flags = [p.locator('.flag').all_inner_texts() for p in panels]
    assert [len(f) for f in flags] == [0, 1, 1, 0] and 'ranks random above oracle by all-met rate' in flags[1][0]
    assert panels[1].locator('.flag').is_visible() and panels[1].locator('.flag').evaluate('e => getComputedStyle(e).color') == 'rgb(183, 28, 28)'
    assert not errors, errors


def test_links_resolve(report, browser):
    out, _, made = report; errors = []
    page = open_page(browser, out/'index.html', errors)
    hrefs = {a.get_attribute('href') for a in page.locator('a').all()}
    assert {'compare.html', 'viewer.html', 'model-oracle.html', 'model-heuristic.html', 'model-random.html'} <= hrefs
    for h in sorted(hrefs):
        target = out/h.split('#')[0]
        assert target.exists(), h
        p = open_page(browser, target, errors); assert p.locator('h1').inner_text(); p.close()
    assert not errors, errors


def test_viewer_navigates(report, browser):
    out, judged, _ = report; errors = []
    page = open_page(browser, out/'viewer.html', errors)
    options = page.locator('#task option').all()
    assert len(options) == N_TASKS
    cols = page.locator('#columns .col')
    assert [c.get_attribute('data-model') for c in cols.all()] == ['oracle', 'heuristic', 'random']
    first_request, first_steps = page.inner_text('#request'), page.inner_text('#columns')
    page.select_option('#task', index=2)
    second = options[2].get_attribute('value')
    page.wait_for_function("id => decodeURIComponent(location.hash.slice(1)) === id", arg=second)
    assert page.inner_text('#request') != first_request and page.inner_text('#columns') != first_steps
    assert page.inner_text('#position') == f'3 of {N_TASKS}'
    page.click('#next'); page.wait_for_function("() => document.getElementById('position').textContent.startsWith('4 of')")
    page.click('#prev'); page.click('#prev'); page.wait_for_function("() => document.getElementById('position').textContent.startsWith('2 of')")
    # a step: action, page type, key facts; its page text collapsed until opened
    turn = page.locator('.col[data-model="oracle"] .turn').first
    assert turn.locator('.act').inner_text().startswith('search_products: ') and 'search_results' in turn.locator('.hd').inner_text()
    details = turn.locator('details')
    assert not details.locator('pre').is_visible()
    details.locator('summary').click(); assert details.locator('pre').is_visible()
    assert not errors, errors


def test_viewer_shows_verdicts(report, browser):
    out, judged, _ = report; errors = []
    page = open_page(browser, (out/'viewer.html').as_uri() + f'#{judged}', errors)
    assert page.locator('#task').input_value() == judged
    col = page.locator('.col[data-model="heuristic"]')
    verdicts = col.locator('.verdicts td.chip').all_inner_texts()
    assert verdicts[0] == 'met' and len(verdicts) > 2 and set(verdicts[1:]) == {'unmet'}  # as judged: R1 met, the rest unmet
    turns = col.locator('.turn')
    assert 'R1 met' in turns.first.inner_text()          # cited the first page
    assert 'R2 unmet' in turns.last.inner_text()          # cited the last page: the purchase's terminal page
    assert col.locator('.verdicts tr').nth(1).locator('td').nth(1).inner_text() == 'hard'  # R1 is the category: a hard requirement
    assert page.locator('.col[data-model="oracle"] .verdicts').count() == 0
    assert not errors, errors


def test_reference_report(tmp_path, browser):
    "The committed reference results: the report builds from them and opens."
    from shopping_grpo.report import build_report
    made = build_report(ROOT/'outputs'/'reference'/'h200', tmp_path/'report', images=False, max_observation_chars=500)
    assert made['models'] == ['oracle', 'expert', 'heuristic', 'random', 'base', 'sft', 'grpo']; errors = []
    page = open_page(browser, tmp_path/'report'/'compare.html', errors)
    assert len(chart_sizes(page)) >= 6 and all(w > 50 and h > 30 for w, h in chart_sizes(page))
    viewer = open_page(browser, tmp_path/'report'/'viewer.html', errors)
    assert viewer.locator('#task option').count() == 200 and viewer.locator('.col').count() == 7  # every model played every task
    viewer.select_option('#task', index=199); viewer.wait_for_function("() => document.getElementById('position').textContent === '200 of 200'")
    assert not errors, errors
