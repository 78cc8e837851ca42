"""Tier directories: private directories, the crash-safe publish (first writer wins, no tmp
file left), tmp files of dead writers at a scan, the tiers users describe and the roots they
cannot use. (What a scan adopts and rejects: test_cache_chunk_store.py; fsync order:
test_cache_durability.py.)"""

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
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.keys import CacheNamespace
from workbench.cache.tiers import ShmTier

NS = CacheNamespace("ab" * 32)


def publish(root: Path, name: str, data: bytes) -> Path:
    final = root / f"{name}.kvc"
    store.publish_file(root, final, name, (data[:3], data[3:]))
    return final


def test_publish_creates_private_files_and_dirs(tmp_path: Path) -> None:
    root = store.ensure_private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    path = publish(root, "ab" * 16, b"header+payload")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == b"header+payload"
    assert os.listdir(root) == [path.name]  # no tmp left behind


def test_publishing_an_existing_name_keeps_the_first_file(tmp_path: Path) -> None:
    publish(tmp_path, "ab" * 16, b"first")
    path = publish(tmp_path, "ab" * 16, b"second")
    assert path.read_bytes() == b"first"
    assert len(os.listdir(tmp_path)) == 1


def test_refuses_a_directory_others_can_use(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(PermissionError):
        store.ensure_private_dir(shared)


def sweep(root: Path, ttl: float = 600.0) -> tuple[store.TmpSweep, list[str]]:
    tmp = store.TmpSweep()
    return tmp, [e.name for e in store.scan_entries(root, ttl, tmp)]


def test_a_scan_removes_tmp_files_of_dead_writers_only(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f"{'aa' * 16}.tmp.{dead_pid}.0badf00d").write_bytes(b"half a chunk")
    alive = tmp_path / f"{'bb' * 16}.tmp.{os.getpid()}.12345678"
    alive.write_bytes(b"being written")
    (tmp_path / "notes.txt").write_text("not ours")
    tmp, seen = sweep(tmp_path)
    assert (tmp.removed, tmp.kept, seen) == (1, 1, ["notes.txt"])     # tmp files are never handed on
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, "notes.txt"])
    os.utime(alive, (1, 1))  # older than the TTL: an orphan even if the pid is alive
    assert sweep(tmp_path, ttl=60)[0].removed == 1
    assert os.listdir(tmp_path) == ["notes.txt"]


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
        chunks = ChunkStore(tier.root, tier.budget_bytes, chunk_size=WHOLE_ROWS)
        key = chunks.put_row(NS.digest(), NS.fingerprint_bytes, [1, 2, 3], [b"kv" * 100])
        assert key is not None and (tier.root / f"{key}.kvm").exists()
        assert chunks.read_row(key)[2] == [b"kv" * 100]
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
