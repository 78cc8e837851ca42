"""Files in a tier directory that a writer of ours never produced: a FIFO, a symlink or a
directory under a row's or a chunk's name, a sparse file whose valid header claims a 40 GiB
payload, a corrupt payload behind a valid header. None may block, flood memory or be served;
start-up stays fast; each is counted once, not at every start-up."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest
import xxhash

from workbench.cache import format as fmt
from workbench.cache import keys, store
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX
from workbench.cache.chunk_store import ChunkStore
from workbench.cache.format import HEADER_SIZE, RowMeta, encode_row
from workbench.cache.keys import CacheNamespace, row_key, token_bytes
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier, RamTier
from workbench.cache.types import SaveReason

NS = CacheNamespace("cd" * 32)
HUGE = 40 << 30


def meta_for(tokens: list[int]) -> RowMeta:
    raw = token_bytes(tokens)
    return RowMeta(row_key(NS.digest(), raw), NS.digest(), NS.fingerprint_bytes, raw, SaveReason.FINISH, 1.0)


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


def test_a_fifo_swapped_in_for_an_adopted_row_is_a_rejection_not_a_hang(tmp_path: Path) -> None:
    cache = TieredCache([RamTier("ram", 1 << 20), DiskTier("disk", tmp_path, None)])
    key = cache.put(NS, [1, 2, 3], b"kv" * 100, tier="disk")
    assert key is not None
    path = store.row_path(tmp_path, key)
    path.unlink()
    os.mkfifo(path)
    payload, took = call_with_deadline(lambda: cache.get(key), path)
    assert payload is None and took < 2
    counters = cache.counters()
    assert counters["rejected_not_regular"] == 1 and key not in cache
    assert not path.exists()  # removed, so the next process does not meet it either


def test_the_scan_refuses_fifos_and_symlinks_under_row_names(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    good = meta_for([5, 6, 7])
    store.publish_row(root, good, b"x" * 64)
    elsewhere = tmp_path / "outside"
    elsewhere.mkdir()
    linked = meta_for([8, 9])
    store.publish_row(elsewhere, linked, b"y" * 64)
    os.symlink(store.row_path(elsewhere, linked.key), store.row_path(root, linked.key))
    fifo = store.row_path(root, meta_for([10]).key)
    os.mkfifo(fifo)
    cache = TieredCache([DiskTier("disk", root, None)])
    reports, took = call_with_deadline(cache.scan, fifo)
    assert took < 2
    assert reports["disk"].rejected == {"not_regular": 2}  # type: ignore[index]
    assert cache.keys() == [good.key]
    assert sorted(os.listdir(root)) == [store.row_path(root, good.key).name]
    assert store.row_path(elsewhere, linked.key).exists()  # the link target is not ours to delete


def write_sparse_row(root: Path, tokens: list[int], payload_len: int) -> str:
    """A row file whose header (with a valid header checksum) claims `payload_len` bytes of
    payload, extended to that size with a hole: what a hostile or broken writer can leave."""
    meta = meta_for(tokens)
    head = bytearray(encode_row(meta, b""))
    struct.pack_into("<Q", head, 24, payload_len)
    check = xxhash.xxh3_64_intdigest(bytes(head[:HEADER_SIZE - 8]) + meta.tokens)
    struct.pack_into("<Q", head, HEADER_SIZE - 8, check)
    path = store.row_path(root, meta.key)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + payload_len)
    os.chmod(path, 0o600)
    return meta.key


def test_a_sparse_40_gib_row_is_refused_by_a_bounded_tier_at_once(tmp_path: Path) -> None:
    key = write_sparse_row(tmp_path, [1, 2, 3, 4], HUGE)
    cache = TieredCache([DiskTier("disk", tmp_path, 1 << 30)])
    start = time.monotonic()
    reports = cache.scan()
    assert time.monotonic() - start < 1.0
    assert reports["disk"].rejected == {"too_large": 1}
    assert key not in cache and os.listdir(tmp_path) == []


def test_a_sparse_40_gib_row_in_an_unbounded_tier_is_adopted_fast_and_refused_at_read(tmp_path: Path) -> None:
    key = write_sparse_row(tmp_path, [1, 2, 3, 4], HUGE)
    cache = TieredCache([DiskTier("disk", tmp_path, None)])
    start = time.monotonic()
    cache.scan()
    assert time.monotonic() - start < 1.0  # was 54 s: the payload was hashed at start-up
    assert key in cache
    start = time.monotonic()
    assert cache.get(key, max_payload=64 << 20) is None  # the reader's bound (the engine's)
    assert time.monotonic() - start < 1.0
    assert cache.counters()["rejected_too_large"] == 1
    assert key not in cache and os.listdir(tmp_path) == []


def test_start_up_reads_no_payload_and_a_corrupt_one_is_never_served(tmp_path: Path, monkeypatch) -> None:
    rows = [meta_for([i, i + 1, i + 2]) for i in range(200)]
    for m in rows:
        store.publish_row(tmp_path, m, bytes([len(rows) % 251]) * (256 << 10))
    bad = store.row_path(tmp_path, rows[7].key)
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0x40  # payload only: header and tokens still verify
    bad.write_bytes(bytes(data))

    hashed: list[int] = []
    real = fmt._read_payload

    def spy(f, length, algo, checksum, verify, keep):
        if verify:
            hashed.append(length)
        return real(f, length, algo, checksum, verify, keep)

    monkeypatch.setattr(fmt, "_read_payload", spy)
    cache = TieredCache([DiskTier("disk", tmp_path, None)])
    start = time.monotonic()
    cache.scan()
    took = time.monotonic() - start
    assert hashed == [] and len(cache) == 200, "the start-up scan hashed payloads"
    assert took < 2.0, f"scan of 200 rows took {took:.2f} s"
    assert cache.get(rows[7].key) is None  # verified at its first read: rejected, not served
    assert hashed == [256 << 10]
    counters = cache.counters()
    assert counters["rejected_payload_checksum"] == 1 and not bad.exists()
    assert cache.get(rows[8].key) == bytes([200 % 251]) * (256 << 10)


# --- a directory under a cache file's name ----------------------------------------------------

CS = 4


def scan_rejected(storage: str, root: Path) -> dict[str, int]:
    """A fresh cache's start-up scan of `root`: what it rejected, by reason."""
    if storage == "rows":
        return dict(TieredCache([DiskTier("disk", root, None)]).scan()["disk"].rejected)
    return ChunkStore(root, chunk_size=CS).scan()


def cache_names(storage: str) -> list[str]:
    """Names a scan of `storage` reads: a row file, or a chunk and a manifest."""
    key = meta_for([1, 2, 3]).key
    if storage == "rows":
        return [store.row_path(Path("."), key).name]
    return [keys.chunk_keys(NS.digest(), [1, 2, 3], CS)[0].hex() + CHUNK_SUFFIX, key + MANIFEST_SUFFIX]


@pytest.mark.parametrize("storage", ["rows", "chunks"])
@pytest.mark.parametrize("content", ["empty", "files"])
def test_a_directory_under_a_cache_name_is_removed_by_the_scan_and_counted_once(
        tmp_path: Path, storage: str, content: str) -> None:
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not the cache's")
    names = cache_names(storage)
    for name in names:
        (root / name).mkdir()
        if content == "files":
            (root / name / "data").write_bytes(b"x" * 10)
            os.mkfifo(root / name / "fifo")
            os.symlink(outside, root / name / "link")
    assert scan_rejected(storage, root) == {"not_regular": len(names)}
    assert os.listdir(root) == []
    assert outside.read_bytes() == b"not the cache's"  # a link inside is removed, never followed
    assert scan_rejected(storage, root) == {}  # it was counted once, not at every start-up


@pytest.mark.parametrize("storage", ["rows", "chunks"])
def test_a_directory_holding_directories_is_set_aside_not_deleted(tmp_path: Path, storage: str) -> None:
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    name = cache_names(storage)[0]
    (root / name / "sub").mkdir(parents=True)
    (root / name / "sub" / "keep").write_bytes(b"someone's")
    assert scan_rejected(storage, root) == {"not_regular": 1}
    [aside] = os.listdir(root)
    assert aside.startswith(name + store.REJECTED_MARK)
    assert (root / aside / "sub" / "keep").read_bytes() == b"someone's"  # no tree the cache did not make is deleted
    assert scan_rejected(storage, root) == {}


def test_a_directory_swapped_in_for_an_adopted_row_is_rejected_and_removed_at_read(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)])
    key = cache.put(NS, [1, 2, 3], b"kv" * 100)
    assert key is not None
    path = store.row_path(tmp_path, key)
    path.unlink()
    path.mkdir()
    (path / "data").write_bytes(b"x")
    assert cache.get(key) is None and key not in cache
    assert cache.counters()["rejected_not_regular"] == 1 and not path.exists()
    assert scan_rejected("rows", tmp_path) == {}


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
    assert scan_rejected("chunks", tmp_path) == {}
