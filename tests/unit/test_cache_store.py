"""Row files on disk: publish protocol, permissions, scan (adopt, reject, orphans)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from workbench.cache import store
from workbench.cache.format import RowMeta, read_row
from workbench.cache.keys import CacheNamespace, row_key, token_bytes
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier, RamTier, ShmTier
from workbench.cache.types import SaveReason

NS = CacheNamespace("ab" * 32)


def meta_for(tokens: list[int], ns: CacheNamespace = NS) -> RowMeta:
    raw = token_bytes(tokens)
    return RowMeta(row_key(ns.digest(), raw), ns.digest(), ns.fingerprint_bytes, raw, SaveReason.FINISH, 1.0)


def test_publish_creates_private_files_and_dirs(tmp_path: Path) -> None:
    root = store.ensure_private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    m = meta_for([1, 2, 3])
    size = store.publish_row(root, m, b"payload")
    path = store.row_path(root, m.key)
    assert size == path.stat().st_size
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_row(path).payload == b"payload"
    assert os.listdir(root) == [path.name]  # no tmp left behind


def test_publishing_an_existing_key_keeps_the_first_file(tmp_path: Path) -> None:
    m = meta_for([1, 2, 3])
    store.publish_row(tmp_path, m, b"first")
    store.publish_row(tmp_path, m, b"second")
    assert read_row(store.row_path(tmp_path, m.key)).payload == b"first"
    assert len(os.listdir(tmp_path)) == 1


def test_refuses_a_directory_others_can_use(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(PermissionError):
        store.ensure_private_dir(shared)


def test_scan_adopts_good_rows_and_removes_bad_ones(tmp_path: Path) -> None:
    good = [meta_for([i, i + 1]) for i in range(3)]
    for m in good:
        store.publish_row(tmp_path, m, b"x" * 100)
    bad = meta_for([99, 98])
    store.publish_row(tmp_path, bad, b"y" * 100)
    path = store.row_path(tmp_path, bad.key)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    store.row_path(tmp_path, "ff" * 16).write_bytes(b"garbage that is not a row")  # bad magic
    misnamed = store.row_path(tmp_path, "ee" * 16)
    misnamed.write_bytes(store.row_path(tmp_path, good[0].key).read_bytes())
    (tmp_path / "notes.txt").write_text("not ours")  # left alone
    report = store.scan_dir(tmp_path)
    assert sorted(m.key for m, _ in report.rows) == sorted(m.key for m in good)
    assert report.rejected == {"payload_checksum": 1, "bad_magic": 1, "key_mismatch": 1}
    kept = [store.row_path(tmp_path, m.key).name for m in good] + ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == sorted(kept)


def test_scan_with_expected_fingerprint_removes_other_models(tmp_path: Path) -> None:
    other = CacheNamespace("cd" * 32)
    store.publish_row(tmp_path, meta_for([1]), b"a")
    store.publish_row(tmp_path, meta_for([1], other), b"b")
    report = store.scan_dir(tmp_path, expected_fingerprint=NS.fingerprint_bytes)
    assert [m.fingerprint for m, _ in report.rows] == [NS.fingerprint_bytes]
    assert report.rejected == {"wrong_fingerprint": 1}


def test_scan_removes_orphans_of_dead_writers_only(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f"{'aa' * 16}.tmp.{dead_pid}.0badf00d").write_bytes(b"half a row")
    (tmp_path / f"{'bb' * 16}.tmp.{os.getpid()}.12345678").write_bytes(b"being written")
    report = store.scan_dir(tmp_path)
    assert report.orphans_removed == 1 and report.tmp_kept == 1
    assert os.listdir(tmp_path) == [f"{'bb' * 16}.tmp.{os.getpid()}.12345678"]
    old = tmp_path / f"{'bb' * 16}.tmp.{os.getpid()}.12345678"
    os.utime(old, (1, 1))  # older than the TTL: an orphan even if the pid is alive
    assert store.scan_dir(tmp_path, tmp_ttl_s=60).orphans_removed == 1
    assert os.listdir(tmp_path) == []


def test_cache_scan_counts_rejections_and_restores_rows(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)], policy="lru")
    keys = [cache.put(NS, list(range(n)), bytes([n]) * 50) for n in range(1, 6)]
    path = store.row_path(tmp_path, keys[0])  # type: ignore[arg-type]
    path.write_bytes(path.read_bytes()[:-7])  # truncated
    (tmp_path / f"{keys[1]}.tmp.999999999.00000000").write_bytes(b"")
    fresh = TieredCache([RamTier("ram", 10_000), DiskTier("disk", tmp_path, None)], policy="lru")
    reports = fresh.scan()
    assert reports["disk"].rejected == {"truncated": 1}
    counters = fresh.counters()
    assert counters["rejected_truncated"] == 1 and counters["rejected_total"] == 1
    assert counters["orphans_removed"] == 1
    assert sorted(fresh.keys()) == sorted(keys[1:])
    assert fresh.cached_prefix_len(NS, list(range(10))) == 5
    assert fresh.get(keys[4]) == bytes([5]) * 50  # type: ignore[arg-type]


def test_shm_tier_default_root_under_dev_shm() -> None:
    """The one test that touches the real /dev/shm: a unique subfolder, removed after."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    parent = Path("/dev/shm") / f"workbench-{os.getuid()}"
    parent_existed = parent.exists()
    name = f"unit-test-{uuid.uuid4().hex}"
    try:
        tier = ShmTier(name, budget_bytes=1 << 20)
        assert tier.root == parent / name
        assert stat.S_IMODE(os.stat(tier.root).st_mode) == 0o700
        cache = TieredCache([tier], policy="lru")
        key = cache.put(NS, [1, 2, 3], b"kv" * 100)
        assert (tier.root / f"{key}.kv").exists()
        assert cache.get(key) == b"kv" * 100  # type: ignore[arg-type]
    finally:
        shutil.rmtree(parent / name, ignore_errors=True)
        if not parent_existed:
            shutil.rmtree(parent, ignore_errors=True)


def test_tier_roots_that_cannot_be_used_are_named(tmp_path: Path) -> None:
    from workbench.cache.shared import make_tier
    from workbench.errors import InvalidOption

    a_file = tmp_path / "file"
    a_file.write_text("x")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    for root, why in ((a_file, "is not a directory"), (shared, "accessible to other users"),
                      ("/proc/no-such-dir", "No such file"), (42, "a directory path")):
        with pytest.raises(InvalidOption, match=why) as e:
            make_tier({"kind": "disk", "root": root})
        assert e.value.key == "root"
