"""A tier whose file system is smaller than its budget (issue 24): once the disk is full a
write fails with ENOSPC; the tier then lowers its limit to what it holds, evicts by its
policy to make room, and writes again, so saves keep succeeding (the newest rows kept)
instead of failing forever. The full disk is simulated: a publish that would take a
directory's files past a capacity raises OSError(ENOSPC), as write(2) does."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from workbench.cache import chunk_backends, keys, store
from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.chunk_store import ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.keys import CacheNamespace

NS = CacheNamespace("ab" * 32)
PAYLOAD = 1000
CS = 4
CHUNK = chunk_file_size(CS, PAYLOAD)
CHUNK_ROW = 2 * CHUNK + manifest_size(2 * CS, 2)   # a row of two full chunks and its manifest


def du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.iterdir() if p.is_file())


class SmallDisk:
    """File systems of ``capacity`` bytes under the given directories: a publish there that
    would take its files past that raises ENOSPC (nothing of it is written)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capacities: dict[Path, int]) -> None:
        self.capacities = capacities
        self.refused = 0
        real = store.publish_file

        def publish(root: Path, final: Path, stem: str, parts: tuple[bytes, ...]) -> None:
            capacity = self.capacities.get(Path(root))
            if capacity is not None and du(Path(root)) + sum(len(p) for p in parts) > capacity:
                self.refused += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final))
            real(root, final, stem, parts)

        monkeypatch.setattr(chunk_backends, "publish_file", publish)   # chunks and manifests


def chunk_row(i: int) -> list[int]:
    return [i * 100 + j for j in range(2 * CS)]


def put_chunks(chunks: ChunkStore, tokens: list[int]) -> str | None:
    ks = keys.chunk_keys(NS.digest(), tokens, CS)
    first = chunks.missing(NS.digest(), tokens)
    return chunks.put_row(NS.digest(), NS.fingerprint_bytes, tokens, [(k * PAYLOAD)[:PAYLOAD] for k in ks[first:]])


def test_chunks_on_a_full_disk_evict_the_oldest_and_later_saves_evict_before_writing(tmp_path, monkeypatch):
    root = tmp_path / "c"
    chunks = ChunkStore(root, 40 * CHUNK_ROW, chunk_size=CS)          # a budget of 40 rows ...
    disk = SmallDisk(monkeypatch, {root: 5 * CHUNK_ROW + CHUNK // 2})  # ... on a disk that holds 5
    saved = [put_chunks(chunks, chunk_row(i)) for i in range(12)]
    assert all(k is not None for k in saved)
    assert chunks.counters.get("saves_failed") == 0 and chunks.counters.get("full_c") == 1
    assert disk.refused == 1
    assert [k in chunks for k in saved] == [False] * 7 + [True] * 5   # lru: the oldest went
    [tier] = chunks.tiers
    assert tier.full_at == 5 * CHUNK_ROW and tier.budget == 40 * CHUNK_ROW
    assert du(root) == tier.used == 5 * CHUNK_ROW
    for k in saved:
        if k in chunks:
            m, served_by, got = chunks.read_row(k)
            assert got == [(c * PAYLOAD)[:PAYLOAD] for c in served_by]


def test_chunks_demoted_onto_a_full_disk_make_room_there(tmp_path, monkeypatch):
    shm, disk_root = tmp_path / "shm", tmp_path / "disk"
    chunks = ChunkStore(tiers=[ChunkTier.directory(shm, "shm", 4 * CHUNK, "lru", kind="shm"),
                               ChunkTier.directory(disk_root, "disk", 40 * CHUNK_ROW, "lru")], chunk_size=CS)
    disk = SmallDisk(monkeypatch, {disk_root: 5 * CHUNK_ROW})
    saved = [put_chunks(chunks, chunk_row(i)) for i in range(12)]
    assert all(k is not None for k in saved)
    assert chunks.counters.get("saves_failed") == 0 and chunks.counters.get("full_disk") == disk.refused == 1
    assert [k in chunks for k in saved] == [False] * 6 + [True] * 6
    assert du(disk_root) <= 5 * CHUNK_ROW and du(disk_root) == chunks.tier("disk").used
    for k in saved:
        if k in chunks:
            m, served_by, got = chunks.read_row(k)
            assert got == [(c * PAYLOAD)[:PAYLOAD] for c in served_by]
