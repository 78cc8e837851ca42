"""TieredCache.rows() is one snapshot: one clock reading (`now`) for every row's score and
age, and each row's logical access clock (`seq`), so a reader can order rows exactly as the
tier will evict them even when their scores tie, and compute ages that agree across rows."""

from __future__ import annotations

from pathlib import Path

from workbench.cache.keys import CacheNamespace
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier, RamTier

NS = CacheNamespace("cd" * 32)
ROW = 100


class CountingClock:
    """Each reading is one second later than the previous one, and counted."""

    def __init__(self) -> None:
        self.t = 0.0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        self.t += 1.0
        return self.t


class StoppedClock:
    """Every reading is the same instant: lru scores all tie."""

    def __call__(self) -> float:
        return 1000.0


def put(cache: TieredCache, n: int) -> str:
    key = cache.put(NS, list(range(1, n + 1)), bytes([n]) * ROW)
    assert key is not None
    return key


def ram_over_disk(tmp_path: Path, clock: object) -> TieredCache:
    return TieredCache([RamTier("ram", 10 * ROW), DiskTier("disk", tmp_path / "disk", None)],
                       policy="lru", clock=clock)  # type: ignore[arg-type]


def eviction_order(rows: list[dict]) -> list[str]:
    """The order a priority tier evicts in, read from rows() alone."""
    return [r["key"] for r in sorted(rows, key=lambda r: (r["pinned"] or r["live"], r["score"], r["seq"]))]


def test_every_row_is_read_at_one_clock_reading(tmp_path: Path) -> None:
    clock = CountingClock()
    cache = ram_over_disk(tmp_path, clock)
    a, b, c = put(cache, 1), put(cache, 2), put(cache, 3)
    assert cache.get(b) is not None
    before = clock.readings
    rows = {r["key"]: r for r in cache.rows()}
    assert clock.readings == before + 1                    # one reading for the whole snapshot
    now = clock.t
    assert {r["now"] for r in rows.values()} == {now}
    for r in rows.values():
        last_use = r["created_at"] if r["last_hit_at"] is None else r["last_hit_at"]
        assert 0 < now - last_use <= now - r["created_at"]  # ages and idle times on one clock
        assert r["score"] == last_use                        # lru: scored at that reading
    assert rows[b]["last_hit_at"] is not None and rows[a]["last_hit_at"] is None
    assert set(rows) == {a, b, c}


def test_seq_orders_tied_scores_as_the_tier_evicts(tmp_path: Path) -> None:
    cache = ram_over_disk(tmp_path, StoppedClock())
    a, b, c = put(cache, 1), put(cache, 2), put(cache, 3)
    assert cache.get(a) is not None                        # a is the most recently used now
    rows = cache.rows()
    assert len({r["score"] for r in rows}) == 1            # scores say nothing about the order
    assert len({r["seq"] for r in rows}) == 3
    order = eviction_order(rows)
    assert order == [b, c, a]
    for expected in order:
        assert cache.evict_bytes(ROW, "ram") == ROW          # the tier's own choice, one row at a time
        tiers = {r["key"]: r["tier"] for r in cache.rows()}
        assert tiers[expected] == "disk"                     # demoted: the one rows() put first
    assert (tmp_path / "disk" / f"{b}.kv").exists()


def test_a_pinned_row_goes_last_whatever_its_seq(tmp_path: Path) -> None:
    cache = ram_over_disk(tmp_path, StoppedClock())
    a, b = put(cache, 1), put(cache, 2)
    cache.pin(a)
    assert eviction_order(cache.rows()) == [b, a]
    cache.evict_bytes(ROW, "ram")
    assert {r["key"]: r["tier"] for r in cache.rows()} == {a: "ram", b: "disk"}
