"""``rows()`` lets a reader order rows exactly as a tier will evict them: by protection
(pinned or live last), then score, then each row's logical access clock (``seq``) where
scores tie. Whole rows (each row one chunk), a RAM tier of copies over a disk tier. (One
clock reading for every row's ``now`` and age: test_cache_chunked.py.)"""

from __future__ import annotations

from pathlib import Path

from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache
from workbench.cache.keys import CacheNamespace

NS = CacheNamespace("cd" * 32)


def stopped_clock() -> float:
    """Every reading is the same instant: lru scores all tie."""
    return 1000.0


def tokens(n: int) -> list[int]:
    return [n] * n   # rows of their own (no row a prefix of another)


def put(cache: ChunkedCache, n: int) -> str:
    key = cache.put(NS, tokens(n), [bytes([n]) * 100])
    assert key is not None
    return key


def eviction_order(rows: list[dict]) -> list[str]:
    """The order a priority tier evicts in, read from rows() alone."""
    return [r["key"] for r in sorted(rows, key=lambda r: (r["pinned"] or r["live"], r["score"], r["seq"]))]


def test_rows_give_the_order_the_tier_evicts_in_when_scores_tie(tmp_path: Path) -> None:
    tiers = [ChunkTier.memory("ram", 1 << 20, "lru"), ChunkTier.directory(tmp_path / "disk", "disk", None, "lru")]
    cache = ChunkedCache(ChunkStore(tiers=tiers, chunk_size=WHOLE_ROWS, clock=stopped_clock))
    a, b, c, d = put(cache, 1), put(cache, 2), put(cache, 3), put(cache, 4)
    hit = cache.lookup(NS, tokens(1))
    assert hit is not None and cache.read(hit) is not None  # a is the most recently used now
    cache.pin(b)                                            # b goes last whatever its seq
    rows = cache.rows()
    assert len({r["score"] for r in rows}) == 1             # scores say nothing about the order
    assert len({r["seq"] for r in rows}) == 4
    order = eviction_order(rows)
    assert order == [c, d, a, b]
    for i, expected in enumerate(order):
        assert cache.evict_bytes(1, "ram") > 0              # the tier's own choice, one RAM copy at a time
        tiers_now = {r["key"]: r["tier"] for r in cache.rows()}
        assert tiers_now[expected] == "disk"                # the one rows() put first went
        assert [k for k in order if tiers_now[k] == "ram"] == order[i + 1:]
    cache.close()
