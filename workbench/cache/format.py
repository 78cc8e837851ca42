"""The row file: a verified header, the token ids, then the opaque KV payload.

All integers little-endian; the header is 160 bytes (struct `<8sHHBBHIIQd16s32s32s32sQ`):

    offset size  field
       0     8   magic            b"WBKVROW\\0"
       8     2   version          u16, currently 1; any other value is rejected
      10     2   flags            u16, bit 0 = pinned
      12     1   reason           u8, SaveReason (1 cold .. 6 agent_prefix)
      13     1   checksum algo    u8, 1 = xxh3-128, 2 = sha256
      14     2   reserved         zero
      16     4   n_tokens         u32
      20     4   hits             u32, the row's hit count when it was written
      24     8   payload length   u64
      32     8   created at       f64, unix seconds
      40    16   key              raw xxh3-128 row key (see keys.row_key)
      56    32   namespace        sha256 namespace digest (lets a scan rebuild the index)
      88    32   fingerprint      sha256 of the model file, raw
     120    32   payload checksum xxh3-128 (16 bytes, zero padded) or sha256
     152     8   header checksum  xxh3-64 of bytes 0..151 followed by the token bytes
     160  4*n    token ids        int32
       .     .   payload          llama.cpp sequence state, opaque here

Verification order: regular file (opened with O_NONBLOCK and O_NOFOLLOW, so a FIFO or a
symlink planted under a row's name never blocks or redirects a read), magic, version,
sizes (the header's lengths against the file's size, then against the reader's bound
`max_payload`, before anything is hashed), header checksum (covers tokens), fields, key
(recomputed from namespace and tokens), expected fingerprint, payload checksum. Each
failure raises `CorruptRow` with a specific `CorruptReason`.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO

import xxhash

from workbench.cache import keys
from workbench.cache.types import SaveReason

MAGIC = b"WBKVROW\x00"
VERSION = 1
FLAG_PINNED = 1
HEADER = struct.Struct("<8sHHBBHIIQd16s32s32s32sQ")
HEADER_SIZE = HEADER.size  # 160
_CHECKED = HEADER_SIZE - 8  # the header checksum covers everything before itself
_CHUNK = 1 << 22


class ChecksumAlgo(enum.IntEnum):
    XXH3_128 = 1
    SHA256 = 2


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
    """A row file that must not be used; `reason` says which check failed."""

    def __init__(self, reason: CorruptReason, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)


@dataclass(slots=True, frozen=True)
class RowMeta:
    """Everything about a row except its payload; what a writer passes and a reader gets."""

    key: str
    namespace: bytes
    fingerprint: bytes
    tokens: bytes  # int32 little-endian token ids
    reason: SaveReason = SaveReason.FINISH
    created_at: float = 0.0
    hits: int = 0
    pinned: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4


@dataclass(slots=True, frozen=True)
class Row:
    """A row read back from a file. `payload` is empty when it was not loaded."""

    meta: RowMeta
    payload: bytes
    payload_len: int
    version: int
    checksum_algo: ChecksumAlgo


def row_size(n_tokens: int, payload_len: int) -> int:
    """Bytes a row file occupies."""
    return HEADER_SIZE + 4 * n_tokens + payload_len


def _payload_checksum(algo: ChecksumAlgo, payload: bytes) -> bytes:
    if algo is ChecksumAlgo.XXH3_128:
        return xxhash.xxh3_128_digest(payload).ljust(32, b"\x00")
    return hashlib.sha256(payload).digest()


def encode_row(meta: RowMeta, payload: bytes, algo: ChecksumAlgo = ChecksumAlgo.XXH3_128) -> bytes:
    """Header plus token bytes; the caller writes `payload` right after them."""
    key_raw = bytes.fromhex(meta.key)
    if len(key_raw) != keys.KEY_SIZE:
        raise ValueError(f"key must be {keys.KEY_SIZE} bytes of hex, got {meta.key!r}")
    if len(meta.namespace) != 32 or len(meta.fingerprint) != 32:
        raise ValueError("namespace and fingerprint must be 32 raw bytes each")
    if len(meta.tokens) % 4:
        raise ValueError("token bytes length must be a multiple of 4")
    header = HEADER.pack(
        MAGIC, VERSION, FLAG_PINNED if meta.pinned else 0, int(meta.reason), int(algo), 0,
        meta.n_tokens, min(meta.hits, 0xFFFFFFFF), len(payload), float(meta.created_at),
        key_raw, meta.namespace, meta.fingerprint, _payload_checksum(algo, payload), 0,
    )
    check = xxhash.xxh3_64_intdigest(header[:_CHECKED] + meta.tokens)
    return header[:_CHECKED] + struct.pack("<Q", check) + meta.tokens


_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a row file for reading without ever blocking: O_NONBLOCK (opening a FIFO with no
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


def read_row(
    path: str | os.PathLike[str],
    *,
    verify: bool = True,
    expected_fingerprint: bytes | None = None,
    load_payload: bool = True,
    max_payload: int | None = None,
) -> Row:
    """Read and check a row file; raise CorruptRow naming the first failed check.

    `verify=False` skips only the payload checksum. With `load_payload=False` the payload
    is streamed through the checksum (when verifying) instead of being kept in memory.
    `max_payload`: a payload longer than this is refused (TOO_LARGE) before it is read.
    """
    with open_regular(path) as f:
        file_size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
        if len(head) < len(MAGIC):
            raise CorruptRow(CorruptReason.TRUNCATED, f"{len(head)} bytes")
        if head[:8] != MAGIC:
            raise CorruptRow(CorruptReason.BAD_MAGIC, repr(head[:8]))
        if len(head) < 10:
            raise CorruptRow(CorruptReason.TRUNCATED, "no version")
        version = struct.unpack_from("<H", head, 8)[0]
        if version != VERSION:
            raise CorruptRow(CorruptReason.BAD_VERSION, f"version {version}, expected {VERSION}")
        if len(head) < HEADER_SIZE:
            raise CorruptRow(CorruptReason.TRUNCATED, f"header is {len(head)} bytes")
        (_, _, flags, reason, algo, _, n_tokens, hits, payload_len, created_at,
         key_raw, namespace, fingerprint, checksum, header_check) = HEADER.unpack(head)
        expected_size = row_size(n_tokens, payload_len)
        if file_size < expected_size:
            raise CorruptRow(CorruptReason.TRUNCATED, f"{file_size} of {expected_size} bytes")
        if file_size > expected_size:
            raise CorruptRow(CorruptReason.SIZE_MISMATCH, f"{file_size} bytes, expected {expected_size}")
        if max_payload is not None and payload_len > max_payload:
            raise CorruptRow(CorruptReason.TOO_LARGE, f"payload of {payload_len} bytes, at most {max_payload}")
        tokens = f.read(4 * n_tokens)
        if xxhash.xxh3_64_intdigest(head[:_CHECKED] + tokens) != header_check:
            raise CorruptRow(CorruptReason.HEADER_CHECKSUM)
        meta = _meta(flags, reason, n_tokens, hits, created_at, key_raw, namespace, fingerprint, tokens)
        try:
            checksum_algo = ChecksumAlgo(algo)
        except ValueError:
            raise CorruptRow(CorruptReason.BAD_FIELD, f"checksum algorithm {algo}") from None
        if expected_fingerprint is not None and fingerprint != expected_fingerprint:
            raise CorruptRow(CorruptReason.WRONG_FINGERPRINT, fingerprint.hex()[:16])
        payload = _read_payload(f, payload_len, checksum_algo, checksum, verify, load_payload)
    return Row(meta, payload, payload_len, version, checksum_algo)


def _meta(
    flags: int, reason: int, n_tokens: int, hits: int, created_at: float,
    key_raw: bytes, namespace: bytes, fingerprint: bytes, tokens: bytes,
) -> RowMeta:
    try:
        save_reason = SaveReason(reason)
    except ValueError:
        raise CorruptRow(CorruptReason.BAD_FIELD, f"save reason {reason}") from None
    if n_tokens < 1:
        raise CorruptRow(CorruptReason.BAD_FIELD, "a row has no tokens")
    key = key_raw.hex()
    if keys.row_key_from_bytes(namespace, tokens) != key:
        raise CorruptRow(CorruptReason.KEY_MISMATCH, key)
    return RowMeta(key, namespace, fingerprint, tokens, save_reason, created_at, hits,
                   bool(flags & FLAG_PINNED))


def _read_payload(
    f: BinaryIO, length: int, algo: ChecksumAlgo, checksum: bytes, verify: bool, keep: bool,
) -> bytes:
    if keep:
        payload = f.read(length)
        if len(payload) != length:
            raise CorruptRow(CorruptReason.TRUNCATED, "payload")
        if verify and _payload_checksum(algo, payload) != checksum:
            raise CorruptRow(CorruptReason.PAYLOAD_CHECKSUM)
        return payload
    if verify:
        h = xxhash.xxh3_128() if algo is ChecksumAlgo.XXH3_128 else hashlib.sha256()
        left = length
        while left:
            chunk = f.read(min(left, _CHUNK))
            if not chunk:
                raise CorruptRow(CorruptReason.TRUNCATED, "payload")
            h.update(chunk)
            left -= len(chunk)
        digest = h.digest().ljust(32, b"\x00")
        if digest != checksum:
            raise CorruptRow(CorruptReason.PAYLOAD_CHECKSUM)
    return b""
