"""The RAM copies of KV chunks above a chunk store's directory, promoted and demoted one
chunk at a time.

Inclusive, as the row tiers are (docs/cache.md, "Tiers, budgets, promotion"): a chunk read
from the directory is copied here, and the file stays; when RAM is over its budget the copies
with the lowest policy score go (the chunk's own `RowStats`: hits and last use per chunk),
which only drops the copy, since the directory holds every chunk. A chain may therefore be
served partly from RAM and partly from files. Payloads here were verified when they were
written or read, and are never handed out twice from different sources.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.cache.chunk_catalog import ChunkInfo
from workbench.cache.counters import Counters


class RamChunks:
    """Payload copies of chunks, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int, score: Callable[[ChunkInfo], float], counters: Counters) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the RAM budget must be >= 0, got {budget_bytes}")
        self.budget = budget_bytes
        self.score = score
        self.counters = counters
        self.payloads: dict[bytes, bytes] = {}
        self.used = 0

    def __contains__(self, key: object) -> bool:
        return key in self.payloads

    def get(self, key: bytes) -> bytes | None:
        return self.payloads.get(key)

    def promote(self, info: ChunkInfo, payload: bytes, infos: dict[bytes, ChunkInfo],
                keep: frozenset[bytes] = frozenset()) -> bool:
        """Copy a chunk here, demoting lower-scored copies (not those in ``keep``: the chain
        being read) to make room; False when it cannot fit."""
        if info.key in self.payloads:
            return True
        if len(payload) > self.budget:
            return False
        over = self.used + len(payload) - self.budget
        if over > 0:
            held = sorted((infos[k] for k in self.payloads if k not in keep),
                          key=lambda c: (self.score(c), c.stats.seq))
            for c in held:
                if over <= 0:
                    break
                over -= len(self.payloads[c.key])
                self.discard(c.key)
                self.counters.inc("demotions_ram")
        if over > 0:
            return False
        self.payloads[info.key] = payload
        self.used += len(payload)
        self.counters.inc("promotions")
        return True

    def discard(self, key: bytes) -> None:
        payload = self.payloads.pop(key, None)
        if payload is not None:
            self.used -= len(payload)

    def shed(self, n: int, infos: dict[bytes, ChunkInfo]) -> int:
        """Drop copies, lowest score first, until ``n`` bytes are freed (the files stay);
        returns the bytes freed."""
        freed = 0
        for c in sorted((infos[k] for k in self.payloads), key=lambda c: (self.score(c), c.stats.seq)):
            if freed >= n:
                break
            freed += len(self.payloads[c.key])
            self.discard(c.key)
            self.counters.inc("demotions_ram")
        return freed
