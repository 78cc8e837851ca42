"""Exact eviction order per policy on small hand-made sequences, pins and live rows, through
the cache itself: one memory tier in whole rows (each row one chunk of its own), rows named
by letters.

A row costs its chunk's and its manifest's bytes (the store counts file sizes, in memory
too); payloads of PAYLOAD bytes make the manifest small beside the chunk, so a budget of
``n`` rows (``budget_rows``) holds n rows and S3-FIFO's queues, shares of the budget in
bytes, hold the rows the algorithm's description counts.
"""

from __future__ import annotations

import math

import pytest

from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunked import ChunkedCache
from workbench.cache.keys import CacheNamespace
from workbench.cache.policies import GDSF, LFU, LRU, POLICIES, Frecency, FunctionPolicy, get_policy
from workbench.cache.s3fifo import S3FIFO
from workbench.cache.types import RowStats

NS = CacheNamespace("ab" * 32)
PAYLOAD = 100_000


def row_bytes(n_tokens: int = 1, payload: int = PAYLOAD) -> int:
    """What a one-chunk row costs the tier: its chunk file and its manifest."""
    return chunk_file_size(n_tokens, payload) + manifest_size(n_tokens, 1)


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Harness:
    """A one-tier cache in whole rows whose rows are named by letters."""

    def __init__(self, policy: object, budget_rows: int | None = None) -> None:
        self.clock = Clock()
        budget = None if budget_rows is None else budget_rows * row_bytes()
        self.store = ChunkStore(None, budget, chunk_size=WHOLE_ROWS, policy=policy, clock=self.clock)
        self.cache = ChunkedCache(self.store)
        self.keys: dict[str, str] = {}

    def put(self, name: str, t: float | None = None, size: int = PAYLOAD, n_tokens: int = 1) -> None:
        if t is not None:
            self.clock.t = t
        tokens = [ord(name)] * n_tokens
        key = self.cache.put(NS, tokens, [b"x" * size])
        assert key is not None
        self.keys[name] = key

    def get(self, name: str, t: float | None = None) -> None:
        if t is not None:
            self.clock.t = t
        self.store.read_row(self.keys[name])

    def names(self) -> list[str]:
        by_key = {v: k for k, v in self.keys.items()}
        return [by_key[k] for k in self.cache.keys()]

    def chunk_bytes(self, name: str) -> int:
        """The size the policy sees: the row's chunk."""
        (chunk,) = self.store.row_chunks[self.keys[name]]
        return self.store.chunks[chunk].size

    def drain_order(self) -> list[str]:
        """Evict one row at a time (evict_bytes(1)) and report who left."""
        order = []
        while len(self.cache):
            before = set(self.names())
            self.cache.evict_bytes(1)
            gone = before - set(self.names())
            assert len(gone) == 1
            order.extend(gone)
        return order


def lru_harness() -> Harness:
    h = Harness("lru")
    for t, name in enumerate("abcd", start=1):
        h.put(name, t)
    h.get("a", 5)
    h.get("c", 6)
    return h


def test_lru_order() -> None:
    assert lru_harness().drain_order() == ["b", "d", "a", "c"]


def test_lru_pinned_row_goes_last() -> None:
    h = lru_harness()
    h.cache.pin(h.keys["b"])
    assert h.drain_order() == ["d", "a", "c", "b"]


def test_live_and_pinned_rows_go_after_all_others_in_policy_order() -> None:
    h = lru_harness()
    h.cache.pin(h.keys["b"])
    h.cache.set_live(h.keys["d"])
    assert h.drain_order() == ["a", "c", "b", "d"]


def test_budget_eviction_skips_protected_rows() -> None:
    h = Harness("lru", budget_rows=3)
    for t, name in enumerate("abc", start=1):
        h.put(name, t)
    h.cache.set_live(h.keys["a"])
    h.put("d", 4)
    assert sorted(h.names()) == ["a", "c", "d"]


def test_lfu_order_ties_broken_by_recency() -> None:
    h = Harness("lfu")
    for t, name in enumerate("abcd", start=1):
        h.put(name, t)
    for t in (5, 6, 7):
        h.get("a", t)
    h.get("b", 8)
    h.get("d", 9)
    assert h.drain_order() == ["c", "b", "d", "a"]


def frecency_harness(now: float) -> Harness:
    h = Harness("frecency")
    h.put("a", 0.0)
    for _ in range(10):
        h.get("a", 100.0)
    h.put("b", 3000.0)
    h.clock.t = now
    return h


def test_frecency_formula_and_order() -> None:
    h = frecency_harness(3600.0)
    scores = {r["key"]: r["score"] for r in h.cache.rows()}
    expected_a = 100.0 + 3600.0 * math.log2(11) * 0.5 ** (3500.0 / 21600.0)
    assert scores[h.keys["a"]] == pytest.approx(expected_a)
    assert scores[h.keys["b"]] == 3000.0  # never hit: just its creation time
    assert h.drain_order() == ["b", "a"]  # ten recent hits outweigh 2,900 s of age


def test_frecency_bonus_decays_with_a_six_hour_half_life() -> None:
    h = frecency_harness(100.0 + 10 * 6 * 3600.0)  # ten half-lives later
    scores = {r["key"]: r["score"] for r in h.cache.rows()}
    assert scores[h.keys["a"]] == pytest.approx(100.0 + 3600.0 * math.log2(11) / 1024)
    assert h.drain_order() == ["a", "b"]


def test_gdsf_order_and_inflation() -> None:
    """GDSF: priority = inflation + hits' weight * tokens / bytes (the chunk's); the inflation
    rises to each victim's priority."""
    gdsf = GDSF()
    h = Harness(gdsf)
    h.put("a", 1, size=100_000, n_tokens=10)   # 10 tokens over ~100 kB: the lowest
    h.put("b", 2, size=10_000, n_tokens=10)
    h.put("c", 3, size=100_000, n_tokens=100)
    p = {n: k / h.chunk_bytes(n) for n, k in (("a", 10), ("b", 10), ("c", 100))}
    h.cache.evict_bytes(1)
    assert sorted(h.names()) == ["b", "c"]
    assert gdsf.inflation == pytest.approx(p["a"])
    h.put("d", 4, size=100_000, n_tokens=10)   # L + a's density
    h.get("b", 5)                              # L + 2 * b's density
    scores = {r["key"]: r["score"] for r in h.cache.rows()}
    assert scores[h.keys["d"]] == pytest.approx(2 * p["a"])
    assert scores[h.keys["b"]] == pytest.approx(p["a"] + 2 * p["b"])
    assert 2 * p["a"] < p["c"] < p["a"] + 2 * p["b"]
    assert h.drain_order() == ["d", "c", "b"]
    assert gdsf.inflation == pytest.approx(p["a"] + 2 * p["b"])


FIRST20 = "abcdefghijklmnopqrst"


def s3fifo_harness() -> Harness:
    """Budget 20 rows: small = 2, main = 18, ghost = 18. S3-FIFO's queues hold the chunks'
    bytes, the budget also the manifests': the policy's capacity is the 20 chunks' bytes (at
    10% of the budget the small queue would start a third row)."""
    h = Harness("s3fifo", budget_rows=20)
    h.store.policy.set_capacity(20 * chunk_file_size(1, PAYLOAD))  # type: ignore[attr-defined]
    for t, name in enumerate(FIRST20, start=1):
        h.put(name, t)  # a, b -> small; c..t -> main (small is full before any eviction)
    return h


def test_s3fifo_small_ghost_and_main() -> None:
    h = s3fifo_harness()
    h.put("u")  # evict from small: a (never hit) -> ghost; u -> small
    assert "a" not in h.names()
    h.put("a")  # ghost hit: a goes to main; room is made in small: b -> ghost
    assert "b" not in h.names() and "a" in h.names()
    h.put("v")  # main is over its share: c (never hit) is evicted from main
    assert "c" not in h.names()
    assert sorted(h.names()) == sorted(FIRST20[3:] + "auv")


def test_s3fifo_hit_in_small_moves_to_main() -> None:
    h = s3fifo_harness()
    h.get("a")
    h.get("a")  # freq 2 >= move_to_main_threshold
    h.put("u")  # a moves to main instead of leaving; b is evicted
    assert "a" in h.names() and "b" not in h.names()


def test_s3fifo_hit_in_main_gets_a_second_chance() -> None:
    h = s3fifo_harness()
    h.put("u")
    h.put("a")
    h.get("c")  # freq 1: reinserted at the tail of main with freq 0
    h.put("v")
    assert "c" in h.names() and "d" not in h.names()


def test_s3fifo_skips_protected_rows() -> None:
    h = s3fifo_harness()
    h.put("u")
    h.put("a")
    h.cache.pin(h.keys["c"])
    h.put("v")
    assert "c" in h.names() and "d" not in h.names()


def test_s3fifo_row_too_large_for_small_goes_to_main() -> None:
    s3 = S3FIFO(capacity_bytes=10)  # small = 1 byte
    s3.on_insert(RowStats("big", 1, 1, 0.0))
    assert s3.main.keys() == ["big"] and not s3.small


def test_s3fifo_falls_back_to_protected_rows_when_nothing_else_is_left() -> None:
    h = Harness("s3fifo", budget_rows=10)
    h.put("a")
    h.put("b")
    h.cache.pin(h.keys["a"])
    h.cache.set_live(h.keys["b"])
    assert sorted(h.drain_order()) == ["a", "b"]


def test_custom_priority_function() -> None:
    def longest_first(row: RowStats, now: float) -> float:
        return -row.n_tokens

    h = Harness(longest_first)
    h.put("a", n_tokens=3)
    h.put("b", n_tokens=9)
    h.put("c", n_tokens=5)
    assert h.drain_order() == ["b", "c", "a"]


def test_get_policy_registry() -> None:
    assert sorted(POLICIES) == ["fifo", "frecency", "gdsf", "lfu", "lru", "s3fifo"]
    assert isinstance(get_policy("LRU"), LRU)
    assert isinstance(get_policy(S3FIFO), S3FIFO)
    assert get_policy("gdsf") is not get_policy("gdsf")  # names give fresh (stateful) instances
    lfu = LFU()
    assert get_policy(lfu) is lfu
    fn = get_policy(lambda row, now: 0.0)
    assert isinstance(fn, FunctionPolicy) and fn.name == "<lambda>"
    with pytest.raises(ValueError, match="valid: fifo, frecency, gdsf, lfu, lru, s3fifo"):
        get_policy("mru")
    with pytest.raises(TypeError):
        get_policy(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        get_policy(dict)
    with pytest.raises(ValueError):
        Frecency(half_life_s=0)
