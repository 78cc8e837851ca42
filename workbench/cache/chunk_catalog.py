"""Which KV chunks and rows the chunked cache holds, and which chunks serve each row.

Bookkeeping only (no I/O; chunk_store.py stores the bytes): per chunk its parent, its
tokens, the rows whose KV it serves (its refcount) and its policy `RowStats`; per anchor (a
parent chunk, or the namespace for first chunks) the chunks that continue it and their
lengths; per row its manifest and the stored chunks that serve it: its own chunks, except
trailing ones that a longer stored chunk of the same parent covers (the row uses that
chunk's first positions).

Where a new row's chunks end (`plan`): the row **follows the stored chain** as far as whole
stored chunks agree with its tokens, whatever their length (at each chunk, the longest
stored continuation that is not a tail, else the chunk the row's own cut would make there
when it is stored); from where it leaves the chain, new chunks are cut every `chunk_size`
positions, the grid restarting at each **mark** (a position where a shared prefix ends: a
chat's system prompt, an agent prefix), so a mark is always a chunk boundary and every row
under a shared prefix of P tokens shares its chunks whole, whatever `P mod chunk_size`. A
tail (a chunk shorter than `chunk_size` that nothing continues: where a row ended) is not
followed: a longer chunk cut over it covers it and absorbs it (chunk_store.py). A chunk
shorter than `chunk_size` that stored chunks continue is a boundary: followed, never
absorbed. With no marks every boundary is on the fixed grid (`keys.grid_ends`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.cache import keys
from workbench.cache.chunk_format import ChunkMeta, Manifest
from workbench.cache.prefix_index import PrefixIndex
from workbench.cache.types import RowStats


@dataclass(slots=True)
class ChunkInfo:
    key: bytes
    parent: bytes | None
    anchor: bytes       # the parent's key, or the namespace digest for a first chunk
    tokens: bytes
    size: int
    full: bool
    stats: RowStats
    rows: set[str] = field(default_factory=set)

    @property
    def refcount(self) -> int:
        return len(self.rows)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4


@dataclass(slots=True, frozen=True)
class ChunkPlan:
    """How a row of tokens is (to be) stored: its chunks' ``ends`` and ``keys``; chunks
    before ``first`` are stored, those from ``first`` on must be cut and written
    (``first == len(keys)``: none, also when a stored chunk covers the rest)."""

    ends: tuple[int, ...]
    keys: tuple[bytes, ...]
    first: int


@dataclass(slots=True, frozen=True)
class ChunkMatch:
    """The longest stored prefix of a prompt: ``n_tokens`` held by ``chunks`` (the row
    ``key`` when a manifest matched, None for a chain of full chunks)."""

    n_tokens: int
    chunks: tuple[bytes, ...]
    key: str | None


class ChunkCatalog:
    """Chunks, rows and who serves whom, for chunks of ``chunk_size`` positions."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self.chunks: dict[bytes, ChunkInfo] = {}
        self.rows: dict[str, Manifest] = {}
        self.row_chunks: dict[str, tuple[bytes, ...]] = {}  # the chunks that serve each row
        self.kids: dict[bytes, set[bytes]] = {}              # anchor -> the chunks continuing it
        self.kid_lengths: dict[bytes, dict[int, int]] = {}   # anchor -> {token counts of those no tail: how many}
        self.live: set[str] = set()                          # rows holding a live session's KV
        self.index = PrefixIndex()
        self._seq = 0

    def tick(self) -> int:
        """The logical clock that breaks ties between equal policy scores."""
        self._seq += 1
        return self._seq

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def children(self, key: bytes) -> int:
        return len(self.kids.get(key, ()))

    def leaves(self) -> list[ChunkInfo]:
        """Chunks no stored chunk continues: the only ones eviction may take."""
        return [c for c in self.chunks.values() if not self.children(c.key)]

    def missing(self, namespace: bytes, tokens: keys.Tokens) -> int:
        """Index of the first chunk of a row of ``tokens`` (no marks) not stored: the caller
        cuts only the chunks from there (``plan`` gives their ends)."""
        return self.plan(namespace, tokens).first

    def is_tail(self, c: ChunkInfo) -> bool:
        """A chunk shorter than ``chunk_size`` that nothing stored continues."""
        return not c.full and not self.children(c.key)

    def plan(self, namespace: bytes, tokens: keys.Tokens, marks: Sequence[int] = ()) -> ChunkPlan:
        """Where a row of ``tokens`` (the shared prefixes it holds ending at ``marks``) is cut:
        the stored chain it follows, then new chunks (the module's docstring)."""
        raw = keys.token_bytes(tokens)
        n = len(raw) // 4
        anchor, pos, ends, ks = namespace, 0, [], []
        while pos < n:
            nxt = self._follow(anchor, raw, pos, n, marks)
            if nxt is None:
                break
            pos += nxt.n_tokens
            ends.append(pos)
            ks.append(nxt.key)
            anchor = nxt.key
        first = len(ks)
        if pos < n:
            new = keys.chunk_ends(n, self.chunk_size, marks, pos)
            ends += new
            ks += keys.keys_at(anchor, raw, new, pos)
            if self.cover(anchor, raw[4 * pos:]) is not None:
                first = len(ks)  # served by a stored chunk's first positions
        return ChunkPlan(tuple(ends), tuple(ks), first)

    def _follow(self, anchor: bytes, raw: bytes, pos: int, n: int, marks: Sequence[int]) -> ChunkInfo | None:
        """The stored chunk a row follows from ``anchor`` (at ``pos``): the longest stored
        continuation whose tokens the row holds whole and that is no tail, else the row's own
        next chunk when it is stored; None when the row leaves the chain here."""
        got = self.whole(anchor, raw, pos, n)
        if got is not None:
            return got
        own = keys.keys_at(anchor, raw, keys.chunk_ends(n, self.chunk_size, marks, pos)[:1], pos)
        return self.chunks.get(own[0]) if own else None

    def whole(self, anchor: bytes, raw: bytes, pos: int, n: int) -> ChunkInfo | None:
        """The longest stored chunk continuing ``anchor`` that is no tail and whose tokens are
        the row's from ``pos`` on (one hash per distinct length of such continuations: full
        chunks and boundaries, a few, however many tails a shared prefix's end collects)."""
        for length in sorted(self.kid_lengths.get(anchor, ()), reverse=True):
            if length > n - pos:
                continue
            c = self.chunks.get(keys.block_digest(anchor + raw[4 * pos:4 * (pos + length)]))
            if c is not None and c.anchor == anchor and c.tokens == raw[4 * pos:4 * (pos + length)]:
                return c
        return None

    def _walkable(self, c: ChunkInfo, delta: int) -> None:
        """Count ``c``'s length among its anchor's continuations that are no tail (or not)."""
        lengths = self.kid_lengths.setdefault(c.anchor, {})
        lengths[c.n_tokens] = lengths.get(c.n_tokens, 0) + delta
        if not lengths[c.n_tokens]:
            del lengths[c.n_tokens]
        if not lengths:
            del self.kid_lengths[c.anchor]

    def cover(self, anchor: bytes, tail: bytes) -> ChunkInfo | None:
        """A stored chunk continuing ``anchor`` whose tokens extend ``tail`` (of several, the
        one used last: ties never depend on set order)."""
        found = [c for c in map(self.chunks.__getitem__, self.kids.get(anchor, ()))
                 if len(c.tokens) > len(tail) and c.tokens.startswith(tail)]
        return max(found, key=lambda c: c.stats.seq, default=None)

    def resolve(self, m: Manifest) -> tuple[bytes, ...] | None:
        """The stored chunks that serve a row: its own, or for its last ones a covering
        chunk; None when a chunk is missing."""
        k = 0
        while k < len(m.chunks) and m.chunks[k] in self.chunks:
            k += 1
        if k == len(m.chunks):
            return m.chunks
        cover = self.cover(m.chunks[k - 1] if k else m.namespace, m.tokens[4 * m.start_of(k):])
        return None if cover is None else (*m.chunks[:k], cover.key)

    def covered_tails(self, c: ChunkInfo) -> list[ChunkInfo]:
        """Tail chunks of the same parent whose positions ``c`` holds too."""
        out = []
        for k in self.kids.get(c.anchor, ()):
            t = self.chunks[k]
            if t is not c and self.is_tail(t) and len(t.tokens) < len(c.tokens) and c.tokens.startswith(t.tokens):
                out.append(t)
        return out

    def move_rows(self, tail: ChunkInfo, cover: ChunkInfo) -> None:
        """The rows ``tail`` served are served by ``cover`` from now."""
        for r in tail.rows:
            cover.rows.add(r)
            self.row_chunks[r] = (*self.row_chunks[r][:-1], cover.key)
        tail.rows.clear()
        self.protect([cover.key])

    def add_chunk(self, meta: ChunkMeta, size: int, created_at: float) -> ChunkInfo:
        info = ChunkInfo(meta.key, meta.parent, meta.namespace if meta.parent is None else meta.parent,
                         meta.tokens, size, meta.n_tokens == self.chunk_size,
                         RowStats(meta.key.hex(), size, meta.n_tokens, created_at, seq=self.tick()))
        self.chunks[meta.key] = info
        self.kids.setdefault(info.anchor, set()).add(meta.key)
        if info.full:
            self._walkable(info, 1)
        parent = self.chunks.get(info.anchor)
        if parent is not None and not parent.full and self.children(parent.key) == 1:
            self._walkable(parent, 1)  # a short chunk continued: a boundary, no tail any more
        return info

    def pop_chunk(self, key: bytes) -> ChunkInfo:
        info = self.chunks[key]
        if info.full or self.children(key):
            self._walkable(info, -1)
        del self.chunks[key]
        self.kids.pop(key, None)
        siblings = self.kids.get(info.anchor)
        if siblings is not None:
            siblings.discard(key)
            if not siblings:
                del self.kids[info.anchor]
                parent = self.chunks.get(info.anchor)
                if parent is not None and not parent.full:
                    self._walkable(parent, -1)  # its last continuation went: a tail again
        return info

    def add_row(self, m: Manifest, served_by: tuple[bytes, ...]) -> None:
        self.rows[m.key] = m
        self.row_chunks[m.key] = served_by
        self.index.insert(m.namespace, m.tokens, m.key)
        for k in served_by:
            info = self.chunks[k]
            info.rows.add(m.key)
            # a new row can only add protection: no pass over every row naming a shared chunk
            # (a system prompt's first chunk is named by every row under it: O(rows) a put)
            info.stats.pinned = info.stats.pinned or m.pinned
            info.stats.live = info.stats.live or m.key in self.live

    def pop_row(self, key: str) -> tuple[Manifest, tuple[bytes, ...]] | None:
        m = self.rows.pop(key, None)
        if m is None:
            return None
        served_by = self.row_chunks.pop(key)
        was_live = key in self.live
        self.live.discard(key)
        self.index.remove(key)
        for k in served_by:
            info = self.chunks.get(k)
            if info is not None:
                info.rows.discard(key)
        if m.pinned or was_live:  # only a protected row's leaving can unprotect its chunks
            self.protect([k for k in served_by if k in self.chunks])
        return m, served_by

    def protect(self, chunk_keys: Sequence[bytes]) -> None:
        """A chunk serving a pinned row or a live session's row is evicted last."""
        for k in chunk_keys:
            info = self.chunks[k]
            info.stats.pinned = any(self.rows[r].pinned for r in info.rows)
            info.stats.live = any(r in self.live for r in info.rows)

    def set_live(self, key: str, live: bool = True) -> bool:
        """Mark a row as a live session's KV (kept in memory only: no session outlives the
        process); False when the row is not held."""
        if key not in self.rows:
            return False
        (self.live.add if live else self.live.discard)(key)
        self.protect(self.row_chunks[key])
        return True

    def lookup(self, namespace: bytes, tokens: keys.Tokens) -> ChunkMatch | None:
        """The longest stored prefix of ``tokens``: a row, or the chain of stored chunks the
        prompt holds whole (at each, the longest: chunks of any length, cut wherever the rows
        that stored them were) followed by the first positions of the stored chunk continuing
        it that agrees longest with the prompt (a re-tokenised prompt resumes at its last agreeing token, not
        at the chunk boundary before it). Join the chunks with ``n_tokens``."""
        raw = keys.token_bytes(tokens)
        best: ChunkMatch | None = None
        match = self.index.longest_prefix(namespace, raw)
        if match is not None:
            best = ChunkMatch(match.n_tokens, self.row_chunks[match.key], match.key)
        chain: tuple[bytes, ...] = ()
        n, total, anchor = 0, len(raw) // 4, namespace
        while (c := self.whole(anchor, raw, n, total)) is not None:  # whole chunks, any length; tails below
            chain, n, anchor = (*chain, c.key), n + c.n_tokens, c.key
        rest = raw[4 * n:]
        agree, inside, used = 0, None, -1  # the longest agreement; of equal ones, the chunk used last
        for k in self.kids.get(anchor, ()):
            common, seq = keys.common_tokens(self.chunks[k].tokens, rest), self.chunks[k].stats.seq
            if common > 0 and (common, seq) > (agree, used):
                agree, inside, used = common, k, seq
        if inside is not None:
            chain, n = (*chain, inside), n + agree
        if n and (best is None or n > best.n_tokens):
            best = ChunkMatch(n, chain, None)
        return best

    # --- views -----------------------------------------------------------------------------

    def chunk_view(self, score: Callable[[ChunkInfo], float], tier: Callable[[ChunkInfo], str]) -> list[dict[str, Any]]:
        """One dict per chunk: key, parent, tokens, bytes, refcount, children, score, tier."""
        return [{"key": c.key.hex(), "parent": c.parent.hex() if c.parent else None,
                 "n_tokens": c.n_tokens, "size_bytes": c.size, "refcount": c.refcount,
                 "children": self.children(c.key), "leaf": not self.children(c.key),
                 "protected": c.stats.protected, "score": score(c), "hits": c.stats.hits, "tier": tier(c)}
                for c in self.chunks.values()]

    def row_view(self) -> list[dict[str, Any]]:
        """One dict per row: key, tokens, chunks, bytes (its own share: chunks no other row uses)."""
        out = []
        for m in self.rows.values():
            served_by = self.row_chunks[m.key]
            own = sum(self.chunks[k].size for k in served_by if self.chunks[k].refcount == 1)
            out.append({"key": m.key, "n_tokens": m.n_tokens, "n_chunks": len(m.chunks),
                        "bytes": sum(self.chunks[k].size for k in served_by), "own_bytes": own,
                        "reason": m.reason.name.lower(), "pinned": m.pinned})
        return out
