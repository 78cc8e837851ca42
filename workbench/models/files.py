"""Checks a model file before llama.cpp sees it, and fingerprints it.

llama.cpp handles most bad files by returning NULL, but not every path through its loader
is guarded; a user's notebook kernel must never die on a file they picked. So we look at
the file first: it exists, is a regular file, starts with the GGUF magic and a known
version, and ggml's own GGUF parser reads its header with every tensor inside the file.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import threading
from pathlib import Path

from ..errors import ModelFileError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)

_fp_lock = threading.Lock()
_fp_memo: dict[tuple[str, int, int], str] = {}


def check_model_file(path: str | os.PathLike[str]) -> Path:
    """Return the resolved path of a loadable-looking GGUF file or raise ModelFileError."""
    raw = os.fspath(path)
    p = Path(raw).expanduser()
    try:
        mode = p.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise ModelFileError(raw, "no such file") from None
    except ValueError as e:  # a NUL byte, a code point the file system encoding cannot write
        raise ModelFileError(raw, f"no such file (the path cannot name one: {e})") from None
    except OSError as e:  # a name too long, a loop of links, no permission
        raise ModelFileError(raw, f"no such file or not reachable ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise ModelFileError(raw, "is a directory, not a GGUF file")
    if not stat.S_ISREG(mode):
        raise ModelFileError(raw, "is not a regular file")
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise ModelFileError(raw, f"cannot be read ({e.strerror})") from None
    if len(head) < 8:
        raise ModelFileError(raw, f"is {len(head)} bytes long, too short to be a GGUF file")
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(raw, f"is not a GGUF file (starts with {head[:4]!r}, expected {GGUF_MAGIC!r})")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in GGUF_VERSIONS:
        raise ModelFileError(raw, f"has GGUF version {version}; supported: {GGUF_VERSIONS}")
    from .. import _native

    problem = _native.gguf_check(str(p))
    if problem is not None:
        raise ModelFileError(raw, problem)
    return p.resolve()


def fingerprint(path: str | os.PathLike[str]) -> str:
    """sha256 of the file, hex; memoised by (path, size, mtime) so a reload costs nothing."""
    p = Path(path).resolve()
    st = p.stat()
    memo_key = (str(p), st.st_size, st.st_mtime_ns)
    with _fp_lock:
        hit = _fp_memo.get(memo_key)
    if hit is not None:
        return hit
    digest = hashlib.sha256()
    with p.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    value = digest.hexdigest()
    with _fp_lock:
        _fp_memo[memo_key] = value
    return value
