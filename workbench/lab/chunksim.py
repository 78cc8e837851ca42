"""The chunk model of the KV cache, payload-free: the rules of the chunked cache the engine
uses (`chunked.ChunkedCache` over a one-tier `chunk_store.ChunkStore`), on the lab's chunk
tree (`chunks.ChunkTree`: keys by `keys.chunk_keys`, token bytes per chunk) and its virtual
row index, so a replay of 10,000 requests takes seconds. tests/unit/test_lab_vs_store.py
replays traces through this and through a real ChunkStore on files and requires the same
hits, bytes and evictions after every request.

    bytes    a chunk costs `chunk_format.chunk_file_size(n, n * bytes_per_token)`, a row's
             manifest `manifest_size(n_tokens, n_chunks)`: the store's file sizes
    lookup   the longer of the longest stored row that is a prefix of the prompt and the
             chain of the prompt's own chunks that is stored (full ones and boundaries where a
             pinned prefix ends: chunks.py), extended into the stored chunk continuing it that
             agrees longest with the prompt (`ChunkCatalog.lookup`); a row wins a tie of
             lengths
    read     every chunk serving the match: hits, last use, seq, the policy's `on_hit`
    put      a row already stored is not stored again (an agent prefix pins it); a row
             whose tail a stored chunk of the same parent covers (a longer chunk starting
             with its tokens) writes no chunk and is served by that chunk; else the chunks
             from the first missing one are written. Too large when the new chunks and the
             manifest exceed the budget; else `on_admit` each, evict until they fit (the
             row's chunks held), then each chunk enters (`on_insert`), the row is added, and
             tail chunks (shorter than a chunk, nothing continuing them) a new chunk covers
             go, their rows served by it (absorbed); a boundary chunk is never absorbed
    evict    only a leaf (no stored chunk continues it), by the policy (chunkrank.py):
             `on_evict`, `on_remove`, then the rows that name it go (each manifest's bytes;
             a tail chunk no row names any more goes too). A full chunk no row names stays
             servable (chain lookups) until evicted
    pin      one pinned row (`ChunkedCache.pin` unpins the namespace's previous one); the
             chunks serving it are protected: evicted only when nothing else may go

Ties the store leaves to set order (`ChunkCatalog.lookup`'s agreeing chunks, `cover`'s
covering chunks) go here to the chunk used last (highest seq); `ties` counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.cache import keys
from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.policies import EvictionPolicy
from workbench.cache.prefix_index import PrefixIndex
from workbench.cache.types import RowStats, SaveReason
from workbench.lab.chunkrank import LeafRanking
from workbench.lab.chunks import ChunkTree
from workbench.lab.simcache import INDEX_BLOCK, ranking_mode


@dataclass(slots=True)
class Chunk:
    """One stored chunk: its policy stats (hex key, bytes, tokens, hits, last use, seq)."""

    stats: RowStats
    parent: str | None
    full: bool
    rows: set[str] = field(default_factory=set)   # the rows it serves (its refcount)


@dataclass(slots=True)
class Row:
    n_tokens: int
    served_by: tuple[str, ...]   # its chunks, the tail possibly a covering chunk
    manifest_bytes: int


@dataclass(slots=True, frozen=True)
class ChunkHit:
    """The longest stored prefix: `n_tokens` served by `chunks` (`key`: the row, None for a
    chain of chunks)."""

    n_tokens: int
    chunks: tuple[str, ...]
    key: str | None


def tokens_raw_first(raw: bytes) -> bytes:
    """The first token of a chunk's token bytes (int32 little-endian)."""
    return raw[:4]


class ChunkSimCache:
    """One tier of `budget_bytes` under `policy`, storing the rows of `tree` as chunks."""

    def __init__(self, policy: EvictionPolicy, budget_bytes: int, tree: ChunkTree, bytes_per_token: int, *,
                 index_block: int = INDEX_BLOCK) -> None:
        self.policy = policy
        self.budget = budget_bytes
        self.tree = tree
        self.bpt = bytes_per_token
        self.size = tree.chunk_size
        self.index = PrefixIndex(index_block)
        self.chunks: dict[str, Chunk] = {}
        self.kids: dict[str | None, dict[str, None]] = {}   # anchor (None: the namespace) -> chunks
        # the same, by first token: only chunks starting with a prompt chunk's first token can
        # agree with it, cover it or be covered by it (`_pick`'s candidates, exactly)
        self.kids_by_first: dict[tuple[str | None, bytes], dict[str, None]] = {}
        self._pinned_chunks = 0   # chunks with stats.pinned set (none: `_protect` has no work)
        self.rows: dict[str, Row] = {}
        self.pinned: str | None = None
        self.used = 0
        self.rank = LeafRanking(policy, ranking_mode(policy), self.chunks, self._leaf)  # type: ignore[arg-type]
        self._hooks = {name: getattr(policy, name, None) for name in
                       ("on_admit", "on_insert", "on_hit", "on_evict", "on_remove")}
        set_capacity = getattr(policy, "set_capacity", None)
        if set_capacity is not None:
            set_capacity(budget_bytes)
        self._seq = 0
        self._agree: dict[tuple[str, str], int] = {}
        self._evicting: str | None = None
        self.saves = self.duplicates = self.too_large = self.ties = 0
        self.evictions = self.evicted_bytes = self.collected = 0
        self.chunks_written = self.chunks_reused = 0
        self.logical_bytes = 0   # what the stored rows would take as whole rows

    @property
    def used_bytes(self) -> int:
        return self.used

    def __len__(self) -> int:
        return len(self.rows)

    # -- lookups and reads -------------------------------------------------------------------
    def lookup(self, namespace: bytes, raw: bytes, prompt: tuple[str, ...]) -> ChunkHit | None:
        """The longest stored prefix of the prompt (virtual tokens `raw`, chunks `prompt`)."""
        best = None
        match = self.index.longest_prefix(namespace, raw)
        if match is not None:
            row = self.rows[match.key]
            best = ChunkHit(row.n_tokens, row.served_by, match.key)
        depth, n, chunks, tokens = 0, 0, self.chunks, self.tree.tokens
        while depth < len(prompt) and (tokens[prompt[depth]] == self.size or depth + 1 < len(prompt)) \
                and prompt[depth] in chunks:  # whole chunks; the prompt's last, when short, below
            n += tokens[prompt[depth]]
            depth += 1
        chain = prompt[:depth]
        if depth < len(prompt):
            rest = prompt[depth]
            inside = self._pick(chain[-1] if chain else None, tokens_raw_first(self.tree.raw[rest]),
                                lambda k: self._agreement(k, rest))
            if inside is not None:
                chain, n = (*chain, inside), n + self._agreement(inside, rest)
        if n and (best is None or n > best.n_tokens):
            best = ChunkHit(n, chain, None)
        return best

    def hit(self, match: ChunkHit, now: float) -> None:
        """The match was read: each chunk serving it was used."""
        on_hit = self._hooks["on_hit"]
        for key in match.chunks:
            s = self.chunks[key].stats
            s.hits += 1
            s.last_hit_at = now
            s.seq = self._tick()
            if on_hit is not None:
                on_hit(s)
            self.rank.changed(key, now)

    # -- storing -----------------------------------------------------------------------------
    def put(self, key: str, namespace: bytes, raw: bytes, n_tokens: int, size: int,
            reason: SaveReason, now: float, *, pinned: bool = False) -> bool:
        """Store a row (`size` is ignored: the store's file sizes count). False for a row
        already stored (pinning it if asked) or one that cannot be stored."""
        if key in self.rows:
            self.duplicates += 1
            if pinned:
                self.pin(key, now)
            return False
        chain = self.tree.chain(key)
        first = self._missing(chain, n_tokens)
        new = chain[first:]
        sizes = [self._chunk_bytes(k) for k in new]
        mbytes = manifest_size(n_tokens, len(chain))
        need = mbytes + sum(sizes)
        if need > self.budget:
            self.too_large += 1
            return False
        served = self._resolve(chain, first >= len(chain) - 1)
        keep = set(chain).union(served or ())
        if self._hooks["on_admit"] is not None:
            for k, nbytes in zip(new, sizes):
                self._hooks["on_admit"](RowStats(k, nbytes, self.tree.tokens[k], now))
        if not self._make_room(need, keep, now):
            self.too_large += 1
            return False
        for k, nbytes in zip(new, sizes):
            self._add_chunk(k, nbytes, now)
        self.chunks_written += len(new)
        self.chunks_reused += len(chain) - len(new)
        self._add_row(key, namespace, raw, n_tokens, chain, mbytes, now)
        for k in new:
            self._absorb(k, now)
        if pinned:
            self.pin(key, now)
        self.saves += 1
        return True

    def pin(self, key: str, now: float) -> bool:
        """Pin a stored row, unpinning the previous one; False if it is not stored."""
        row = self.rows.get(key)
        if row is None:
            return False
        old = self.rows.get(self.pinned) if self.pinned is not None and self.pinned != key else None
        self.pinned = key
        if old is not None:
            self._protect(old.served_by, now)
        self._protect(row.served_by, now)
        return True

    def evict_bytes(self, n: int, now: float) -> int:
        """Free at least `n` bytes (leaves first); the bytes freed."""
        before = self.used
        while before - self.used < n:
            victim = self.rank.next((), now)
            if victim is None:
                break
            self._evict(victim, now)
        return before - self.used

    def shared_bytes(self) -> int:
        """Bytes of chunks serving more than one row."""
        return sum(c.stats.size_bytes for c in self.chunks.values() if len(c.rows) > 1)

    # -- the store's rules -------------------------------------------------------------------
    def _chunk_bytes(self, key: str) -> int:
        n = self.tree.tokens[key]
        return chunk_file_size(n, n * self.bpt)

    def _missing(self, chain: list[str], n_tokens: int) -> int:
        """`ChunkCatalog.missing`, then no chunk at all when the tail is covered."""
        for i, k in enumerate(chain):
            if k not in self.chunks:
                tail = i == len(chain) - 1 and self.tree.tokens[k] < self.size
                if tail and self._cover(chain[i - 1] if i else None, k) is not None:
                    return len(chain)
                return i
        return len(chain)

    def _cover(self, anchor: str | None, tail: str) -> str | None:
        """A stored chunk continuing `anchor` whose tokens extend the tail's."""
        raw = self.tree.raw
        t = raw[tail]
        return self._pick(anchor, tokens_raw_first(t), lambda k: len(raw[k]) > len(t) and raw[k].startswith(t))

    def _resolve(self, chain: list[str], head_stored: bool) -> tuple[str, ...] | None:
        """The chunks serving the row of `chain`: the chain, or its tail replaced by a
        covering chunk; None when one of them is missing. `head_stored`: every chunk but the
        last is stored (the caller knows it)."""
        if not head_stored:
            return None
        if chain[-1] in self.chunks:
            return tuple(chain)
        cover = self._cover(chain[-2] if len(chain) > 1 else None, chain[-1])
        return None if cover is None else (*chain[:-1], cover)

    def _pick(self, anchor: str | None, first: bytes, score: Callable[[str], int]) -> str | None:
        """The stored chunk continuing `anchor` with the highest positive score (a bool or a
        count); ties to the highest seq. Only chunks starting with the token `first` can
        score (every score is about a common start), so only they are asked."""
        best, best_rank, tied = None, (0, 0), False
        for k in self.kids_by_first.get((anchor, first), ()):
            value = int(score(k))
            if value <= 0:
                continue
            rank = (value, self.chunks[k].stats.seq)
            if value == best_rank[0]:
                tied = True
            elif value > best_rank[0]:
                tied = False
            if rank > best_rank:
                best, best_rank = k, rank
        self.ties += tied
        return best

    def _agreement(self, key: str, rest: str) -> int:
        """Leading tokens a chunk shares with the prompt's chunk at the same place."""
        got = self._agree.get((key, rest))
        if got is None:
            got = self._agree[(key, rest)] = keys.common_tokens(self.tree.raw[key], self.tree.raw[rest])
        return got

    def _make_room(self, need: int, keep: set[str], now: float) -> bool:
        while self.used + need > self.budget:
            victim = self.rank.next(keep, now)
            if victim is None:
                return False
            self._evict(victim, now)
        return True

    def _add_chunk(self, key: str, nbytes: int, now: float) -> None:
        parent = self.tree.parent[key]
        n = self.tree.tokens[key]
        self.chunks[key] = Chunk(RowStats(key, nbytes, n, now, seq=self._tick()), parent, n == self.size)
        self.kids.setdefault(parent, {})[key] = None
        self.kids_by_first.setdefault((parent, tokens_raw_first(self.tree.raw[key])), {})[key] = None
        self.used += nbytes
        if self._hooks["on_insert"] is not None:
            self._hooks["on_insert"](self.chunks[key].stats)
        self.rank.changed(key, now)

    def _add_row(self, key: str, namespace: bytes, raw: bytes, n_tokens: int, chain: list[str], mbytes: int,
                 now: float) -> None:
        served = self._resolve(chain, True)   # put made room holding the chain, then added its chunks
        assert served is not None
        self.rows[key] = Row(n_tokens, served, mbytes)
        self.used += mbytes
        self.logical_bytes += n_tokens * self.bpt
        self.index.insert(namespace, raw, key)
        for k in served:
            self.chunks[k].rows.add(key)
        self._protect(served, now)

    def _absorb(self, key: str, now: float) -> None:
        """Tail chunks of the same parent that `key` covers go; their rows are served by it."""
        c = self.chunks.get(key)
        if c is None:
            return
        raw = self.tree.raw
        candidates = self.kids_by_first.get((c.parent, tokens_raw_first(raw[key])), ())
        for t in [t for t in candidates if t != key and not self.chunks[t].full
                  and self._leaf(t) and len(raw[t]) < len(raw[key]) and raw[key].startswith(raw[t])]:
            tail = self.chunks[t]
            for r in tail.rows:
                c.rows.add(r)
                row = self.rows[r]
                row.served_by = (*row.served_by[:-1], key)
            tail.rows.clear()
            self._protect((key,), now)
            self.collected += 1
            self._drop_chunk(t, now)

    def _protect(self, keys: tuple[str, ...], now: float) -> None:
        if self.pinned is None and not self._pinned_chunks:
            return   # nothing pinned, nothing to unpin
        for k in keys:
            c = self.chunks.get(k)
            if c is not None and c.stats.pinned != (self.pinned in c.rows):
                c.stats.pinned = not c.stats.pinned
                self._pinned_chunks += 1 if c.stats.pinned else -1
                self.rank.changed(k, now)

    # -- leaving -----------------------------------------------------------------------------
    def _evict(self, key: str, now: float) -> None:
        c = self.chunks[key]
        before = self.used
        self.evictions += 1
        for name in ("on_evict", "on_remove"):
            hook = self._hooks[name]
            if hook is not None:
                hook(c.stats)
        self._evicting = key
        self._drop_chunk(key, now)
        self._evicting = None
        self.evicted_bytes += before - self.used

    def _drop_chunk(self, key: str, now: float) -> None:
        """A chunk goes with what continues it and the rows it serves (`drop_chunk`)."""
        c = self.chunks.get(key)
        if c is None:
            return
        for child in list(self.kids.get(key, ())):
            self._drop_chunk(child, now)
        for r in list(c.rows):
            self._remove_row(r, now)
        if key not in self.chunks:
            return   # removing its rows dropped it as an unnamed tail
        del self.chunks[key]
        self._pinned_chunks -= c.stats.pinned
        self.kids.pop(key, None)
        siblings = self.kids[c.parent]
        del siblings[key]
        if not siblings:
            del self.kids[c.parent]
        bucket_key = (c.parent, tokens_raw_first(self.tree.raw[key]))
        bucket = self.kids_by_first[bucket_key]
        del bucket[key]
        if not bucket:
            del self.kids_by_first[bucket_key]
        if key != self._evicting and self._hooks["on_remove"] is not None:
            self._hooks["on_remove"](c.stats)
        self.used -= c.stats.size_bytes
        if c.parent is not None and self._leaf(c.parent):
            self.rank.changed(c.parent, now)

    def _remove_row(self, key: str, now: float) -> None:
        row = self.rows.pop(key)
        self.index.remove(key)
        for k in row.served_by:
            c = self.chunks.get(k)
            if c is not None:
                c.rows.discard(key)
        if self.pinned == key:
            self.pinned = None
            self._protect(row.served_by, now)
        self.used -= row.manifest_bytes
        self.logical_bytes -= row.n_tokens * self.bpt
        tail = self.chunks.get(row.served_by[-1])
        if tail is not None and not tail.full and not tail.rows and self._leaf(row.served_by[-1]):
            if row.served_by[-1] != self._evicting:
                self.collected += 1
            self._drop_chunk(row.served_by[-1], now)

    def _leaf(self, key: str) -> bool:
        return key not in self.kids

    def _tick(self) -> int:
        self._seq += 1
        return self._seq
