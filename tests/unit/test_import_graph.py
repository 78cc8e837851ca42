"""The import graph of the workbench package, read from the sources (no import runs).

Two rules (issue 26, "One prefix-cache path"):

* **No import cycle** among workbench modules. An edge A -> B is an import of B by A at
  module level: the module's body, class bodies, ``if``/``try``/``with`` blocks, and
  ``if TYPE_CHECKING:`` blocks too (a cycle only the type checker sees is still a cycle).
  Imports inside functions are left out (they run at call time). ``import a.b.c`` and
  ``from a.b import c`` (``c`` a module) are edges to ``a.b.c``; ``from a.b import name`` to
  ``a.b``; the packages above the named module are not counted (every module would then
  depend on ``workbench/__init__.py``). Relative imports are resolved from the importing
  module's package.
* **No module imports another's underscore names** (``from workbench.x import _y``), at any
  level, functions included; dunder names are public. The compiled extension
  ``workbench._native`` is the one private module anyone may import.

Run: ``python -m pytest tests/unit/test_import_graph.py`` (or ``python
tests/unit/test_import_graph.py``, which prints the graph's cycles and underscore imports).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "workbench"
NATIVE = "workbench._native"  # the compiled extension: importing it is fine

# Cycles allowed (none): a cycle found fails the test. An entry is a cycle as `cycles()` names
# it (starting at its smallest module); one that is gone must leave the set
# (test_known_cycles_still_exist).
KNOWN_CYCLES: set[tuple[str, ...]] = set()

# Underscore imports found when this check was written (issue 26), as (importer, module,
# name). Remove an entry once it is gone; a new one fails the test.
KNOWN_UNDERSCORE_IMPORTS: set[tuple[str, str, str]] = set()


@dataclass(frozen=True, slots=True)
class Import:
    importer: str       # the importing module
    target: str         # the workbench module imported
    names: tuple[str, ...]  # ``from target import names``; () for ``import target``
    line: int
    top_level: bool     # at module level (``if TYPE_CHECKING:`` included), not in a function


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def workbench_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under workbench/ by its dotted name (packages by their __init__.py)."""
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def _walk(body: list[ast.stmt], top_level: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Import statements under ``body``, each with whether it runs at import time (not
    inside a function)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, top_level
            continue
        inner = top_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                stmts = [c for c in children if isinstance(c, ast.stmt)]
                stmts += [s for c in children if isinstance(c, (ast.ExceptHandler, ast.match_case)) for s in c.body]
                yield from _walk(stmts, inner)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve_base(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The absolute module ``from <base> import ...`` names."""
    if node.level == 0:
        return node.module or ""
    package = _package_of(module, path)
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts):
        raise ValueError(f"{module}: relative import beyond the top package (line {node.lineno})")
    base = ".".join(parts[:len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest workbench module that ``name`` or its prefixes name."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of workbench modules (and the extension) that ``module`` makes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: list[Import] = []
    for node, top in _walk(tree.body, True):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == NATIVE:
                    out.append(Import(module, NATIVE, (), node.lineno, top))
                    continue
                target = _owner(alias.name, modules)
                if target is not None:
                    out.append(Import(module, target, (), node.lineno, top))
            continue
        base = _resolve_base(node, module, path)
        plain: list[str] = []
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in modules or sub == NATIVE:
                out.append(Import(module, sub, (), node.lineno, top))
            else:
                plain.append(alias.name)
        if plain:
            target = NATIVE if base == NATIVE else _owner(base, modules)
            if target is not None:
                out.append(Import(module, target, tuple(plain), node.lineno, top))
    return out


def all_imports(root: Path = ROOT) -> list[Import]:
    modules = workbench_modules(root)
    return [i for m, p in modules.items() for i in imports_of(m, p, modules)]


def import_graph(imports: list[Import]) -> dict[str, set[str]]:
    """Module -> the workbench modules it imports at module level (the extension left out)."""
    graph: dict[str, set[str]] = {}
    for i in imports:
        graph.setdefault(i.importer, set())
        if i.top_level and i.target != NATIVE and i.target != i.importer:
            graph[i.importer].add(i.target)
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> tuple[str, ...]:
    """The shortest cycle through ``start`` inside one component (breadth first)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in within:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return tuple(reversed(path))
                if child not in came:
                    came[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{start} is in a component but on no cycle")


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """One cycle per module of each strongly connected component (the shortest through it),
    each rotated to start at its smallest module, deduplicated: enough to name every edge
    that closes a cycle the component holds, each printable as a -> b -> ... -> a."""
    found: set[tuple[str, ...]] = set()
    for comp in _components(graph):
        members = set(comp)
        for m in comp:
            c = _shortest_cycle(graph, m, members)
            i = c.index(min(c))
            found.add(c[i:] + c[:i])
    return sorted(found)


def underscore_imports(imports: list[Import]) -> list[tuple[str, str, str, int]]:
    """(importer, module, name, line) for each private name one workbench module imports
    from another (dunder names are public; the extension is fine)."""
    out = []
    for i in imports:
        if i.target == NATIVE:
            continue
        for name in i.names:
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                out.append((i.importer, i.target, name, i.line))
        last = i.target.rpartition(".")[2]
        if not i.names and last.startswith("_") and i.target != NATIVE and i.importer != i.target:
            out.append((i.importer, i.target.rpartition(".")[0], last, i.line))
    return sorted(out)


def show(cycle: tuple[str, ...]) -> str:
    return " -> ".join((*cycle, cycle[0]))


# -- the checks ---------------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    found = cycles(import_graph(all_imports()))
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles among workbench modules:\n" + "\n".join(show(c) for c in new)


def test_known_cycles_still_exist() -> None:
    """A known cycle that is gone leaves ``KNOWN_CYCLES``: the list stays true."""
    gone = KNOWN_CYCLES - set(cycles(import_graph(all_imports())))
    assert not gone, "remove from KNOWN_CYCLES (fixed):\n" + "\n".join(show(c) for c in sorted(gone))


def test_no_underscore_imports() -> None:
    found = underscore_imports(all_imports())
    new = [f for f in found if f[:3] not in KNOWN_UNDERSCORE_IMPORTS]
    assert not new, "workbench modules importing another module's underscore names:\n" + "\n".join(
        f"{importer}:{line}: from {module} import {name}" for importer, module, name, line in new)
    gone = KNOWN_UNDERSCORE_IMPORTS - {f[:3] for f in found}
    assert not gone, f"remove from KNOWN_UNDERSCORE_IMPORTS (fixed): {sorted(gone)}"


# -- the checker checked, on a made-up package ------------------------------------------------


def _package(tmp: Path, files: dict[str, str]) -> list[Import]:
    for rel, text in files.items():
        p = tmp / PACKAGE / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return all_imports(tmp)


def test_checker_resolves_relative_imports_and_type_checking_blocks(tmp_path: Path) -> None:
    imports = _package(tmp_path, {
        "__init__.py": "",
        "cache/__init__.py": "from .store import Store\n",
        "cache/store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import request\n",
        "engine/__init__.py": "",
        "engine/request.py": "from ..cache import store\nfrom .. import cache\n",
        "engine/loop.py": ("def f():\n    from workbench.engine.request import _hidden\n"
                           "    import workbench.cache.store\n"),
        "engine/blocks.py": ("import typing\nif typing.TYPE_CHECKING:\n    import workbench.engine.request as r\n"
                             "try:\n    pass\nexcept ImportError:\n    from workbench.engine import loop\n"
                             "class C:\n    from ..cache.store import Store\n"),
    })
    graph = import_graph(imports)
    assert graph["workbench.cache"] == {"workbench.cache.store"}
    assert graph["workbench.cache.store"] == {"workbench.engine.request"}
    assert graph["workbench.engine.request"] == {"workbench.cache.store", "workbench.cache"}
    assert graph["workbench.engine.loop"] == set()  # inside a function: not an edge
    assert graph["workbench.engine.blocks"] == {"workbench.engine.request", "workbench.engine.loop",
                                                "workbench.cache.store"}
    assert cycles(graph) == [
        ("workbench.cache", "workbench.cache.store", "workbench.engine.request"),
        ("workbench.cache.store", "workbench.engine.request"),
    ]
    assert underscore_imports(imports) == [("workbench.engine.loop", "workbench.engine.request", "_hidden", 2)]


def test_checker_allows_the_extension_and_dunders(tmp_path: Path) -> None:
    imports = _package(tmp_path, {
        "__init__.py": "from workbench import _native\nfrom . import _native as n\n",
        "a.py": "from workbench._native import Thing, _impl\nimport workbench._native\nfrom . import __version__\n",
        "b.py": "from .a import _private\nfrom . import _helpers\n",
        "_helpers.py": "",
    })
    assert cycles(import_graph(imports)) == []
    assert underscore_imports(imports) == [
        ("workbench.b", "workbench", "_helpers", 2),
        ("workbench.b", "workbench.a", "_private", 1),
    ]


if __name__ == "__main__":
    everything = all_imports()
    for c in cycles(import_graph(everything)):
        print("cycle:", show(c), "(known)" if c in KNOWN_CYCLES else "")
    for importer, module, name, line in underscore_imports(everything):
        known = (importer, module, name) in KNOWN_UNDERSCORE_IMPORTS
        print(f"underscore: {importer}:{line}: from {module} import {name}", "(known)" if known else "")
    sys.exit(0)
