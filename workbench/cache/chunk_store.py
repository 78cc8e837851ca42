"""The chunked KV cache's storage, `ChunkStore`: rows as manifests over shared chunks, in
tiers (RAM, shm, disk: `chunk_tiers.ChunkTier`, fastest first).

A row of ``tokens`` is stored as the chunks ``chunk_format.chunks_of`` names (keys by
``keys.chunk_keys``, cut where ``ChunkCatalog.plan`` says: the stored chain the row follows,
then the grid restarted at each mark where a shared prefix ends) plus a manifest; a chunk
another row already stored is not written again, so a prefix shared by many rows, sessions
or turns is stored once. What is kept per
chunk (``ChunkInfo``): its size, its parent, the rows whose manifests name it (its
refcount), how many stored chunks continue it (its children) and its policy bookkeeping.

The store is the catalog (`chunk_catalog.ChunkCatalog`, its base: which chunks and rows
exist, who serves whom, where a row is cut) with bytes in tiers, and it has its parts; each
sees the store through a narrow view declared in its own module (a Protocol that
``ChunkStore`` satisfies), none imports this one:

* ``moves`` (`chunk_tier_moves.TierMoves`, view ``MovesHost``): where a put writes, room
  made by eviction, demotion down the tiers, promotion, and the locking of payload I/O: the
  store's algorithm, described and coded there.
* the start-up scan (`chunk_tier_scan.scan_tiers`, view ``ScanHost``) and the adopt-only
  rescan of what live peers publish (`chunk_peer_scan`, view ``PeerHost``).

What is coded here:

* **Bookkeeping.** Entering chunks and manifests into the catalog and the tiers
  (``adopt_chunk``, ``adopt_manifest``), absorbing tails, dropping a chunk from every tier
  with everything that continues it and the rows naming it (``drop_chunk``), removing a
  row, pinning one. ``lock`` serialises it; payload I/O runs outside it (chunk_tier_moves.py).
* **Serving.** ``read_row`` returns a row's chunk payloads only when its manifest and every
  chunk verify; a chunk that fails is deleted with every row that names it, and the read
  raises ``CorruptRow``; a read that races an eviction finds the file gone and is a miss
  (KeyError), never a wrong payload. Chunks read from below the top tier are copied up.
  ``lookup`` gives the longest stored prefix of a prompt.
* **Crash safety.** Chunks, then the manifest, each by ``store.publish_file``; a demotion
  publishes the new copy before it deletes the old one. Scan: chunk_tier_scan.py.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from workbench.cache import chunk_peer_scan, keys
from workbench.cache.chunk_backends import ChunkDir, ChunkGone
from workbench.cache.chunk_catalog import ChunkCatalog, ChunkInfo, ChunkPlan
from workbench.cache.chunk_format import CHUNK_SUFFIX, ChunkMeta, Manifest, manifest_size
from workbench.cache.chunk_tier_moves import TierMoves
from workbench.cache.chunk_tier_scan import scan_tiers
from workbench.cache.chunk_tiers import ChunkTier, Move
from workbench.cache.counters import Counters
from workbench.cache.format import CorruptReason, CorruptRow
from workbench.cache.policies import DEFAULT_POLICY, EvictionPolicy, PolicySpec
from workbench.cache.types import SaveReason

DEFAULT_CHUNK_SIZE = 64  # docs/cache.md, "Choosing the chunk size"
#: The chunk size of whole-row storage (``configure_cache(storage='rows')``): no grid, so a
#: row's new KV is one chunk ending where the row ends (or at a mark); no context is this long.
WHOLE_ROWS = 1 << 30


def one_store_tiers(root: str | os.PathLike[str] | None, budget_bytes: int | None, policy: PolicySpec,
                    ram_budget_bytes: int, name: str | None) -> list[ChunkTier]:
    """The tiers of ``ChunkStore(root, budget, ram_budget_bytes=...)``: one directory (or
    memory, ``root=None``) with RAM copies above it when ``ram_budget_bytes``."""
    if root is None:
        if ram_budget_bytes:
            raise ValueError("a store in memory has no RAM copies (ram_budget_bytes must be 0)")
        return [ChunkTier.memory(name or "ram", budget_bytes, policy)]
    main = ChunkTier.directory(root, name, budget_bytes, policy)
    if ram_budget_bytes < 0:
        raise ValueError(f"the RAM budget must be >= 0, got {ram_budget_bytes}")
    return [ChunkTier.memory("ram", ram_budget_bytes, policy), main] if ram_budget_bytes else [main]


class ChunkStore(ChunkCatalog):
    """Rows as manifests over content-addressed chunks in ``tiers`` (fastest first), or, the
    short form, in one private directory ``root`` (memory with ``root=None``) with RAM
    copies of ``ram_budget_bytes`` above it."""

    def __init__(self, root: str | os.PathLike[str] | None = None, budget_bytes: int | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, policy: Any = DEFAULT_POLICY,
                 counters: Counters | None = None, clock: Callable[[], float] = time.time,
                 ram_budget_bytes: int = 0, name: str | None = None,
                 tiers: Sequence[ChunkTier] | None = None) -> None:
        super().__init__(chunk_size)
        if tiers is None:
            tiers = one_store_tiers(root, budget_bytes, policy, ram_budget_bytes, name)
        elif root is not None or budget_bytes is not None or ram_budget_bytes:
            raise ValueError("give either tiers or root/budget_bytes/ram_budget_bytes")
        self.tiers = check_tiers(tiers)
        self.counters = counters or Counters()
        self.clock = clock
        self.lock = threading.RLock()
        self.used = 0                                   # distinct bytes: each chunk once, manifests
        self.metas: dict[bytes, ChunkMeta] = {}
        self.manifest_at: dict[str, ChunkTier] = {}     # row -> the tier holding its manifest
        self.moves = TierMoves(self)

    # --- where things live ----------------------------------------------------------------

    @property
    def policy(self) -> EvictionPolicy:
        """The last tier's policy: the one that decides which chunks leave the cache."""
        return self.tiers[-1].policy

    @property
    def budget(self) -> int | None:
        """What the cache can hold distinct: the persistent tiers' budgets (RAM holds copies
        above them), or the memory tier's; None when one is unbounded."""
        persistent = [t for t in self.tiers if t.persistent] or self.tiers
        budgets = [t.budget for t in persistent]
        return None if any(b is None for b in budgets) else sum(b for b in budgets if b is not None)

    @property
    def root(self) -> Path:
        """The last tier's directory (a store in memory has none)."""
        backend = self.tiers[-1].backend
        if not isinstance(backend, ChunkDir):
            raise AttributeError("this chunk store keeps its chunks in memory")
        return backend.root

    def tier(self, name: str) -> ChunkTier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no chunk tier named {name!r}; tiers: {[t.name for t in self.tiers]}")

    def holders(self, key: bytes) -> list[ChunkTier]:
        return [t for t in self.tiers if key in t]

    def top_tier(self, key: bytes) -> ChunkTier | None:
        return next((t for t in self.tiers if key in t), None)

    def _chunk_path(self, key: bytes) -> Path:
        return self.root / f"{key.hex()}{CHUNK_SUFFIX}"

    def adopt_chunk(self, meta: ChunkMeta, size: int, created_at: float, tier: ChunkTier, *,
                    admitted: bool = False) -> ChunkInfo:
        """Enter a chunk into the catalog, held by ``tier`` (its policy admitted it already
        when ``admitted``)."""
        self.used += size
        info = self.add_chunk(meta, size, created_at)
        self.metas[meta.key] = meta
        if not admitted:
            tier.admit(info.stats)
        tier.add(info, size)
        return info

    def adopt_manifest(self, tier: ChunkTier, m: Manifest, served_by: tuple[bytes, ...]) -> None:
        """Hold a manifest ``tier`` holds (written, or found verified) as a row served by
        ``served_by``, its bytes counted in the tier and the store (lock held): a put's
        commit, the start-up scan's and the peer rescan's."""
        size = manifest_size(m.n_tokens, len(m.chunks))
        tier.used += size
        self.used += size
        self.manifest_at[m.key] = tier
        self.add_row(m, served_by)

    def absorb(self, c: ChunkInfo) -> None:
        """Tail chunks whose positions ``c`` holds too go; their rows are served by ``c``."""
        for t in self.covered_tails(c):
            self.move_rows(t, c)
            self.drop_chunk(t.key)
            self.counters.inc("tails_absorbed")

    def entry_tiers(self) -> list[ChunkTier]:
        """Where a put writes new chunks: the persistent tiers, else the memory tier."""
        return [t for t in self.tiers if t.persistent] or self.tiers[:1]

    # --- writing -----------------------------------------------------------------------

    def put_row(self, namespace: bytes, fingerprint: bytes, tokens: keys.Tokens,
                pieces: Sequence[bytes], reason: SaveReason = SaveReason.FINISH, *,
                pinned: bool = False, ends: Sequence[int] | None = None, saved_by: str = "") -> str | None:
        """Store a row (``saved_by``: the id of the model saving it); ``pieces``: the
        payloads of its chunks from ``plan().first`` on, cut
        at ``ends`` (the plan's; default: ``plan()`` now, with no marks). Chunks stored
        already are not written again. Returns the row key, None when the row cannot fit the
        budgets or chunks before ``pieces`` are not stored (evicted since ``missing()`` or
        ``plan()``: ``saves_chunks_gone``; checked under the lock, so calling ``missing()``
        then ``put_row`` unlocked is safe). ValueError when there are more ``pieces`` than
        chunks, or ``ends`` are not a row's chunk ends; OSError when a write fails (nothing
        of the row is kept)."""
        raw = keys.token_bytes(tokens)
        with self.lock:
            key = keys.row_key_from_bytes(namespace, raw)
            if key in self.rows:
                self.counters.inc("saves_duplicate")
                return key
            cut = self.plan(namespace, raw).ends if ends is None else tuple(ends)
            plan = self.moves.plan_put(namespace, fingerprint, raw, pieces, SaveReason(reason), pinned, cut,
                                       saved_by)
        if plan is None:
            return None
        return self.moves.write_put(plan)

    def plan(self, namespace: bytes, tokens: keys.Tokens, marks: Sequence[int] = ()) -> ChunkPlan:
        """``ChunkCatalog.plan`` under the store's lock (puts change the chains it walks)."""
        with self.lock:
            return super().plan(namespace, tokens, marks)

    def pin(self, key: str, pinned: bool = True) -> None:
        """Pin a row (its chunks are evicted last), or unpin it (``pinned=False``). The flag
        lives in the manifest, rewritten crash-safely under a fresh name then renamed over
        the old one. KeyError for a row not held."""
        with self.lock:
            m = self.rows[key]
            if m.pinned != pinned:
                m = dataclasses.replace(m, pinned=pinned)
                self.manifest_at[key].backend.replace_manifest(m)
                self.rows[key] = m
            self.protect(self.row_chunks[key])

    # --- reading -----------------------------------------------------------------------

    def read_chunks(self, chunk_keys: Sequence[bytes], max_payload: int | None = None) -> list[bytes]:
        """The payloads of a chain of chunks, each verified; CorruptRow (the bad chunk and
        the rows naming it removed) when one does not verify or its payload is longer than
        ``max_payload`` (default: the largest tier budget), KeyError when one is not stored
        (or went while it was read)."""
        limit = self.max_payload() if max_payload is None else max_payload
        with self.lock:
            sources = [self._source(k) for k in chunk_keys]
            in_memory = {k: t.backend.read_chunk(k, limit) for k, t in zip(chunk_keys, sources) if not t.persistent}
            self.moves.hold(chunk_keys)
        got: dict[bytes, bytes] = dict(in_memory)
        failed: tuple[bytes, ChunkTier, Exception] | None = None
        try:
            for k, t in zip(chunk_keys, sources):
                if k not in got:
                    got[k] = t.backend.read_chunk(k, limit)
        except (ChunkGone, CorruptRow, OSError) as exc:  # OSError: unreadable, as a missing file
            failed = (k, t, exc)
        finally:
            with self.lock:
                self.moves.release(chunk_keys)
        if failed is not None:
            self._failed_read(*failed)
        with self.lock:
            if any(k not in self.chunks for k in chunk_keys):
                raise KeyError("a chunk of the chain went while it was read")
            promote = self._count_hits(chunk_keys, sources)
            moves = self.moves.copy_up(promote, got, frozenset(chunk_keys))
        self.moves.run(moves)
        return [got[k] for k in chunk_keys]

    def _source(self, key: bytes) -> ChunkTier:
        if key not in self.chunks:
            raise KeyError(key.hex())
        top = self.top_tier(key) or self.moves.moving.get(key)
        if top is None:
            raise KeyError(key.hex())
        return top

    def _failed_read(self, key: bytes, tier: ChunkTier, exc: Exception) -> None:
        """A read failed: a chunk that went meanwhile is a miss; so is one whose file went
        while this catalog held it (a peer sharing the directory evicted or moved it): it is
        forgotten here only, with what continues it, no file deleted (they may be the peer's;
        orphans are the start-up scan's). One still held whose file does not verify is
        removed (with what depends on it)."""
        with self.lock:
            if key not in self.chunks or key not in tier:
                raise KeyError(key.hex()) from exc
            if isinstance(exc, ChunkGone) and tier.persistent:
                tier.discard(self.chunks[key], evicted=False)
                if not self.holders(key):
                    chunk_peer_scan.forget_chunk(self, key)
                raise KeyError(key.hex()) from exc
            reason = exc.reason if isinstance(exc, CorruptRow) else CorruptReason.TRUNCATED
            self.reject_chunk(key, reason)
        raise exc if isinstance(exc, CorruptRow) else CorruptRow(reason, "chunk file missing")

    def _count_hits(self, chunk_keys: Sequence[bytes], sources: Sequence[ChunkTier]) -> list[bytes]:
        """Hits and last use per chunk, the serving tier's ``on_hit``; the chunks read from
        below the top tier (to be copied up)."""
        now = self.clock()
        promote = []
        for k, t in zip(chunk_keys, sources):
            self.counters.inc("chunk_reads_file" if t.persistent else "chunk_reads_ram")
            info = self.chunks[k]
            stats = info.stats
            stats.hits += 1
            stats.last_hit_at = now
            stats.seq = self.tick()
            t.hit(info)
            if t is not self.tiers[0]:
                promote.append(k)
        return promote

    def read_row(self, key: str, max_payload: int | None = None) -> tuple[Manifest, tuple[bytes, ...], list[bytes]]:
        """(manifest, the keys of the chunks that serve it, their verified payloads); join them
        with ``n_tokens=manifest.n_tokens`` (a covering chunk holds more positions)."""
        with self.lock:
            m = self.rows[key]
            served_by = self.row_chunks[key]
        return m, served_by, self.read_chunks(served_by, max_payload)

    def max_payload(self) -> int | None:
        budgets = [t.budget for t in self.tiers]
        return None if any(b is None for b in budgets) else max(b for b in budgets if b is not None)

    # --- removing and evicting ---------------------------------------------------------

    def reject_chunk(self, key: bytes, reason: CorruptReason) -> None:
        with self.lock:
            self.counters.inc(f"rejected_{reason.value}")
            self.counters.inc("rejected_total")
            self.drop_chunk(key)

    def remove_row(self, key: str) -> bool:
        """Delete a row's manifest; its chunks stay while another row names them or, full
        ones, as servable prefixes; a tail chunk no row names goes."""
        with self.lock:
            popped = self.pop_row(key)
            if popped is None:
                return False
            m, served_by = popped
            self.forget_manifest(key, manifest_size(m.n_tokens, len(m.chunks)))
            tail = self.chunks.get(served_by[-1])
            if tail is not None and not tail.full and not tail.rows and not self.children(tail.key):
                self.drop_chunk(tail.key)
            return True

    def forget_manifest(self, key: str, size: int) -> None:
        tier = self.manifest_at.pop(key, None)
        if tier is not None:
            tier.backend.delete_manifest(key)
            tier.used -= size
            self.used -= size

    def drop_chunk(self, key: bytes) -> None:
        """Delete a chunk from every tier, everything that continues it, and the rows that
        name it."""
        info = self.chunks.get(key)
        if info is None:
            return
        for child in list(self.kids.get(key, ())):
            self.drop_chunk(child)
        for row in list(info.rows):
            self.remove_row(row)
        if key not in self.chunks:  # removing the rows dropped it as an unnamed tail
            return
        self.pop_chunk(key)
        self.metas.pop(key, None)
        for t in self.holders(key):
            t.discard(info, evicted=False)
            t.backend.delete_chunk(key)
        source = self.moves.moving.pop(key, None)
        if source is not None:
            source.backend.delete_chunk(key)
        self.used -= info.size

    def score(self, info: ChunkInfo, now: float | None = None) -> float:
        """The chunk's priority under the policy of the top tier holding it, at ``now``
        (default: the store's clock now)."""
        tier = self.top_tier(info.key) or self.tiers[-1]
        return tier.policy.priority(info.stats, self.clock() if now is None else now)

    def evict_bytes(self, n: int, tier: str | None = None) -> int:
        """Evict from ``tier`` (default: the last, where chunks leave the cache, leaves
        first) until at least ``n`` bytes of it are freed; returns the bytes freed there."""
        with self.lock:
            t = self.tiers[-1] if tier is None else self.tier(tier)
            before = t.used
            moves: list[Move] = []
            while before - t.used < n and self.moves.evict_one(t, frozenset(), moves):
                pass
            freed = before - t.used
        self.moves.run(moves)
        return freed

    # --- start-up ------------------------------------------------------------------------

    def scan(self, *, tmp_ttl_s: float = 600.0) -> dict[str, int]:
        """Adopt what every persistent tier holds (chunk_tier_scan.py); returns what was
        rejected, by reason."""
        with self.lock:
            return scan_tiers(self, tmp_ttl_s)

    # --- views -----------------------------------------------------------------------------

    def tier_names(self, key: bytes) -> list[str]:
        return [t.name for t in self.holders(key)] or [t.name for t in self.moves.moving_to(key)]

    def chunk_rows(self) -> list[dict[str, Any]]:
        """One dict per chunk: key, parent, tokens, bytes, refcount, children, score, tier
        (the fastest holding it) and tiers (all holding it)."""
        with self.lock:
            out = self.chunk_view(self.score, lambda c: (self.tier_names(c.key) or ["moving"])[0])
            for row in out:
                row["tiers"] = self.tier_names(bytes.fromhex(row["key"]))
            return out

    def row_views(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.row_view()


def check_tiers(tiers: Iterable[ChunkTier]) -> list[ChunkTier]:
    """Tiers fastest first: at least one, distinct names, a memory tier only at the top."""
    out = list(tiers)
    if not out:
        raise ValueError("a chunk store needs at least one tier")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ValueError(f"chunk tier names must be distinct, got {names}")
    if any(not t.persistent for t in out[1:]):
        raise ValueError(f"a memory tier must be the first of the chunk tiers, got {names}")
    return out

