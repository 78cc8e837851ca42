"""PeerRows without a model: two caches over one directory, as two replicas see a shared
tier. A row one publishes is adopted by the other at its next look, under its tenant scope
only; a look at an unchanged directory costs a stat (no listing, no scan); a look after a
peer published reads only the new row files (chunk storage: test_cache_chunk_peer_scan.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from workbench.cache import store
from workbench.cache.keys import CacheNamespace
from workbench.cache.shared import PeerRows
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier, RamTier

NS = CacheNamespace("cd" * 32, scope="tenant-a")
NS_B = CacheNamespace("cd" * 32, scope="tenant-b")
TOKENS = list(range(1, 41))


def replica_cache(root: Path) -> TieredCache:
    return TieredCache([DiskTier("disk", root, None)], policy="lru")


class Looks:
    """Counts the listings a PeerRows makes and the row files its scans read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listings = self.scans = 0
        self.read: list[str] = []
        listdir, scan_files = os.listdir, store.scan_files

        def counted_listdir(path: str) -> list[str]:
            self.listings += 1
            return listdir(path)

        def counted_scan(root: Path, names: list[str], **kw: object) -> object:
            self.scans += 1
            self.read += names
            return scan_files(root, names, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr("workbench.cache.shared.os.listdir", counted_listdir)
        monkeypatch.setattr("workbench.cache.row_scans.store.scan_files", counted_scan)


def age(root: Path, seconds: float) -> None:
    """Set the directory's mtime back, as if its last change were `seconds` ago."""
    t = os.stat(root).st_mtime_ns - int(seconds * 1e9)
    os.utime(root, ns=(t, t))


def test_a_row_one_cache_publishes_is_adopted_by_the_other_at_its_next_look(tmp_path: Path, monkeypatch) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    peers = PeerRows()
    looks = Looks(monkeypatch)
    assert peers.adopt(b) == 0 and b.lookup(NS, TOKENS) is None
    key = a.put(NS, TOKENS, b"kv" * 50)
    assert peers.adopt(b) == 1 and looks.scans == 1
    hit = b.lookup(NS, TOKENS + [99])
    assert hit is not None and hit.key == key and hit.n_tokens == len(TOKENS)
    assert b.get(key) == b"kv" * 50  # the payload verifies as the peer wrote it
    assert b.lookup(NS_B, TOKENS) is None  # another tenant never sees it


def test_an_unchanged_directory_costs_no_listing_and_no_scan(tmp_path: Path, monkeypatch) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    a.put(NS, TOKENS, b"kv" * 50)
    age(tmp_path, 5.0)
    peers = PeerRows()
    looks = Looks(monkeypatch)
    assert peers.adopt(b) == 1 and (looks.listings, looks.scans) == (1, 1)
    for _ in range(3):
        assert peers.adopt(b) == 0
    assert (looks.listings, looks.scans) == (1, 1)
    b.put(NS, TOKENS[:20], b"own" * 10)  # its own row changes the directory: listed, no file read
    assert peers.adopt(b) == 0 and looks.listings == 2 and len(looks.read) == 1


def test_a_look_reads_only_the_row_files_new_to_the_cache(tmp_path: Path, monkeypatch) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    peers = PeerRows()
    for n in (10, 20, 30):
        a.put(NS, TOKENS[:n], b"kv" * n)
    assert peers.adopt(b) == 3
    looks = Looks(monkeypatch)
    key = a.put(NS, TOKENS, b"kv" * 50)
    assert peers.adopt(b) == 1 and looks.read == [f"{key}.kv"]  # not the three it holds
    assert b.get(key) == b"kv" * 50


def test_a_row_published_in_the_same_mtime_tick_as_the_last_look_is_not_missed(tmp_path: Path) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    peers = PeerRows()
    assert peers.adopt(b) == 0
    before = os.stat(tmp_path).st_mtime_ns
    a.put(NS, TOKENS, b"kv" * 50)
    os.utime(tmp_path, ns=(before, before))  # a coarse clock: the publish left the mtime as it was
    assert peers.adopt(b) == 1 and b.lookup(NS, TOKENS) is not None


def test_a_peer_write_in_progress_is_neither_adopted_nor_removed(tmp_path: Path) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    key = a.put(NS, TOKENS, b"kv" * 50)
    assert key is not None
    tmp = tmp_path / f"{'e' * len(key)}.tmp.{os.getppid()}.0000"  # a live peer process
    tmp.write_bytes(b"half a row")  # a peer's publish before its link: not a row yet
    assert PeerRows().adopt(b) == 1
    assert tmp.exists() and len(b) == 1


def test_a_row_this_process_is_writing_is_left_to_its_put(tmp_path: Path) -> None:
    published, go = threading.Event(), threading.Event()
    tier = DiskTier("disk", tmp_path, None)
    b = TieredCache([tier], policy="lru")
    write = tier.write

    def stopped(meta, payload):  # published, then stopped before the put commits it
        size = write(meta, payload)
        published.set()
        go.wait(10)
        return size

    tier.write = stopped  # type: ignore[method-assign]
    writer = threading.Thread(target=b.put, args=(NS, TOKENS, b"kv" * 50), kwargs={"live": True})
    writer.start()
    try:
        assert published.wait(10)
        assert PeerRows().adopt(b) == 0 and len(b) == 0  # its own row: the put commits it
    finally:
        go.set()
        writer.join()
    assert [r["live"] for r in b.rows()] == [True]  # the put's stats, not the header's
    assert b.counters()["bytes_disk"] == (tmp_path / f"{b.keys()[0]}.kv").stat().st_size  # counted once


def test_a_ram_only_cache_has_no_peer_rows(tmp_path: Path) -> None:
    ram = TieredCache([RamTier("ram", 1 << 20)])
    ram.put(NS, TOKENS, b"kv" * 50)
    assert PeerRows().adopt(ram) == 0
