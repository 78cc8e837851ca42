"""Which KV chunks and rows the chunked cache holds, and which chunks serve each row.

Bookkeeping only (no I/O; chunk_store.py stores the bytes): per chunk its parent, its
tokens, the rows whose KV it serves (its refcount) and its policy `RowStats`; per anchor (a
parent chunk, or the namespace for first chunks) the chunks that continue it; per row its
manifest and the stored chunks that serve it: its own chunks, except a tail chunk that a
longer stored chunk of the same parent covers (the row uses that chunk's first positions).
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
        """Index of the first chunk of a row of ``tokens`` not stored (its chunks before it
        are): the caller cuts only the chunks from there (``kv_chunks.cut(first=...)``). A
        tail chunk whose positions a stored chunk holds already (a longer row's) is not
        missing: the row is served by that chunk's first positions."""
        raw = keys.token_bytes(tokens)
        ks = keys.chunk_keys(namespace, raw, self.chunk_size)
        for i, k in enumerate(ks):
            if k not in self.chunks:
                tail = i == len(ks) - 1 and len(raw) % (4 * self.chunk_size)
                anchor = ks[i - 1] if i else namespace
                return i if not tail or self.cover(anchor, raw[4 * self.chunk_size * i:]) is None else len(ks)
        return len(ks)

    def cover(self, anchor: bytes, tail: bytes) -> ChunkInfo | None:
        """A stored chunk continuing ``anchor`` whose tokens extend ``tail`` (of several, the
        one used last: ties never depend on set order)."""
        found = [c for c in map(self.chunks.__getitem__, self.kids.get(anchor, ()))
                 if len(c.tokens) > len(tail) and c.tokens.startswith(tail)]
        return max(found, key=lambda c: c.stats.seq, default=None)

    def resolve(self, m: Manifest) -> tuple[bytes, ...] | None:
        """The stored chunks that serve a row: its own, or for its tail a covering chunk;
        None when a chunk is missing."""
        *head, last = m.chunks
        if any(k not in self.chunks for k in head):
            return None
        if last in self.chunks:
            return m.chunks
        if m.n_tokens % m.chunk_size == 0:
            return None
        cover = self.cover(head[-1] if head else m.namespace, m.tokens[4 * m.chunk_size * len(head):])
        return None if cover is None else (*head, cover.key)

    def covered_tails(self, c: ChunkInfo) -> list[ChunkInfo]:
        """Tail chunks of the same parent whose positions ``c`` holds too."""
        out = []
        for k in self.kids.get(c.anchor, ()):
            t = self.chunks[k]
            if t is not c and not t.full and len(t.tokens) < len(c.tokens) and c.tokens.startswith(t.tokens):
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
        return info

    def pop_chunk(self, key: bytes) -> ChunkInfo:
        info = self.chunks.pop(key)
        self.kids.pop(key, None)
        siblings = self.kids.get(info.anchor)
        if siblings is not None:
            siblings.discard(key)
            if not siblings:
                del self.kids[info.anchor]
        return info

    def add_row(self, m: Manifest, served_by: tuple[bytes, ...]) -> None:
        self.rows[m.key] = m
        self.row_chunks[m.key] = served_by
        self.index.insert(m.namespace, m.tokens, m.key)
        for k in served_by:
            self.chunks[k].rows.add(m.key)
        self.protect(served_by)

    def pop_row(self, key: str) -> tuple[Manifest, tuple[bytes, ...]] | None:
        m = self.rows.pop(key, None)
        if m is None:
            return None
        served_by = self.row_chunks.pop(key)
        self.live.discard(key)
        self.index.remove(key)
        for k in served_by:
            info = self.chunks.get(k)
            if info is not None:
                info.rows.discard(key)
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
        """The longest stored prefix of ``tokens``: a row, or the chain of the prompt's own full
        chunks followed by the first positions of the stored chunk continuing it that agrees
        longest with the prompt (a re-tokenised prompt resumes at its last agreeing token, not
        at the chunk boundary before it). Join the chunks with ``n_tokens``."""
        raw = keys.token_bytes(tokens)
        best: ChunkMatch | None = None
        match = self.index.longest_prefix(namespace, raw)
        if match is not None:
            best = ChunkMatch(match.n_tokens, self.row_chunks[match.key], match.key)
        full = keys.chain_hashes(namespace, raw, self.chunk_size)
        depth = 0
        while depth < len(full) and full[depth] in self.chunks:
            depth += 1
        chain, n = tuple(full[:depth]), depth * self.chunk_size
        rest = raw[4 * n:]
        agree, inside, used = 0, None, -1  # the longest agreement; of equal ones, the chunk used last
        for k in self.kids.get(chain[-1] if chain else namespace, ()):
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
