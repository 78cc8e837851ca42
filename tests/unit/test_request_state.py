"""A request's state changes only through its transition methods (engine/request.py): no
other module assigns a Request field or mutates one of its lists in place (issue 26). The
check reads the engine's source (the only package that holds a Request): an assignment or
a list mutation of a Request field on a name that holds a request (``req``, ``request``,
``r``, ``s.request``) outside request.py fails."""

from __future__ import annotations

import ast
from pathlib import Path

import workbench
from workbench.engine.request import Request

ROOT = Path(workbench.__file__).parent / "engine"
FIELDS = set(Request.__dataclass_fields__)
NAMES = {"req", "request", "r"}
MUTATORS = {"append", "extend", "clear", "pop", "popleft", "insert", "remove", "appendleft"}


def holds_request(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in NAMES) or (isinstance(node, ast.Attribute)
                                                                  and node.attr == "request")


def writes(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = [t.value if isinstance(t, ast.Subscript) else t for t in node.targets]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
              and isinstance(node.func.value, ast.Attribute)):
            targets = [node.func.value]
        out += [(t.attr, node.lineno) for t in targets
                if isinstance(t, ast.Attribute) and t.attr in FIELDS and holds_request(t.value)]
    return out


def test_only_the_request_changes_its_state():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "request.py":
            continue
        hits = writes(ast.parse(path.read_text(), str(path)))
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, f"Request fields written outside engine/request.py (use a transition method): {found}"


def test_the_check_finds_a_write():
    src = "req.n_past += 1\nreq.feed = []\ns.request.generated.append(3)\ndel req.feed[:2]\nx.n_past = 1\n"
    assert [name for name, _ in sorted(writes(ast.parse(src)), key=lambda w: w[1])] == [
        "n_past", "feed", "generated", "feed"]
