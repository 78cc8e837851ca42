"""The whole-row model's tier (simcache.py): its eviction policy and which rows it holds.

A `Level` keeps the byte accounting its budget is enforced against (`used`) and chooses
victims. It is not thread-safe: the replay runs in one thread.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from workbench.cache.policies import EvictionPolicy, bind_hooks
from workbench.cache.types import RowStats


def _never(key: str) -> bool:
    return False


class Level:
    """A budget of bytes (None: unbounded) bound to a policy, with the rows it holds and
    their sizes."""

    def __init__(self, budget: int | None, policy: EvictionPolicy) -> None:
        self.limit = budget
        self.policy = policy
        self.sizes: dict[str, int] = {}
        self.used = 0
        (self._admit, self._insert, self._hit, self._evict, self._remove,
         self._victim) = bind_hooks(policy, budget)

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    def fits(self, size: int) -> bool:
        """Could a row of `size` bytes ever live here (ignoring what is stored now)?"""
        return self.limit is None or size <= self.limit

    def overflow(self, extra: int = 0) -> int:
        """Bytes to free so that `extra` more fit (<= 0: nothing to free)."""
        limit = self.limit
        if limit is None:
            return 0
        return self.used + extra - limit

    def admit(self, row: RowStats) -> None:
        self._admit(row)

    def add(self, row: RowStats, size: int) -> None:
        self.sizes[row.key] = size
        self.used += size
        self._insert(row)

    def hit(self, row: RowStats) -> None:
        self._hit(row)

    def discard(self, row: RowStats, *, evicted: bool) -> int:
        """Stop holding a row; return the bytes it used (0 if it was not here)."""
        size = self.sizes.pop(row.key, None)
        if size is None:
            return 0
        self.used -= size
        if evicted:
            self._evict(row)
        self._remove(row)
        return size

    def score(self, row: RowStats, now: float) -> float:
        return self.policy.priority(row, now)

    def choose_victims(self, need: int, rows: Mapping[str, RowStats], now: float) -> list[str]:
        """Rows to evict, in order, until at least `need` bytes are freed (or none are left).

        Protected rows come last. With a `victim()` policy the policy is asked first with
        protection on, then, only if that yields nothing, with protection off.
        """
        if need <= 0 or not self.sizes:
            return []
        if self._victim is not None:
            return self._victims_from_policy(need, rows)
        heap = [
            (rows[k].protected, self.policy.priority(rows[k], now), rows[k].seq, k)
            for k in self.sizes
        ]
        heapq.heapify(heap)
        out: list[str] = []
        freed = 0
        while heap and freed < need:
            key = heapq.heappop(heap)[3]
            out.append(key)
            freed += self.sizes[key]
        return out

    def _victims_from_policy(self, need: int, rows: Mapping[str, RowStats]) -> list[str]:
        assert self._victim is not None

        def is_protected(key: str) -> bool:
            row = rows.get(key)
            return row is not None and row.protected

        out: list[str] = []
        taken: set[str] = set()
        freed = 0
        for _ in range(4 * len(self.sizes) + 4):  # bound: a buggy policy cannot spin us
            if freed >= need:
                break
            key = self._victim(is_protected) or self._victim(_never)
            if key is None:
                break
            if key in self.sizes and key not in taken:
                taken.add(key)
                out.append(key)
                freed += self.sizes[key]
        return out
