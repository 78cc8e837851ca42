"""The chunk store's algorithm: chunks entering and leaving its tiers (room made by
eviction, demotion down the tiers, promotion, a put's writes), with payload I/O outside the
store's lock. `TierMoves` is a part the store has (``ChunkStore.moves``); it owns the state of
the moves in flight and sees the store through ``MovesHost``.

* **Tiers.** Each chunk lives in one or more tiers. A put writes a new chunk to the first
  persistent tier that can hold it (or to the memory tier when there is no persistent one:
  ``entry_tiers``) and, when the top tier is RAM above persistent tiers, copies it there
  too: RAM holds copies only, so a manifest never names a chunk that lives only in process
  memory. Manifests live in the last tier. A read from a lower tier copies the chunk to the
  top tier and keeps the lower copy (inclusive promotion: ``copy_up``).
* **Eviction, per tier** (``evictable``, ``evict_copy``): a copy may leave a tier when a
  lower tier holds the chunk too (it is dropped) or can hold it (it is demoted: written
  there, making room there in turn), whatever depends on it, so in upper tiers a parent may
  go down before its children and a chain may span tiers; when neither, the chunk leaves the
  cache, which only a leaf may do (no stored chunk continues it). Each tier's policy ranks
  its own chunks (chunk_tiers.py); chunks of pinned or live rows go last; chunks an
  operation in flight uses (``held``) and chunks being moved are never chosen. Evicting a
  chunk from the cache drops the rows ending at it; its parent may become a leaf in turn.
* **Locking.** Each move takes three steps, as placement.py's for rows: under the store's
  lock, room is made in the destination tier (the evicted copies are dropped, demoted, or
  leave the cache) and the bytes are reserved; unlocked, the payload is read from its source
  (verified) or taken in hand and written; under the lock, the reservation is released and
  the copy committed, or, when the chunk went meanwhile, the new copy is deleted. A demoted
  chunk is in ``moving`` from its eviction to the commit (no tier holds it then; it is read
  from its old tier, whose file stays until the new copy is committed). Chunks an operation
  needs (a put's earlier chunks, a chain being read) are ``held``: never chosen for
  eviction; the chunks a put builds on are ``staying``: they may move down, not leave.
* **A full disk.** A write that finds its tier's file system full (ENOSPC) lowers that
  tier's limit to what it holds, evicts there and is tried once more
  (``write_or_make_room``; docs/cache.md, "A full disk").
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from workbench.cache import keys
from workbench.cache.chunk_backends import ChunkGone
from workbench.cache.chunk_catalog import ChunkInfo
from workbench.cache.chunk_format import ChunkMeta, Manifest, check_ends, chunk_file_size, chunks_of, manifest_size
from workbench.cache.chunk_tiers import ChunkTier, Move
from workbench.cache.counters import Counters
from workbench.cache.format import CorruptRow
from workbench.cache.types import RowStats, SaveReason


class MovesHost(Protocol):
    """What the tier moves see of their store (`chunk_store.ChunkStore` is one): its lock,
    counters, clock and tiers (read each time: tiers are added and removed), the catalog
    read, and the store's calls that enter, absorb, pin and drop chunks and rows."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def tiers(self) -> Sequence[ChunkTier]: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def chunks(self) -> Mapping[bytes, ChunkInfo]: ...
    @property
    def metas(self) -> Mapping[bytes, ChunkMeta]: ...
    @property
    def rows(self) -> Mapping[str, Manifest]: ...

    def clock(self) -> float: ...
    def children(self, key: bytes) -> int: ...
    def top_tier(self, key: bytes) -> ChunkTier | None: ...
    def entry_tiers(self) -> list[ChunkTier]: ...
    def resolve(self, m: Manifest) -> tuple[bytes, ...] | None: ...
    def adopt_chunk(self, meta: ChunkMeta, size: int, created_at: float, tier: ChunkTier, *,
                    admitted: bool = False) -> ChunkInfo: ...
    def adopt_manifest(self, tier: ChunkTier, m: Manifest, served_by: tuple[bytes, ...]) -> None: ...
    def absorb(self, c: ChunkInfo) -> None: ...
    def pin(self, key: str, pinned: bool = True) -> None: ...
    def drop_chunk(self, key: bytes) -> None: ...


@dataclass(slots=True)
class PutPlan:
    """A put between its planning and its commit (see ``TierMoves.plan_put``)."""

    manifest: Manifest
    n_chunks: int
    new: list[tuple[ChunkMeta, bytes, ChunkTier, int]]   # meta, payload, entry tier, bytes
    reserved: dict[ChunkTier, int]
    keep: frozenset[bytes]
    moves: list[Move] = field(default_factory=list)
    ok: bool = True


class TierMoves:
    """The moving of chunks between a store's tiers (the store calls it under its lock,
    except ``run`` and ``write_put``, which take the lock for their commits)."""

    def __init__(self, store: MovesHost) -> None:
        self.store = store
        self.moving: dict[bytes, ChunkTier] = {}   # chunk -> the tier its demotion reads from
        self.dest: dict[bytes, ChunkTier] = {}     # chunk -> the tier it is being demoted to
        self.held: dict[bytes, int] = {}           # chunks being read: not moved, not evicted
        self.staying: dict[bytes, int] = {}        # chunks a put builds on: they may move down, not leave
        self.writing: dict[tuple[str, bytes], int] = {}  # (tier, chunk) -> puts writing it now

    # -- holds -------------------------------------------------------------------------------
    def hold(self, chunk_keys: Sequence[bytes] | frozenset[bytes], counts: dict[bytes, int] | None = None) -> None:
        counts = self.held if counts is None else counts
        for k in chunk_keys:
            counts[k] = counts.get(k, 0) + 1

    def release(self, chunk_keys: Sequence[bytes] | frozenset[bytes], counts: dict[bytes, int] | None = None) -> None:
        counts = self.held if counts is None else counts
        for k in chunk_keys:
            left = counts.get(k, 0) - 1
            if left > 0:
                counts[k] = left
            else:
                counts.pop(k, None)

    def moving_to(self, key: bytes) -> list[ChunkTier]:
        return [self.dest[key]] if key in self.dest else []

    # -- eviction (lock held) ---------------------------------------------------------------
    def evictable(self, tier: ChunkTier, c: ChunkInfo, keep: frozenset[bytes]) -> bool:
        """May ``c``'s copy leave ``tier``? Not when in ``keep``, held or moving; yes when a
        lower tier holds it or could hold it; else it would leave the cache: only a leaf
        may, and not one a put in flight builds on (``staying``)."""
        if c.key in keep or c.key in self.held or c.key in self.moving:
            return False
        tiers = self.store.tiers
        below = tiers[tiers.index(tier) + 1:]
        if any(c.key in t or t.fits(c.size) for t in below):
            return True
        return c.key not in self.staying and self.store.children(c.key) == 0

    def evict_one(self, tier: ChunkTier, keep: frozenset[bytes], moves: list[Move]) -> bool:
        """Evict the policy's next choice from ``tier``; False when nothing may go."""
        store = self.store
        c = tier.victim(store.chunks, lambda c: self.evictable(tier, c, keep), store.clock())
        if c is None:
            return False
        self.evict_copy(tier, c, keep, moves)
        return True

    def make_room(self, tier: ChunkTier, need: int, keep: frozenset[bytes], moves: list[Move]) -> bool:
        """Evict from ``tier`` until ``need`` more bytes fit; False when they cannot."""
        if not tier.fits(need):
            return False
        while tier.overflow(need) > 0:
            if not self.evict_one(tier, keep, moves):
                return False
        return True

    def evict_copy(self, tier: ChunkTier, c: ChunkInfo, keep: frozenset[bytes], moves: list[Move]) -> None:
        """Take ``c`` out of ``tier``: dropped when a lower tier holds it, else demoted to the
        first lower tier that can make room for it, else out of the cache."""
        store = self.store
        tier.discard(c, evicted=True)
        store.counters.inc(f"evictions_{tier.name}")
        below = store.tiers[store.tiers.index(tier) + 1:]
        if any(c.key in t for t in below):
            tier.backend.delete_chunk(c.key)
            return
        for dst in below:
            if not dst.fits(c.size):
                continue
            dst.admit(c.stats)
            if self.make_room(dst, c.size, keep | {c.key}, moves):
                dst.reserved += c.size
                self.moving[c.key], self.dest[c.key] = tier, dst
                moves.append(Move(c, store.metas[c.key], dst, c.size, src=tier))
                store.counters.inc(f"demotions_{tier.name}")
                return
        store.counters.inc("evictions_chunks")
        if store.children(c.key):
            store.counters.inc("drops")  # no lower tier could make room: it goes with what continues it
        tier.backend.delete_chunk(c.key)
        store.drop_chunk(c.key)

    # -- copies up (lock held) ---------------------------------------------------------------
    def copy_up(self, chunk_keys: Sequence[bytes], payloads: dict[bytes, bytes], keep: frozenset[bytes],
                counter: str = "promotions") -> list[Move]:
        """Copy chunks (verified payloads in hand) to the top tier, keeping the lower copies;
        a memory tier takes them at once, a directory through the returned moves."""
        store = self.store
        top = store.tiers[0]
        moves: list[Move] = []
        for k in chunk_keys:
            info = store.chunks.get(k)
            if info is None or k in top or k in self.dest or not top.fits(info.size):
                continue
            top.admit(info.stats)
            if not self.make_room(top, info.size, keep, moves):
                continue
            if top.persistent:
                top.reserved += info.size
                moves.append(Move(info, store.metas[k], top, info.size, payload=payloads[k]))
            else:
                top.backend.write_chunk(store.metas[k], payloads[k])
                top.add(info, info.size)
                store.counters.inc(counter)
        return moves

    # -- running moves (lock NOT held) --------------------------------------------------------
    def run(self, moves: list[Move]) -> None:
        for mv in moves:
            error: Exception | None = None
            try:
                payload = mv.payload
                if payload is None:
                    assert mv.src is not None
                    payload = mv.src.backend.read_chunk(mv.meta.key, None)
                self.write_or_make_room(mv.dst, mv.size, frozenset([mv.info.key]),
                                        partial(mv.dst.backend.write_chunk, mv.meta, payload))
            except (OSError, CorruptRow, ChunkGone) as exc:
                error = exc
            with self.store.lock:
                self._commit(mv, error)

    def _commit(self, mv: Move, error: Exception | None) -> None:
        store = self.store
        key = mv.info.key
        mv.dst.reserved -= mv.size
        demotion = mv.src is not None
        if demotion and self.moving.get(key) is mv.src:
            del self.moving[key]
            self.dest.pop(key, None)
        alive = store.chunks.get(key) is mv.info
        if error is None and alive:
            mv.dst.add(mv.info, mv.size)
            if not demotion:
                store.counters.inc("promotions")
        elif error is None and key not in mv.dst:
            mv.dst.backend.delete_chunk(key)  # the chunk went meanwhile
        elif error is not None:
            if isinstance(error, CorruptRow):
                store.counters.inc(f"rejected_{error.reason.value}")
                store.counters.inc("rejected_total")
            else:
                store.counters.inc("saves_failed")
            if alive and store.top_tier(key) is None:
                store.counters.inc("drops")
                store.drop_chunk(key)
        if mv.src is not None and key not in mv.src:
            mv.src.backend.delete_chunk(key)

    # -- puts ----------------------------------------------------------------------------------
    def plan_put(self, namespace: bytes, fingerprint: bytes, raw: bytes, pieces: Sequence[bytes],
                 reason: SaveReason, pinned: bool, ends: tuple[int, ...], saved_by: str = "") -> PutPlan | None:
        """Under the lock: the chunks (ending at ``ends``) to write and where, room made and
        reserved, the row's stored chunks held. None when the row cannot fit
        (``saves_too_large``) or chunks before ``pieces`` are not stored (``saves_chunks_gone``:
        evicted since the caller's ``missing()`` or ``plan()``, checked here under the lock)."""
        store = self.store
        now = store.clock()
        if not check_ends(ends, len(raw) // 4, store.chunk_size):
            raise ValueError(f"chunk ends {list(ends)[:8]} are not a row of {len(raw) // 4} tokens' chunks")
        metas = chunks_of(namespace, fingerprint, raw, store.chunk_size, now, ends)
        manifest = Manifest(keys.row_key_from_bytes(namespace, raw), namespace, fingerprint, raw, store.chunk_size,
                            tuple(m.key for m in metas), reason, now, 0, pinned, ends, saved_by)
        first = len(metas) - len(pieces)
        stored = next((i for i, m in enumerate(metas) if m.key not in store.chunks), len(metas))
        covered = stored < len(metas) and store.resolve(manifest) is not None
        missing = len(metas) if covered else stored
        if first < 0:
            raise ValueError(f"{len(pieces)} chunk payloads for a row of {len(metas)} chunks")
        if first > missing:  # stored when the caller cut its pieces (``missing()``), evicted since
            store.counters.inc("saves_chunks_gone")
            return None
        last = store.tiers[-1]
        reserved = {last: manifest_size(len(raw) // 4, len(metas))}
        new: list[tuple[ChunkMeta, bytes, ChunkTier, int]] = []
        for m, p in reversed(list(zip(metas[first:], pieces))):  # the row's end first: its hottest part
            if m.key in store.chunks or covered:
                continue
            size = chunk_file_size(m.n_tokens, len(p))
            tier = next((t for t in store.entry_tiers() if t.fits(reserved.get(t, 0) + size)), None)
            if tier is None:
                store.counters.inc("saves_too_large")
                return None
            reserved[tier] = reserved.get(tier, 0) + size
            new.insert(0, (m, p, tier, size))
        keep = frozenset(manifest.chunks) | frozenset(store.resolve(manifest) or ())
        plan = PutPlan(manifest, len(metas), new, {}, keep)
        for m, _, tier, size in new:
            tier.admit(RowStats(m.key.hex(), size, m.n_tokens, now))
            self.writing[(tier.name, m.key)] = self.writing.get((tier.name, m.key), 0) + 1
        self.hold(plan.keep, self.staying)
        for tier, need in reserved.items():
            if not self.make_room(tier, need, frozenset(), plan.moves):
                plan.ok = False
                break
            tier.reserved += need
            plan.reserved[tier] = need
        return plan

    def write_put(self, plan: PutPlan) -> str | None:
        """Unlocked: the demotions the room took, the new chunks, then the manifest; then the
        commit under the lock (``commit_put``). Re-raises a write's OSError, keeping nothing."""
        self.run(plan.moves)
        error: OSError | None = None
        if plan.ok:
            try:
                self._write_files(plan)
            except OSError as exc:
                error = exc
        with self.store.lock:
            for tier, n in plan.reserved.items():
                tier.reserved -= n
            self.release(plan.keep, self.staying)
            for m, _, tier, _ in plan.new:
                left = self.writing.pop((tier.name, m.key)) - 1
                if left:
                    self.writing[(tier.name, m.key)] = left
            key = None
            if not plan.ok:
                self.store.counters.inc("saves_too_large")
            elif error is None:
                key = self._commit_put(plan)
            if key is None:
                self._undo_put(plan)
        if error is not None:
            raise error
        return key

    def _write_files(self, plan: PutPlan) -> None:
        """A put's new chunks, then its manifest (lock NOT held); a write that finds its
        tier's file system full makes room there and is tried once more (``write_or_make_room``)."""
        last = self.store.tiers[-1]
        writes: list[tuple[ChunkTier, int, Callable[[], object]]] = [
            (tier, size, partial(tier.backend.write_chunk, m, p)) for m, p, tier, size in plan.new]
        m = plan.manifest
        writes.append((last, manifest_size(m.n_tokens, len(m.chunks)), partial(last.backend.write_manifest, m)))
        for i, (tier, _, write) in enumerate(writes):
            unwritten = sum(size for t, size, _ in writes[i:] if t is tier)
            self.write_or_make_room(tier, unwritten, plan.keep, write)

    def write_or_make_room(self, tier: ChunkTier, unwritten: int, keep: frozenset[bytes],
                           write: Callable[[], object]) -> None:
        """Run ``write`` into ``tier`` (lock NOT held). When its file system is full (ENOSPC:
        a disk smaller than the tier's budget), the tier's limit is lowered to what it holds
        besides the ``unwritten`` bytes reserved for this write and the ones after it
        (``ChunkTier.file_system_full``: later puts evict before they write), chunks are
        evicted from it by its policy until they fit (not those in ``keep``), the demotions
        that takes are run, and the write is tried once more."""
        try:
            write()
            return
        except OSError as exc:
            with self.store.lock:
                if exc.errno != errno.ENOSPC or tier not in self.store.tiers:  # not full, or removed meanwhile
                    raise
                self.store.counters.inc(f"full_{tier.name}")
                tier.file_system_full(unwritten)
                moves: list[Move] = []
                while tier.overflow() > 0 and self.evict_one(tier, keep, moves):
                    pass
        self.run(moves)  # a demoted chunk's old file goes once its new copy is written below
        write()

    def _commit_put(self, plan: PutPlan) -> str | None:
        store = self.store
        m = plan.manifest
        if any(meta.parent is not None and meta.parent not in store.chunks and
               all(meta.parent != other.key for other, *_ in plan.new) for meta, *_ in plan.new):
            store.counters.inc("saves_chunks_gone")
            return None
        if not all(tier.backend.has(meta.key) for meta, _, tier, _ in plan.new):
            store.counters.inc("saves_failed")  # a copy another put published went meanwhile
            return None
        adopted, copies = [], []
        for meta, payload, tier, size in plan.new:
            info = store.chunks.get(meta.key)
            if info is None:
                info = store.adopt_chunk(meta, size, m.created_at, tier, admitted=True)
                adopted.append(info)
            else:
                tier.add(info, size)  # another put stored it meanwhile: one copy more (or the same)
            copies.append((info.key, payload))
            store.counters.inc("chunks_written")
        served_by = store.resolve(m)
        if served_by is None:
            store.counters.inc("saves_chunks_gone")
            for info in adopted:
                if info.key in store.chunks and not info.full and not info.rows and not store.children(info.key):
                    store.drop_chunk(info.key)
            return None
        store.counters.inc("chunks_shared", plan.n_chunks - len(plan.new))
        store.adopt_manifest(store.tiers[-1], m, served_by)
        if not store.tiers[0].persistent and len(store.tiers) > 1:
            self.copy_up([k for k, _ in copies], dict(copies), frozenset(k for k, _ in copies), counter="ram_copies")
        for info in adopted:
            store.absorb(info)
        if m.pinned:
            store.pin(m.key)
        store.counters.inc(f"saves_{m.reason.name.lower()}")
        return m.key

    def _undo_put(self, plan: PutPlan) -> None:
        """Delete what a put that stored nothing wrote: files no tier holds and no other put
        is writing."""
        store = self.store
        for meta, _, tier, _ in plan.new:
            if meta.key not in tier and (tier.name, meta.key) not in self.writing:
                tier.backend.delete_chunk(meta.key)
        if plan.manifest.key not in store.rows:
            store.tiers[-1].backend.delete_manifest(plan.manifest.key)
