"""The whole-row model's tier (simcache.py): its eviction policy and which rows it holds.

A `Level` keeps the byte accounting the budget is enforced against (`used` for committed
rows, `reserved` for writes in flight) and chooses victims. It is not thread-safe: the
replay runs in one thread.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from workbench.cache.policies import EvictionPolicy, bind_hooks
from workbench.cache.tiers import Tier, effective_limit
from workbench.cache.types import RowStats


def _never(key: str) -> bool:
    return False


class Level:
    """A tier bound to a policy, with the set of rows it holds and their stored sizes."""

    def __init__(self, tier: Tier, policy: EvictionPolicy) -> None:
        self.tier = tier
        self.policy = policy
        self.sizes: dict[str, int] = {}
        self.used = 0
        self.reserved = 0
        self.full_at: int | None = None   # bytes it held when its file system was full
        (self._admit, self._insert, self._hit, self._evict, self._remove,
         self._victim) = bind_hooks(policy, tier.budget_bytes)

    @property
    def name(self) -> str:
        return self.tier.name

    @property
    def budget(self) -> int | None:
        return self.tier.budget_bytes

    @property
    def limit(self) -> int | None:
        """The bytes it may hold (tiers.effective_limit)."""
        return effective_limit(self.budget, self.full_at)

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
        return self.used + self.reserved + extra - limit

    def file_system_full(self, unwritten: int) -> None:
        """A write here failed with ENOSPC while `unwritten` of the reserved bytes were not
        on disk: what the tier holds besides them is what fits, its limit from now on (it
        is never raised again in this process)."""
        fit = max(0, self.used + self.reserved - unwritten)
        self.full_at = fit if self.full_at is None else min(self.full_at, fit)

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

    def describe(self) -> dict[str, Any]:
        return {
            **self.tier.describe(),
            "policy": self.policy.name,
            "rows": len(self.sizes),
            "used_bytes": self.used,
            "reserved_bytes": self.reserved,
            "full_at_bytes": self.full_at,
        }
