"""A chunked cache's tiers after it was built: the order rule, default directories, adding a
tier and removing one (``add_tier`` / ``remove_tier``), over a `ChunkStore`'s public surface.

* **Order.** At most one tier of each kind, fastest first: ram, shm, disk. A tier added goes
  to its kind's place; ``position``, when given, must be that place.
* **Adding** a tier moves nothing, except in one case: a persistent tier added under a store
  whose only tier is RAM (the default cache). RAM then holds copies only (a manifest never
  names a chunk that lives only in process memory), so its chunks are first written to the
  new tier, parents first, each kept in RAM as a copy, then its manifests. A chunk the new
  tier's budget cannot take leaves the cache with every chunk continuing it and every row
  naming one. Otherwise an upper tier fills by promotion and copies, a lower one by
  demotion, and puts write new chunks to the first persistent tier that takes them. A
  persistent tier is then scanned: what it held from before is adopted.
* **Removing** a tier, as for rows: its copies leave it, nothing is moved down first; chunks
  no other tier holds leave the cache, with every chunk continuing them and every row naming
  one (the rows that left are returned). Manifests it held are rewritten into the new last
  tier for the rows that stay. Its files stay (a later ``add_tier`` over its root adopts
  them) unless ``purge``, which deletes the chunk and manifest files it held; a RAM tier's
  copies always go. A chunked cache keeps at least one tier.
* **Writes in flight.** Both wait until no chunk is being written, moved or read (a cache
  busy past ``BUSY_S`` refuses, ``TiersBusy``); the chunk copies of an added tier are
  written outside the store's lock, the manifests moved by a removal under it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.cache.chunk_format import manifest_size
from workbench.cache.chunk_store import ChunkStore, check_tiers
from workbench.cache.chunk_tiers import ChunkTier, Move
from workbench.cache.policies import PolicySpec
from workbench.cache.tiers import FileTier, RamTier, Tier, default_disk_root, default_shm_root
from workbench.errors import InvalidOption

KIND_ORDER = {"ram": 0, "shm": 1, "disk": 2}
#: What chunk storage accepts as tiers (the message of InvalidOption otherwise).
CHUNK_TIERS = ("at most one tier of each kind, fastest first: ram, shm, disk (a RAM tier alone keeps the chunks "
               "in memory; above shm or disk it holds copies of their chunks); shm and disk each with a root of "
               "its own")
BUSY_S = 30.0  # how long add_tier / remove_tier wait for writes in flight


class TiersBusy(InvalidOption):
    """Chunk writes or moves stayed in flight past ``BUSY_S``: the tiers were not changed."""


def default_root(kind: str, name: str) -> Path:
    """Where a shm or disk chunk tier without a root keeps its files: beside, never inside,
    the directories version 1 row files were kept in by default (a chunk directory's scan
    deletes row files)."""
    rows = default_shm_root(name) if kind == "shm" else default_disk_root(name)
    return rows.parent.with_name(rows.parent.name + "-chunks") / name


def in_order(kinds: Sequence[str]) -> bool:
    ranks = [KIND_ORDER.get(k, -1) for k in kinds]
    return -1 not in ranks and ranks == sorted(set(ranks))


def to_chunk_tier(tier: Tier, policy: PolicySpec) -> ChunkTier:
    """The chunk tier for one of ``shared.make_tier``'s tiers: RAM in memory, shm and disk as
    directories with their budgets."""
    if isinstance(tier, RamTier):
        return ChunkTier.memory(tier.name, tier.budget_bytes, policy)
    if isinstance(tier, FileTier):
        return ChunkTier.directory(tier.root, tier.name, tier.budget_bytes, policy, kind=tier.kind)
    raise InvalidOption("tiers", tier.name, CHUNK_TIERS, "cache")


def place_of(store: ChunkStore, tier: ChunkTier, position: int | None) -> int:
    """Where ``tier`` goes among the store's tiers; InvalidOption when its kind is there
    already, its name is taken or ``position`` is not its kind's place."""
    kinds = [t.kind for t in store.tiers]
    if tier.kind in kinds:
        raise InvalidOption("kind", tier.kind, f"a kind the chunked cache has no tier of yet ({CHUNK_TIERS})", "tier")
    if tier.name in {t.name for t in store.tiers}:
        raise InvalidOption("name", tier.name, "a tier name not in use", "tier")
    place = sum(KIND_ORDER[k] < KIND_ORDER[tier.kind] for k in kinds)
    if position is not None and position != place:
        raise InvalidOption("position", position, f"{place}, the place of a {tier.kind} tier ({CHUNK_TIERS})", "tier")
    return place


def wait_idle(store: ChunkStore) -> None:
    """Return with the store's lock held once no chunk is being written, moved or read."""
    deadline = time.monotonic() + BUSY_S
    while True:
        store.lock.acquire()
        m = store.moves
        if not (m.moving or m.dest or m.held or m.staying or m.writing or any(t.reserved for t in store.tiers)):
            return
        store.lock.release()
        if time.monotonic() > deadline:
            raise TiersBusy("tiers", [t.name for t in store.tiers], f"no chunk write in flight within {BUSY_S:.0f} s",
                            "cache")
        time.sleep(0.005)


def add_tier(store: ChunkStore, tier: ChunkTier, position: int | None = None) -> None:
    """Add ``tier`` at its kind's place (see the module doc); the caller scans it."""
    wait_idle(store)
    try:
        place = place_of(store, tier, position)
        store.tiers = check_tiers([*store.tiers[:place], tier, *store.tiers[place:]])
        moves = _plan_copies(store)
    finally:
        store.lock.release()
    _settle(store, moves)


def remove_tier(store: ChunkStore, name: str, purge: bool = False) -> int:
    """Detach the tier ``name`` (see the module doc); returns how many rows left the cache."""
    wait_idle(store)
    try:
        tier = store.tier(name)
        if len(store.tiers) == 1:
            raise InvalidOption("tier", name, "a tier other than the chunked cache's only one (configure_cache "
                                "replaces it)", "tier")
        rows_before = set(store.rows)
        held = list(tier.sizes)
        store.tiers = check_tiers([t for t in store.tiers if t is not tier])
        for key in held:
            info = store.chunks.get(key)
            if info is not None:
                tier.discard(info, evicted=False)
            if purge or not tier.persistent:
                tier.backend.delete_chunk(key)
        _rehome_manifests(store, tier, purge)
        for key in [k for k in held if k in store.chunks and not store.holders(k)]:
            store.drop_chunk(key)
        moves = _plan_copies(store)
    finally:
        store.lock.release()
    _settle(store, moves)
    with store.lock:
        return len(rows_before - set(store.rows))


def _plan_copies(store: ChunkStore) -> list[Move]:
    """When RAM is above persistent tiers, moves writing the chunks it alone holds to the
    first persistent tier, parents first, each held until written; a chunk that tier cannot
    make room for is not planned (``_settle`` drops it). Lock held."""
    ram, entry = store.tiers[0], store.entry_tiers()[0]
    if ram.persistent or not entry.persistent:
        return []
    lone = [store.chunks[k] for k in ram.sizes if k in store.chunks and len(store.holders(k)) == 1]
    moves: list[Move] = []
    for info in sorted(lone, key=lambda c: _depth(store, c.key)):
        entry.admit(info.stats)
        if not store.moves.make_room(entry, info.size, frozenset(), moves):
            continue
        entry.reserved += info.size
        store.moves.hold([info.key])
        moves.append(Move(info, store.metas[info.key], entry, info.size, src=ram))
    return moves


def _depth(store: ChunkStore, key: bytes) -> int:
    depth, parent = 0, store.chunks[key].parent
    while parent is not None and parent in store.chunks:
        depth, parent = depth + 1, store.chunks[parent].parent
    return depth


def _settle(store: ChunkStore, moves: list[Move]) -> None:
    """Run the planned copies (unlocked), then, when persistent tiers exist, drop the chunks
    none of them holds and move RAM's manifests to the last tier; then bring the last tier
    within its budget (the manifests it took)."""
    store.moves.run(moves)
    room: list[Move] = []
    with store.lock:
        store.moves.release([mv.info.key for mv in moves if mv.src is not None and not mv.src.persistent])
        persistent = [t for t in store.tiers if t.persistent]
        if persistent and not store.tiers[0].persistent:
            for key in [k for k in store.chunks if not any(k in t for t in persistent)]:
                store.drop_chunk(key)
            _move_manifests(store, store.tiers[0], store.tiers[-1])
        store.moves.make_room(store.tiers[-1], 0, frozenset(), room)
    store.moves.run(room)


def _move_manifests(store: ChunkStore, src: ChunkTier, dst: ChunkTier) -> None:
    """The manifests ``src`` held, rewritten in ``dst`` (lock held)."""
    for key in [k for k, t in store.manifest_at.items() if t is src]:
        m = store.rows[key]
        size = manifest_size(m.n_tokens, len(m.chunks))
        dst.backend.write_manifest(m)
        src.used -= size
        dst.used += size
        store.manifest_at[key] = dst


def _rehome_manifests(store: ChunkStore, tier: ChunkTier, purge: bool) -> None:
    """The removed tier's manifests: rewritten in the new last tier for rows whose chunks all
    stay; the others are forgotten here, so dropping their chunks leaves the file alone."""
    last = store.tiers[-1]
    for key in [k for k, t in store.manifest_at.items() if t is tier]:
        m = store.rows[key]
        size = manifest_size(m.n_tokens, len(m.chunks))
        del store.manifest_at[key]
        if purge:
            tier.backend.delete_manifest(key)
        if all(store.holders(k) for k in store.row_chunks[key]):
            last.backend.write_manifest(m)
            last.used += size
            store.manifest_at[key] = last
        else:
            store.used -= size


def fill_roots(tiers: Iterable[Any]) -> list[Any]:
    """Tier specs with the default chunk directory given to a shm or disk tier without a
    root (``default_root``); anything else unchanged (configure_cache checks it)."""
    out: list[Any] = []
    for spec in tiers:
        if isinstance(spec, Mapping) and spec.get("kind") in ("shm", "disk") and spec.get("root") is None:
            name = spec.get("name") or spec["kind"]
            spec = {**spec, "root": os.fspath(default_root(spec["kind"], name))} if isinstance(name, str) else spec
        out.append(spec)
    return out
