"""An adopt-only rescan of a chunk store's directories while other processes (live peers:
the replicas of a cluster, two notebooks) write to them too. The rescan sees the store
through ``PeerHost``; what it remembers between looks is the caller's ``PeerMemo``.

The start-up scan (chunk_tier_scan.py) may delete what it cannot place, because at start-up
nobody else writes. Against a live peer that would delete what is only in flight: a tail
chunk whose manifest is not written yet, a chunk whose parent the peer is publishing, a
manifest whose chunks the peer is evicting. This rescan deletes **nothing**:

* Chunk files the catalog does not hold are adopted parent first (verified as the start-up
  scan verifies them: header, tokens, sizes, the key recomputed; payloads at their first
  read), held by the tier whose directory holds them; a chunk whose parent is not held
  waits (kept in the ``PeerMemo`` with its header, so a later rescan adopts it once its
  parent comes, without reading it again). A tail chunk no manifest names is adopted as a
  servable chain (a leaf, evicted by the policy in time), not deleted.
* Manifests of rows the catalog does not hold are adopted when all their chunks are held
  (else they wait, as chunks do).
* Skipped, for their writer to commit: a chunk this process is writing (a put in flight),
  a manifest all of whose chunks a put of this process builds on (its own row, published
  and not yet committed). The result says ``deferred`` then, so the caller looks again.
* A file that fails its checks is left alone (and not read again while it is the same file);
  tmp files are never touched.
* A chunk the catalog holds whose file vanished from a tier since the last look (a peer
  evicted or demoted it): the copy is dropped from that tier's accounting; when no tier
  holds it any more, :func:`forget_chunk` drops the chunk from this catalog with what
  continues it and the rows naming them (``peer_chunks_gone``), deleting no file.

Bytes are never counted twice: a chunk is adopted once (by key), a copy once per tier; each
process accounts what its own catalog holds (its own writes and what it adopted).
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable, Mapping, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workbench.cache.chunk_backends import ChunkDir
from workbench.cache.chunk_format import (
    CHUNK_SUFFIX,
    MANIFEST_SUFFIX,
    ChunkMeta,
    Manifest,
    chunk_file_size,
    manifest_size,
    read_chunk,
    read_manifest,
)
from workbench.cache.chunk_catalog import ChunkInfo
from workbench.cache.chunk_tier_moves import TierMoves
from workbench.cache.chunk_tier_scan import ScanHost, adopt_parent_first
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.format import CorruptRow
from workbench.cache.store import TMP_MARK


class PeerHost(ScanHost, Protocol):
    """What the peer rescan sees of its store (`chunk_store.ChunkStore` is one): a scan's
    view, plus the lock, the moves in flight (``moves``: held, moving, being written, built
    on), and what forgetting a chunk or a row takes: the catalog's ``pop_chunk`` /
    ``pop_row``, the metas, the manifests' tiers and the byte count ``used``."""

    used: int

    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def moves(self) -> TierMoves: ...
    @property
    def kids(self) -> Mapping[bytes, set[bytes]]: ...
    @property
    def metas(self) -> MutableMapping[bytes, ChunkMeta]: ...
    @property
    def manifest_at(self) -> MutableMapping[str, ChunkTier]: ...

    def holders(self, key: bytes) -> list[ChunkTier]: ...
    def pop_chunk(self, key: bytes) -> ChunkInfo: ...
    def pop_row(self, key: str) -> tuple[Manifest, tuple[bytes, ...]] | None: ...

# what a file read gave: a chunk (meta, size), a manifest, or None (it failed its checks)
Parsed = tuple[ChunkMeta, int] | Manifest | None


@dataclass(slots=True)
class PeerMemo:
    """What the last look saw, so a look reads only what changed since: each tier's file
    names (``listed``; a look after one that forgot chunks or skipped its own files in
    flight, ``full``, considers them all again), and the files it read but could not adopt
    yet, (tier, name) -> (inode, what it held), not read again while the file is the same."""

    files: dict[tuple[str, str], tuple[int, Parsed]] = field(default_factory=dict)
    listed: dict[str, set[str]] = field(default_factory=dict)
    full: bool = True


@dataclass(slots=True)
class PeerScan:
    """What one rescan did."""

    chunks: int = 0         # chunk files adopted
    rows: int = 0           # manifests adopted
    waiting: int = 0        # files kept for later: a parent or a chunk not held yet
    gone: int = 0           # chunks this catalog held whose files peers removed
    deferred: bool = False  # something of this process's own in flight was skipped: look again


def rescan(store: PeerHost, memo: PeerMemo | None = None) -> PeerScan:
    """Adopt what peers published to the store's directories since the last look (see the
    module doc); nothing is deleted."""
    memo = PeerMemo() if memo is None else memo
    tiers = [t for t in store.tiers if t.persistent and isinstance(t.backend, ChunkDir)]
    full = memo.full or any(t.name not in memo.listed for t in tiers)
    with store.lock:
        before = {t.name: set(t.sizes) for t in tiers}
    listed = {t.name: _listing(_root(t)) for t in tiers}
    out = PeerScan()
    with store.lock:
        gone = {t.name: before[t.name] if full else _gone(memo.listed[t.name], listed[t.name]) for t in tiers}
        _vanished(store, tiers, before, gone, listed, out)  # first: a row it forgets may be adopted again below
        wanted = {t.name: [n for n in _candidates(t.name, listed[t.name], memo, full)
                           if _is_new(n, store.chunks, store.rows)] for t in tiers}
    parsed = {t.name: _read_new(t.name, _root(t), wanted[t.name], memo) for t in tiers}
    with store.lock:
        _adopt_chunks(store, tiers, parsed, out)
        _adopt_manifests(store, tiers, parsed, out)
    memo.listed = listed
    memo.full = out.deferred or out.gone > 0
    return out


def _gone(last: set[str], now: set[str]) -> set[bytes]:
    """Keys of the chunk files listed last time and not now."""
    return {bytes.fromhex(n[:-len(CHUNK_SUFFIX)]) for n in last - now if n.endswith(CHUNK_SUFFIX)
            and _is_hex(n[:-len(CHUNK_SUFFIX)])}


def _candidates(tier: str, now: set[str], memo: PeerMemo, full: bool) -> Iterable[str]:
    """The names to consider: all (``full``), else those new since the last listing and
    those read before and still waiting."""
    if full:
        return now
    return (now - memo.listed[tier]) | {n for (t, n) in memo.files if t == tier and n in now}


def _root(tier: ChunkTier) -> Path:
    assert isinstance(tier.backend, ChunkDir)
    return tier.backend.root


def _listing(root: Path) -> set[str]:
    """Chunk and manifest file names in ``root`` (tmp files left out)."""
    try:
        return {n for n in os.listdir(root) if n.endswith((CHUNK_SUFFIX, MANIFEST_SUFFIX)) and TMP_MARK not in n}
    except OSError:
        return set()


def _read_new(tier: str, root: Path, wanted: Iterable[str], memo: PeerMemo) -> dict[str, Parsed]:
    """The ``wanted`` files (the catalog does not hold them) read, unlocked, or from the memo
    when the same file (by inode) was read before; the memo keeps only files still wanted."""
    wanted = set(wanted)
    for stale in [k for k in memo.files if k[0] == tier and k[1] not in wanted]:
        del memo.files[stale]
    out: dict[str, Parsed] = {}
    for name in wanted:
        try:
            inode = os.stat(root / name, follow_symlinks=False).st_ino
        except OSError:
            continue  # went since the listing
        seen = memo.files.get((tier, name))
        if seen is not None and seen[0] == inode:
            out[name] = seen[1]
            continue
        got = _read(root / name, name)
        if not isinstance(got, _Vanished):
            out[name] = got
            memo.files[(tier, name)] = (inode, got)
    return out


def _is_new(name: str, chunks: Container[bytes], rows: Container[str]) -> bool:
    if name.endswith(MANIFEST_SUFFIX):
        return name[:-len(MANIFEST_SUFFIX)] not in rows
    stem = name[:-len(CHUNK_SUFFIX)]
    return not _is_hex(stem) or bytes.fromhex(stem) not in chunks  # not a key: read, and refused by its checks


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


class _Vanished:
    """The file went between the listing and its read."""


def _read(path: Path, name: str) -> Parsed | _Vanished:
    try:
        if name.endswith(CHUNK_SUFFIX):
            meta, _, length = read_chunk(path, load_payload=False)
            return (meta, chunk_file_size(meta.n_tokens, length)) if name == meta.key.hex() + CHUNK_SUFFIX else None
        m = read_manifest(path)
        return m if name == m.key + MANIFEST_SUFFIX else None
    except CorruptRow:
        return None
    except FileNotFoundError:
        return _Vanished()
    except OSError:
        return None  # unreadable: left alone


def _vanished(store: PeerHost, tiers: list[ChunkTier], before: dict[str, set[bytes]], gone: dict[str, set[bytes]],
              listed: dict[str, set[str]], out: PeerScan) -> None:
    """Copies held before the listing and still held whose files (among ``gone``) the
    listing did not show: a peer removed them (lock held). This process's own moves are
    left to finish."""
    busy = store.moves.held.keys() | store.moves.moving.keys() | store.moves.dest.keys()
    for tier in tiers:
        for key in gone[tier.name] & before[tier.name]:
            name = key.hex() + CHUNK_SUFFIX
            if key not in tier or key in busy or name in listed[tier.name]:
                continue
            info = store.chunks[key]
            tier.discard(info, evicted=False)
            moved = next((t for t in tiers if t is not tier and name in listed[t.name] and key not in t), None)
            if moved is not None:  # a peer demoted or promoted it: its copy there is held instead
                moved.admit(info.stats)
                moved.add(info, info.size)
            if not store.holders(key):
                out.gone += forget_chunk(store, key)


def forget_chunk(store: PeerHost, key: bytes) -> int:
    """Drop a chunk from this catalog only (its file went: a peer evicted it), with every
    chunk continuing it and the rows naming them; no file is deleted (they may be a peer's)
    except this process's own memory copies. Counted as ``peer_chunks_gone``; returns how
    many chunks went (lock held)."""
    info = store.chunks.get(key)
    if info is None:
        return 0
    n = sum(forget_chunk(store, child) for child in list(store.kids.get(key, ())))
    for row in list(info.rows):
        forget_row(store, row)
    store.pop_chunk(key)
    store.metas.pop(key, None)
    for t in store.holders(key):
        t.discard(info, evicted=False)
        if not t.persistent:
            t.backend.delete_chunk(key)
    store.used -= info.size
    store.counters.inc("peer_chunks_gone")
    return n + 1


def forget_row(store: PeerHost, key: str) -> None:
    """Drop a row from this catalog only (its manifest file stays; lock held)."""
    popped = store.pop_row(key)
    if popped is None:
        return
    m, _ = popped
    tier = store.manifest_at.pop(key, None)
    if tier is not None:
        size = manifest_size(m.n_tokens, len(m.chunks))
        tier.used -= size
        store.used -= size
    store.counters.inc("peer_rows_gone")


def _adopt_chunks(store: PeerHost, tiers: list[ChunkTier], parsed: dict[str, dict[str, Parsed]],
                  out: PeerScan) -> None:
    """New chunks, parent first over every tier (lock held)."""
    writing = store.moves.writing
    pending: dict[bytes, tuple[ChunkMeta, list[tuple[ChunkTier, int]]]] = {}
    for tier in tiers:
        for got in parsed[tier.name].values():
            if not isinstance(got, tuple) or got[0].n_tokens > store.chunk_size:
                continue
            meta, size = got
            if (tier.name, meta.key) in writing or meta.key in store.moves.dest:
                out.deferred = True  # this process's own put or demotion: it commits it
                continue
            if meta.key not in store.chunks:
                pending.setdefault(meta.key, (meta, []))[1].append((tier, size))
    out.chunks += adopt_parent_first(store, pending)
    out.waiting += len(pending)
    if out.chunks:
        store.counters.inc("peer_chunks_adopted", out.chunks)


def _adopt_manifests(store: PeerHost, tiers: list[ChunkTier], parsed: dict[str, dict[str, Parsed]],
                     out: PeerScan) -> None:
    """New manifests whose chunks are all held, in the last tier (where manifests live; lock
    held). One whose chunks a put of this process builds on may be that put's own row."""
    last = store.tiers[-1]
    if last not in tiers:
        return
    staying = store.moves.staying
    for got in parsed[last.name].values():
        if not isinstance(got, Manifest) or got.key in store.rows or got.chunk_size != store.chunk_size:
            continue
        if got.chunks and all(k in staying for k in got.chunks):
            out.deferred = True
            continue
        served_by = store.resolve(got)
        if served_by is None:
            out.waiting += 1
            out.deferred = out.deferred or any((t.name, k) in store.moves.writing for t in tiers for k in got.chunks)
            continue
        store.adopt_manifest(last, got, served_by)
        out.rows += 1
    if out.rows:
        store.counters.inc("peer_rows_adopted", out.rows)


__all__ = ["PeerMemo", "PeerScan", "forget_chunk", "forget_row", "rescan"]
