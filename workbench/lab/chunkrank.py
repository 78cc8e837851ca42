"""Which chunk the lab's chunk model evicts next: the rule of a one-tier chunk store
(`chunk_tiers.ChunkTier.victim` over the leaves `chunk_tier_moves.TierMoves.evictable`
allows), computed with less work where the policy allows it.

The store ranks every evictable chunk (a leaf: no stored chunk continues it; not held by
the put making room) by (protected, priority(chunk, now), seq, key) at each eviction, or
asks a policy that chooses itself (s3fifo) with `victim(blocked_or_protected)`, then
`victim(blocked)`. The modes (`simcache.ranking_mode`):

    event   LRU, LFU, GDSF, time-invariant functions: a chunk's rank changes only on its own
            insert, hit or protection, so a lazy heap is kept across time: an entry is
            pushed on each change and when a chunk becomes a leaf; stale ones are skipped
    pure    Frecency, plain functions: one ranking of the leaves per `now` (a request's
            evictions share it), then the same lazy heap
    full    any other policy: the minimum over all leaves at each eviction
    victim  the policy's own choice, asked as the store asks it
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from typing import Protocol

from workbench.cache.policies import EvictionPolicy
from workbench.cache.types import RowStats


class Ranked(Protocol):
    stats: RowStats


class LeafRanking:
    """The next victim among `chunks` (hex key -> chunk) for which `leaf(key)` holds."""

    def __init__(self, policy: EvictionPolicy, mode: str, chunks: dict[str, Ranked],
                 leaf: Callable[[str], bool]) -> None:
        self.policy = policy
        self.mode = mode
        self.chunks = chunks
        self.leaf = leaf
        self._heap: list[tuple[bool, float, int, str]] = []
        self._heap_now: float | None = None
        self._victim: Callable[[Callable[[str], bool]], str | None] | None = getattr(policy, "victim", None)

    def changed(self, key: str, now: float) -> None:
        """A chunk's (protected, priority, seq) or leafness may have changed: rank it again."""
        if self.mode == "event" or (self.mode == "pure" and now == self._heap_now):
            if self.leaf(key):
                s = self.chunks[key].stats
                heapq.heappush(self._heap, (s.protected, self.policy.priority(s, now), s.seq, key))
                if len(self._heap) > 4 * len(self.chunks) + 1024:
                    self._rank(now)

    def next(self, keep: Collection[str], now: float) -> str | None:
        """The chunk to evict now, never one of `keep`; None when no leaf may go."""
        if self.mode == "victim":
            return self._policy_choice(keep)
        if self.mode == "full":
            return self._minimum(keep, now)
        if self.mode == "pure" and now != self._heap_now:
            self._rank(now)
        return self._pop(keep)

    def _valid(self, entry: tuple[bool, float, int, str]) -> bool:
        protected, _, seq, key = entry
        chunk = self.chunks.get(key)
        return (chunk is not None and chunk.stats.seq == seq and chunk.stats.protected == protected
                and self.leaf(key))

    def _pop(self, keep: Collection[str]) -> str | None:
        heap = self._heap
        kept = []
        found = None
        while heap:
            entry = heapq.heappop(heap)
            if not self._valid(entry):
                continue
            if entry[3] in keep:
                kept.append(entry)
                continue
            found = entry[3]
            break
        for entry in kept:
            heapq.heappush(heap, entry)
        return found

    def _rank(self, now: float) -> None:
        prio = self.policy.priority
        self._heap = [(c.stats.protected, prio(c.stats, now), c.stats.seq, k)
                      for k, c in self.chunks.items() if self.leaf(k)]
        heapq.heapify(self._heap)
        self._heap_now = now

    def _minimum(self, keep: Collection[str], now: float) -> str | None:
        prio = self.policy.priority
        best = min(((c.stats.protected, prio(c.stats, now), c.stats.seq, k)
                    for k, c in self.chunks.items() if k not in keep and self.leaf(k)), default=None)
        return None if best is None else best[3]

    def _policy_choice(self, keep: Collection[str]) -> str | None:
        assert self._victim is not None
        chunks = self.chunks

        def blocked(key: str) -> bool:
            return key not in chunks or key in keep or not self.leaf(key)

        def blocked_or_protected(key: str) -> bool:
            return blocked(key) or chunks[key].stats.protected

        picked = self._victim(blocked_or_protected) or self._victim(blocked)
        return picked if picked is not None and not blocked(picked) else None
