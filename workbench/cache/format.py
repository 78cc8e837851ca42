"""What every cache file reader shares: the reasons a file is refused and a safe open.

The file layouts are chunk_format.py's (chunks and manifests). A file is refused with
`CorruptRow` naming its `CorruptReason`; `open_regular` opens it with O_NONBLOCK and
O_NOFOLLOW and checks it is a regular file on the open descriptor, so a FIFO or a symlink
planted under a cache file's name never blocks or redirects a read. Version 1 row files
(`*.kv`, magic ``WBKVROW``), which earlier releases wrote, are refused as BAD_VERSION and
deleted by a directory's scan (chunk_scan.py).
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from typing import BinaryIO


class CorruptReason(str, enum.Enum):
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    TRUNCATED = "truncated"
    SIZE_MISMATCH = "size_mismatch"
    HEADER_CHECKSUM = "header_checksum"
    BAD_FIELD = "bad_field"
    KEY_MISMATCH = "key_mismatch"
    WRONG_FINGERPRINT = "wrong_fingerprint"
    PAYLOAD_CHECKSUM = "payload_checksum"
    NOT_REGULAR = "not_regular"      # a FIFO, device, socket, symlink or directory
    TOO_LARGE = "too_large"          # payload length past the reader's bound
    BAD_STATE = "bad_state"          # verified file, but llama.cpp refused its state


class CorruptRow(Exception):
    """A cache file that must not be used; `reason` says which check failed."""

    def __init__(self, reason: CorruptReason, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)


_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a cache file for reading without ever blocking: O_NONBLOCK (opening a FIFO with no
    writer would otherwise wait forever), O_NOFOLLOW, and a regular-file check on the open
    descriptor (so a file swapped in after a stat cannot slip through). FileNotFoundError
    when absent, CorruptRow(NOT_REGULAR) for anything but a regular file, OSError for
    other failures to open (permissions, I/O)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # symlink, socket, directory
            raise CorruptRow(CorruptReason.NOT_REGULAR, exc.strerror or "") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CorruptRow(CorruptReason.NOT_REGULAR, f"file type {stat.filemode(mode)[0]!r}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
