"""The package's layout: no import circle between its modules (imports inside functions count), and every module
opens with a docstring that says what it holds."""
from __future__ import annotations
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent/'shopping_grpo'
MODULES = sorted(p.stem for p in PKG.glob('*.py') if p.stem not in ('__init__', '_modidx'))


def imports_of(name:str) -> set[str]:
    "The package modules `name` imports anywhere in its source."
    deps = set()
    for n in ast.walk(ast.parse((PKG/f'{name}.py').read_text(encoding='utf-8'))):
        if isinstance(n, ast.ImportFrom) and n.module:
            if n.level == 1: deps.add(n.module.split('.')[0])
            elif n.module.startswith('shopping_grpo.'): deps.add(n.module.split('.')[1])
        elif isinstance(n, ast.Import):
            deps |= {a.name.split('.')[1] for a in n.names if a.name.startswith('shopping_grpo.')}
    return deps & set(MODULES) - {name}


def find_cycle(graph:dict[str, set[str]]) -> list[str] | None:
    "One import circle of `graph`, as the list of modules on it, or None."
    state, path = {}, []
    def visit(u):
        state[u] = 'open'; path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 'open': return path[path.index(v):] + [v]
            if v not in state and (c := visit(v)): return c
        state[u] = 'done'; path.pop()
    for m in sorted(graph):
        if m not in state and (c := visit(m)): return c
    return None


def test_find_cycle_finds_one():
    "The check itself: a circle of three is found, a chain is not."
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None


def test_no_import_circle():
    graph = {m: imports_of(m) for m in MODULES}
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_records_and_env_stand_alone():
    "What goes to disk depends on nothing else in the package; the shop's environment only on records."
    assert imports_of('records') == set() and imports_of('env') == {'records'}


def test_every_module_says_what_it_holds():
    for m in MODULES:
        doc = ast.get_docstring(ast.parse((PKG/f'{m}.py').read_text(encoding='utf-8')))
        assert doc and len(doc.split('\n')[0]) > 20, f'{m}.py has no first line saying what it holds'
