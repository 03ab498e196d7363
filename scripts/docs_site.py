"""Render the project as a static site from the executed notebooks of a run, without executing them again.

    python scripts/docs_site.py [--run RUN] [--out _docs]      (`make docs`, `make docs RUN=outputs/smoke`)

Pages: the front page (nbs/index.ipynb, executed here: it only reads committed files), one page per pipeline stage
(STAGES of 99_cli, read from RUN/notebooks/, plain or gzipped) with its prose, tables and charts, the run's HTML report
(RUN/report/, copied under report/), and one API page per exported module, read from the code nbdev exported from
the source notebooks. A sidebar follows the pipeline. Charts are in the notebooks as inline SVG (the project renders
altair through vl-convert); a chart kept in a notebook through altair's HTML renderer, which loads vega-embed from a
CDN, or as a vega-lite mime bundle, is drawn here as SVG by vl-convert the same way. So the pages load no script and
fetch nothing: they read offline from file://.

Quarto is not used: quarto-cli 1.10.19 on PyPI is a source distribution whose build downloads Quarto's binaries from
GitHub, which the project's machines (and CI) cannot reach, so it cannot be installed by `make setup`.
"""
from __future__ import annotations
import argparse, ast, gzip, html, json, re, shutil, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_RUN = ROOT/'outputs'/'reference'/'h200'  # the committed GPU run (`shopping-grpo publish-run RUN outputs/reference/h200`)
SMOKE_RUN = ROOT/'outputs'/'smoke'                 # what `make run` writes

CSS = """
body{margin:0;font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;background:#fff;display:flex}
nav.side{position:sticky;top:0;height:100vh;overflow:auto;width:250px;flex:none;background:#f4f6f7;border-right:1px solid #dde;padding:1em;box-sizing:border-box;font-size:14px}
nav.side h2{font-size:13px;text-transform:uppercase;color:#667;margin:1.2em 0 .3em}nav.side ol,nav.side ul{margin:0;padding-left:1.3em}
nav.side a{color:#1d4f91;text-decoration:none}nav.side a.here{font-weight:bold;color:#000}nav.side .missing{color:#999}
main{padding:1em 2.5em 4em;max-width:1100px;min-width:0;flex:1}main img,main svg{max-width:100%;height:auto}
pre{background:#f6f8fa;padding:.6em;overflow:auto;font-size:12.5px;max-height:32em}code{font-size:90%}
details{margin:.3em 0}details>summary{cursor:pointer;color:#667;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}th,td{border:1px solid #ddd;padding:2px 7px;text-align:right}th{background:#eef1f3}
.output{margin:.4em 0 1em;overflow-x:auto}.note{background:#fff8e1;border-left:3px solid #ffb300;padding:.4em .8em}
.api h3{font-family:ui-monospace,Menlo,monospace;font-size:14px;background:#f4f6f7;padding:.3em .5em;border-left:3px solid #1d4f91}
.anchor-link{display:none}.pager{border-top:1px solid #dde;margin-top:3em;padding-top:.8em}
"""


def stages() -> list[str]:
    "The pipeline's stage notebooks, in order (`shopping_grpo.cli.STAGES`), read without importing the CLI's dependencies."
    tree = ast.parse((ROOT/'shopping_grpo'/'cli.py').read_text())
    return next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'STAGES')


def rel(p: Path) -> str:
    "`p` relative to the repository when inside it."
    try: return str(Path(p).absolute().relative_to(ROOT))
    except ValueError: return str(p)


def pick_run(run: str | None) -> Path:
    "The run folder: `run` if given, else the committed GPU reference run, else outputs/smoke (said on stderr)."
    if run:
        p = Path(run) if Path(run).is_absolute() else ROOT/run
        if not (p/'notebooks').is_dir(): raise SystemExit(f"{run} has no notebooks/ folder: run `shopping-grpo pipeline --run {run}` (or `make run`) first")
        return p
    if (REFERENCE_RUN/'notebooks').is_dir(): return REFERENCE_RUN
    if (SMOKE_RUN/'notebooks').is_dir():
        print(f"docs: no reference run at {rel(REFERENCE_RUN)}; rendering {rel(SMOKE_RUN)} instead", file=sys.stderr)
        return SMOKE_RUN
    raise SystemExit(f"docs: no executed notebooks to render: neither {rel(REFERENCE_RUN)} (the published GPU run) "
                     f"nor {rel(SMOKE_RUN)} (`make run`) exists; pass RUN=<run folder>")


def read_nb(path: Path) -> dict | None:
    "A notebook as JSON, from `path` or `path`.gz; None if neither exists."
    if path.exists(): return json.loads(path.read_text())
    if (gz := path.with_name(path.name + '.gz')).exists(): return json.loads(gzip.decompress(gz.read_bytes()))
    return None


def src(x) -> str: return ''.join(x) if isinstance(x, list) else (x or '')


def md(text: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    return markdown2html_mistune(text)


def render_output(o: dict) -> str:
    "One output of a code cell as HTML: rich HTML or SVG as is, images inline, text as preformatted text."
    t = o.get('output_type')
    if t == 'stream':
        return f'<details><summary>{o.get("name", "stream")}</summary><pre>{html.escape(src(o.get("text")))}</pre></details>'
    if t == 'error':
        return f'<pre class="error">{html.escape(o.get("ename", ""))}: {html.escape(o.get("evalue", ""))}</pre>'
    d = o.get('data', {})
    for mime in d:
        if mime.startswith('application/vnd.vegalite.'): return vega_svg(d[mime])
    if 'text/html' in d:
        h = src(d['text/html'])
        return vega_svg(embedded_spec(h)) if 'vegaEmbed' in h else h
    if 'image/svg+xml' in d: return src(d['image/svg+xml'])
    for mime in ('image/png', 'image/jpeg'):
        if mime in d: return f'<img src="data:{mime};base64,{src(d[mime]).strip()}">'
    if 'text/markdown' in d: return md(src(d['text/markdown']))
    if 'text/plain' in d: return f'<pre>{html.escape(src(d["text/plain"]))}</pre>'
    return ''


def embedded_spec(h: str) -> dict | None:
    "The vega-lite spec of an altair chart shown through its HTML renderer (vega-embed, loaded from a CDN), or None."
    i = h.rfind('})(')
    try: return json.JSONDecoder().raw_decode(h[i + 3:])[0] if i >= 0 else None
    except ValueError: return None


def vega_svg(spec: dict | None) -> str:
    "A vega-lite chart drawn here as SVG (vl-convert), so that its page loads no script from a CDN."
    if not spec: return '<p class="note">a chart whose spec could not be read</p>'
    import vl_convert
    try: return vl_convert.vegalite_to_svg(spec)
    except Exception as e: return f'<p class="note">a chart vl-convert could not draw: {html.escape(str(e)[:200])}</p>'


def render_nb(nb: dict) -> tuple[str, str]:
    "Title and body of a notebook: prose as HTML, code folded, outputs shown."
    parts, title = [], None
    for c in nb['cells']:
        s = src(c['source'])
        if c['cell_type'] == 'markdown':
            if title is None and (m := re.match(r'\s*#\s+(.+)', s)): title = m.group(1).strip()
            parts.append(md(s))
        elif c['cell_type'] == 'code':
            tags = c.get('metadata', {}).get('tags', [])
            label = 'parameters (this run)' if 'injected-parameters' in tags else 'code'
            if s.strip(): parts.append(f'<details><summary>{label}</summary><pre><code>{html.escape(s)}</code></pre></details>')
            outs = ''.join(render_output(o) for o in c.get('outputs', []))
            if outs: parts.append(f'<div class="output">{outs}</div>')
    return title or '', '\n'.join(parts)


def module_notebooks() -> dict[str, str]:
    "Source notebook -> the module it exports (`#| default_exp`)."
    out = {}
    for nb in sorted((ROOT/'nbs').glob('[0-9]*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            if c['cell_type'] == 'code' and (m := re.search(r'^#\|\s*default_exp\s+(\S+)', src(c['source']), re.M)):
                out[nb.stem] = m.group(1); break
    return out


def api_body(module: str, nb_name: str, stage_page: str | None) -> str:
    """The exported names of `module` (its `__all__`) with signatures, fields, values and docstrings, read from the code
    nbdev exported; then the source notebook itself (its prose, code folded) unless a stage page shows it executed."""
    path = ROOT/'shopping_grpo'/(module.replace('.', '/') + '.py')
    tree = ast.parse(path.read_text())
    names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == '__all__'), [])
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    values = {t.id: n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    def short(x, n=240): x = ast.unparse(x); return x if len(x) <= n else x[:n] + ' …'
    def sig(f): return f'{f.name}({ast.unparse(f.args)})' + (f' -> {ast.unparse(f.returns)}' if f.returns else '')
    def first_line(n): d = ast.get_docstring(n); return f': {html.escape(d.splitlines()[0])}' if d else ''
    seen = f'<a href="{stage_page}">its stage page</a>, as executed in the run' if stage_page else 'below'
    parts = [f'<h1>shopping_grpo.{module}</h1>', md(ast.get_docstring(tree) or ''),
             f'<p>Exported from the source notebook <code>nbs/{nb_name}.ipynb</code> (shown {seen}).</p>', '<h2>Reference</h2>']
    for name in names:
        d = defs.get(name)
        if isinstance(d, ast.ClassDef):
            bases = ', '.join(ast.unparse(b) for b in d.bases)
            parts.append(f'<h3>class {html.escape(name)}({html.escape(bases)})</h3>' + md(ast.get_docstring(d) or ''))
            fields = [f for f in d.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)]
            methods = [m for m in d.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and (not m.name.startswith('_') or m.name == '__init__')]
            items = [f'<li><code>{html.escape(f.target.id)}: {html.escape(ast.unparse(f.annotation))}'
                     + (f' = {html.escape(short(f.value, 80))}' if f.value is not None else '') + '</code></li>' for f in fields]
            items += [f'<li><code>{html.escape(sig(m))}</code>{first_line(m)}</li>' for m in methods]
            if items: parts.append('<ul>' + ''.join(items) + '</ul>')
        elif d is not None: parts.append(f'<h3>{html.escape(sig(d))}</h3>' + md(ast.get_docstring(d) or ''))
        else: parts.append(f'<h3>{html.escape(name)}</h3>' + (f'<pre><code>{html.escape(name)} = {html.escape(short(values[name]))}</code></pre>' if name in values else ''))
    if not stage_page:
        _, body = render_nb(json.loads((ROOT/'nbs'/f'{nb_name}.ipynb').read_text()))
        parts += ['<h2>The notebook</h2>', body]
    return '\n'.join(parts)


def page(title: str, body: str, nav: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>{html.escape(title)} · shopping_grpo</title><link rel="stylesheet" href="site.css"></head>'
            f'<body>{nav}<main>{body}</main></body></html>')


def sidebar(here: str, stage_pages: dict, api_pages: dict, report: bool, run_label: str) -> str:
    "The sidebar: front page, the stages in pipeline order (those the run lacks greyed), the report, the API pages."
    def a(href, text): return f'<a href="{href}"{" class=here" if href == here else ""}>{html.escape(text)}</a>'
    stages_html = ''.join(f'<li>{a(p, t)}</li>' if p else f'<li class="missing" title="not in this run">{html.escape(t)}</li>'
                          for t, p in stage_pages.items())
    api_html = ''.join(f'<li>{a(p, m)}</li>' for m, p in api_pages.items())
    rep = f'<p>{a("report/index.html", "The run’s HTML report")}</p>' if report else '<p class="missing">no report in this run</p>'
    return (f'<nav class="side"><p><b>{a("index.html", "shopping_grpo")}</b></p><p class="missing">run: {html.escape(run_label)}</p>'
            f'<h2>Pipeline</h2><ol start="0">{stages_html}</ol><h2>Report</h2>{rep}<h2>API</h2><ul>{api_html}</ul></nav>')


def fix_links(body: str, targets: dict[str, str]) -> str:
    "Links to notebooks (`05_sft.ipynb`, `../nbs/05_sft.ipynb`) lead to their page on the site."
    def sub(m):
        name = Path(m.group(2)).stem
        return f'{m.group(1)}{targets[name]}{m.group(3) or ""}"' if name in targets else m.group(0)
    return re.sub(r'(href=")([^"#]*?\.ipynb)(#[^"]*)?"', sub, body)


def execute_index(timeout: int = 300) -> dict:
    "nbs/index.ipynb executed in nbs/ (it reads committed files only)."
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(ROOT/'nbs'/'index.ipynb', as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name='python3', resources={'metadata': {'path': str(ROOT/'nbs')}}).execute()
    return json.loads(nbformat.writes(nb))


def build(run: str | None = None, out: str | Path = ROOT/'_docs', index_nb: dict | None = None) -> dict:
    "Write the site for `run` into `out` (replaced whole); pages, bytes and seconds."
    t0, run_dir, out = time.time(), pick_run(run), Path(out)
    if out.exists(): shutil.rmtree(out)
    out.mkdir(parents=True)
    mods = module_notebooks()
    nbs = {st: read_nb(run_dir/'notebooks'/f'{st}.ipynb') for st in stages()}
    stage_pages = {st: (f'{st}.html' if nb else None) for st, nb in nbs.items()}
    api_pages = {f'{m} ({nb_name})': f'api-{m}.html' for nb_name, m in mods.items()}
    targets = {st: p for st, p in stage_pages.items() if p} | {n: f'api-{m}.html' for n, m in mods.items() if n not in targets_of(stage_pages)} | {'index': 'index.html'}
    report = (run_dir/'report'/'index.html').exists()
    if report: shutil.copytree(run_dir/'report', out/'report')
    label = rel(run_dir)
    (out/'site.css').write_text(CSS)
    written = []
    def write(name, title, body):
        (out/name).write_text(page(title, fix_links(body, targets), sidebar(name, stage_pages, api_pages, report, label))); written.append(name)
    ledger = json.loads((run_dir/'pipeline.json').read_text()) if (run_dir/'pipeline.json').exists() else {}
    done = [st for st, nb in nbs.items() if nb is not None]
    for i, st in enumerate(done):
        title, body = render_nb(nbs[st])
        e = ledger.get(st, {})
        ran = f", {e['seconds'] / 60:.1f} min on {html.escape(str(e.get('machine', '?')))}, finished {html.escape(str(e.get('finished_at', '?')))}" if 'seconds' in e else ''
        head = f'<p class="missing">{st}, as executed in <code>{html.escape(label)}</code>{ran}</p>'
        prev = f'<a href="{done[i-1]}.html">← {done[i-1]}</a>' if i else '<a href="index.html">← front page</a>'
        nxt = f'<a href="{done[i+1]}.html">{done[i+1]} →</a>' if i + 1 < len(done) else ('<a href="report/index.html">the report →</a>' if report else '')
        write(f'{st}.html', title or st, head + body + f'<p class="pager">{prev}<span style="float:right">{nxt}</span></p>')
    for nb_name, m in mods.items(): write(f'api-{m}.html', f'shopping_grpo.{m}', f'<div class="api">{api_body(m, nb_name, stage_pages.get(nb_name))}</div>')
    idx = index_nb if index_nb is not None else execute_index()
    title, body = render_nb(idx)
    run_note = (f'<p class="note">Stage pages show the run <code>{html.escape(label)}</code>: '
                f'{sum(p is not None for p in stage_pages.values())} of {len(stage_pages)} stages. '
                + ('Its <a href="report/index.html">HTML report</a> is part of the site.' if report else 'It has no HTML report.') + '</p>')
    write('index.html', title or 'shopping_grpo', run_note + body)
    size = sum(f.stat().st_size for f in out.rglob('*') if f.is_file())
    return dict(run=label, out=str(out), pages=written, n_pages=len(written), report=report, bytes=size, seconds=round(time.time() - t0, 2))


def targets_of(stage_pages: dict) -> set: return {st for st, p in stage_pages.items() if p}


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--run', default=None, help='run folder with notebooks/ (default: outputs/reference/h200, else outputs/smoke)')
    ap.add_argument('--out', default=str(ROOT/'_docs'), help='site folder (replaced whole)')
    ap.add_argument('--record', default=None, help='write build time and size to this JSON file')
    a = ap.parse_args()
    r = build(a.run, a.out)
    print(f"docs: {r['n_pages']} pages from {r['run']} in {r['seconds']} s, {r['bytes']/1e6:.1f} MB in {r['out']}; open {r['out']}/index.html", file=sys.stderr)
    if a.record: Path(a.record).write_text(json.dumps({k: v for k, v in r.items() if k != 'pages'} | dict(pages=r['n_pages']), indent=1) + '\n')
