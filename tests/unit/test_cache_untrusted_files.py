"""Files in a tier directory that a writer of ours never produced: a FIFO, a symlink or a
directory under a chunk's or a manifest's name, a corrupt payload behind a valid header. None
may block, flood memory or be served; start-up stays fast; each is counted once, not at
every start-up. (A sparse file whose valid header claims a 40 GiB payload:
test_cache_chunk_store.py.)"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from workbench.cache import chunk_scan, keys, store
from workbench.cache import format as fmt
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.keys import CacheNamespace, row_key

NS = CacheNamespace("cd" * 32)


def whole_rows(root: Path) -> ChunkStore:
    return ChunkStore(root, None, chunk_size=WHOLE_ROWS)


def put(chunks: ChunkStore, tokens: list[int], payload: bytes) -> str:
    key = chunks.put_row(NS.digest(), NS.fingerprint_bytes, tokens, [payload])
    assert key is not None
    return key


def chunk_path(root: Path, tokens: list[int]) -> Path:
    """The file of a whole row's one chunk."""
    return root / (keys.chunk_keys(NS.digest(), tokens, WHOLE_ROWS)[0].hex() + CHUNK_SUFFIX)


def call_with_deadline(fn, fifo: Path, seconds: float = 5.0):
    """Run fn in a thread; if it is still blocked after `seconds`, open the FIFO for writing
    (which releases a reader stuck in open) and fail."""
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail(f"blocked for more than {seconds} s on a FIFO")
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("value"), time.monotonic() - start


def test_a_fifo_swapped_in_for_an_adopted_chunk_is_a_rejection_not_a_hang(tmp_path: Path) -> None:
    chunks = whole_rows(tmp_path)
    key = put(chunks, [1, 2, 3], b"kv" * 100)
    path = chunk_path(tmp_path, [1, 2, 3])
    path.unlink()
    os.mkfifo(path)

    def read() -> str:
        with pytest.raises(fmt.CorruptRow, match="not_regular"):
            chunks.read_row(key)
        return "refused"

    got, took = call_with_deadline(read, path)
    assert got == "refused" and took < 2
    assert chunks.counters.get("rejected_not_regular") == 1 and key not in chunks
    assert not path.exists()  # removed, so the next process does not meet it either


def test_the_scan_refuses_fifos_and_symlinks_under_chunk_names(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "tier", tmp_path / "outside"
    good = put(whole_rows(root), [5, 6, 7], b"x" * 64)
    put(whole_rows(elsewhere), [8, 9], b"y" * 64)
    target = chunk_path(elsewhere, [8, 9])
    os.symlink(target, chunk_path(root, [8, 9]))
    fifo = chunk_path(root, [10])
    os.mkfifo(fifo)
    fresh = whole_rows(root)
    rejected, took = call_with_deadline(fresh.scan, fifo)
    assert took < 2
    assert rejected == {"not_regular": 2}
    assert list(fresh.rows) == [good]
    assert sorted(os.listdir(root)) == sorted([chunk_path(root, [5, 6, 7]).name, good + MANIFEST_SUFFIX])
    assert target.exists()  # the link target is not ours to delete


def test_start_up_reads_no_payload_and_a_corrupt_one_is_never_served(tmp_path: Path, monkeypatch) -> None:
    rows = [[i, i + 1, i + 2] for i in range(0, 600, 3)]
    writer = whole_rows(tmp_path)
    for t in rows:
        put(writer, t, bytes([len(rows) % 251]) * (256 << 10))
    bad = chunk_path(tmp_path, rows[7])
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0x40  # payload only: header and tokens still verify
    bad.write_bytes(bytes(data))

    loaded: list[str] = []
    real = chunk_scan.read_chunk

    def spy(path, *, load_payload=True, max_payload=None):
        if load_payload:
            loaded.append(os.fspath(path))
        return real(path, load_payload=load_payload, max_payload=max_payload)

    monkeypatch.setattr(chunk_scan, "read_chunk", spy)
    fresh = whole_rows(tmp_path)
    start = time.monotonic()
    fresh.scan()
    took = time.monotonic() - start
    assert loaded == [] and len(fresh.rows) == 200, "the start-up scan read payloads"
    assert took < 2.0, f"scan of 200 rows took {took:.2f} s"
    with pytest.raises(fmt.CorruptRow, match="payload_checksum"):
        fresh.read_row(row_key(NS.digest(), rows[7]))   # verified at its first read: not served
    assert fresh.counters.get("rejected_payload_checksum") == 1 and not bad.exists()
    assert fresh.read_row(row_key(NS.digest(), rows[8]))[2] == [bytes([200 % 251]) * (256 << 10)]


# --- a directory under a cache file's name ----------------------------------------------------

CS = 4


def scan_rejected(root: Path) -> dict[str, int]:
    """A fresh cache's start-up scan of `root`: what it rejected, by reason."""
    return ChunkStore(root, chunk_size=CS).scan()


def cache_names() -> list[str]:
    """Names a scan reads: a chunk and a manifest."""
    key = row_key(NS.digest(), [1, 2, 3])
    return [keys.chunk_keys(NS.digest(), [1, 2, 3], CS)[0].hex() + CHUNK_SUFFIX, key + MANIFEST_SUFFIX]


@pytest.mark.parametrize("content", ["empty", "files"])
def test_a_directory_under_a_cache_name_is_removed_by_the_scan_and_counted_once(tmp_path: Path, content: str) -> None:
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not the cache's")
    names = cache_names()
    for name in names:
        (root / name).mkdir()
        if content == "files":
            (root / name / "data").write_bytes(b"x" * 10)
            os.mkfifo(root / name / "fifo")
            os.symlink(outside, root / name / "link")
    assert scan_rejected(root) == {"not_regular": len(names)}
    assert os.listdir(root) == []
    assert outside.read_bytes() == b"not the cache's"  # a link inside is removed, never followed
    assert scan_rejected(root) == {}  # it was counted once, not at every start-up


def test_a_directory_holding_directories_is_set_aside_not_deleted(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    name = cache_names()[0]
    (root / name / "sub").mkdir(parents=True)
    (root / name / "sub" / "keep").write_bytes(b"someone's")
    assert scan_rejected(root) == {"not_regular": 1}
    [aside] = os.listdir(root)
    assert aside.startswith(name + store.REJECTED_MARK)
    assert (root / aside / "sub" / "keep").read_bytes() == b"someone's"  # no tree the cache did not make is deleted
    assert scan_rejected(root) == {}


def test_a_directory_swapped_in_for_an_adopted_chunk_is_rejected_and_removed_at_read(tmp_path: Path) -> None:
    chunks = ChunkStore(tmp_path, chunk_size=CS)
    tokens = list(range(10))
    ks = keys.chunk_keys(NS.digest(), tokens, CS)
    row = chunks.put_row(NS.digest(), NS.fingerprint_bytes, tokens, [k * 10 for k in ks])
    assert row is not None
    path = tmp_path / (ks[1].hex() + CHUNK_SUFFIX)
    path.unlink()
    path.mkdir()
    (path / "data").write_bytes(b"x")
    with pytest.raises(fmt.CorruptRow, match="not_regular"):
        chunks.read_row(row)
    assert row not in chunks and not path.exists()
    assert chunks.counters.get("rejected_not_regular") == 1
    assert scan_rejected(tmp_path) == {}
