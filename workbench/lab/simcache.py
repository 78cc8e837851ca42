"""The lab's whole-row model: rows as independent objects in one tier, each stored in full
and shared with no other row (erllama's storage, and libCacheSim's objects), for replaying
long traces fast. The cache itself keeps whole rows as whole-row chunks, which share
prefixes (`chunksim.py` models that); this model is the baseline sharing is measured against.

Its parts: `Catalog` (row_catalog.py: rows, their `PrefixIndex`, pins and the seq clock),
`Level` (row_level.py: byte accounting, policy hooks, victim choice) and the cache's
eviction policies themselves. The steps for a single tier:

    hit    catalog.touch, level.hit
    put    level.admit, evict until the row fits, catalog.add, level.add
    evict  level.discard(evicted=True), catalog.forget

Ranking. `Level.choose_victims` ranks every row by (protected, priority(row,
now), seq) at each eviction. The simulation picks the same victims in the same order, with
less work when the policy allows it:

    event  LRU, LFU, GDSF, and any policy or function with `time_invariant = True`: a row's
           priority changes only on its own insert or hit, so a lazy heap is kept across
           time (an entry is pushed on each change, stale entries are skipped): O(log rows).
    pure   Frecency and plain functions: the priority depends on `now` but only on the
           row and `now`, so one ranking serves every eviction at the same `now` (a
           request's checkpoint and finish saves): O(rows) once per request.
    full   any other policy (its hooks may change priorities of other rows):
           `Level.choose_victims` at each eviction. S3-FIFO chooses victims itself.
"""

from __future__ import annotations

import heapq

from workbench.cache.policies import GDSF, LFU, LRU, EvictionPolicy, Frecency, FunctionPolicy
from workbench.cache.types import RowStats, SaveReason
from workbench.lab.row_catalog import Catalog, Entry
from workbench.lab.row_level import Level

EVENT_DRIVEN: tuple[type, ...] = (LRU, LFU, GDSF)
PURE: tuple[type, ...] = (Frecency, FunctionPolicy)
INDEX_BLOCK = 2  # virtual tokens per index block (prompts are a few dozen virtual tokens)


def ranking_mode(policy: EvictionPolicy) -> str:
    """'event', 'pure', 'full' or 'victim' (see the module doc)."""
    if getattr(policy, "victim", None) is not None:
        return "victim"
    fn = getattr(policy, "fn", None) if type(policy) is FunctionPolicy else None
    if type(policy) in EVENT_DRIVEN or getattr(policy, "time_invariant", False) or getattr(fn, "time_invariant", False):
        return "event"
    return "pure" if type(policy) in PURE else "full"


class SimCache:
    """One tier of `budget_bytes` under `policy` (an instance; give each SimCache its own)."""

    def __init__(self, policy: EvictionPolicy, budget_bytes: int, *, index_block: int = INDEX_BLOCK) -> None:
        self.catalog = Catalog(index_block)
        self.level = Level(budget_bytes, policy)
        self.policy = policy
        self.mode = ranking_mode(policy)
        self._entries = self.catalog.entries
        self._index = self.catalog.index
        self._rows: dict[str, RowStats] = {}  # key -> stats: what Level.choose_victims ranks
        self._heap: list[tuple[bool, float, int, str]] = []
        self._heap_now: float | None = None   # 'pure': the time the heap was ranked at
        self.saves = 0
        self.duplicates = 0
        self.too_large = 0
        self.evictions = 0
        self.evicted_bytes = 0

    @property
    def used_bytes(self) -> int:
        return self.level.used

    def __len__(self) -> int:
        return len(self._rows)

    def lookup(self, namespace: bytes, raw: bytes) -> RowStats | None:
        """The longest cached row that is a prefix of `raw` (nothing is touched)."""
        match = self._index.longest_prefix(namespace, raw)
        return None if match is None else self._rows[match.key]

    def hit(self, row: RowStats, now: float) -> None:
        """The row was read (a hit)."""
        self.catalog.touch(row, now)
        self.level.hit(row)
        self._changed(row, now)

    def put(self, key: str, namespace: bytes, raw: bytes, n_tokens: int, size: int,
            reason: SaveReason, now: float, *, pinned: bool = False) -> bool:
        """Store a row; False for a duplicate (pinning it if asked) or a row too large."""
        entry = self._entries.get(key)
        if entry is not None:
            self.duplicates += 1
            if pinned and not entry.stats.pinned:
                self._pin(entry, now)
            return False
        if not self.level.fits(size):
            self.too_large += 1
            return False
        row = RowStats(key, size, n_tokens, now, pinned=pinned, reason=reason)
        self.level.admit(row)
        need = self.level.overflow(size)
        if need > 0:
            self._evict(need, now)
        old_pin = self.catalog.pins.get(namespace) if pinned else None
        self.catalog.add(key, namespace, raw, row)
        self.level.add(row, size)
        self._rows[key] = row
        self.saves += 1
        self._changed(row, now)
        if old_pin is not None and old_pin in self._rows:
            self._changed(self._rows[old_pin], now)
        return True

    def pin(self, key: str, now: float) -> bool:
        """Pin a cached row (one pinned row per namespace); False if it is not cached."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        if not entry.stats.pinned:
            self._pin(entry, now)
        return True

    def evict_bytes(self, n: int, now: float) -> int:
        """Free at least `n` bytes (the cache's evict_bytes)."""
        before = self.level.used
        self._evict(n, now)
        return before - self.level.used

    # -- ranking -----------------------------------------------------------------------------
    def _pin(self, entry: Entry, now: float) -> None:
        old = self.catalog.pin(entry)
        self._changed(entry.stats, now)
        if old is not None and old in self._rows:
            self._changed(self._rows[old], now)

    def _changed(self, row: RowStats, now: float) -> None:
        """A row's (protected, priority, seq) may have changed: rank it again."""
        if self.mode == "event" or (self.mode == "pure" and now == self._heap_now):
            heapq.heappush(self._heap, (row.protected, self.policy.priority(row, now), row.seq, row.key))
            if len(self._heap) > 4 * len(self._rows) + 1024:
                self._rank(now)

    def _rank(self, now: float) -> None:
        prio = self.policy.priority
        self._heap = [(r.protected, prio(r, now), r.seq, k) for k, r in self._rows.items()]
        heapq.heapify(self._heap)
        self._heap_now = now

    def _victims(self, need: int) -> list[str]:
        heap, sizes, rows = self._heap, self.level.sizes, self._rows
        out: list[str] = []
        taken: set[str] = set()
        freed = 0
        while heap and freed < need:
            protected, _, seq, key = heapq.heappop(heap)
            size = sizes.get(key)
            if size is None or key in taken:
                continue
            row = rows[key]
            if row.seq != seq or row.protected != protected:
                continue  # stale: the row changed since this entry was pushed
            out.append(key)
            taken.add(key)
            freed += size
        return out

    def _evict(self, need: int, now: float) -> None:
        if self.mode == "event":
            victims = self._victims(need)
        elif self.mode == "pure":
            if now != self._heap_now:
                self._rank(now)
            victims = self._victims(need)
        else:
            victims = self.level.choose_victims(need, self._rows, now)
        for key in victims:
            row = self._rows.pop(key)
            self.evicted_bytes += self.level.discard(row, evicted=True)
            self.evictions += 1
            self.catalog.forget(key)
