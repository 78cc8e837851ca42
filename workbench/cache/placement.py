"""The ordered tiers and the moving of rows between them: store, promote, demote, drop.

Every row that enters a tier is a `Job` (a put, a promotion or a demotion). Placing one
takes three steps so payload I/O never runs under the cache lock:

  1. under the lock: pick the first tier from `job.start` that can hold the row, make room
     there (the evicted rows become demotion jobs, or are dropped from the last tier) and
     reserve the bytes;
  2. unlocked: read the payload from its source and write it into the tier (a full file
     system, ENOSPC, lowers the tier's limit, evicts there and writes once more: `_write`);
  3. under the lock: release the reservation and commit the row to the tier's accounting.

Demotion jobs are then placed the same way, so a cascade down the tiers is a queue of jobs,
never recursion. A row being promoted or demoted is counted in `moving` so it is not
forgotten while it is briefly held by no tier.
"""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from workbench.cache.catalog import Catalog
from workbench.cache.counters import Counters
from workbench.cache.format import CorruptRow, RowMeta
from workbench.cache.levels import Level
from workbench.cache.tiers import Detached
from workbench.cache.types import RowStats


@dataclass(slots=True)
class Job:
    """A row on its way into a tier."""

    meta: RowMeta
    stats: RowStats
    source: Detached
    start: int   # index of the first tier to try
    new: bool    # a put (the row is not in the catalog yet)


class TierStack:
    """Levels ordered fastest first, and the placement of rows among them."""

    def __init__(self, catalog: Catalog, counters: Counters, lock: threading.RLock,
                 clock: Callable[[], float]) -> None:
        self.levels: list[Level] = []
        self.moving: dict[str, int] = {}
        self._catalog = catalog
        self._counters = counters
        self._lock = lock
        self._clock = clock

    # -- queries (lock held) ---------------------------------------------------------------
    def level(self, name: str) -> Level:
        for level in self.levels:
            if level.name == name:
                return level
        raise ValueError(f"no tier named {name!r}; tiers: {[lvl.name for lvl in self.levels]}")

    def top_index(self, key: str) -> int | None:
        for i, level in enumerate(self.levels):
            if key in level:
                return i
        return None

    def top_name(self, key: str) -> str | None:
        i = self.top_index(key)
        return None if i is None else self.levels[i].name

    def holding(self, key: str) -> list[Level]:
        return [level for level in self.levels if key in level]

    # -- bookkeeping (lock held) -----------------------------------------------------------
    def update_tier(self, key: str) -> None:
        entry = self._catalog.get(key)
        if entry is not None:
            entry.stats.tier = self.top_name(key)

    def start_move(self, key: str) -> None:
        self.moving[key] = self.moving.get(key, 0) + 1

    def forget_if_homeless(self, key: str) -> bool:
        """Forget a row no tier holds, unless it is on its way into one."""
        if key in self._catalog and key not in self.moving and self.top_index(key) is None:
            self._catalog.forget(key)
            return True
        return False

    def drop_copy(self, level: Level, key: str, error: CorruptRow | None) -> None:
        """A copy vanished or failed to verify: forget it (deleting a corrupt file)."""
        entry = self._catalog.get(key)
        if entry is not None:
            level.discard(entry.stats, evicted=False)
        if error is not None:
            level.tier.delete(key)
            self._counters.inc(f"rejected_{error.reason.value}")
            self._counters.inc("rejected_total")
        self.update_tier(key)
        self.forget_if_homeless(key)

    def evict_from(self, level: Level, need: int) -> list[Job]:
        """Evict rows from `level` until `need` bytes are freed; return the demotion jobs."""
        entries = self._catalog.entries
        victims = level.choose_victims(need, {k: entries[k].stats for k in level.sizes}, self._clock())
        below_start = self.levels.index(level) + 1
        below = self.levels[below_start:]
        jobs: list[Job] = []
        for key in victims:
            entry = entries[key]
            level.discard(entry.stats, evicted=True)
            self._counters.inc(f"evictions_{level.name}")
            if any(key in lower for lower in below):
                level.tier.delete(key)  # a lower copy exists: just drop this one
            else:
                detached = level.tier.detach(key, entry.fingerprint)
                if detached is not None and below:
                    jobs.append(Job(self._catalog.meta(key), entry.stats, detached, below_start, new=False))
                    self.start_move(key)
                    self._counters.inc(f"demotions_{level.name}")
                elif detached is not None:
                    detached.release()
            self.update_tier(key)
            if self.forget_if_homeless(key):
                self._counters.inc("drops")
        return jobs

    # -- placement (called WITHOUT the lock) -----------------------------------------------
    def place(self, job: Job) -> bool:
        """Store `job`, then the demotions it causes; True if `job` itself was stored."""
        jobs: deque[Job] = deque()
        stored = self._place_one(job, jobs)
        self.run(jobs)
        return stored

    def run(self, jobs: deque[Job] | list[Job]) -> None:
        queue = deque(jobs)
        while queue:
            self._place_one(queue.popleft(), queue)

    def _place_one(self, job: Job, jobs: deque[Job]) -> bool:
        key = job.meta.key
        with self._lock:
            plan = self._reserve(job, jobs)
            if plan is None or plan is True:
                self._settle(job)
                job.source.release()
            if plan is None:
                if job.new:
                    self._counters.inc("saves_too_large")
                elif self.forget_if_homeless(key):
                    self._counters.inc("drops")
                return False
            if plan is True:
                return True
            level, size = plan
        try:
            start = time.perf_counter_ns()
            stored = self._write(level, job.meta, job.source.read(), size)
            self._counters.inc("store_ns", time.perf_counter_ns() - start)
        except (OSError, CorruptRow) as exc:
            with self._lock:
                level.reserved -= size
                self._settle(job)
                if isinstance(exc, CorruptRow):
                    self._counters.inc(f"rejected_{exc.reason.value}")
                    self._counters.inc("rejected_total")
                else:
                    self._counters.inc("saves_failed")
                self.forget_if_homeless(key)
            return False
        finally:
            job.source.release()
        with self._lock:
            level.reserved -= size
            self._settle(job)
            return self._commit(job, level, stored)

    def _write(self, level: Level, meta: RowMeta, payload: bytes, size: int) -> int:
        """Write a row into `level` (lock NOT held). When its file system is full (ENOSPC: a
        disk smaller than the tier's budget), the tier's limit is lowered to what it holds
        (`Level.file_system_full`, so later puts evict before they write), rows are evicted
        from it by its policy until the row fits that limit, and the write is tried once more."""
        try:
            return level.tier.write(meta, payload)
        except OSError as exc:
            with self._lock:
                if exc.errno != errno.ENOSPC or level not in self.levels:  # not full, or removed meanwhile
                    raise
                self._counters.inc(f"full_{level.name}")
                level.file_system_full(size)
                jobs = self.evict_from(level, level.overflow())
        self.run(jobs)  # a demotion frees the full tier's bytes once its row is written below
        return level.tier.write(meta, payload)

    def _settle(self, job: Job) -> None:
        """A promotion or demotion is over, stored or not."""
        if job.new:
            return
        key = job.meta.key
        left = self.moving.get(key, 0) - 1
        if left > 0:
            self.moving[key] = left
        else:
            self.moving.pop(key, None)

    def _reserve(self, job: Job, jobs: deque[Job]) -> tuple[Level, int] | Literal[True] | None:
        """Reserve space in the first tier from `job.start` that can take the row, evicting as
        needed. True: a tier on the way already holds it; None: no tier can take it."""
        if not job.new and job.meta.key not in self._catalog:
            return None  # removed while in flight
        for level in self.levels[job.start:]:
            if job.meta.key in level:
                return True
            size = level.tier.stored_size(job.stats.n_tokens, job.stats.size_bytes)
            if not level.fits(size) or level.overflow(size) > level.used:
                continue  # too large, or writes in flight leave no room
            level.admit(job.stats)
            jobs.extend(self.evict_from(level, level.overflow(size)))
            level.reserved += size
            return level, size
        return None

    def _commit(self, job: Job, level: Level, stored: int) -> bool:
        key = job.meta.key
        if level not in self.levels:
            level.tier.delete(key)  # the tier was removed meanwhile
            return False
        entry = self._catalog.get(key)
        if entry is None and not job.new:
            level.tier.delete(key)  # the row was removed meanwhile
            return False
        if entry is None:
            entry = self._catalog.add(job.meta, job.stats)
        if key not in level:
            level.add(entry.stats, stored)
        self.update_tier(key)
        return True
