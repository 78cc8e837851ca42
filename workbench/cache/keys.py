"""Cache namespaces, row keys and chained block hashes.

A KV row can only be reused by a request whose KV would be bit-for-bit the same, so every
input that changes the KV layout or values is folded into a `CacheNamespace`: the model
file's sha256, the LoRA adapters with their scales (in application order), the weight
quantisation, the context parameters that change the KV (e.g. `type_k`, `type_v`,
`flash_attn`) and the caller's scope (tenant). Two namespaces that differ in any field have
different digests, and every hash below starts from the namespace digest, so rows of
different scopes or models can never be confused, not even by a hash collision: the prefix
index stores the namespace digest with each row and compares it on a hit.

Hash choice: the namespace digest is sha256 (computed once per namespace, must be
collision-resistant because it stands for the model). Row keys and block hashes are
xxh3-128 (xxhash package): ~3x faster than hashlib's blake2b on the 64-byte blocks hashed
here, which keeps a lookup on an 8,000-token prompt at a few tens of microseconds. xxh3 is
not cryptographic, so a hash is only ever a pre-filter: the index checks token equality on
every hit and the cache refuses a put whose key exists with other tokens, so a collision
(accidental or crafted) can cost a miss but never return a wrong row.

Token ids are hashed as int32 little-endian, the same bytes the row file stores.
"""

from __future__ import annotations

import array
import hashlib
import json
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

import xxhash

KvParamValue = str | int | float | bool
Tokens = Union[Sequence[int], bytes, bytearray, memoryview, "array.array[int]"]

NAMESPACE_DIGEST_SIZE = 32  # sha256
KEY_SIZE = 16               # xxh3-128, raw bytes; 32 hex characters
_NS_DOMAIN = b"workbench.cache.namespace.v1\x00"

#: The 16-byte hash applied to (parent hash || block bytes). A module attribute, looked up
#: at call time, so tests can replace it with a colliding one.
block_digest = xxhash.xxh3_128_digest


@dataclass(slots=True, frozen=True)
class CacheNamespace:
    """Everything besides the tokens that determines the KV of a prefix.

    `kv_params` is normalised to a tuple of (name, value) pairs sorted by name; pass a dict
    or any iterable of pairs. Adapter order is kept as given, because applying the same
    adapters in another order can round differently.
    """

    fingerprint: str
    adapters: tuple[tuple[str, float], ...] = ()
    quantisation: str = ""
    kv_params: tuple[tuple[str, KvParamValue], ...] = ()
    scope: str = "default"

    def __post_init__(self) -> None:
        fp = self.fingerprint.lower()
        if len(fp) != 64 or any(c not in "0123456789abcdef" for c in fp):
            raise ValueError(f"fingerprint must be a sha256 hex string, got {self.fingerprint!r}")
        object.__setattr__(self, "fingerprint", fp)
        object.__setattr__(self, "adapters", _normalise_adapters(self.adapters))
        object.__setattr__(self, "kv_params", _normalise_kv_params(self.kv_params))
        if not isinstance(self.quantisation, str):
            raise TypeError(f"quantisation must be a str, got {type(self.quantisation).__name__}")
        if not isinstance(self.scope, str) or not self.scope:
            raise ValueError(f"scope must be a non-empty str, got {self.scope!r}")

    def canonical(self) -> bytes:
        """The exact bytes hashed by `digest()` (compact JSON, ASCII, fixed field order)."""
        doc = [
            self.fingerprint,
            [[sha, scale] for sha, scale in self.adapters],
            self.quantisation,
            [[name, value] for name, value in self.kv_params],
            self.scope,
        ]
        return _NS_DOMAIN + json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode()

    def digest(self) -> bytes:
        """sha256 of the canonical encoding: 32 bytes that stand for this namespace."""
        return hashlib.sha256(self.canonical()).digest()

    @property
    def fingerprint_bytes(self) -> bytes:
        """The model fingerprint as 32 raw bytes (as stored in row headers)."""
        return bytes.fromhex(self.fingerprint)


def _normalise_adapters(adapters: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    out = []
    for item in adapters:
        sha, scale = item
        if not isinstance(sha, str) or not sha:
            raise ValueError(f"adapter id must be a non-empty str, got {sha!r}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"adapter scale must be a number, got {scale!r}")
        out.append((sha.lower(), float(scale)))
    return tuple(out)


def _normalise_kv_params(
    params: Mapping[str, KvParamValue] | Iterable[tuple[str, KvParamValue]],
) -> tuple[tuple[str, KvParamValue], ...]:
    items = list(params.items()) if isinstance(params, Mapping) else [tuple(p) for p in params]
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate kv_params names in {names}")
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"kv_params name must be a str, got {name!r}")
        if not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"kv_params[{name!r}] must be str/int/float/bool, got {value!r}")
    return tuple(sorted(items))


def common_tokens(a: bytes, b: bytes) -> int:
    """How many leading token ids (4 bytes each) two token byte strings share."""
    lo, hi = 0, min(len(a), len(b)) // 4
    while lo < hi:  # the longest agreeing prefix, by halving (each test one memcmp)
        mid = (lo + hi + 1) // 2
        if a[:4 * mid] == b[:4 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def token_bytes(tokens: Tokens) -> bytes:
    """Token ids as int32 little-endian bytes (bytes-like input is taken as already encoded)."""
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        raw = bytes(tokens)
        if len(raw) % 4:
            raise ValueError(f"token bytes length {len(raw)} is not a multiple of 4")
        return raw
    if isinstance(tokens, array.array) and tokens.itemsize == 4 and tokens.typecode in "il":
        if sys.byteorder == "little":
            return tokens.tobytes()
        swapped = array.array(tokens.typecode, tokens)
        swapped.byteswap()
        return swapped.tobytes()
    astype = getattr(tokens, "astype", None)
    if astype is not None:  # numpy array: avoid a Python-level loop
        return bytes(astype("<i4", copy=False).tobytes())
    try:
        return struct.pack(f"<{len(tokens)}i", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must be int32: {exc}") from None


def tokens_from_bytes(raw: bytes) -> list[int]:
    """Inverse of `token_bytes`."""
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def block_hashes(namespace_digest: bytes, tokens: Tokens, block_size: int) -> list[bytes]:
    """Chained hashes of the full blocks of `tokens`.

    hash_1 = xxh3_128(namespace_digest || block_1), hash_i = xxh3_128(hash_{i-1} || block_i);
    a trailing partial block is not hashed. Equal hashes at depth i mean (barring a
    collision) equal namespace and equal first i*block_size tokens.
    """
    return chain_hashes(namespace_digest, token_bytes(tokens), block_size)


def chain_hashes(namespace_digest: bytes, raw: bytes, block_size: int) -> list[bytes]:
    """`block_hashes` over already-encoded tokens."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    step = 4 * block_size
    n_blocks = len(raw) // step
    digest = block_digest
    out: list[bytes] = []
    h = namespace_digest
    for start in range(0, n_blocks * step, step):
        h = digest(h + raw[start:start + step])
        out.append(h)
    return out


def row_key(namespace_digest: bytes, tokens: Tokens) -> str:
    """Key of the row holding exactly `tokens`: xxh3_128(namespace_digest || tokens), hex."""
    return row_key_from_bytes(namespace_digest, token_bytes(tokens))


def row_key_from_bytes(namespace_digest: bytes, raw: bytes) -> str:
    """`row_key` over already-encoded tokens."""
    return xxhash.xxh3_128_hexdigest(namespace_digest + raw)


def digest_of(namespace: CacheNamespace | bytes) -> bytes:
    """The namespace digest, given a namespace or the digest itself."""
    return namespace if isinstance(namespace, bytes) else namespace.digest()


def chunk_ends(n_tokens: int, chunk_size: int, marks: Iterable[int] = (), start: int = 0) -> list[int]:
    """End positions of the chunks holding positions ``start .. n_tokens``: every
    ``chunk_size`` positions from ``start``, the grid restarting at each mark (a position where
    a shared prefix ends, ``start < mark < n_tokens``), so a mark is always a chunk boundary.
    With no marks and ``start=0``: the full chunks, then a shorter tail."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out: list[int] = []
    pos = start
    for stop in [*sorted({m for m in marks if start < m < n_tokens}), n_tokens]:
        if stop <= pos:
            continue
        out.extend(range(pos + chunk_size, stop, chunk_size))
        out.append(stop)
        pos = stop
    return out


def grid_ends(n_tokens: int, chunk_size: int) -> list[int]:
    """``chunk_ends`` with no marks: chunks on the fixed grid."""
    return chunk_ends(n_tokens, chunk_size)


def keys_at(anchor: bytes, raw: bytes, ends: Sequence[int], start: int = 0) -> list[bytes]:
    """Chained keys of the chunks of ``raw`` (encoded tokens) ending at ``ends``, the first
    starting at position ``start`` and continuing ``anchor`` (the namespace digest, or the key
    of the chunk before it)."""
    out: list[bytes] = []
    h, prev = anchor, start
    for end in ends:
        h = block_digest(h + raw[4 * prev:4 * end])
        out.append(h)
        prev = end
    return out


def chunk_keys(namespace_digest: bytes, tokens: Tokens, chunk_size: int,
               ends: Sequence[int] | None = None) -> list[bytes]:
    """Keys of the chunks a row of ``tokens`` is stored as, the chunks ending at ``ends``
    (default: the fixed grid, ``grid_ends``: the full chunks, exactly ``block_hashes``, then
    the tail's). A chunk's key names (namespace, parent chunk key, its tokens): a prefix
    shared by many rows, cut at the same boundaries, has the same chunk keys in all of them
    and is stored once.
    """
    raw = token_bytes(tokens)
    return keys_at(namespace_digest, raw, grid_ends(len(raw) // 4, chunk_size) if ends is None else ends)
