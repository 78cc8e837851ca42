"""Thread-safe named integer counters, snapshotted as a plain dict.

Names used by the cache (all ints; times are nanosecond totals):
    hits_exact, hits_partial, misses_cold       lookup() outcomes
    get_hits, get_misses, promotions            get() outcomes
    saves_<reason>, saves_duplicate, saves_dropped, saves_too_large, saves_failed,
    saves_chunks_gone                           put() outcomes
    evictions_<tier>, demotions_<tier>, drops   chunks leaving a tier / the cache
    rejected_<reason>, rejected_total, orphans_removed   corrupt files and tmp orphans
    lookup_ns, load_ns, pack_ns, unpack_ns      time totals (pack/unpack are recorded by
                                                the engine)
    queued_wait_ns                              time lookups waited for a queued save

``counters()`` of a cache adds gauges (levels now, not totals): bytes_<tier>, rows_<tier>,
rows and chunks; `is_gauge` says which names those are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


GAUGES = ("rows", "chunks")
GAUGE_PREFIXES = ("bytes_", "rows_")


def is_gauge(name: str) -> bool:
    """Whether a cache counters() name is a gauge (a level now), not a running total."""
    return name in GAUGES or name.startswith(GAUGE_PREFIXES)


class Counters:
    """A dict of ints behind a lock; missing names read as 0."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n

    def get(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """A copy, sorted by name."""
        with self._lock:
            return dict(sorted(self._values.items()))

    def reset(self) -> None:
        with self._lock:
            self._values.clear()

    @contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """Add the elapsed nanoseconds of the block to `name`."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self.inc(name, time.perf_counter_ns() - start)
