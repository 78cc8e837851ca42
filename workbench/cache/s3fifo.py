"""S3-FIFO eviction (Yang et al., SOSP'23), following libCacheSim's current S3FIFO.c.

    small  = FIFO, 10% of the capacity   (new rows; most are seen once and leave quickly)
    main   = FIFO, the rest              (rows that proved useful; a 2-bit clock)
    ghost  = FIFO of keys only, 90% of the capacity (recently evicted from small)
    freq[k]: hits since the row entered its current queue (capped at 3 on reinsertion)

    admit(k):                        # before the cache makes room for a new row
        ghost_hit = ghost.remove(k)
    insert(k):
        if ghost_hit:                        main.push(k)
        elif no eviction yet and small full: main.push(k)   # warm-up: fill main too
        else:                                small.push(k)
        freq[k] = 0
    hit(k):  freq[k] += 1
    victim():
        loop:
            if main.bytes > main.capacity or small is empty:
                k = main.head
                if freq[k] >= 1: main.move_to_tail(k); freq[k] = min(freq[k], 3) - 1
                else:            main.pop(k); return k
            else:                    # scan small until one row leaves the cache
                k = small.head; small.pop(k)
                if freq[k] >= move_to_main_threshold (2): main.push(k); freq[k] = 0
                else:            ghost.admit(k); return k

Extensions for the KV cache (the simulator has neither): a protected (pinned or live) row
is never returned while `is_protected` says so; at the head of main it goes to the tail
with its freq intact, at the head of small it graduates to main. When every remaining row
is protected `victim` returns None and the cache retries with nothing protected. A row too
large for the small queue goes straight to main (libCacheSim would refuse to cache it).
Without a capacity (an unbounded tier) small never counts as full and there is no ghost.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.cache.fifo import FifoQueue
from workbench.cache.types import RowStats


def _never(key: str) -> bool:
    return False


class S3FIFO:
    """S3-FIFO as an eviction policy: it chooses victims itself through `victim()`."""

    name = "s3fifo"

    def __init__(
        self,
        capacity_bytes: int | None = None,
        *,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        move_to_main_threshold: int = 2,
    ) -> None:
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.move_to_main_threshold = move_to_main_threshold
        self.small = FifoQueue()
        self.main = FifoQueue()
        self.ghost: FifoQueue | None = None
        self.main_capacity: int | None = None
        self.has_evicted = False
        self._freq: dict[str, int] = {}
        self._ghost_hits: set[str] = set()
        self._ranks: dict[str, int] | None = None
        self.set_capacity(capacity_bytes)

    def set_capacity(self, capacity_bytes: int | None) -> None:
        """Size the queues for a tier budget (the cache calls this when binding a tier)."""
        if capacity_bytes is None:
            self.small.capacity = None
            self.main_capacity = None
            self.ghost = None
            return
        small = int(capacity_bytes * self.small_ratio)
        self.small.capacity = small
        self.main_capacity = capacity_bytes - small
        ghost = int(capacity_bytes * self.ghost_ratio)
        if ghost <= 0:
            self.ghost = None
        elif self.ghost is None:
            self.ghost = FifoQueue(ghost)
        else:
            self.ghost.capacity = ghost

    # -- hooks called by the cache ---------------------------------------------------------
    def on_admit(self, row: RowStats) -> None:
        if self.ghost is not None and self.ghost.remove(row.key):
            self._ghost_hits.add(row.key)

    def on_insert(self, row: RowStats) -> None:
        key, size = row.key, row.size_bytes
        if key in self._freq:
            return
        small_cap = self.small.capacity
        if key in self._ghost_hits:
            self._ghost_hits.discard(key)
            self.main.push(key, size)
        elif small_cap is not None and size >= small_cap:
            self.main.push(key, size)
        elif not self.has_evicted and small_cap is not None and self.small.bytes >= small_cap:
            self.main.push(key, size)
        else:
            self.small.push(key, size)
        self._freq[key] = 0
        self._ranks = None

    def on_hit(self, row: RowStats) -> None:
        if row.key in self._freq:
            self._freq[row.key] += 1

    def on_remove(self, row: RowStats) -> None:
        key = row.key
        self._ghost_hits.discard(key)
        if self._freq.pop(key, None) is not None:
            self.small.remove(key) or self.main.remove(key)
            self._ranks = None

    def on_evict(self, row: RowStats) -> None:
        self.on_remove(row)

    # -- eviction --------------------------------------------------------------------------
    def victim(self, is_protected: Callable[[str], bool] = _never) -> str | None:
        """Choose, and stop tracking, the next row to evict; None if all are protected."""
        self.has_evicted = True
        self._ranks = None
        while self.small or self.main:
            main_over = self.main_capacity is not None and self.main.bytes > self.main_capacity
            if main_over or not self.small:
                key = self._evict_main(is_protected)
                if key is None:
                    if not self.small:
                        return None
                    key = self._evict_small(is_protected)
            else:
                key = self._evict_small(is_protected)
            if key is not None:
                return key
        return None

    def _evict_main(self, is_protected: Callable[[str], bool]) -> str | None:
        main = self.main
        while main:
            # protected heads go to the tail (with their freq) until an unprotected one
            if main.rotate_while(is_protected, len(main)) >= len(main):
                return None  # a full rotation saw only protected rows
            key = main.head()
            assert key is not None
            freq = self._freq[key]
            if freq >= 1:
                self.main.move_to_tail(key)
                self._freq[key] = min(freq, 3) - 1
            else:
                self.main.remove(key)
                del self._freq[key]
                return key
        return None

    def _evict_small(self, is_protected: Callable[[str], bool]) -> str | None:
        while self.small:
            key, size = self.small.pop_head()
            if is_protected(key) or self._freq[key] >= self.move_to_main_threshold:
                self.main.push(key, size)
                if not is_protected(key):
                    self._freq[key] = 0
                continue
            del self._freq[key]
            if self.ghost is not None:
                self.ghost.admit(key, size)
            return key
        return None

    # -- display ---------------------------------------------------------------------------
    def priority(self, row: RowStats, now: float) -> float:
        """Queue position (small head first, then main): an approximate eviction order,
        since the real choice also depends on the access bits; for display only."""
        if self._ranks is None:
            order = self.small.keys() + self.main.keys()
            self._ranks = {key: i for i, key in enumerate(order)}
        return float(self._ranks.get(row.key, -1))
