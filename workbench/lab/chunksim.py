"""The chunk model of the KV cache, payload-free: rows are manifests over shared chunks.

A row of n tokens is the chain of chunks `ChunkTree.chain(row)` (keys from
`keys.chunk_keys`, see chunks.py); a chunk is stored once however many rows hold it, and
costs `tokens * bytes_per_token` bytes, as the real chunked cache stores it. The rules:

    lookup   the longest cached row that is a token prefix of the prompt (the cache's own
             `Catalog` / `PrefixIndex` over rows, as in the whole-row model); a row is
             cached only while all of its chunks are
    hit      the row's hit count and last use move, and those of every chunk of its chain
             (each chunk is a unit the policy scores: hits, last use, size, tokens)
    put      only the chunks not yet cached are new; room is made for their bytes; the
             chunks the row shares with the cache are held while room is made
    evict    only a leaf can go: a chunk no cached chunk depends on (children == 0). The
             policy ranks the leaves, (protected, priority, seq) as `Level.choose_victims`;
             the chosen leaf takes with it the row that ends in it, and every chunk that
             no remaining row holds is collected at once (it could serve no lookup). The
             parent left behind may become a leaf, ranked from then on
    protect  the chunks of the pinned row (agent prefix) come after every other leaf

Ranking uses the same three modes as `simcache.SimCache` (event-driven heap, one ranking
per `now`, the cache's full ranking), over leaves only; S3-FIFO chooses itself, told that
non-leaf and held chunks are protected.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from workbench.cache.catalog import Catalog
from workbench.cache.format import RowMeta
from workbench.cache.levels import Level
from workbench.cache.policies import EvictionPolicy
from workbench.cache.types import RowStats, SaveReason
from workbench.lab.chunks import ChunkTree
from workbench.lab.simcache import INDEX_BLOCK, SimTier, ranking_mode

_FINGERPRINT = bytes(32)


@dataclass(slots=True)
class Chunk:
    """One cached chunk: its policy stats (key, bytes, tokens, hits, last use, seq)."""

    stats: RowStats
    parent: str | None
    children: int = 0   # cached chunks whose parent this is
    refs: int = 0       # cached rows whose chain holds it
    pins: int = 0       # pinned rows whose chain holds it
    held: int = 0       # puts in progress that will hold it

    @property
    def evictable(self) -> bool:
        return self.children == 0 and self.held == 0


class ChunkSimCache:
    """One tier of `budget_bytes` under `policy`, storing the rows of `tree` as chunks."""

    def __init__(self, policy: EvictionPolicy, budget_bytes: int, tree: ChunkTree, bytes_per_token: int, *,
                 index_block: int = INDEX_BLOCK) -> None:
        self.catalog = Catalog(index_block)
        self.level = Level(SimTier("sim", budget_bytes), policy)
        self.policy = policy
        self.mode = ranking_mode(policy)
        self.tree = tree
        self.bpt = bytes_per_token
        self.chunks: dict[str, Chunk] = {}
        # chunk -> the rows that end in it: one, unless two virtual-token rows have the
        # same real tokens (possible for rows of a token or two; they share every chunk)
        self._row_at: dict[str, list[str]] = {}
        self._heap: list[tuple[bool, float, int, str]] = []
        self._heap_now: float | None = None
        self.saves = self.duplicates = self.too_large = 0
        self.evictions = self.evicted_bytes = self.collected = 0
        self.chunks_written = self.chunks_reused = 0
        self.logical_bytes = 0   # what the cached rows would take as whole rows

    @property
    def used_bytes(self) -> int:
        return self.level.used

    def __len__(self) -> int:
        return len(self.catalog)

    # -- the cache's operations --------------------------------------------------------------
    def lookup(self, namespace: bytes, raw: bytes) -> RowStats | None:
        """The longest cached row that is a prefix of `raw` (nothing is touched)."""
        match = self.catalog.longest_prefix(namespace, raw)
        return None if match is None else self.catalog.entry(match.key).stats

    def hit(self, row: RowStats, now: float) -> None:
        """The row was read: it and every chunk of its chain were used."""
        self.catalog.touch(row, now)
        for key in self.tree.chain(row.key):
            chunk = self.chunks[key]
            self.catalog.touch(chunk.stats, now)
            self.level.hit(chunk.stats)
            self._changed(key, chunk, now)

    def put(self, key: str, namespace: bytes, raw: bytes, n_tokens: int, size: int,
            reason: SaveReason, now: float, *, pinned: bool = False) -> bool:
        """Store a row (`size` is ignored: its new chunks' bytes count). False for a row
        already cached (pinning it if asked) or one that cannot be stored."""
        if key in self.catalog:
            self.duplicates += 1
            if pinned:
                self.pin(key, now)
            return False
        chain = self.tree.chain(key)
        n_old = sum(1 for k in chain if k in self.chunks)   # cached chunks are a prefix
        new = chain[n_old:]
        sizes = [self.tree.tokens[k] * self.bpt for k in new]
        if not self.level.fits(sum(sizes)):
            self.too_large += 1
            return False
        if not self._make_room(chain[:n_old], new, sizes, reason, now):
            self.too_large += 1
            return False
        for k, nbytes in zip(new, sizes):
            self._add_chunk(k, nbytes, reason, now)
            self.chunks[k].refs += 1   # the shared ones were taken by _make_room
        self.chunks_written += len(new)
        self.chunks_reused += n_old
        stats = RowStats(key, n_tokens * self.bpt, n_tokens, now, reason=reason)
        self.catalog.add(RowMeta(key, namespace, _FINGERPRINT, raw, reason, now, 0, False), stats)
        self._row_at.setdefault(chain[-1], []).append(key)
        self.logical_bytes += stats.size_bytes
        self.saves += 1
        if pinned:
            self.pin(key, now)
        return True

    def pin(self, key: str, now: float) -> bool:
        """Pin a cached row (unpinning the namespace's previous one); False if not cached."""
        entry = self.catalog.get(key)
        if entry is None:
            return False
        if not entry.stats.pinned:
            old = self.catalog.pin(entry)
            if old is not None and old in self.catalog:
                self._pin_chain(old, -1, now)
            self._pin_chain(key, 1, now)
        return True

    def evict_bytes(self, n: int, now: float) -> int:
        """Free at least `n` bytes (leaves first); the bytes freed."""
        before = self.level.used
        self._evict(n, now)
        return before - self.level.used

    def shared_bytes(self) -> int:
        """Bytes of chunks held by more than one row."""
        return sum(c.stats.size_bytes for c in self.chunks.values() if c.refs > 1)

    # -- storing and dropping -----------------------------------------------------------------
    def _make_room(self, old: list[str], new: list[str], sizes: list[int], reason: SaveReason,
                   now: float) -> bool:
        for k, nbytes in zip(new, sizes):
            self.level.admit(RowStats(k, nbytes, self.tree.tokens[k], now, reason=reason))
        for k in old:   # held (not evictable) and referenced (not collected) meanwhile
            self.chunks[k].held += 1
            self.chunks[k].refs += 1
        need = self.level.overflow(sum(sizes))
        if need > 0:
            self._evict(need, now)
        for k in old:
            chunk = self.chunks[k]
            chunk.held -= 1
            if chunk.evictable:
                self._changed(k, chunk, now)
        if self.level.overflow(sum(sizes)) <= 0:
            return True
        self._release(old, None, now)
        return False

    def _add_chunk(self, key: str, nbytes: int, reason: SaveReason, now: float) -> None:
        parent = self.tree.parent[key]
        chunk = self.chunks[key] = Chunk(RowStats(key, nbytes, self.tree.tokens[key], now, reason=reason), parent)
        chunk.stats.seq = self.catalog.next_seq()
        if parent is not None:
            self.chunks[parent].children += 1
        self.level.add(chunk.stats, nbytes)
        self._changed(key, chunk, now)

    def _pin_chain(self, row: str, delta: int, now: float) -> None:
        chain = self.tree.chain(row)
        for k in chain:
            self.chunks[k].pins += delta
        for k in chain:
            chunk = self.chunks[k]
            chunk.stats.pinned = chunk.pins > 0
        tail = self.chunks[chain[-1]]
        if tail.evictable:
            self._changed(chain[-1], tail, now)

    def _drop(self, leaf: str, now: float) -> int:
        """Evict a leaf: drop the rows ending in it, collect the chunks no row holds."""
        freed = 0
        for row in self._row_at.pop(leaf):
            entry = self.catalog.entry(row)
            if entry.stats.pinned:
                self._pin_chain(row, -1, now)
            self.logical_bytes -= entry.stats.size_bytes
            self.catalog.forget(row)
            freed += self._release(self.tree.chain(row), leaf, now)
        self.evictions += 1
        self.evicted_bytes += freed
        return freed

    def _release(self, chain: list[str], leaf: str | None, now: float) -> int:
        """Drop one reference to each chunk of `chain` (a chain prefix); remove those no
        row holds any more (`leaf` as evicted, the others as collected); the bytes freed."""
        freed = 0
        for k in reversed(chain):
            chunk = self.chunks[k]
            chunk.refs -= 1
            if chunk.refs > 0:
                if chunk.evictable:
                    self._changed(k, chunk, now)   # a new leaf
                continue
            del self.chunks[k]
            freed += self.level.discard(chunk.stats, evicted=k == leaf)
            if k != leaf:
                self.collected += 1
            if chunk.parent is not None:
                self.chunks[chunk.parent].children -= 1
        return freed

    # -- ranking -----------------------------------------------------------------------------
    def _changed(self, key: str, chunk: Chunk, now: float) -> None:
        """A chunk's (protected, priority, seq) or leafness may have changed: rank it again."""
        if not chunk.evictable:
            return
        if self.mode == "event" or (self.mode == "pure" and now == self._heap_now):
            s = chunk.stats
            heapq.heappush(self._heap, (s.protected, self.policy.priority(s, now), s.seq, key))
            if len(self._heap) > 4 * len(self.chunks) + 1024:
                self._rank(now)

    def _rank(self, now: float) -> None:
        prio = self.policy.priority
        self._heap = [(c.stats.protected, prio(c.stats, now), c.stats.seq, k)
                      for k, c in self.chunks.items() if c.evictable]
        heapq.heapify(self._heap)
        self._heap_now = now

    def _evict(self, need: int, now: float) -> None:
        if self.mode == "pure" and now != self._heap_now:
            self._rank(now)
        freed = 0
        while freed < need:
            leaf = self._next_victim(now)
            if leaf is None:
                return
            freed += self._drop(leaf, now)

    def _next_victim(self, now: float) -> str | None:
        if self.mode == "victim":
            return self._victim_from_policy()
        if self.mode == "full":
            return self._victim_by_full_ranking(now)
        heap, chunks = self._heap, self.chunks
        while heap:
            protected, _, seq, key = heapq.heappop(heap)
            chunk = chunks.get(key)
            if chunk is None or not chunk.evictable or chunk.stats.seq != seq or chunk.stats.protected != protected:
                continue   # stale: gone, no longer a leaf, or changed since it was pushed
            return key
        return None

    def _victim_by_full_ranking(self, now: float) -> str | None:
        prio = self.policy.priority
        best = min(((c.stats.protected, prio(c.stats, now), c.stats.seq, k)
                    for k, c in self.chunks.items() if c.evictable), default=None)
        return None if best is None else best[3]

    def _victim_from_policy(self) -> str | None:
        victim: Callable[[Callable[[str], bool]], str | None] = getattr(self.policy, "victim")  # noqa: B009
        chunks = self.chunks

        def blocked(key: str) -> bool:
            chunk = chunks.get(key)
            return chunk is None or not chunk.evictable or chunk.pins > 0

        def not_a_leaf(key: str) -> bool:
            chunk = chunks.get(key)
            return chunk is None or not chunk.evictable

        key = victim(blocked) or victim(not_a_leaf)
        return key if key is not None and key in chunks and chunks[key].evictable else None
