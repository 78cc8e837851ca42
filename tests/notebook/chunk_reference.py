"""A slow, obvious chunk cache over real token ids: the reference the lab's chunk model
(`ChunkTree` built incrementally, `ChunkSimCache` with lazy heaps and refcounts) must agree
with. Written from the rules in chunksim.py's docstring, sharing nothing with it but the
chunk key (`keys.chunk_keys`), the policies and `RowStats`: every row keeps its full chain,
leaves and references are recounted from scratch at each eviction, the victim is the
minimum over all leaves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.cache.keys import CacheNamespace, chunk_keys, row_key
from workbench.cache.policies import PolicySpec, get_policy
from workbench.cache.types import Match, RowStats


@dataclass
class _Row:
    tokens: tuple[int, ...]
    chain: list[str]
    stats: RowStats


class ChunkReference:
    """lookup / get / put / pin / `in`, as reference_replay calls them on a TieredCache."""

    def __init__(self, size_bytes: int, policy: PolicySpec, clock: Callable[[], float], chunk_size: int = 256):
        self.budget = size_bytes
        self.policy = get_policy(policy)
        if hasattr(self.policy, "set_capacity"):
            self.policy.set_capacity(size_bytes)
        self.clock = clock
        self.chunk_size = chunk_size
        self.rows: dict[str, _Row] = {}
        self.chunks: dict[str, RowStats] = {}
        self.parent: dict[str, str | None] = {}
        self.pinned: str | None = None
        self.seq = 0
        self.evicted_bytes = 0

    def _tick(self) -> int:
        self.seq += 1
        return self.seq

    def _hook(self, name: str, stats: RowStats) -> None:
        fn = getattr(self.policy, name, None)
        if fn is not None:
            fn(stats)

    # -- what reference_replay calls -------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def lookup(self, ns: CacheNamespace, prompt: list[int]) -> Match | None:
        best = max((r for r in self.rows.values() if tuple(prompt[:len(r.tokens)]) == r.tokens),
                   key=lambda r: len(r.tokens), default=None)
        return None if best is None else Match(best.stats.key, len(best.tokens))

    def get(self, key: str) -> bytes | None:
        row = self.rows[key]
        now = self.clock()
        for stats in [row.stats, *(self.chunks[k] for k in row.chain)]:
            stats.hits += 1
            stats.last_hit_at = now
            stats.seq = self._tick()
            if stats is not row.stats:
                self._hook("on_hit", stats)
        return b""

    def put(self, ns: CacheNamespace, tokens: list[int], payload: bytes, why: str) -> None:
        key = row_key(ns.digest(), tokens)
        if key in self.rows:
            if why == "agent_prefix":
                self.pin(key)
            return
        bpt = len(payload) // len(tokens)
        chain, parent = [], None
        for digest in chunk_keys(ns.digest(), tokens, self.chunk_size):
            chain.append(digest.hex())
            self.parent[digest.hex()] = parent
            parent = digest.hex()
        new = [k for k in chain if k not in self.chunks]
        sizes = {k: self._tokens(tokens, chain, k) * bpt for k in new}
        if sum(sizes.values()) > self.budget:
            return
        now = self.clock()
        stats = {k: RowStats(k, sizes[k], sizes[k] // bpt, now) for k in new}
        for s in stats.values():
            self._hook("on_admit", s)
        held = set(chain) - set(new)
        while self._used() + sum(sizes.values()) > self.budget:
            if not self._evict_one(held):
                return
        for k in new:
            self.chunks[k] = stats[k]
            stats[k].seq = self._tick()
            self._hook("on_insert", stats[k])
        self.rows[key] = _Row(tuple(tokens), chain, RowStats(key, len(payload), len(tokens), now))
        self.rows[key].stats.seq = self._tick()
        if why == "agent_prefix":
            self.pin(key)

    def pin(self, key: str) -> None:
        self.pinned = key

    # -- the rules, recomputed each time ----------------------------------------------------
    def _tokens(self, tokens: list[int], chain: list[str], k: str) -> int:
        i = chain.index(k)
        return min(self.chunk_size, len(tokens) - i * self.chunk_size)

    def _used(self) -> int:
        return sum(s.size_bytes for s in self.chunks.values())

    def _evict_one(self, held: set[str]) -> bool:
        parents = {self.parent[k] for k in self.chunks}
        leaves = [k for k in self.chunks if k not in parents and k not in held]
        if not leaves:
            return False
        pinned = set(self.rows[self.pinned].chain) if self.pinned in self.rows else set()
        victim = getattr(self.policy, "victim", None)
        if victim is not None:
            leaf = victim(lambda k: k not in leaves or k in pinned) or victim(lambda k: k not in leaves)
            if leaf is None:
                return False
        else:
            now = self.clock()
            leaf = min(leaves, key=lambda k: (k in pinned, self.policy.priority(self.chunks[k], now),
                                              self.chunks[k].seq))
        for key in [k for k, r in self.rows.items() if r.chain[-1] == leaf]:
            del self.rows[key]
            if self.pinned == key:
                self.pinned = None
        used = {k for r in self.rows.values() for k in r.chain} | held
        for k in [k for k in self.chunks if k not in used]:
            stats = self.chunks.pop(k)
            self.evicted_bytes += stats.size_bytes
            self._hook("on_evict" if k == leaf else "on_remove", stats)
            if k == leaf:
                self._hook("on_remove", stats)
        return True


def chunk_cache(chunk_size: int = 256) -> Callable[..., Any]:
    """A cache_factory for reference_replay."""
    return lambda size, policy, clock: ChunkReference(size, policy, clock, chunk_size)


class ChunkStoreCache:
    """`chunk_store.ChunkStore` (files in ``root``, or in memory) behind the calls reference_replay makes:
    the real chunked store, its own lookup (rows, and chains of full chunks extended to the
    last agreeing token), reads and eviction, with zero payloads of the right sizes."""

    def __init__(self, root: str | None, size_bytes: int, policy: PolicySpec, clock: Callable[[], float],
                 bytes_per_token: int) -> None:
        from workbench.cache.chunk_store import ChunkStore

        self.store = ChunkStore(root, size_bytes, policy=policy, clock=clock)
        self.bpt = bytes_per_token
        self._match: Any = None

    def __contains__(self, key: str) -> bool:
        return key in self.store.rows

    def lookup(self, ns: CacheNamespace, prompt: list[int]) -> Match | None:
        self._match = self.store.lookup(ns.digest(), prompt)
        return None if self._match is None else Match(self._match.key or "chain", self._match.n_tokens)

    def get(self, key: str) -> bytes:
        self.store.read_chunks(self._match.chunks)
        return b""

    def put(self, ns: CacheNamespace, tokens: list[int], payload: bytes, why: str) -> None:
        from workbench.cache.types import SaveReason

        digest, size = ns.digest(), self.store.chunk_size
        first = self.store.missing(digest, tokens)
        n = len(chunk_keys(digest, tokens, size))
        pieces = [bytes(min(size, len(tokens) - size * i) * self.bpt) for i in range(first, n)]
        self.store.put_row(digest, bytes(32), tokens, pieces, SaveReason.parse(why), pinned=why == "agent_prefix")

    def pin(self, key: str) -> None:
        self.store.pin(key)


def chunk_store_cache(root: str | None, bytes_per_token: int) -> Callable[..., Any]:
    """A cache_factory for reference_replay: a fresh ChunkStore per call, under ``root`` (a
    new directory in it) or in memory (None)."""
    import tempfile

    return lambda size, policy, clock: ChunkStoreCache(None if root is None else tempfile.mkdtemp(dir=root),
                                                       size, policy, clock, bytes_per_token)
