"""Cache namespaces, row keys and chained block hashes (no model needed)."""

from __future__ import annotations

import array
import random

import numpy as np
import pytest
import xxhash

from workbench.cache import keys
from workbench.cache.keys import CacheNamespace, block_hashes, row_key, token_bytes

FP = "ab" * 32


def test_namespace_normalises_kv_params_and_fingerprint() -> None:
    a = CacheNamespace(FP.upper(), kv_params={"type_v": "f16", "type_k": "q8_0"})
    b = CacheNamespace(FP, kv_params=[("type_k", "q8_0"), ("type_v", "f16")])
    assert a == b
    assert a.kv_params == (("type_k", "q8_0"), ("type_v", "f16"))
    assert a.digest() == b.digest() and len(a.digest()) == 32
    assert a.fingerprint_bytes == bytes.fromhex(FP)


@pytest.mark.parametrize(
    "other",
    [
        CacheNamespace("cd" * 32),
        CacheNamespace(FP, adapters=(("aa" * 32, 1.0),)),
        CacheNamespace(FP, quantisation="Q4_K_M"),
        CacheNamespace(FP, kv_params={"flash_attn": True}),
        CacheNamespace(FP, kv_params={"flash_attn": 1}),
        CacheNamespace(FP, scope="tenant-b"),
    ],
)
def test_every_field_changes_the_digest(other: CacheNamespace) -> None:
    assert CacheNamespace(FP).digest() != other.digest()


def test_adapter_order_and_scale_matter() -> None:
    a1, a2 = ("11" * 32, 0.5), ("22" * 32, 1.0)
    assert CacheNamespace(FP, adapters=(a1, a2)).digest() != CacheNamespace(FP, adapters=(a2, a1)).digest()
    assert CacheNamespace(FP, adapters=(("11" * 32, 1),)) == CacheNamespace(FP, adapters=(("11" * 32, 1.0),))
    quarter = CacheNamespace(FP, adapters=(("11" * 32, 0.25),))
    assert CacheNamespace(FP, adapters=(a1,)).digest() != quarter.digest()


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"fingerprint": "xyz"}, ValueError),
        ({"fingerprint": FP, "scope": ""}, ValueError),
        ({"fingerprint": FP, "kv_params": {"type_k": None}}, TypeError),
        ({"fingerprint": FP, "kv_params": [("a", 1), ("a", 2)]}, ValueError),
        ({"fingerprint": FP, "adapters": (("", 1.0),)}, ValueError),
        ({"fingerprint": FP, "adapters": (("aa", "1"),)}, TypeError),
    ],
)
def test_namespace_rejects_bad_fields(kwargs: dict, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        CacheNamespace(**kwargs)


def test_token_bytes_accepts_lists_arrays_numpy_and_bytes() -> None:
    toks = [1, 2, 3, 150_000, -1]
    raw = token_bytes(toks)
    assert raw == b"".join(t.to_bytes(4, "little", signed=True) for t in toks)
    assert token_bytes(array.array("i", toks)) == raw
    assert token_bytes(np.array(toks, dtype=np.int64)) == raw
    assert token_bytes(raw) == raw
    assert keys.tokens_from_bytes(raw) == toks
    with pytest.raises(ValueError):
        token_bytes([2**40])
    with pytest.raises(ValueError):
        token_bytes(b"abc")


def test_block_hashes_chain_from_the_namespace_digest() -> None:
    ns = CacheNamespace(FP).digest()
    toks = list(range(10))
    hashes = block_hashes(ns, toks, 4)
    assert len(hashes) == 2  # the partial third block is not hashed
    h1 = xxhash.xxh3_128_digest(ns + token_bytes(toks[:4]))
    h2 = xxhash.xxh3_128_digest(h1 + token_bytes(toks[4:8]))
    assert hashes == [h1, h2]
    # the same tokens in another scope share no hash
    other = CacheNamespace(FP, scope="b").digest()
    assert not set(hashes) & set(block_hashes(other, toks, 4))
    # a prefix has a prefix of the hashes
    assert block_hashes(ns, toks[:8], 4) == hashes
    with pytest.raises(ValueError):
        block_hashes(ns, toks, 0)


def test_row_key_covers_namespace_and_every_token() -> None:
    ns = CacheNamespace(FP).digest()
    k = row_key(ns, [1, 2, 3])
    assert len(k) == 32 and int(k, 16) >= 0
    assert k == row_key(ns, array.array("i", [1, 2, 3]))
    assert k != row_key(ns, [1, 2])
    assert k != row_key(ns, [1, 2, 4])
    assert k != row_key(CacheNamespace(FP, scope="x").digest(), [1, 2, 3])


def test_common_tokens_counts_whole_agreeing_token_ids() -> None:
    rng = random.Random(5)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(40))]
        b = a[:rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(10))]
        expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert keys.common_tokens(token_bytes(a), token_bytes(b)) == expected
    # ids that differ only in a high byte agree in three of their four bytes: still no match
    assert keys.common_tokens(token_bytes([1, 2, 1 << 24]), token_bytes([1, 2, 2 << 24])) == 2
