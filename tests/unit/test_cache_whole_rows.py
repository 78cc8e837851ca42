"""Whole rows (``configure_cache(storage='rows')``): the chunk store with chunks of
WHOLE_ROWS positions (issue 26). A row's new KV is one chunk; a longer row that extends a
stored one absorbs it (one chunk serves both); rows share a chunk only where a mark ends
their shared prefix; a prompt that agrees with a stored row on part of it restores those
positions; a restart adopts the rows. Payloads are stand-in bytes (the store treats them
as opaque; the engine's join is tested in tests/integration). What storage='rows' builds
and reports (info: storage 'rows', chunk_size None): test_cache_chunked.py and
test_cache_interface.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from workbench.cache import CacheNamespace
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX
from workbench.cache.chunked import ChunkedCache
from workbench.cache.shared import build

NS = CacheNamespace("ef" * 32)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Callable[[str], ChunkedCache]]:
    """Whole rows on one disk tier in ``tmp_path / name``, scanned as at start-up."""
    made: list[ChunkedCache] = []

    def make(name: str = "rows") -> ChunkedCache:
        cache = build([{"kind": "disk", "root": str(tmp_path / name), "budget_bytes": None}], storage="rows")
        assert isinstance(cache, ChunkedCache)
        cache.scan()
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


def payload(tokens: list[int]) -> bytes:
    """A row's stand-in payload (distinct per row length)."""
    return len(tokens).to_bytes(4, "little") * 50


def piece(tokens: list[int], start: int, end: int) -> bytes:
    """A chunk's stand-in payload: its positions' tokens."""
    return b"".join(t.to_bytes(4, "little") for t in tokens[start:end])


def put(cache: ChunkedCache, tokens: list[int]) -> str:
    """Store a row: one chunk, unless it is stored already (``missing``: 1)."""
    key = cache.put(NS, tokens, [payload(tokens)][cache.missing(NS, tokens):])
    assert key is not None
    return key


def files(cache: ChunkedCache, suffix: str) -> list[Path]:
    root = Path(cache.list_tiers()[0]["root"])
    return sorted(p for p in root.iterdir() if p.name.endswith(suffix))


def test_a_row_is_one_chunk_and_a_longer_row_absorbs_the_one_it_extends(disk):
    cache = disk()
    turn1, turn2 = list(range(100)), list(range(100)) + list(range(500, 640))
    k1 = put(cache, turn1)
    assert len(files(cache, CHUNK_SUFFIX)) == 1 and len(files(cache, MANIFEST_SUFFIX)) == 1
    k2 = put(cache, turn2)                                    # a conversation's next turn
    assert len(files(cache, CHUNK_SUFFIX)) == 1               # the first turn's chunk went
    assert len(files(cache, MANIFEST_SUFFIX)) == 2
    for key, tokens in ((k1, turn1), (k2, turn2)):
        hit = cache.lookup(NS, tokens + [9999])
        assert hit is not None and (hit.key, hit.n_tokens) == (key, len(tokens))
        assert cache.read(hit) == [payload(turn2)]            # the long chunk's first positions
    assert [r["n_chunks"] for r in cache.rows()] == [1, 1]


def test_branching_rows_share_a_chunk_only_where_a_mark_ends_their_prefix(disk):
    shared = list(range(200))
    a, b = shared + [1, 2, 3], shared + [4, 5, 6]
    plain = disk("plain")
    put(plain, a)
    put(plain, b)
    assert len(files(plain, CHUNK_SUFFIX)) == 2               # no grid: each row's KV whole
    marked = disk("marked")                                   # a mark where the shared prefix ends
    assert marked.plan(NS, a, [len(shared)]).ends == (200, 203)
    for t in (a, b):
        plan = marked.plan(NS, t, [len(shared)])
        pieces = [piece(t, s, e) for s, e in zip((0, *plan.ends), plan.ends)][plan.first:]
        assert marked.put(NS, t, pieces, ends=plan.ends) is not None
    assert len(files(marked, CHUNK_SUFFIX)) == 3              # the prefix once, a tail each
    for t in (a, b):
        hit = marked.lookup(NS, t + [9999])
        assert hit is not None and hit.n_tokens == len(t)
        assert marked.read(hit) == [piece(a, 0, 200), piece(t, 200, 203)]


def test_a_prompt_agreeing_with_part_of_a_row_restores_those_positions(disk):
    """The old row storage served only a row that was a whole prefix of the prompt (here:
    cold); a whole-row chunk serves the positions the prompt agrees on."""
    cache = disk()
    row = list(range(300))
    put(cache, row)
    prompt = list(range(120)) + [7777] * 30
    hit = cache.lookup(NS, prompt)
    assert hit is not None and hit.key is None and hit.n_tokens == 120
    assert cache.counters()["hits_partial"] == 1
    assert cache.read(hit) == [payload(row)]                  # the row's chunk (its first 120 positions)


def test_a_restart_adopts_the_rows(disk):
    first = disk()
    short, other, longer = list(range(50)), list(range(1000, 1080)), list(range(50)) + [5] * 20
    stored = {put(first, t) for t in (short, other, longer)}
    first.close()
    again = disk()
    assert set(again.keys()) == stored
    for t, served_by in ((short, longer), (other, other), (longer, longer)):
        hit = again.lookup(NS, t + [1])
        assert hit is not None and hit.n_tokens == len(t)
        assert again.read(hit) == [payload(served_by)]
