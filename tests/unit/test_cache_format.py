"""The row file format: round trip and every rejection reason."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from workbench.cache.format import (
    HEADER_SIZE,
    MAGIC,
    ChecksumAlgo,
    CorruptReason,
    CorruptRow,
    RowMeta,
    encode_row,
    read_row,
    row_size,
)
from workbench.cache.keys import CacheNamespace, row_key, token_bytes
from workbench.cache.types import SaveReason

NS = CacheNamespace("ab" * 32)
TOKENS = [5, 6, 7, 150_000]
PAYLOAD = bytes(range(256)) * 8


def meta(**kw: object) -> RowMeta:
    raw = token_bytes(TOKENS)
    base: dict[str, object] = dict(
        key=row_key(NS.digest(), raw), namespace=NS.digest(), fingerprint=NS.fingerprint_bytes,
        tokens=raw, reason=SaveReason.AGENT_PREFIX, created_at=1234.5, hits=7, pinned=True,
    )
    base.update(kw)
    return RowMeta(**base)  # type: ignore[arg-type]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def good_bytes(algo: ChecksumAlgo = ChecksumAlgo.XXH3_128) -> bytes:
    return encode_row(meta(), PAYLOAD, algo) + PAYLOAD


def reason_of(path: Path, **kw: object) -> CorruptReason:
    with pytest.raises(CorruptRow) as info:
        read_row(path, **kw)  # type: ignore[arg-type]
    return info.value.reason


@pytest.mark.parametrize("algo", list(ChecksumAlgo))
def test_round_trip(tmp_path: Path, algo: ChecksumAlgo) -> None:
    path = write(tmp_path / "r.kv", good_bytes(algo))
    assert path.stat().st_size == row_size(len(TOKENS), len(PAYLOAD)) == HEADER_SIZE + 16 + len(PAYLOAD)
    row = read_row(path, expected_fingerprint=NS.fingerprint_bytes)
    assert row.meta == meta()
    assert row.payload == PAYLOAD and row.payload_len == len(PAYLOAD)
    assert row.checksum_algo is algo and row.version == 1
    streamed = read_row(path, load_payload=False)
    assert streamed.payload == b"" and streamed.meta == meta()


def test_header_layout_is_little_endian_and_documented(tmp_path: Path) -> None:
    data = good_bytes()
    assert data[:8] == MAGIC
    version, flags, reason, algo = struct.unpack_from("<HHBB", data, 8)
    assert (version, flags, reason, algo) == (1, 1, 6, 1)
    n_tokens, hits, payload_len = struct.unpack_from("<IIQ", data, 16)
    assert (n_tokens, hits, payload_len) == (4, 7, len(PAYLOAD))
    assert data[40:56].hex() == meta().key
    assert data[HEADER_SIZE:HEADER_SIZE + 16] == token_bytes(TOKENS)


def test_bad_magic(tmp_path: Path) -> None:
    assert reason_of(write(tmp_path / "r.kv", b"NOTAROW!" + good_bytes()[8:])) is CorruptReason.BAD_MAGIC


def test_wrong_version(tmp_path: Path) -> None:
    data = bytearray(good_bytes())
    struct.pack_into("<H", data, 8, 2)
    assert reason_of(write(tmp_path / "r.kv", bytes(data))) is CorruptReason.BAD_VERSION


@pytest.mark.parametrize("cut", [0, 5, 9, 100, HEADER_SIZE + 3, HEADER_SIZE + 16 + 100, -1])
def test_truncated(tmp_path: Path, cut: int) -> None:
    data = good_bytes()
    assert reason_of(write(tmp_path / "r.kv", data[:cut])) is CorruptReason.TRUNCATED


def test_trailing_bytes(tmp_path: Path) -> None:
    assert reason_of(write(tmp_path / "r.kv", good_bytes() + b"x")) is CorruptReason.SIZE_MISMATCH


@pytest.mark.parametrize(
    "offset, reason",
    [
        (12, CorruptReason.HEADER_CHECKSUM),             # save reason
        (20, CorruptReason.HEADER_CHECKSUM),             # hits
        (45, CorruptReason.HEADER_CHECKSUM),             # key
        (100, CorruptReason.HEADER_CHECKSUM),            # fingerprint
        (130, CorruptReason.HEADER_CHECKSUM),            # payload checksum
        (155, CorruptReason.HEADER_CHECKSUM),            # header checksum itself
        (HEADER_SIZE + 5, CorruptReason.HEADER_CHECKSUM),  # a token id
        (HEADER_SIZE + 16, CorruptReason.PAYLOAD_CHECKSUM),
        (-1, CorruptReason.PAYLOAD_CHECKSUM),
    ],
)
def test_bit_flips_are_caught(tmp_path: Path, offset: int, reason: CorruptReason) -> None:
    data = bytearray(good_bytes())
    data[offset] ^= 0x10
    assert reason_of(write(tmp_path / "r.kv", bytes(data))) is reason


def test_payload_flip_passes_without_verify_but_not_with(tmp_path: Path) -> None:
    data = bytearray(good_bytes())
    data[-10] ^= 1
    path = write(tmp_path / "r.kv", bytes(data))
    assert read_row(path, verify=False).payload == bytes(data[-len(PAYLOAD):])
    assert reason_of(path, load_payload=False) is CorruptReason.PAYLOAD_CHECKSUM


def test_wrong_fingerprint(tmp_path: Path) -> None:
    path = write(tmp_path / "r.kv", good_bytes())
    assert reason_of(path, expected_fingerprint=b"\x01" * 32) is CorruptReason.WRONG_FINGERPRINT


def test_key_must_match_namespace_and_tokens(tmp_path: Path) -> None:
    data = encode_row(meta(key="00" * 16), PAYLOAD) + PAYLOAD  # consistent checksums, wrong key
    assert reason_of(write(tmp_path / "r.kv", data)) is CorruptReason.KEY_MISMATCH


def test_encode_rejects_malformed_meta() -> None:
    with pytest.raises(ValueError):
        encode_row(meta(key="abc"), PAYLOAD)
    with pytest.raises(ValueError):
        encode_row(meta(namespace=b"short"), PAYLOAD)
