"""One prefix-cache interface (issue 26): outside workbench/cache nothing asks which storage
it holds with ``isinstance`` on an implementation; both storages are the one PrefixCache
implementation (whole rows: chunks of WHOLE_ROWS).

The check reads the sources (no import runs): an ``isinstance(x, C)`` (C a name, a dotted
name or a tuple of them) outside workbench/cache/ whose C names a class that implements
PrefixCache fails. ``isinstance(x, PrefixCache)``, the interface, is fine.

Run: ``python -m pytest tests/unit/test_cache_interface.py`` (or the file itself, which
prints what it finds).
"""

from __future__ import annotations

import ast
from pathlib import Path

from workbench.cache import PrefixCache, RamTier
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunked import chunked_cache

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = ROOT / "workbench" / "cache"


def storage_classes() -> set[str]:
    """Names of the classes implementing the interface, and the chunk store under one."""
    found: set[str] = {ChunkStore.__name__}
    todo = list(PrefixCache.__subclasses__())
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return found


def _names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _names(elt)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def storage_checks(root: Path, classes: set[str], skip: Path | None = CACHE_DIR) -> list[str]:
    """``path:line: isinstance(.., Class)`` for each check on a storage class under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if skip is not None and skip in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2):
                hit = [n for n in _names(node.args[1]) if n in classes]
                if hit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno}: isinstance(.., {', '.join(hit)})")
    return out


def test_no_isinstance_on_a_storage_outside_the_cache_package() -> None:
    assert storage_checks(ROOT / "workbench", storage_classes()) == []


def test_the_check_finds_one_planted(tmp_path: Path) -> None:
    pkg = tmp_path / "workbench"
    pkg.mkdir()
    (pkg / "views.py").write_text(
        "from workbench.cache import chunked\n"
        "def f(c):\n"
        "    if isinstance(c, (int, chunked.ChunkedCache)):\n"
        "        return 1\n"
        "    return isinstance(c, PrefixCache)\n")
    assert storage_checks(pkg, storage_classes(), skip=None) == ["workbench/views.py:3: isinstance(.., ChunkedCache)"]


def test_both_storages_are_the_one_implementation() -> None:
    assert [c.__name__ for c in PrefixCache.__subclasses__()] == ["ChunkedCache"]
    rows = chunked_cache([(RamTier("ram", 1 << 20), None)], "lru", WHOLE_ROWS)
    chunks = chunked_cache([(RamTier("ram", 1 << 20), None)], "lru", 64)
    try:
        for cache, storage, size in ((rows, "rows", None), (chunks, "chunks", 64)):
            assert isinstance(cache, PrefixCache)
            assert (cache.storage, cache.info()["storage"], cache.info()["chunk_size"]) == (storage, storage, size)
            assert cache.chunk_rows() == []
            assert cache.tier_spec({"kind": "disk"})["root"]  # the chunk directory's default
    finally:
        rows.close()
        chunks.close()


if __name__ == "__main__":
    print("\n".join(storage_checks(ROOT / "workbench", storage_classes())) or "no isinstance on a storage")
