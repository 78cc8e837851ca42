"""One tier of the chunked cache: where its chunks live, its budget, its eviction policy and
which chunks it holds (the chunk counterpart of levels.py's `Level`).

A `ChunkTier` keeps the byte accounting its budget is enforced against (`used`: chunks and
manifests committed here, at their file sizes in every backend, so a tier in memory counts as
one on disk; `reserved`: writes in flight) and calls its policy's hooks for the chunks it
holds: `on_admit` / `on_insert` when a chunk enters, `on_hit` when it serves a read,
`on_evict` (the cache chose it) and `on_remove` (it left for any reason), `set_capacity` with
its budget, and `victim()` for a policy that chooses itself (s3fifo), asked first with
protected chunks blocked, then, when that yields nothing, with them allowed (as
`Level.choose_victims`). Which chunks may go at all is the store's rule (`evictable`): the
tier only ranks them, by (protected, priority, seq). Not thread-safe: the store calls it
under its lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.cache.chunk_backends import ChunkDir, ChunkMemory
from workbench.cache.chunk_catalog import ChunkInfo
from workbench.cache.chunk_format import ChunkMeta
from workbench.cache.policies import EvictionPolicy, bind_hooks, PolicySpec, get_policy
from workbench.cache.types import RowStats


def effective_limit(budget: int | None, full_at: int | None) -> int | None:
    """The bytes a tier may hold: its budget, lowered to ``full_at`` once a write found its
    file system full (a disk smaller than the budget); None = no bound."""
    if full_at is None:
        return budget
    return full_at if budget is None else min(budget, full_at)


class ChunkTier:
    """Chunks in one backend (a private directory or process memory) within ``budget``."""

    def __init__(self, backend: ChunkDir | ChunkMemory, budget: int | None, policy: EvictionPolicy,
                 kind: str | None = None) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"a tier budget must be >= 0 or None, got {budget}")
        self.backend = backend
        self.budget = budget
        self.policy = policy
        self.kind = kind or ("disk" if backend.persistent else "ram")
        self.sizes: dict[bytes, int] = {}
        self.used = 0
        self.reserved = 0
        self.full_at: int | None = None   # bytes it held when its file system was full
        (self._admit, self._insert, self._hit, self._evict, self._remove,
         self._victim) = bind_hooks(policy, budget)

    @classmethod
    def memory(cls, name: str, budget: int | None, policy: PolicySpec) -> ChunkTier:
        return cls(ChunkMemory(name), budget, get_policy(policy), "ram")

    @classmethod
    def directory(cls, root: str | os.PathLike[str], name: str | None, budget: int | None, policy: PolicySpec,
                  kind: str = "disk") -> ChunkTier:
        return cls(ChunkDir(root, name), budget, get_policy(policy), kind)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def persistent(self) -> bool:
        return self.backend.persistent

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    @property
    def limit(self) -> int | None:
        """The bytes it may hold (effective_limit)."""
        return effective_limit(self.budget, self.full_at)

    def fits(self, size: int) -> bool:
        """Could a chunk of ``size`` bytes ever live here (ignoring what is stored now)?"""
        limit = self.limit
        return limit is None or size <= limit

    def overflow(self, extra: int = 0) -> int:
        """Bytes to free so that ``extra`` more fit (<= 0: nothing to free)."""
        limit = self.limit
        return 0 if limit is None else self.used + self.reserved + extra - limit

    def file_system_full(self, unwritten: int) -> None:
        """A write here failed with ENOSPC while ``unwritten`` of the reserved bytes were not
        on disk: what the tier holds besides them is what fits, its limit from now on (never
        raised again in this process; ``remove_tier`` and ``add_tier`` make a new tier)."""
        fit = max(0, self.used + self.reserved - unwritten)
        self.full_at = fit if self.full_at is None else min(self.full_at, fit)

    def admit(self, stats: RowStats) -> None:
        """A chunk is about to enter (before room is made for it, as `Level.admit`)."""
        self._admit(stats)

    def add(self, info: ChunkInfo, size: int) -> None:
        """Hold a chunk (a copy committed here); no-op when held already."""
        if info.key in self.sizes:
            return
        self.sizes[info.key] = size
        self.used += size
        self._insert(info.stats)

    def hit(self, info: ChunkInfo) -> None:
        self._hit(info.stats)

    def discard(self, info: ChunkInfo, *, evicted: bool) -> int:
        """Stop holding a chunk; the bytes it used here (0 when it was not held)."""
        size = self.sizes.pop(info.key, None)
        if size is None:
            return 0
        self.used -= size
        if evicted:
            self._evict(info.stats)
        self._remove(info.stats)
        return size

    def victim(self, chunks: Mapping[bytes, ChunkInfo], evictable: Callable[[ChunkInfo], bool],
               now: float) -> ChunkInfo | None:
        """The chunk to evict next among those held here that ``evictable`` allows: the policy's
        own choice (protected ones blocked first, then allowed), else the lowest
        (protected, priority, seq)."""
        if self._victim is not None:
            def blocked(hex_key: str) -> bool:
                c = chunks.get(bytes.fromhex(hex_key))
                return c is None or c.key not in self.sizes or not evictable(c)

            def blocked_or_protected(hex_key: str) -> bool:
                return blocked(hex_key) or chunks[bytes.fromhex(hex_key)].stats.protected

            picked = self._victim(blocked_or_protected) or self._victim(blocked)
            c = None if picked is None else chunks.get(bytes.fromhex(picked))
            return c if c is not None and c.key in self.sizes and evictable(c) else None
        best: tuple[bool, float, int, bytes] | None = None
        for k in self.sizes:
            c = chunks.get(k)
            if c is None or not evictable(c):
                continue
            rank = (c.stats.protected, self.policy.priority(c.stats, now), c.stats.seq, k)
            if best is None or rank < best:
                best = rank
        return None if best is None else chunks[best[3]]

    def describe(self) -> dict[str, Any]:
        """Name, kind, budget, policy, usage and chunks (rows are the store's to count)."""
        root = self.backend.root if isinstance(self.backend, ChunkDir) else None
        return {"name": self.name, "kind": self.kind, "policy": self.policy.name, "budget_bytes": self.budget,
                "used_bytes": self.used, "reserved_bytes": self.reserved, "full_at_bytes": self.full_at,
                "chunks": len(self.sizes),
                "persistent": self.persistent, "root": None if root is None else str(root)}


@dataclass(slots=True)
class Move:
    """A chunk on its way into tier ``dst``: from tier ``src`` (a demotion or a promotion:
    read there, verified, written here) or with its ``payload`` in hand (a put, a RAM copy)."""

    info: ChunkInfo
    meta: ChunkMeta
    dst: ChunkTier
    size: int
    src: ChunkTier | None = None
    payload: bytes | None = None
    ok: bool = False
