"""Chunk files and manifests (chunk_format.py, version 3) against bit flips: every bit of a
file's header and body, flipped alone, is refused with the reason of the first check it
fails, as the row format's (test_cache_format.py). Fields no other check reads (a
manifest's hits, created-at, pinned flag, save reason, fingerprint and saved-by; a chunk's
created-at and payload checksum) are caught by the header checksum alone: without it they
would be read silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cache import keys
from workbench.cache.chunk_format import (
    HEADER_SIZE,
    Manifest,
    chunks_of,
    encode_chunk,
    encode_manifest,
    read_chunk,
    read_manifest,
    saved_by_text,
)
from workbench.cache.format import CorruptReason, CorruptRow
from workbench.cache.types import SaveReason, stored_model_id

NS = bytes(range(32))
FP = bytes(range(100, 132))
CS = 4
TOKENS = keys.token_bytes(list(range(10)))
SIZES = {CorruptReason.TRUNCATED, CorruptReason.SIZE_MISMATCH, CorruptReason.TOO_LARGE}

# manifest header: (offset, size, field, the reasons a flip there may give)
MANIFEST_FIELDS = [
    (0, 8, "magic", {CorruptReason.BAD_MAGIC}),
    (8, 2, "version", {CorruptReason.BAD_VERSION}),
    (10, 2, "flags (pinned)", {CorruptReason.HEADER_CHECKSUM}),
    (12, 1, "save reason", {CorruptReason.HEADER_CHECKSUM}),
    (13, 3, "reserved", {CorruptReason.HEADER_CHECKSUM}),
    (16, 4, "chunk size", {CorruptReason.HEADER_CHECKSUM}),
    (20, 4, "n_tokens", SIZES),
    (24, 4, "n_chunks", SIZES),
    (28, 4, "hits", {CorruptReason.HEADER_CHECKSUM}),
    (32, 8, "created at", {CorruptReason.HEADER_CHECKSUM}),
    (40, 4, "reserved", {CorruptReason.HEADER_CHECKSUM}),
    (44, 16, "row key", {CorruptReason.HEADER_CHECKSUM}),
    (60, 32, "namespace", {CorruptReason.HEADER_CHECKSUM}),
    (92, 32, "fingerprint", {CorruptReason.HEADER_CHECKSUM}),
    (124, 28, "saved by", {CorruptReason.HEADER_CHECKSUM}),
    (152, 8, "header checksum", {CorruptReason.HEADER_CHECKSUM}),
]

CHUNK_FIELDS = [
    (0, 8, "magic", {CorruptReason.BAD_MAGIC}),
    (8, 2, "version", {CorruptReason.BAD_VERSION}),
    (10, 2, "flags", {CorruptReason.HEADER_CHECKSUM}),
    (12, 4, "p0", {CorruptReason.HEADER_CHECKSUM}),
    (16, 4, "n_tokens", SIZES),
    (20, 4, "reserved", {CorruptReason.HEADER_CHECKSUM}),
    (24, 8, "payload length", SIZES),
    (32, 16, "key", {CorruptReason.HEADER_CHECKSUM}),
    (48, 16, "parent key", {CorruptReason.HEADER_CHECKSUM}),
    (64, 32, "namespace", {CorruptReason.HEADER_CHECKSUM}),
    (96, 32, "fingerprint", {CorruptReason.HEADER_CHECKSUM}),
    (128, 16, "payload checksum", {CorruptReason.HEADER_CHECKSUM}),
    (144, 8, "created at", {CorruptReason.HEADER_CHECKSUM}),
    (152, 8, "header checksum", {CorruptReason.HEADER_CHECKSUM}),
]


def manifest_bytes(saved_by: str = "qwen-0.5b") -> bytes:
    metas = chunks_of(NS, FP, TOKENS, CS, 5.0)
    m = Manifest(keys.row_key_from_bytes(NS, TOKENS), NS, FP, TOKENS, CS, tuple(c.key for c in metas),
                 SaveReason.CONTINUED, 1234.5, 7, True, saved_by=saved_by)
    return encode_manifest(m)


def chunk_bytes() -> tuple[bytes, bytes]:
    meta = chunks_of(NS, FP, TOKENS, CS, 5.0)[1]   # a chunk with a parent
    payload = bytes(range(256)) * 2
    return encode_chunk(meta, payload) + payload, payload


def refusal(read, path: Path, data: bytes) -> CorruptReason | None:
    path.write_bytes(data)
    try:
        read(path)
    except CorruptRow as exc:
        return exc.reason
    return None


def flips(data: bytes, start: int, size: int):
    for i in range(start, start + size):
        for bit in range(8):
            out = bytearray(data)
            out[i] ^= 1 << bit
            yield i, bit, bytes(out)


def test_the_good_files_read_back(tmp_path):
    path = tmp_path / "m.kvm"
    path.write_bytes(manifest_bytes())
    m = read_manifest(path)
    assert (m.hits, m.created_at, m.pinned, m.reason, m.fingerprint) == (7, 1234.5, True, SaveReason.CONTINUED, FP)
    assert m.saved_by == "qwen-0.5b"
    data, payload = chunk_bytes()
    path = tmp_path / "c.kvc"
    path.write_bytes(data)
    assert read_chunk(path)[1] == payload


@pytest.mark.parametrize("model_id, recorded", [
    ("", ""),                                         # a save with no id, or a file from before the field
    ("a" * 28, "a" * 28),                             # the room there is
    ("b" * 40, "b" * 28),                             # a longer id is cut
    ("x" * 27 + "é", "x" * 27),                       # ... between characters, never inside one
])
def test_the_model_that_saved_a_row_reads_back_as_recorded(tmp_path, model_id, recorded):
    path = tmp_path / "m.kvm"
    path.write_bytes(manifest_bytes(model_id))
    assert read_manifest(path).saved_by == recorded == stored_model_id(model_id)


def test_a_saved_by_field_that_is_not_utf8_reads_back_replaced_not_raised():
    assert saved_by_text(b"\xff\xfeab" + bytes(24)) == "\ufffd\ufffdab"


@pytest.mark.parametrize("start, size, field, reasons", MANIFEST_FIELDS, ids=[f[2] for f in MANIFEST_FIELDS])
def test_a_bit_flipped_in_any_manifest_header_field_is_refused(tmp_path, start, size, field, reasons):
    good = manifest_bytes()
    for i, bit, data in flips(good, start, size):
        got = refusal(read_manifest, tmp_path / "m.kvm", data)
        assert got in reasons, f"{field}: byte {i} bit {bit} gave {got}"


def test_a_bit_flipped_in_a_manifests_tokens_chunk_keys_or_ends_is_refused(tmp_path):
    good = manifest_bytes()
    for i, bit, data in flips(good, HEADER_SIZE, len(good) - HEADER_SIZE):
        got = refusal(read_manifest, tmp_path / "m.kvm", data)
        assert got is CorruptReason.HEADER_CHECKSUM, f"body byte {i - HEADER_SIZE} bit {bit} gave {got}"


@pytest.mark.parametrize("start, size, field, reasons", CHUNK_FIELDS, ids=[f[2] for f in CHUNK_FIELDS])
def test_a_bit_flipped_in_any_chunk_header_field_is_refused(tmp_path, start, size, field, reasons):
    good, _ = chunk_bytes()
    for i, bit, data in flips(good, start, size):
        got = refusal(read_chunk, tmp_path / "c.kvc", data)
        assert got in reasons, f"{field}: byte {i} bit {bit} gave {got}"


def test_a_bit_flipped_in_a_chunks_tokens_or_payload_is_refused(tmp_path):
    good, payload = chunk_bytes()
    body = len(good) - len(payload)
    for i, bit, data in flips(good, HEADER_SIZE, body - HEADER_SIZE):
        got = refusal(read_chunk, tmp_path / "c.kvc", data)
        assert got is CorruptReason.HEADER_CHECKSUM, f"token byte {i - HEADER_SIZE} bit {bit} gave {got}"
    for i in (body, body + len(payload) // 2, len(good) - 1):   # the payload: its own checksum
        for _, _, data in flips(good, i, 1):
            assert refusal(read_chunk, tmp_path / "c.kvc", data) is CorruptReason.PAYLOAD_CHECKSUM
