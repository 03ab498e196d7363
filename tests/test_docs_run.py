"""Which run `make docs` renders (shopping_grpo.docs): the one asked for, else the published GPU run, else
outputs/smoke, else a clear error."""
import json
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def docs(monkeypatch, tmp_path):
    import shopping_grpo.docs as mod
    monkeypatch.setattr(mod, 'REFERENCE_RUN', tmp_path/'reference'/'h200')
    monkeypatch.setattr(mod, 'SMOKE_RUN', tmp_path/'smoke')
    return mod


def test_default_run(docs, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match='no executed notebooks to render'): docs.pick_run(None)
    (tmp_path/'smoke'/'notebooks').mkdir(parents=True)
    assert docs.pick_run(None) == tmp_path/'smoke' and 'rendering' in capsys.readouterr().err
    (tmp_path/'reference'/'h200'/'notebooks').mkdir(parents=True)
    assert docs.pick_run(None) == tmp_path/'reference'/'h200'
    with pytest.raises(FileNotFoundError, match='has no notebooks/ folder'): docs.pick_run(str(tmp_path/'elsewhere'))


def test_stages_and_modules(docs):
    from shopping_grpo.cli import STAGES
    assert docs.stages() == STAGES
    mods = docs.module_notebooks()
    assert mods['02_reward'] == 'reward' and mods['99_cli'] == 'cli' and 'index' not in mods


def test_vega_embed_chart_is_redrawn(docs):
    spec = {'mark': 'bar', 'data': {'values': [{'a': 1, 'b': 2}]}, 'encoding': {'x': {'field': 'a', 'type': 'quantitative'}}}
    h = f'<div id="v"></div><script>(function(spec, embedOpt){{ vegaEmbed("#v", spec) }})({json.dumps(spec)}, {{"mode": "vega-lite"}});</script>'
    out = docs.render_output({'output_type': 'display_data', 'data': {'text/html': h}})
    assert out.startswith('<svg') and 'cdn' not in out and 'class="marks"' in out
    assert 'could not be read' in docs.render_output({'output_type': 'display_data', 'data': {'text/html': '<script>vegaEmbed()</script>'}})


def test_notebook_links_lead_to_pages(docs):
    body = '<a href="05_sft.ipynb#the-recipe">x</a> <a href="../nbs/00a_records.ipynb">y</a> <a href="other.ipynb">z</a>'
    assert docs.fix_links(body, {'05_sft': '05_sft.html', '00a_records': 'api-records.html'}) == \
        '<a href="05_sft.html#the-recipe">x</a> <a href="api-records.html">y</a> <a href="other.ipynb">z</a>'
