"""The real chunked cache behind the calls `reference.reference_replay` makes: the reference
the eviction lab's chunk model (`workbench/lab/chunksim.py`) must agree with exactly.

`StoreCache` is `chunked.ChunkedCache` (the engine's chunk storage: one pin per namespace,
hit kinds, reads) over a `chunk_store.ChunkStore` with its chunks in files in a directory
(or in memory), its own lookup (rows, and chains of full chunks extended to the last
agreeing token), eviction and byte accounting, fed zero payloads of `bytes_per_token`
bytes a token. It records the store's used bytes and evictions before each lookup, so a
replay can be compared request by request."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from workbench.cache.chunk_store import ChunkStore
from workbench.cache.chunked import ChunkedCache, ChunkHit
from workbench.cache.keys import CacheNamespace
from workbench.cache.policies import PolicySpec
from workbench.cache.types import Match


class StoreCache:
    """lookup / get / put / pin / `in`, as reference_replay calls them on its WholeRows."""

    def __init__(self, root: str | None, size_bytes: int, policy: PolicySpec, clock: Callable[[], float],
                 bytes_per_token: int, chunk_size: int,
                 marks: Callable[[list[int]], tuple[int, ...]] = lambda tokens: ()) -> None:
        self.store = ChunkStore(root, size_bytes, chunk_size=chunk_size, policy=policy, clock=clock)
        self.cache = ChunkedCache(self.store)
        self.bpt = bytes_per_token
        self.marks = marks                      # where the shared prefixes a row holds end
        self.trail: list[tuple[int, int]] = []   # (used bytes, evictions) before each lookup
        self._hit: ChunkHit | None = None

    def state(self) -> tuple[int, int]:
        return self.store.used, self.store.counters.get("evictions_chunks")

    def __contains__(self, key: str) -> bool:
        return key in self.cache

    def lookup(self, ns: CacheNamespace, prompt: list[int]) -> Match | None:
        self.trail.append(self.state())
        self._hit = self.cache.lookup(ns, prompt)
        return None if self._hit is None else Match(self._hit.key or "chain", self._hit.n_tokens)

    def get(self, key: str) -> Any:
        assert self._hit is not None
        return self.cache.read(self._hit)

    def put(self, ns: CacheNamespace, tokens: list[int], payload: bytes, why: str) -> None:
        plan = self.cache.plan(ns, tokens, self.marks(tokens))
        starts = [0, *plan.ends[:-1]]
        pieces = [bytes((end - start) * self.bpt) for start, end in zip(starts, plan.ends)][plan.first:]
        self.cache.put(ns, tokens, pieces, why, ends=plan.ends)

    def pin(self, key: str) -> None:
        self.cache.pin(key)


def store_cache(root: str | None, bytes_per_token: int, chunk_size: int,
                made: list[StoreCache] | None = None,
                marks: Callable[[list[int]], tuple[int, ...]] = lambda tokens: ()) -> Callable[..., Any]:
    """A cache_factory for reference_replay: a fresh store per call, in a new directory
    under ``root`` (or in memory: None); each one made is appended to ``made``. ``marks``:
    token ids -> where the shared prefixes they hold end (the engine's chunk boundaries)."""

    def make(size: int, policy: PolicySpec, clock: Callable[[], float]) -> StoreCache:
        cache = StoreCache(None if root is None else tempfile.mkdtemp(dir=root), size, policy, clock,
                           bytes_per_token, chunk_size, marks)
        if made is not None:
            made.append(cache)
        return cache

    return make
