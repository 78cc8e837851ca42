"""A chunk store's start-up scan over all its persistent tiers (each directory read by
chunk_scan.py), so a chain spanning shm and disk is adopted whole. The scan sees the store
through ``ScanHost``.

* Chunks that verify are adopted parent first over the union of the tiers (a chunk whose
  parent no tier holds is an orphan: deleted from every tier, ``orphans_removed``); a chunk
  found in several tiers (a promoted copy, a demotion killed after its new copy was
  published) is held by each.
* Manifests are adopted, the last tier's first, when all their chunks are present (else
  ``rejected_missing_chunk``); a second manifest of a row already adopted is deleted.
* Then, as in one directory: tails absorbed by the chunk that covers them, and tail chunks
  no manifest names (a writer killed between its chunks and its manifest) deleted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from workbench.cache.chunk_catalog import ChunkInfo
from workbench.cache.chunk_format import ChunkMeta, Manifest
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.counters import Counters
from workbench.cache.store import unlink_quietly


class ScanHost(Protocol):
    """What a scan sees of its store (`chunk_store.ChunkStore` is one): the tiers, the
    catalog, and the store's calls that adopt, absorb and drop chunks and rows."""

    @property
    def tiers(self) -> Sequence[ChunkTier]: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def chunks(self) -> Mapping[bytes, ChunkInfo]: ...
    @property
    def rows(self) -> Mapping[str, Manifest]: ...
    @property
    def manifest_at(self) -> Mapping[str, ChunkTier]: ...

    def children(self, key: bytes) -> int: ...
    def resolve(self, m: Manifest) -> tuple[bytes, ...] | None: ...
    def adopt_chunk(self, meta: ChunkMeta, size: int, created_at: float, tier: ChunkTier, *,
                    admitted: bool = False) -> ChunkInfo: ...
    def adopt_manifest(self, tier: ChunkTier, m: Manifest, served_by: tuple[bytes, ...]) -> None: ...
    def absorb(self, c: ChunkInfo) -> None: ...
    def drop_chunk(self, key: bytes) -> None: ...


def scan_tiers(store: ScanHost, tmp_ttl_s: float) -> dict[str, int]:
    """Adopt what the store's directories hold (lock held); rejected files by reason."""
    rejected: dict[str, int] = {}

    def reject(path: str, reason: str) -> None:
        unlink_quietly(path)
        rejected[reason] = rejected.get(reason, 0) + 1
        store.counters.inc(f"rejected_{reason}")
        store.counters.inc("rejected_total")

    found: dict[bytes, tuple[ChunkMeta, list[tuple[ChunkTier, int]]]] = {}
    manifests: list[tuple[ChunkTier, str, Manifest]] = []
    for tier in store.tiers:
        if not tier.persistent:
            continue
        contents = tier.backend.scan(reject, tmp_ttl_s)
        store.counters.inc("orphans_removed", contents.tmp_removed)
        for k, (meta, size) in contents.chunks.items():
            found.setdefault(k, (meta, []))[1].append((tier, size))
        manifests[:0] = [(tier, path, m) for path, m in contents.manifests]  # the last tier's first
    _adopt_chains(store, found)
    for tier, path, m in manifests:
        if m.key in store.rows:
            if store.manifest_at.get(m.key) is not tier:
                unlink_quietly(path)
            continue
        served_by = store.resolve(m)
        if served_by is None:
            reject(path, "missing_chunk")
            continue
        store.adopt_manifest(tier, m, served_by)
    for info in list(store.chunks.values()):
        if info.key in store.chunks:
            store.absorb(info)  # a writer killed between a chunk and the absorption
    for info in [c for c in store.chunks.values() if not c.full and not c.rows and not store.children(c.key)]:
        store.counters.inc("orphans_removed")
        store.drop_chunk(info.key)
    return rejected


Found = dict[bytes, tuple[ChunkMeta, list[tuple[ChunkTier, int]]]]  # chunk key -> (its meta, its copies: tier, size)


def adopt_parent_first(store: ScanHost, pending: Found) -> int:
    """Adopt the pending chunks whose parent is held (or that start a chain), parents first,
    each copy in its tier, until none is left that can be; the adopted leave ``pending``.
    Returns how many were adopted (lock held). The start-up scan and the peer rescan's rule."""
    adopted, progress = 0, True
    while pending and progress:
        progress = False
        for k, (meta, copies) in list(pending.items()):
            if meta.parent is None or meta.parent in store.chunks:
                (tier, size), *others = copies
                info = store.adopt_chunk(meta, size, meta.created_at, tier)
                for other, other_size in others:
                    other.admit(info.stats)
                    other.add(info, other_size)
                del pending[k]
                adopted += 1
                progress = True
    return adopted


def _adopt_chains(store: ScanHost, found: Found) -> None:
    """Adopt chunks parent first; a chunk whose parent is absent is an orphan."""
    pending = {k: v for k, v in found.items() if k not in store.chunks}
    adopt_parent_first(store, pending)
    for k, (_, copies) in pending.items():
        store.counters.inc("orphans_removed")
        for tier, _ in copies:
            tier.backend.delete_chunk(k)
