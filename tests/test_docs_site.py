"""The site of `make docs` (shopping_grpo.docs) in a real browser: Debian's Chromium, headless, driven by Playwright.

A small run folder is prepared: two stages' source notebooks with an altair chart (SVG through vl-convert, as the
project draws them) added as the output of a code cell, and a report. The site is built from it (nbs/index.ipynb is
executed, nothing else), then every page is opened from disk (file:// URLs, no server, no network): no page raises a
script error, every chart has a size and every link inside the site leads to a file. When the repository holds the
run of `make run` (outputs/smoke), its site is checked the same way.
"""
import json
from pathlib import Path
import pytest
from _helpers import CHROMIUM, NO_CHROMIUM, launched_chromium, open_page
from shopping_grpo import docs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
sync_api = pytest.importorskip('playwright.sync_api', reason='playwright (the Python package) is not installed')


def charts() -> tuple[str, str]:
    "One chart two ways: SVG through vl-convert, and altair's HTML renderer (vega-embed from a CDN), which the site redraws."
    import altair as alt, polars as pl, vl_convert
    df = pl.DataFrame(dict(model=['oracle', 'heuristic', 'random'], strict_success=[1.0, 0.385, 0.0]))
    chart = alt.Chart(df).mark_bar().encode(x='strict_success:Q', y='model:N')
    with alt.renderers.enable('html'): bundle = chart._repr_mimebundle_()
    return vl_convert.vegalite_to_svg(chart.to_dict()), (bundle[0] if isinstance(bundle, tuple) else bundle)['text/html']


@pytest.fixture(scope='module')
def index_nb():
    "nbs/index.ipynb executed once, shared by the builds."
    return docs.execute_index()


@pytest.fixture(scope='module')
def small_site(tmp_path_factory, index_nb):
    run = tmp_path_factory.mktemp('run'); (run/'notebooks').mkdir(); (run/'report').mkdir()
    svg, embed = charts()
    for st in ('00_env', '07_evaluate'):
        nb = json.loads((ROOT/'nbs'/f'{st}.ipynb').read_text())
        code = next(c for c in nb['cells'] if c['cell_type'] == 'code')
        code['outputs'] = [dict(output_type='display_data', metadata={}, data={'text/html': h, 'text/plain': '<Chart>'})
                           for h in ([svg, embed] if st == '07_evaluate' else [svg])]
        (run/'notebooks'/f'{st}.ipynb').write_text(json.dumps(nb))
    (run/'report'/'index.html').write_text('<!doctype html><title>report</title><p>the report</p>')
    made = docs.build(str(run), run.parent/'site', index_nb=index_nb)
    return Path(made['out']), made


@pytest.fixture(scope='module')
def browser():
    yield from launched_chromium(sync_api)


def check_site(browser, out: Path, pages: list[str]) -> dict:
    "Open every page: script errors, charts without size and links inside the site that lead nowhere; charts per page."
    errors, charts = [], {}
    for name in pages:
        page = open_page(browser, out/name, errors)
        boxes = [s.bounding_box() for s in page.locator('svg.marks').all()]
        charts[name] = len(boxes)
        assert all(b and b['width'] > 50 and b['height'] > 30 for b in boxes), f'{name}: a chart without size: {boxes}'
        for href in page.eval_on_selector_all('a[href]', 'els => els.map(a => a.href)'):
            if not href.startswith('file:'): continue
            target = Path(href.split('#')[0].removeprefix('file://'))
            assert target.is_file(), f'{name}: link to {href} leads nowhere'
        page.close()
    assert not errors, errors
    return charts


def test_small_site(small_site, browser):
    out, made = small_site
    assert {'index.html', '00_env.html', '07_evaluate.html', 'api-env.html', 'api-cli.html'} <= set(made['pages'])
    assert '01_tasks.html' not in made['pages'] and made['report']
    drawn = check_site(browser, out, made['pages'])
    assert drawn['00_env.html'] == 1 and drawn['07_evaluate.html'] == 2  # the vega-embed chart drawn as SVG, no CDN fetched
    page = browser.new_page(); page.goto((out/'07_evaluate.html').as_uri())
    side = page.locator('nav.side')
    assert side.locator('ol li').all_inner_texts()[:3] == ['00_env', '01_tasks', '02_reward']  # the pipeline's order, stages not run included
    assert side.locator('a.here').inner_text() == '07_evaluate' and side.locator('a[href="report/index.html"]').count() == 1
    page.goto((out/'index.html').as_uri())
    assert page.locator('main table').count() >= 1  # the headline results, from the committed summaries
    page.close()


@pytest.mark.skipif(not (ROOT/'outputs'/'smoke'/'notebooks').is_dir(), reason='no outputs/smoke run (`make run` writes it)')
def test_smoke_run_site(tmp_path, index_nb, browser):
    made = docs.build('outputs/smoke', tmp_path/'site', index_nb=index_nb)
    assert len([p for p in made['pages'] if p[:2].isdigit()]) == len(docs.stages())
    drawn = check_site(browser, Path(made['out']), made['pages'])
    assert sum(drawn.values()) > 10, drawn
