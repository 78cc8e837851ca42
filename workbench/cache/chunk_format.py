"""Format version 3: KV chunk files and row manifests (the chunked cache, issue 14).

A row is a manifest over chunks: chunk ``i`` of a row of ``tokens`` holds the KV of positions
``[ends[i - 1], ends[i])`` (``ends[-1]`` is 0) and is keyed by
``keys.chunk_keys(namespace, tokens, chunk_size, ends)[i]``, which names (namespace, parent
chunk key, its tokens): rows sharing a prefix cut at the same boundaries share its chunks,
stored once. A chunk holds at most ``chunk_size`` positions; where a row's chunks end is the
store's choice (the fixed grid, restarted where a shared prefix ends: chunk_catalog.py), so
the manifest records it. Version 3 added the ends; files of version 2 are refused.

Chunk file ``<chunk key>.kvc``, all integers little-endian, a 160-byte header
(struct ``<8sHHIIIQ16s16s32s32s16sdQ``):

    offset size  field
       0     8   magic            b"WBKVCHN\\0"
       8     2   version          u16 = 3
      10     2   flags            bit 0: first chunk (its parent is the namespace)
      12     4   p0               first position
      16     4   n_tokens         u32, >= 1
      20     4   reserved         zero
      24     8   payload length   u64 (the native chunk: csrc/kv_chunks.cpp)
      32    16   key              raw chunk key
      48    16   parent key       raw; zero for a first chunk
      64    32   namespace        sha256 namespace digest
      96    32   fingerprint      sha256 of the model file
     128    16   payload checksum xxh3-128
     144     8   created at       f64
     152     8   header checksum  xxh3-64 of bytes 0..151 followed by the token bytes
     160  4*n    the chunk's token ids, then the payload

Manifest file ``<row key>.kvm``, a 160-byte header (struct ``<8sHHBBHIIIIdI16s32s32s28sQ``):

       0     8   magic            b"WBKVMAN\\0"
       8     2   version          u16 = 3
      10     2   flags            bit 0 pinned
      12     1   reason           SaveReason
      13     1   reserved         zero
      14     2   reserved         zero
      16     4   chunk_size
      20     4   n_tokens
      24     4   n_chunks         its chunks, each of 1 .. chunk_size positions
      28     4   hits
      32     8   created at       f64
      40     4   reserved         zero
      44    16   row key          keys.row_key
      60    32   namespace
      92    32   fingerprint
     124    28   saved by         the id of the model whose save wrote the row, UTF-8, zero
                                  padded (cut to 28 bytes between characters); all zero: not
                                  recorded (a file from before this field, or a save with no id)
     152     8   header checksum  xxh3-64 of bytes 0..151, the token bytes, the chunk keys, the ends
     160  4*n    token ids, then 16 * n_chunks bytes of chunk keys, then n_chunks u32 chunk ends
                 (increasing, the last n_tokens)

Every key is recomputed on read (a chunk's from its parent or namespace and its tokens, a
manifest's row key and chunk keys from its namespace and tokens), so a file can never be
served under another prompt. Failures raise ``CorruptRow`` with the reasons of format.py.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import xxhash

from workbench.cache import keys
from workbench.cache.format import CorruptReason, CorruptRow, open_regular
from workbench.cache.types import SAVED_BY_BYTES, SaveReason, stored_model_id

VERSION = 3
CHUNK_MAGIC = b"WBKVCHN\x00"
MANIFEST_MAGIC = b"WBKVMAN\x00"
CHUNK_SUFFIX = ".kvc"
MANIFEST_SUFFIX = ".kvm"
FLAG_FIRST = 1
FLAG_PINNED = 1
CHUNK_HEADER = struct.Struct("<8sHHIIIQ16s16s32s32s16sdQ")
MANIFEST_HEADER = struct.Struct("<8sHHBBHIIIIdI16s32s32s28sQ")
HEADER_SIZE = 160
assert CHUNK_HEADER.size == HEADER_SIZE and MANIFEST_HEADER.size == HEADER_SIZE
_CHECKED = HEADER_SIZE - 8
_NO_PARENT = bytes(keys.KEY_SIZE)
#: No row or chunk holds more tokens than this (no context is that long): a header that
#: claims more is refused before its tokens are read (a sparse file cannot flood memory).
MAX_TOKENS = 1 << 22


@dataclass(slots=True, frozen=True)
class ChunkMeta:
    """A chunk's identity: its key, its parent's (None for a first chunk), its tokens."""

    key: bytes
    parent: bytes | None
    namespace: bytes
    fingerprint: bytes
    p0: int
    tokens: bytes
    created_at: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4


@dataclass(slots=True, frozen=True)
class Manifest:
    """A row: its tokens and the keys of the chunks that hold its KV."""

    key: str
    namespace: bytes
    fingerprint: bytes
    tokens: bytes
    chunk_size: int
    chunks: tuple[bytes, ...]
    reason: SaveReason = SaveReason.FINISH
    created_at: float = 0.0
    hits: int = 0
    pinned: bool = False
    ends: tuple[int, ...] = ()   # where each chunk ends; () means the fixed grid
    saved_by: str = ""           # the model id that saved it ("" unknown): SAVED_BY_BYTES of UTF-8 at most

    def __post_init__(self) -> None:
        if not self.ends:
            object.__setattr__(self, "ends", tuple(keys.grid_ends(self.n_tokens, self.chunk_size)))

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4

    def start_of(self, i: int) -> int:
        """The first position of chunk ``i``."""
        return self.ends[i - 1] if i else 0


def chunk_file_size(n_tokens: int, payload_len: int) -> int:
    return HEADER_SIZE + 4 * n_tokens + payload_len


def manifest_size(n_tokens: int, n_chunks: int) -> int:
    return HEADER_SIZE + 4 * n_tokens + (keys.KEY_SIZE + 4) * n_chunks


def chunks_of(namespace: bytes, fingerprint: bytes, tokens: bytes, chunk_size: int,
              created_at: float = 0.0, ends: tuple[int, ...] | list[int] | None = None) -> list[ChunkMeta]:
    """The chunks a row of ``tokens`` is stored as, ending at ``ends`` (default the fixed
    grid; keys by ``keys.chunk_keys``)."""
    if ends is None:
        ends = keys.grid_ends(len(tokens) // 4, chunk_size)
    ks = keys.chunk_keys(namespace, tokens, chunk_size, ends)
    starts = [0, *ends[:-1]]
    return [ChunkMeta(k, ks[i - 1] if i else None, namespace, fingerprint, starts[i],
                      tokens[4 * starts[i]:4 * ends[i]], created_at) for i, k in enumerate(ks)]


def check_ends(ends: tuple[int, ...] | list[int], n_tokens: int, chunk_size: int) -> bool:
    """Chunk ends a manifest may hold: increasing, at most ``chunk_size`` apart, the last
    ``n_tokens``."""
    prev = 0
    for end in ends:
        if not prev < end <= prev + chunk_size:
            return False
        prev = end
    return prev == n_tokens and bool(ends)


# --- chunks ------------------------------------------------------------------------------

def encode_chunk(meta: ChunkMeta, payload: bytes) -> bytes:
    """Header plus token bytes; the payload follows them in the file."""
    if len(meta.key) != keys.KEY_SIZE or (meta.parent is not None and len(meta.parent) != keys.KEY_SIZE):
        raise ValueError("chunk keys are 16 raw bytes")
    header = CHUNK_HEADER.pack(
        CHUNK_MAGIC, VERSION, FLAG_FIRST if meta.parent is None else 0, meta.p0, meta.n_tokens, 0,
        len(payload), meta.key, meta.parent or _NO_PARENT, meta.namespace, meta.fingerprint,
        xxhash.xxh3_128_digest(payload), float(meta.created_at), 0)
    check = xxhash.xxh3_64_intdigest(header[:_CHECKED] + meta.tokens)
    return header[:_CHECKED] + struct.pack("<Q", check) + meta.tokens


def _check_magic(head: bytes, magic: bytes) -> None:
    if len(head) < 10:
        raise CorruptRow(CorruptReason.TRUNCATED, f"{len(head)} bytes")
    if head[:8] != magic:
        raise CorruptRow(CorruptReason.BAD_MAGIC, repr(head[:8]))
    version = struct.unpack_from("<H", head, 8)[0]
    if version != VERSION:
        raise CorruptRow(CorruptReason.BAD_VERSION, f"version {version}, expected {VERSION}")
    if len(head) < HEADER_SIZE:
        raise CorruptRow(CorruptReason.TRUNCATED, f"header is {len(head)} bytes")


def _sizes(file_size: int, expected: int) -> None:
    if file_size < expected:
        raise CorruptRow(CorruptReason.TRUNCATED, f"{file_size} of {expected} bytes")
    if file_size > expected:
        raise CorruptRow(CorruptReason.SIZE_MISMATCH, f"{file_size} bytes, expected {expected}")


def read_chunk(path: str | os.PathLike[str], *, load_payload: bool = True,
               max_payload: int | None = None) -> tuple[ChunkMeta, bytes, int]:
    """Read and check a chunk file: (meta, payload or b"", payload length). The payload's
    checksum is checked whenever it is loaded."""
    with open_regular(path) as f:
        file_size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
        _check_magic(head, CHUNK_MAGIC)
        (_, _, flags, p0, n_tokens, _, payload_len, key, parent, namespace, fingerprint,
         checksum, created_at, header_check) = CHUNK_HEADER.unpack(head)
        if n_tokens > MAX_TOKENS:
            raise CorruptRow(CorruptReason.TOO_LARGE, f"{n_tokens} tokens")
        _sizes(file_size, chunk_file_size(n_tokens, payload_len))
        if max_payload is not None and payload_len > max_payload:
            raise CorruptRow(CorruptReason.TOO_LARGE, f"payload of {payload_len} bytes, at most {max_payload}")
        tokens = f.read(4 * n_tokens)
        if xxhash.xxh3_64_intdigest(head[:_CHECKED] + tokens) != header_check:
            raise CorruptRow(CorruptReason.HEADER_CHECKSUM)
        first = bool(flags & FLAG_FIRST)
        if n_tokens < 1 or (first and (p0 != 0 or parent != _NO_PARENT)) or (not first and p0 == 0):
            raise CorruptRow(CorruptReason.BAD_FIELD, "chunk position or parent")
        if keys.block_digest((namespace if first else parent) + tokens) != key:
            raise CorruptRow(CorruptReason.KEY_MISMATCH, key.hex())
        meta = ChunkMeta(key, None if first else parent, namespace, fingerprint, p0, tokens, created_at)
        payload = b""
        if load_payload:
            payload = f.read(payload_len)
            if len(payload) != payload_len:
                raise CorruptRow(CorruptReason.TRUNCATED, "payload")
            if xxhash.xxh3_128_digest(payload) != checksum:
                raise CorruptRow(CorruptReason.PAYLOAD_CHECKSUM)
    return meta, payload, payload_len


# --- manifests ---------------------------------------------------------------------------

def encode_manifest(m: Manifest) -> bytes:
    key_raw = bytes.fromhex(m.key)
    if len(key_raw) != keys.KEY_SIZE or len(m.namespace) != 32 or len(m.fingerprint) != 32:
        raise ValueError("manifest key, namespace or fingerprint has the wrong size")
    header = MANIFEST_HEADER.pack(
        MANIFEST_MAGIC, VERSION, FLAG_PINNED if m.pinned else 0, int(m.reason), 0, 0, m.chunk_size,
        m.n_tokens, len(m.chunks), min(m.hits, 0xFFFFFFFF), float(m.created_at), 0, key_raw,
        m.namespace, m.fingerprint, saved_by_field(m.saved_by), 0)
    body = m.tokens + b"".join(m.chunks) + struct.pack(f"<{len(m.ends)}I", *m.ends)
    check = xxhash.xxh3_64_intdigest(header[:_CHECKED] + body)
    return header[:_CHECKED] + struct.pack("<Q", check) + body


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and check a manifest (its row key and chunk keys are recomputed)."""
    with open_regular(path) as f:
        file_size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
        _check_magic(head, MANIFEST_MAGIC)
        (_, _, flags, reason, _, _, chunk_size, n_tokens, n_chunks, hits, created_at, _, key_raw,
         namespace, fingerprint, saved_by, header_check) = MANIFEST_HEADER.unpack(head)
        if n_tokens > MAX_TOKENS or n_chunks > MAX_TOKENS:
            raise CorruptRow(CorruptReason.TOO_LARGE, f"{n_tokens} tokens in {n_chunks} chunks")
        _sizes(file_size, manifest_size(n_tokens, n_chunks))
        body = f.read(file_size - HEADER_SIZE)
    if xxhash.xxh3_64_intdigest(head[:_CHECKED] + body) != header_check:
        raise CorruptRow(CorruptReason.HEADER_CHECKSUM)
    tokens = body[:4 * n_tokens]
    chunk_keys = tuple(body[4 * n_tokens + i * 16: 4 * n_tokens + (i + 1) * 16] for i in range(n_chunks))
    ends = struct.unpack_from(f"<{n_chunks}I", body, 4 * n_tokens + 16 * n_chunks)
    if n_tokens < 1 or chunk_size < 1 or not check_ends(ends, n_tokens, chunk_size):
        raise CorruptRow(CorruptReason.BAD_FIELD, "token count or chunk ends")
    try:
        save_reason = SaveReason(reason)
    except ValueError:
        raise CorruptRow(CorruptReason.BAD_FIELD, f"save reason {reason}") from None
    key = key_raw.hex()
    if keys.row_key_from_bytes(namespace, tokens) != key:
        raise CorruptRow(CorruptReason.KEY_MISMATCH, key)
    if tuple(keys.chunk_keys(namespace, tokens, chunk_size, ends)) != chunk_keys:
        raise CorruptRow(CorruptReason.KEY_MISMATCH, "chunk keys")
    return Manifest(key, namespace, fingerprint, tokens, chunk_size, chunk_keys, save_reason, created_at,
                    hits, bool(flags & FLAG_PINNED), tuple(ends), saved_by_text(saved_by))


def saved_by_field(model_id: str) -> bytes:
    """A model id as the manifest's saved-by field (types.stored_model_id), zero padded."""
    return stored_model_id(model_id).encode("utf-8").ljust(SAVED_BY_BYTES, b"\0")


def saved_by_text(field: bytes) -> str:
    """The saved-by field read back (bytes that are not UTF-8 are replaced, never raised)."""
    return field.rstrip(b"\0").decode("utf-8", errors="replace")
