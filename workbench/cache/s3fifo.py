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

The algorithm is coded once, in csrc/eviction.h (`workbench._native.evict.S3Fifo`), and used
by this class (the cache's policy, over interned keys) and by the eviction lab's native
replay alike.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench._native import evict as _evict
from workbench.cache.types import RowStats


def _never(key: str) -> bool:
    return False


class _Queue:
    """A read-only view of one of S3-FIFO's queues (keys from head to tail)."""

    def __init__(self, keys: list[str]) -> None:
        self._keys = keys

    def keys(self) -> list[str]:
        return list(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)


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
        if isinstance(move_to_main_threshold, bool) or not isinstance(move_to_main_threshold, int) \
                or move_to_main_threshold < 1:
            raise ValueError(f"move_to_main_threshold must be an int >= 1, got {move_to_main_threshold!r}")
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.move_to_main_threshold = move_to_main_threshold
        self._core = _evict.S3Fifo(small_ratio, ghost_ratio, move_to_main_threshold)
        self._ids: dict[str, int] = {}       # key -> the core's small integer
        self._keys: list[str | None] = []    # and back
        self._free: list[int] = []
        self._sweep_at = 1024
        self._ranks: dict[str, int] | None = None
        self.set_capacity(capacity_bytes)

    def set_capacity(self, capacity_bytes: int | None) -> None:
        """Size the queues for a tier budget (the cache calls this when binding a tier)."""
        self._core.set_capacity(-1 if capacity_bytes is None else max(0, int(capacity_bytes)))

    @property
    def small(self) -> _Queue:
        return _Queue([self._key(i) for i in self._core.small_keys()])

    @property
    def main(self) -> _Queue:
        return _Queue([self._key(i) for i in self._core.main_keys()])

    @property
    def main_capacity(self) -> int | None:
        cap = self._core.main_capacity
        return None if cap < 0 else int(cap)

    @property
    def has_evicted(self) -> bool:
        return bool(self._core.has_evicted)

    # -- hooks called by the cache ---------------------------------------------------------
    def on_admit(self, row: RowStats) -> None:
        i = self._ids.get(row.key)   # a key never interned is in no queue and not in the ghost
        if i is not None:
            self._core.on_admit(i)

    def on_insert(self, row: RowStats) -> None:
        self._core.on_insert(self._intern(row.key), row.size_bytes)
        self._ranks = None

    def on_hit(self, row: RowStats) -> None:
        i = self._ids.get(row.key)
        if i is not None:
            self._core.on_hit(i)

    def on_remove(self, row: RowStats) -> None:
        i = self._ids.get(row.key)
        if i is not None:
            self._core.on_remove(i)
            self._ranks = None

    def on_evict(self, row: RowStats) -> None:
        self.on_remove(row)

    # -- eviction --------------------------------------------------------------------------
    def victim(self, is_protected: Callable[[str], bool] = _never) -> str | None:
        """Choose, and stop tracking, the next row to evict; None if all are protected."""
        self._ranks = None
        keys = self._keys
        picked = self._core.victim(lambda i: is_protected(keys[i]))  # type: ignore[arg-type]
        return None if picked < 0 else self._key(picked)

    def native_spec(self) -> tuple[str, dict[str, float]] | None:
        """The eviction lab's native replay of a fresh S3FIFO (policies.NativeSpec)."""
        if type(self) is not S3FIFO or not self._core.empty or self._core.has_evicted or self._ids:
            return None
        return ("s3fifo", {"small_ratio": float(self.small_ratio), "ghost_ratio": float(self.ghost_ratio),
                           "move_to_main_threshold": self.move_to_main_threshold})

    # -- display ---------------------------------------------------------------------------
    def priority(self, row: RowStats, now: float) -> float:
        """Queue position (small head first, then main): an approximate eviction order,
        since the real choice also depends on the access bits; for display only."""
        if self._ranks is None:
            order = self.small.keys() + self.main.keys()
            self._ranks = {key: i for i, key in enumerate(order)}
        return float(self._ranks.get(row.key, -1))

    # -- keys ------------------------------------------------------------------------------
    def _key(self, i: int) -> str:
        key = self._keys[i]
        assert key is not None
        return key

    def _intern(self, key: str) -> int:
        i = self._ids.get(key)
        if i is not None:
            return i
        if len(self._ids) >= self._sweep_at:
            self._sweep()
        i = self._free.pop() if self._free else len(self._keys)
        if i == len(self._keys):
            self._keys.append(key)
        else:
            self._keys[i] = key
        self._ids[key] = i
        return i

    def _sweep(self) -> None:
        """Forget keys the core no longer holds (evicted and out of the ghost): bounded memory."""
        for key, i in list(self._ids.items()):
            if not self._core.alive(i):
                del self._ids[key]
                self._keys[i] = None
                self._free.append(i)
        self._sweep_at = max(1024, 2 * len(self._ids))
