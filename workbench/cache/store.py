"""Row files in a directory: crash-safe publish, detach, and the start-up scan.

Publish protocol (a reader or a crash never sees a half-written `<key>.kv`):

  1. create `<key>.tmp.<pid>.<random>` with O_CREAT|O_EXCL, mode 0600
  2. write header+tokens, then the payload; fsync the file
  3. link(2) it to `<key>.kv`: fails if the row exists, so a published file is never
     replaced (same key = same tokens and namespace = same KV, so the first writer wins);
     rename(2) is the fallback on file systems without hard links
  4. unlink the tmp name; fsync the directory so the new name survives power loss

A crash leaves at worst a tmp file, which the next scan removes once its writer is gone.
Directories are created 0700 and must belong to us: shared /dev/shm is world-writable,
and someone else's directory there must never be trusted.

Scan: adopt every `<key>.kv` that verifies (a regular file, magic, version, sizes against
the file and against `max_payload`, header checksum, key, optionally the model fingerprint,
and the payload checksum when `verify_payload`); delete and count the rest by reason (a
directory under a row's name too, once: `remove_planted_dir`); delete tmp orphans (writer
pid gone, or older than `tmp_ttl_s`); leave other files alone.
Without `verify_payload` a scan reads 160 bytes plus the tokens of each row, whatever its
payload size, and the payload is verified when the row is first read.
"""

from __future__ import annotations

import errno
import os
import stat
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from workbench.cache.format import (
    ChecksumAlgo,
    CorruptReason,
    CorruptRow,
    RowMeta,
    encode_row,
    read_row,
    row_size,
)

ROW_SUFFIX = ".kv"
TMP_MARK = ".tmp."


@dataclass(slots=True)
class ScanReport:
    """What a directory scan found: adopted rows (with file sizes) and what it removed."""

    rows: list[tuple[RowMeta, int]] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    orphans_removed: int = 0
    tmp_kept: int = 0

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())


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


def row_path(root: Path, key: str) -> Path:
    return root / f"{key}{ROW_SUFFIX}"


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


def publish_row(root: Path, meta: RowMeta, payload: bytes, algo: ChecksumAlgo = ChecksumAlgo.XXH3_128) -> int:
    """Write a row crash-safely as `<key>.kv`; return its size. Publishing a key that is
    already there keeps the existing file."""
    publish_file(root, row_path(root, meta.key), meta.key, (encode_row(meta, payload, algo), payload))
    return row_size(meta.n_tokens, len(payload))


def publish_file(root: Path, final: Path, stem: str, parts: tuple[bytes, ...]) -> None:
    """The publish protocol of the module doc for any file of `root` (rows, KV chunks,
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


def detach_row(root: Path, key: str) -> Path | None:
    """Rename `<key>.kv` to a private tmp name, so it can be copied elsewhere and deleted
    without racing a new publish of the same key; None if it is not there. A crash
    before the copy completes loses the row (it is a cache), never corrupts it."""
    src = row_path(root, key)
    dst = tmp_path(root, key)
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return None
    return dst


def remove_row(root: Path, key: str) -> bool:
    path = row_path(root, key)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno not in _UNLINK_DIR_ERRNOS:
            raise
        remove_planted_dir(path)
    return True


def scan_dir(
    root: Path,
    *,
    verify_payload: bool = True,
    expected_fingerprint: bytes | None = None,
    tmp_ttl_s: float = 600.0,
    max_payload: int | None = None,
) -> ScanReport:
    """Verify every row file under `root`; see the module doc for what is kept."""
    report = ScanReport()
    tmp = TmpSweep()
    for entry in scan_entries(root, tmp_ttl_s, tmp):
        if entry.name.endswith(ROW_SUFFIX):
            _scan_row(root, entry.name, report, verify_payload, expected_fingerprint, max_payload)
    report.orphans_removed, report.tmp_kept = tmp.removed, tmp.kept
    return report


def scan_files(root: Path, names: list[str], *, max_payload: int | None = None) -> ScanReport:
    """Verify the row files `names` of `root` only (a peer published them since the last
    look), as `scan_dir` verifies each; a name that is not a row file, or is no longer
    there, is skipped."""
    report = ScanReport()
    for name in names:
        if TMP_MARK not in name and name.endswith(ROW_SUFFIX) and os.sep not in name:
            _scan_row(root, name, report, False, None, max_payload)
    return report


def _scan_row(root: Path, name: str, report: ScanReport, verify_payload: bool,
              expected_fingerprint: bytes | None, max_payload: int | None) -> None:
    path = root / name
    try:  # read_row refuses a FIFO, symlink, device or directory under a row's name
        row = read_row(path, verify=verify_payload, expected_fingerprint=expected_fingerprint,
                       load_payload=False, max_payload=max_payload)
        if name != f"{row.meta.key}{ROW_SUFFIX}":
            raise CorruptRow(CorruptReason.KEY_MISMATCH, f"file {name} holds {row.meta.key}")
    except CorruptRow as exc:
        unlink_quietly(path)
        report.rejected[exc.reason.value] = report.rejected.get(exc.reason.value, 0) + 1
        return
    except OSError:
        return  # vanished, or unreadable (permissions, I/O): not adopted, left alone
    report.rows.append((row.meta, row_size(row.meta.n_tokens, row.payload_len)))


@dataclass(slots=True)
class TmpSweep:
    """The tmp files a directory scan met: orphans it deleted, and the rest (writers at work)."""

    removed: int = 0
    kept: int = 0


def scan_entries(root: Path, tmp_ttl_s: float, tmp: TmpSweep) -> Iterator[os.DirEntry[str]]:
    """The entries of `root` other than tmp files, for a start-up scan (row files and chunk
    files alike); each tmp file on the way is deleted when it is an orphan (`is_orphan`),
    and counted in `tmp`."""
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
