"""Durability of the publish path: the fsyncs and their order, and a simulated power loss.

kill -9 never loses the page cache, so the SIGKILL tests cannot tell whether a chunk or a
manifest was fsynced. These tests can: one records the system calls of `store.publish_file`
under a row's put (its chunk, then its manifest) and checks fsync(tmp) -> link (or rename)
-> fsync(directory) for each file; the other replays the writes of
a series of puts through a model of a disk that keeps only what was fsynced (file data at
its file's last fsync, directory entries at their directory's last fsync), cuts the power
after every single call in turn, and restarts a cache on what survived. After every cut,
0 corrupt rows may be served, and every row whose put had returned must be there intact.
Removing either fsync from the publish path fails both tests.
"""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path

import pytest

from workbench.cache import store
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.format import CorruptRow
from workbench.cache.keys import CacheNamespace, row_key

NS = CacheNamespace("ef" * 32)
WATCHED = ("open", "write", "fsync", "close", "link", "rename", "unlink")


class PowerCut(BaseException):
    """The power went off before this call (a BaseException: nothing may catch it)."""


class Disk:
    """Wraps the os calls of the store module; records them and what an fsync made durable."""

    def __init__(self, cut_at: int | None = None) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.paths: dict[int, str] = {}
        self.synced_data: dict[int, bytes] = {}             # inode -> content at its last fsync
        self.synced_dirs: dict[str, dict[str, int]] = {}    # dir -> {name: inode} at its last fsync
        self.cut_at = cut_at

    def proxy(self) -> types.SimpleNamespace:
        ns = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        for name in WATCHED:
            setattr(ns, name, self._wrap(name, getattr(os, name)))
        return ns

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            if self.cut_at is not None and len(self.calls) >= self.cut_at:
                raise PowerCut(name)
            self.calls.append((name, tuple(self._label(a) for a in args)))
            result = real(*args, **kwargs)
            if name == "open":
                self.paths[result] = os.fspath(args[0])
            elif name == "fsync":
                self._sync(self.paths[args[0]])
            return result
        return call

    def _label(self, arg):
        if isinstance(arg, int) and arg in self.paths:
            return self.paths[arg]
        return os.fspath(arg) if isinstance(arg, os.PathLike) else arg

    def _sync(self, path: str) -> None:
        if os.path.isdir(path):
            self.synced_dirs[path] = {n: os.stat(os.path.join(path, n)).st_ino for n in os.listdir(path)}
        else:
            with open(path, "rb") as f:
                self.synced_data[os.fstat(f.fileno()).st_ino] = f.read()

    def after_power_loss(self, root: Path, into: Path) -> Path:
        """The directory as a disk would have it after the cut: names from the last fsync of
        the directory, each file's data from its last fsync (none: an empty file)."""
        into.mkdir(mode=0o700)
        for name, inode in self.synced_dirs.get(os.fspath(root), {}).items():
            path = into / name
            path.write_bytes(self.synced_data.get(inode, b""))
            os.chmod(path, 0o600)
        return into


def payload_for(n: int) -> bytes:
    return bytes([n % 251]) * (1000 + 37 * n)


def tokens_for(n: int) -> list[int]:
    return list(range(n, n + 5 + n % 7))


def put(root: Path, tokens: list[int], payload: bytes) -> str | None:
    """A whole-row put into a store over ``root`` (its one chunk, then its manifest)."""
    return ChunkStore(root, None, chunk_size=WHOLE_ROWS).put_row(NS.digest(), NS.fingerprint_bytes, tokens, [payload])


def published(disk: Disk, how: str) -> list[tuple[str, str]]:
    """(tmp name, final name) of each file published with ``how`` ('link' or 'rename')."""
    return [args for name, args in disk.calls if name == how and ".tmp." in args[0]]


def assert_synced_around(disk: Disk, tmp: str, publish_at: int, root: Path) -> None:
    """Its data fsynced before it gets its name, the directory fsynced after."""
    writes = [i for i, (name, args) in enumerate(disk.calls) if name == "write" and args[0] == tmp]
    sync_tmp = disk.calls.index(("fsync", (tmp,)))
    sync_dir = next(i for i, c in enumerate(disk.calls) if c == ("fsync", (os.fspath(root),)) and i > publish_at)
    assert writes and max(writes) < sync_tmp < publish_at < sync_dir, disk.calls
    unlink = next(i for i, (name, args) in enumerate(disk.calls) if name == "unlink" and args[0] == tmp)
    assert unlink < sync_dir  # the tmp name's removal is made durable too


def test_publish_fsyncs_the_file_then_links_then_fsyncs_the_directory(tmp_path: Path, monkeypatch) -> None:
    disk = Disk()
    monkeypatch.setattr(store, "os", disk.proxy())
    assert put(tmp_path, [1, 2, 3], b"kv" * 500) is not None
    files = published(disk, "link")
    assert [Path(final).suffix for _, final in files] == [CHUNK_SUFFIX, MANIFEST_SUFFIX]
    for tmp, final in files:
        assert_synced_around(disk, tmp, disk.calls.index(("link", (tmp, final))), tmp_path)


def test_the_rename_fallback_keeps_the_same_order(tmp_path: Path, monkeypatch) -> None:
    disk = Disk()
    proxy = disk.proxy()

    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported here")

    proxy.link = no_links
    monkeypatch.setattr(store, "os", proxy)
    assert put(tmp_path, [4, 5], b"kv" * 100) is not None
    files = published(disk, "rename")
    assert [Path(final).suffix for _, final in files] == [CHUNK_SUFFIX, MANIFEST_SUFFIX]
    for tmp, final in files:
        assert_synced_around(disk, tmp, disk.calls.index(("rename", (tmp, final))), tmp_path)


EXPECTED = {row_key(NS.digest(), tokens_for(n)): n for n in range(8)}


def run_until_cut(root: Path, cut_at: int | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Disk, dict[str, int]]:
    """Put rows 0..7 (row 5 twice) until the power is cut; return the disk and the rows whose
    put returned (key -> n)."""
    disk = Disk(cut_at)
    with monkeypatch.context() as m:
        m.setattr(store, "os", disk.proxy())
        cache = ChunkStore(root, None, chunk_size=WHOLE_ROWS)
        acknowledged: dict[str, int] = {}
        try:
            for n in (0, 1, 2, 3, 4, 5, 5, 6, 7):
                key = cache.put_row(NS.digest(), NS.fingerprint_bytes, tokens_for(n), [payload_for(n)])
                assert key is not None
                acknowledged[key] = n
        except PowerCut:
            pass
    return disk, acknowledged


def read(cache: ChunkStore, key: str) -> bytes | None:
    """The row's payload as a restore gets it (its one chunk, verified); None when it is not
    served."""
    try:
        _, _, pieces = cache.read_row(key)
    except (KeyError, CorruptRow):
        return None
    return b"".join(pieces)


def test_after_a_power_cut_at_any_call_no_corrupt_row_is_served_and_no_acknowledged_row_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    full, _ = run_until_cut(tmp_path / "full", None, monkeypatch)
    n_calls = len(full.calls)
    assert n_calls > 40
    served_corrupt = lost = 0
    for cut in range(n_calls + 1):
        disk, acknowledged = run_until_cut(tmp_path / f"run{cut}", cut, monkeypatch)
        survived = disk.after_power_loss(tmp_path / f"run{cut}", tmp_path / f"after{cut}")
        cache = ChunkStore(survived, None, chunk_size=WHOLE_ROWS)
        cache.scan()
        for key in list(cache.rows):
            payload = read(cache, key)
            if payload is not None and (key not in EXPECTED or payload != payload_for(EXPECTED[key])):
                served_corrupt += 1
        for key, n in acknowledged.items():
            if read(cache, key) != payload_for(n):
                lost += 1
    assert served_corrupt == 0
    assert lost == 0, f"{lost} acknowledged rows lost over {n_calls + 1} power cuts"
