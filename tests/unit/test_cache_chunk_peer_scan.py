"""The adopt-only rescan of chunk storage (cache/chunk_peer_scan.py, driven by
shared.PeerRows): two ChunkedCache objects over one real directory, as two replicas of a
cluster see a shared tier. A peer's rows are adopted with their chunks; nothing a live peer
has in flight is deleted or counted twice; a chunk a peer evicted turns the other's lookup
cold, counted. Stand-in payloads (the store treats them as opaque)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from waiting import wait_for

from workbench.cache import keys
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX
from workbench.cache.chunk_store import ChunkStore
from workbench.cache.chunked import ChunkedCache, chunked_cache
from workbench.cache.keys import CacheNamespace
from workbench.cache.shared import PeerRows
from workbench.cache.tiers import DiskTier, ShmTier

NS = CacheNamespace("cd" * 32, scope="tenant-a")
NS_B = CacheNamespace("cd" * 32, scope="tenant-b")
CS = 4
TURN1 = list(range(1, 19))                 # 4 full chunks + a tail of 2
TURN2 = TURN1 + [60, 61, 62, 63, 64]       # its fifth chunk covers turn 1's tail


def pieces(ns: CacheNamespace, tokens: list[int], first: int) -> list[bytes]:
    return [k * (40 + i) for i, k in enumerate(keys.chunk_keys(ns.digest(), tokens, CS))][first:]


def save(cache: ChunkedCache, tokens: list[int], ns: CacheNamespace = NS) -> str | None:
    return cache.put(ns, tokens, pieces(ns, tokens, cache.missing(ns, tokens)))


def replica(root: Path, *, shm: Path | None = None) -> ChunkedCache:
    tiers = [] if shm is None else [(ShmTier("shm", shm, None), None)]
    return chunked_cache([*tiers, (DiskTier("disk", root, None), None)], "lru", CS)


class StoppedWriter:
    """A replica whose puts stop between their chunks and their manifest until ``go``."""

    def __init__(self, root: Path) -> None:
        self.store = ChunkStore(root, None, chunk_size=CS, policy="lru")
        self.cache = ChunkedCache(self.store)
        self.at_manifest, self.go = threading.Event(), threading.Event()
        self.go.set()
        backend = self.store.tiers[-1].backend
        write_manifest = backend.write_manifest

        def stopped(m):
            self.at_manifest.set()
            self.go.wait(10)
            return write_manifest(m)

        backend.write_manifest = stopped  # type: ignore[method-assign]

    def start(self, tokens: list[int]) -> threading.Thread:
        self.at_manifest.clear()
        self.go.clear()
        writer = threading.Thread(target=save, args=(self.cache, tokens))
        writer.start()
        assert self.at_manifest.wait(10)
        return writer


def files(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in root.iterdir()}


def accounted(cache: ChunkedCache) -> int:
    return sum(t["used_bytes"] for t in cache.list_tiers())


def stored(root: Path) -> int:
    return sum(size for name, size in files(root).items() if name.endswith((CHUNK_SUFFIX, MANIFEST_SUFFIX)))


def test_a_row_one_peer_publishes_is_adopted_by_the_other_with_its_payloads(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)
    peers = PeerRows()
    assert peers.adopt(b) == 0 and b.lookup(NS, TURN1) is None
    key = save(a, TURN1)
    assert peers.adopt(b) == 1
    hit = b.lookup(NS, TURN1 + [99])
    assert hit is not None and hit.key == key and hit.n_tokens == len(TURN1)
    assert b.read(hit) == pieces(NS, TURN1, 0)  # every chunk verifies as the peer wrote it
    assert b.lookup(NS_B, TURN1) is None       # another tenant never sees it
    assert b.counters()["peer_rows_adopted"] == 1 and b.counters()["peer_chunks_adopted"] == 5
    assert accounted(b) == accounted(a) == stored(tmp_path)  # the same bytes, each counted once


def test_an_unchanged_directory_costs_no_rescan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = replica(tmp_path), replica(tmp_path)
    save(a, TURN1)
    t = os.stat(tmp_path).st_mtime_ns - 5_000_000_000
    os.utime(tmp_path, ns=(t, t))  # its last change long ago: the mtime is to be trusted
    rescans = []
    real = b.adopt_peer_files
    monkeypatch.setattr(b, "adopt_peer_files", lambda memo=None: rescans.append(1) or real(memo))
    peers = PeerRows()
    assert peers.adopt(b) == 1 and len(rescans) == 1
    assert [peers.adopt(b) for _ in range(3)] == [0, 0, 0] and len(rescans) == 1


def test_the_rescan_deletes_nothing_a_live_peer_has_in_flight(tmp_path: Path) -> None:
    peer, b = StoppedWriter(tmp_path), replica(tmp_path)
    a = peer.cache
    save(a, TURN1)
    PeerRows().adopt(b)
    writer = peer.start(TURN2)  # a's next turn, stopped between its chunks and its manifest (a live writer)
    try:
        tmp = tmp_path / f"{'e' * 32}.tmp.{os.getppid()}.0000"  # a live peer's publish before its link
        tmp.write_bytes(b"half a chunk")
        orphan = keys.chunk_keys(NS.digest(), [7] * 12, CS)[-1].hex() + CHUNK_SUFFIX  # its parent not stored
        (tmp_path / orphan).write_bytes((tmp_path / next(n for n in files(tmp_path) if n.endswith(CHUNK_SUFFIX)))
                                        .read_bytes())  # a chunk file under a name that is not its key
        before = files(tmp_path)
        scan = b.adopt_peer_files()
        assert files(tmp_path) == before  # nothing deleted: the tail without its manifest, tmp, junk
        assert scan.chunks == 2 and scan.rows == 0  # turn 2's new chunks (a full one, a tail): a servable chain
        assert b.lookup(NS, TURN2).n_tokens == len(TURN2)
    finally:
        peer.go.set()
        writer.join()
    # turn 2's manifest once written, and turn 1 again: a absorbed its tail chunk into turn
    # 2's (the file went), so b forgot the row, then found it served by the covering chunk
    assert PeerRows().adopt(b) == 2 and b.counters()["peer_rows_gone"] == 1
    assert b.lookup(NS, TURN2 + [1]).key == keys.row_key(NS.digest(), TURN2)
    assert b.read(b.match_key(NS, TURN1, keys.row_key(NS.digest(), TURN1))) is not None
    assert tmp.exists() and (tmp_path / orphan).exists()  # never b's to delete


def test_its_own_put_in_flight_is_skipped_and_counted_once(tmp_path: Path) -> None:
    a, own = replica(tmp_path), StoppedWriter(tmp_path)
    b = own.cache
    save(a, TURN1)
    writer = own.start(TURN2)  # b writes every chunk itself: it adopted nothing
    try:
        scan = b.adopt_peer_files()
        # its own chunks in flight (a's turn 1 needs four of them): left to its put, looked at again
        assert scan.deferred and (scan.chunks, scan.rows) == (0, 0)
    finally:
        own.go.set()
        writer.join()
    b.adopt_peer_files()
    assert keys.row_key(NS.digest(), TURN2) in b and len(b) == 2
    assert accounted(b) == stored(tmp_path)  # no byte counted twice


def test_a_chunk_a_peer_evicted_turns_the_lookup_cold_and_is_counted(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)
    save(a, TURN1)
    other = save(a, [90, 91, 92, 93, 94, 95])
    peers = PeerRows()
    assert peers.adopt(b) == 2
    assert a.evict_bytes(1, None) > 0 and a.evict_bytes(1 << 20, None) > 0  # a's policy takes every leaf
    assert not any(n.endswith(CHUNK_SUFFIX) for n in files(tmp_path))
    assert b.lookup(NS, TURN1) is not None  # b has not looked yet: its catalog still names them
    peers.adopt(b)
    assert b.lookup(NS, TURN1) is None and b.lookup(NS, [90, 91, 92, 93, 94, 95]) is None  # cold
    c = b.counters()
    assert c["peer_chunks_gone"] == 7 and c["peer_rows_gone"] == 2 and other not in b
    assert accounted(b) == stored(tmp_path) == 0


def test_a_read_racing_a_peers_eviction_is_a_miss(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)
    save(a, TURN1)
    PeerRows().adopt(b)
    hit = b.lookup(NS, TURN1)
    a.evict_bytes(1 << 20, None)  # between b's lookup and its read
    assert b.read(hit) is None and b.counters()["get_misses"] == 1
    assert b.lookup(NS, TURN1) is None
    # forgotten here, not rejected as a damaged file (which deletes what continues it: a peer's)
    assert b.counters().get("peer_chunks_gone", 0) >= 1 and b.counters().get("rejected_total", 0) == 0


def test_a_chain_a_peer_demoted_from_shm_to_disk_stays_held(tmp_path: Path) -> None:
    shm, disk = tmp_path / "shm", tmp_path / "disk"
    a, b = replica(disk, shm=shm), replica(disk, shm=shm)
    save(a, TURN1)
    PeerRows().adopt(b)
    assert {c["tier"] for c in b.chunk_rows()} == {"shm"}
    a.evict_bytes(1 << 20, "shm")  # a demotes every chunk to disk
    assert wait_for(lambda: not any(n.endswith(CHUNK_SUFFIX) for n in files(shm)), timeout=10)
    b.adopt_peer_files()
    assert {c["tier"] for c in b.chunk_rows()} == {"disk"} and b.counters().get("peer_chunks_gone", 0) == 0
    hit = b.lookup(NS, TURN1)
    assert hit is not None and b.read(hit) == pieces(NS, TURN1, 0)
