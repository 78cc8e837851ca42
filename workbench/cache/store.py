"""Files in a tier directory: private directories, the crash-safe publish, and what a
start-up scan does with tmp files and entries no writer of ours made.

Publish protocol (`publish_file`: a reader or a crash never sees a half-written chunk
`<key>.kvc` or manifest `<row key>.kvm`):

  1. create `<stem>.tmp.<pid>.<random>` with O_CREAT|O_EXCL, mode 0600
  2. write the file's parts; fsync the file
  3. link(2) it to its final name: fails if the file exists, so a published file is never
     replaced (same key = same tokens and namespace = same KV, so the first writer wins);
     rename(2) is the fallback on file systems without hard links
  4. unlink the tmp name; fsync the directory so the new name survives power loss

A crash leaves at worst a tmp file, which the next scan removes once its writer is gone
(`scan_entries`, `is_orphan`). Directories are created 0700 and must belong to us: shared
/dev/shm is world-writable, and someone else's directory there must never be trusted. A
directory planted under a cache file's name is met once (`remove_planted_dir`).
"""

from __future__ import annotations

import errno
import os
import stat
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROW_SUFFIX = ".kv"  # a version 1 row file: a scan deletes it (format.py)
TMP_MARK = ".tmp."


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) with mode 0700; refuse one we do not own or that
    others can access."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
    if st.st_mode & 0o077:  # KV state reveals the prompts it was computed from
        raise PermissionError(
            f"{path} is accessible to other users (mode {st.st_mode & 0o777:o}); "
            "chmod 700 it or choose another root"
        )
    return path


def tmp_path(root: Path, key: str) -> Path:
    return root / f"{key}{TMP_MARK}{os.getpid()}.{secrets.token_hex(4)}"


def fsync_dir(root: Path) -> None:
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def publish_file(root: Path, final: Path, stem: str, parts: tuple[bytes, ...]) -> None:
    """The publish protocol of the module doc for any file of `root` (KV chunks,
    manifests): tmp file `<stem>.tmp.<pid>.<random>`, write, fsync, link (first writer
    wins), unlink the tmp name, fsync the directory."""
    tmp = tmp_path(root, stem)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            for part in parts:
                _write_all(fd, part)
            os.fsync(fd)
        finally:
            os.close(fd)
        _link_or_rename(tmp, final)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass  # renamed into place
    fsync_dir(root)


def _link_or_rename(tmp: Path, final: Path) -> None:
    try:
        os.link(tmp, final)
    except FileExistsError:
        return
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if not final.exists():
            os.rename(tmp, final)


@dataclass(slots=True)
class TmpSweep:
    """The tmp files a directory scan met: orphans it deleted, and the rest (writers at work)."""

    removed: int = 0
    kept: int = 0


def scan_entries(root: Path, tmp_ttl_s: float, tmp: TmpSweep) -> Iterator[os.DirEntry[str]]:
    """The entries of `root` other than tmp files, for a start-up scan; each tmp file on
    the way is deleted when it is an orphan (`is_orphan`), and counted in `tmp`."""
    now = time.time()
    for entry in os.scandir(root):
        if TMP_MARK not in entry.name:
            yield entry
        elif is_orphan(entry, now, tmp_ttl_s):
            unlink_quietly(entry.path)
            tmp.removed += 1
        else:
            tmp.kept += 1


def is_orphan(entry: os.DirEntry[str], now: float, ttl: float) -> bool:
    """A tmp file is an orphan when its writer process is gone or it is older than `ttl`."""
    try:
        age = now - entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False
    if age > ttl:
        return True
    try:
        pid = int(entry.name.split(TMP_MARK, 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def unlink_quietly(path: str | Path) -> None:
    """Delete the entry under a cache file's name in a tier directory, whatever it is: a
    file, a FIFO, a symlink (never its target) or a planted directory (`remove_planted_dir`);
    nothing when it is gone already or cannot be deleted."""
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno in _UNLINK_DIR_ERRNOS:
            remove_planted_dir(path)


# unlink(2) of a directory: EISDIR on Linux, EPERM where POSIX's answer is kept
_UNLINK_DIR_ERRNOS = (errno.EISDIR, errno.EPERM)
REJECTED_MARK = ".rejected-"


def remove_planted_dir(path: str | Path) -> None:
    """A directory under a cache file's name (`<key>.kvc`, `<key>.kv`, ...) in a tier
    directory. The cache never makes one, so it never deletes a tree it did not make: the
    directory goes when it is empty or holds no directory (its entries unlinked, symlinks
    not followed, then rmdir); one holding directories is renamed to
    `<name>.rejected-<random>`, a name no scan reads. Either way a scan meets it once
    (one `rejected_not_regular`), not at every start-up. Errors leave it as it is."""
    path = Path(path)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return
        with os.scandir(path) as it:
            entries = list(it)
        if any(e.is_dir(follow_symlinks=False) for e in entries):
            os.rename(path, path.with_name(f"{path.name}{REJECTED_MARK}{secrets.token_hex(4)}"))
            return
        for e in entries:
            os.unlink(e.path)
        os.rmdir(path)
    except OSError:
        pass  # a permission, or a race with its maker: counted again at the next scan
