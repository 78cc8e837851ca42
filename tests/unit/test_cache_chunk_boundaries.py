"""Chunk boundaries where a shared prefix ends (chunk_catalog.plan, chunk_store.put_row with
``ends``): rows under one shared prefix of P tokens store it once whatever ``P mod
chunk_size``; a row saved without the mark follows the stored chain; lookups walk chunks of
any length; manifests keep their chunks' ends across a restart (format version 3)."""

from __future__ import annotations

import pytest

from workbench.cache import keys
from workbench.cache.chunk_catalog import ChunkPlan
from workbench.cache.chunk_format import CHUNK_SUFFIX, read_chunk
from workbench.cache.chunk_store import ChunkStore

NS = bytes(range(32))
FP = bytes(32)
CS = 8
SYSTEM = list(range(1000, 1013))            # a shared prefix of 13 tokens: 13 mod 8 = 5


def save(store: ChunkStore, tokens: list[int], marks: tuple[int, ...] = ()) -> ChunkPlan:
    plan = store.plan(NS, tokens, marks)
    pieces = [k * (50 + i) for i, k in enumerate(plan.keys)][plan.first:]
    assert store.put_row(NS, FP, tokens, pieces, ends=plan.ends) == keys.row_key(NS, tokens)
    return plan


def positions(store: ChunkStore) -> int:
    return sum(c.n_tokens for c in store.chunks.values())


def chats(n: int) -> list[list[int]]:
    return [SYSTEM + [2000 + 100 * i + j for j in range(11)] for i in range(n)]


def test_a_mark_ends_a_chunk_and_the_shared_prefix_is_stored_once(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    rows = chats(5)
    plans = [save(store, r, (len(SYSTEM),)) for r in rows]
    assert plans[0].ends == (8, 13, 21, 24) and plans[1].first == 2  # chunks 0..8, 8..13 shared
    assert positions(store) == len(SYSTEM) + 5 * 11  # every position once
    grid = ChunkStore(tmp_path / "g", chunk_size=CS)
    for r in rows:
        save(grid, r)
    assert positions(grid) == len(SYSTEM) + 5 * 11 + 4 * 5  # each chat re-stores 13 mod 8 positions
    for r in rows:
        m, served_by, got = store.read_row(keys.row_key(NS, r))
        assert m.ends == plans[0].ends and len(got) == len(served_by) == 4


def test_a_row_without_the_mark_follows_the_stored_chain(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    first, later = chats(2)
    save(store, first, (len(SYSTEM),))
    plan = save(store, later)  # e.g. a session's KV saved on eviction: no mark given
    assert plan.ends[:2] == (8, 13) and plan.first == 2 and plan.ends[2:] == (21, 24)  # the grid from 13
    turn2 = later + list(range(3000, 3010))
    assert save(store, turn2).ends == (8, 13, 21, 29, 34)  # 21..24, the earlier row's tail, absorbed
    assert positions(store) == len(SYSTEM) + 11 + len(turn2) - len(SYSTEM)


def test_lookups_walk_chunks_of_any_length(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    a, b = chats(2)
    save(store, a, (len(SYSTEM),))
    hit = store.lookup(NS, b + [5])  # b shares the system prompt's two chunks (8 and 5 tokens)
    assert hit is not None and hit.key is None and hit.n_tokens == len(SYSTEM) and len(hit.chunks) == 2
    assert store.lookup(NS, a + [7]).key == keys.row_key(NS, a)
    c = SYSTEM + a[len(SYSTEM):len(SYSTEM) + 9] + [4]  # inside a's third chunk, then leaving it
    assert store.lookup(NS, c).n_tokens == len(SYSTEM) + 9


def test_chunk_ends_survive_a_restart(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    rows = chats(3)
    for r in rows:
        save(store, r, (len(SYSTEM),))
    fresh = ChunkStore(tmp_path / "d", chunk_size=CS)
    assert fresh.scan() == {}
    assert sorted(fresh.rows) == sorted(store.rows) and positions(fresh) == positions(store)
    assert {read_chunk(p)[0].n_tokens for p in (tmp_path / "d").glob(f"*{CHUNK_SUFFIX}")} == {8, 5, 3}
    m, _, _ = fresh.read_row(keys.row_key(NS, rows[2]))
    assert m.ends == (8, 13, 21, 24)


def test_ends_that_are_no_row_of_the_tokens_are_refused(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    row = chats(1)[0]
    for ends in [(8, 13, 21), (8, 20, 24), (0, 8, 16, 24), (12, 24)]:
        with pytest.raises(ValueError, match="chunk ends"):
            store.put_row(NS, FP, row, [b"x"] * len(ends), ends=ends)
    assert not store.rows and not store.chunks
