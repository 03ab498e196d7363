"""Flagged cells and the cells after them: a cell flagged `slow`, `gpu` or `notest` is skipped by nbdev-test but run by
papermill, so it must not change a name that a later unflagged cell reads (the two runs would check different values)."""
from __future__ import annotations
import ast, json, re
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parent.parent/'nbs'
FLAGS = {'slow', 'gpu', 'notest'}


def cell_flags(src:str) -> set[str]:
    "The test flags among the cell's `#|` directives."
    words = set()
    for line in src.splitlines():
        if m := re.match(r'\s*#\|\s*(.*)', line): words |= set(m.group(1).replace(',', ' ').split())
    return words & FLAGS


def cell_tree(src:str) -> ast.Module:
    "The cell's code as Python: IPython magics and shell lines become `pass`, a cell magic's body is dropped."
    lines = src.splitlines()
    if lines and lines[0].lstrip().startswith('%%'): return ast.parse('')
    return ast.parse('\n'.join(re.sub(r'^(\s*)[%!].*', r'\1pass', l) for l in lines))


def _target_names(t) -> set[str]:
    "Names a store target binds or changes in place (`x`, `x, y`, `x[k]`, `x.a`: the name `x`)."
    if isinstance(t, ast.Name): return {t.id}
    if isinstance(t, ast.Starred): return _target_names(t.value)
    if isinstance(t, (ast.Tuple, ast.List)): return set().union(*map(_target_names, t.elts)) if t.elts else set()
    if isinstance(t, (ast.Subscript, ast.Attribute)): return _target_names(t.value)
    return set()


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
          ast.GeneratorExp)


def _walk_own(node):
    "`node` and the nodes under it in its scope: of a function, lambda, class or comprehension only the node itself and"
    "what is evaluated where it stands (decorators, defaults, bases, a comprehension's first iterable)."
    yield node
    if isinstance(node, SCOPES):
        outer = list(getattr(node, 'decorator_list', [])) + list(getattr(node, 'bases', []))
        if hasattr(node, 'args'): outer += [d for d in node.args.defaults + node.args.kw_defaults if d is not None]
        if hasattr(node, 'generators'): outer.append(node.generators[0].iter)
        for d in outer: yield from _walk_own(d)
        return
    for child in ast.iter_child_nodes(node): yield from _walk_own(child)


def stored(stmt) -> set[str]:
    "Names a top-level statement binds or changes in place, in the cell's (the notebook's) scope."
    out = set()
    for n in _walk_own(stmt):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): out.add(n.name)
        elif isinstance(n, ast.Assign): out |= set().union(*map(_target_names, n.targets))
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)): out |= _target_names(n.target)
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)): out |= _target_names(n.target)
        elif isinstance(n, ast.withitem) and n.optional_vars is not None: out |= _target_names(n.optional_vars)
        elif isinstance(n, ast.NamedExpr): out |= _target_names(n.target)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split('.')[0] for a in n.names if a.name != '*'}
        elif isinstance(n, ast.ExceptHandler) and n.name: out.add(n.name)
        elif isinstance(n, ast.Delete): out |= set().union(*map(_target_names, n.targets))
    # names a comprehension's walrus binds leak into the enclosing scope
    for n in ast.walk(stmt):
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            out |= {w.target.id for w in ast.walk(n) if isinstance(w, ast.NamedExpr)}
    return out


def _local_names(fn) -> set[str]:
    "Names bound inside a function, lambda, class or comprehension (its parameters among them)."
    if isinstance(fn, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return set().union(*(_target_names(g.target) for g in fn.generators))
    out = set()
    if hasattr(fn, 'args'):
        a = fn.args
        out |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        out |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    glob = {x for s in body for n in ast.walk(s) if isinstance(n, ast.Global) for x in n.names}
    for s in body:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store): out.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn: out.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out |= {(x.asname or x.name).split('.')[0] for x in n.names}
            elif isinstance(n, ast.ExceptHandler) and n.name: out.add(n.name)
    return out - glob


def loaded(stmt) -> set[str]:
    "Names a top-level statement reads from the notebook's scope, in its own code or in the functions it defines."
    out = set()
    def visit(node, local:frozenset):
        for n in _walk_own(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local: out.add(n.id)
            if isinstance(n, SCOPES):
                inner = local | _local_names(n)
                if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                    for i, g in enumerate(n.generators):  # the first iterable is read where the comprehension stands
                        if i: visit(g.iter, inner)
                        for c in g.ifs: visit(c, inner)
                    for e in ([n.key, n.value] if isinstance(n, ast.DictComp) else [n.elt]): visit(e, inner)
                elif isinstance(n, ast.Lambda): visit(n.body, inner)
                else:
                    for s in n.body: visit(s, inner)
    visit(stmt, frozenset())
    return out


def leaks(cells:list[tuple[set[str], str]]) -> list[str]:
    """Where a flagged cell changes a name that a later unflagged cell reads before any unflagged cell binds it again.
    `cells`: (flags, source) of each code cell in order. One message per (flagged cell, name, reading cell)."""
    found, changed = [], {}  # name -> index of the flagged cell that last changed it
    for i, (flags, src) in enumerate(cells):
        tree = cell_tree(src)
        if flags:
            for s in tree.body:
                for name in stored(s): changed[name] = i
            continue
        for s in tree.body:
            for name in sorted(loaded(s) & changed.keys()):
                found.append(f'cell {changed[name]} ({"/".join(sorted(cells[changed[name]][0]))}) changes {name!r}, '
                             f'which cell {i} reads')
                changed.pop(name)
            for name in stored(s): changed.pop(name, None)
    return found


def notebook_cells(path:Path) -> list[tuple[set[str], str]]:
    "(flags, source) of each code cell of a notebook."
    nb = json.loads(path.read_text(encoding='utf-8'))
    cells = [''.join(c['source']) if isinstance(c['source'], list) else c['source'] for c in nb['cells']
             if c['cell_type'] == 'code']
    return [(cell_flags(s), s) for s in cells]


def test_the_check_finds_what_it_should():
    "The check itself: a slow cell that rebinds, appends to or defines a name read later is found; rebinding it in an"
    "unflagged cell first, reading it only in flagged cells, or a local of the same name in a function is not."
    c = lambda src: (cell_flags(src), src)
    assert leaks([c('recs = [1]'), c('#| slow\nrecs = [2]'), c('assert recs == [1]')]) == [
        "cell 1 (slow) changes 'recs', which cell 2 reads"]
    assert leaks([c('d = {}'), c('#| gpu\nd["k"] = 1'), c('print(len(d))')]) != []
    assert leaks([c('#|notest\ndef f(): return 1'), c('f()')]) != []
    assert leaks([c('#| slow\nfrom math import pi'), c('print([pi for _ in range(2)])')]) != []
    assert leaks([c('#| slow\nx = 2'), c('x = 1'), c('print(x)')]) == []
    assert leaks([c('#| slow\nx = 2'), c('#| slow\nprint(x)')]) == []
    assert leaks([c('#| slow\nx = 2'), c('def f(x): return x\nprint([x for x in range(3)])')]) == []
    assert leaks([c('#| slow\nx = 2'), c('x = f(x)')]) != []
    assert leaks([c('#| slow\nif True:\n    y = 1'), c('%time print(y)')]) == []  # a magic line is not read
    assert leaks([c('#| slow\nwith open("f") as fh: pass'), c('fh.close()')]) != []


@pytest.mark.parametrize('nb', sorted(p.name for p in NBS.glob('*.ipynb')))
def test_flagged_cells_change_nothing_unflagged_cells_read(nb):
    found = leaks(notebook_cells(NBS/nb))
    assert not found, f'{nb}: ' + '; '.join(found)
