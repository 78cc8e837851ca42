"""PrefixIndex: longest stored prefix, unaligned rows, scope isolation, collision safety."""

from __future__ import annotations

import random

import pytest
from workbench.cache import keys
from workbench.cache.keys import CacheNamespace, row_key
from workbench.cache.prefix_index import KeyConflict, PrefixIndex
from workbench.cache.types import Match

NS = CacheNamespace("ab" * 32).digest()
OTHER = CacheNamespace("ab" * 32, scope="tenant-b").digest()


def add(index: PrefixIndex, tokens: list[int], ns: bytes = NS) -> str:
    key = row_key(ns, tokens)
    index.insert(ns, tokens, key)
    return key


def test_longest_prefix_with_unaligned_rows() -> None:
    index = PrefixIndex(block_size=4)
    seq = list(range(100, 130))
    k3 = add(index, seq[:3])     # shorter than one block: anchored at the root
    k9 = add(index, seq[:9])     # 2 full blocks + 1
    k11 = add(index, seq[:11])   # same node as k9, longer tail
    k16 = add(index, seq[:16])   # block aligned
    assert index.longest_prefix(NS, seq) == Match(k16, 16)
    assert index.longest_prefix(NS, seq[:15]) == Match(k11, 11)
    assert index.longest_prefix(NS, seq[:11]) == Match(k11, 11)
    assert index.longest_prefix(NS, seq[:10]) == Match(k9, 9)
    assert index.longest_prefix(NS, seq[:8]) == Match(k3, 3)
    assert index.longest_prefix(NS, seq[:2]) is None
    # a tail that diverges inside the last block falls back to the shorter row
    assert index.longest_prefix(NS, seq[:10] + [0] + seq[11:]) == Match(k9, 9)
    # diverging in the first block: only the root row can match, and it does not
    assert index.longest_prefix(NS, [100, 101, 0] + seq[3:]) is None
    assert index.cached_prefix_len(NS, seq[:13]) == 11
    assert index.cached_prefix_len(NS, [7]) == 0
    assert len(index) == 4 and k9 in index


def test_remove_forgets_rows_and_their_nodes() -> None:
    index = PrefixIndex(block_size=4)
    seq = list(range(20))
    k5, k13 = add(index, seq[:5]), add(index, seq[:13])
    assert index.remove(k13)
    assert not index.remove(k13)
    assert index.longest_prefix(NS, seq) == Match(k5, 5)
    assert index.remove(k5)
    assert index.longest_prefix(NS, seq) is None
    assert not index._refs and not index._anchored  # nothing leaks


def test_scopes_never_share_rows() -> None:
    index = PrefixIndex(block_size=4)
    seq = list(range(12))
    add(index, seq, ns=OTHER)
    assert index.longest_prefix(NS, seq) is None
    k = add(index, seq[:6])
    assert index.longest_prefix(NS, seq) == Match(k, 6)
    assert index.longest_prefix(OTHER, seq).n_tokens == 12  # type: ignore[union-attr]


def test_hash_collisions_never_give_a_wrong_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block hashes to the same value: lookups must still be exact."""
    monkeypatch.setattr(keys, "block_digest", lambda data: b"\x00" * 16)
    index = PrefixIndex(block_size=2)
    a = [1, 2, 3, 4, 5, 6, 7]
    b = [9, 9, 9, 9, 9]
    ka, kb = add(index, a[:5]), add(index, b)
    add(index, a[:7], ns=OTHER)  # collides too, but another scope
    assert index.longest_prefix(NS, a + [8]) == Match(ka, 5)
    assert index.longest_prefix(NS, b + [1]) == Match(kb, 5)
    assert index.longest_prefix(NS, [1, 2, 3, 4, 0, 6, 7]) is None
    assert index.longest_prefix(NS, [9, 9, 9, 9]) is None  # shorter than every stored row
    index.remove(ka)
    assert index.longest_prefix(NS, a) is None


def test_insert_is_idempotent_and_detects_key_conflicts() -> None:
    index = PrefixIndex(block_size=4)
    k = add(index, [1, 2, 3])
    assert index.insert(NS, [1, 2, 3], k) is False
    with pytest.raises(KeyConflict):
        index.insert(NS, [1, 2, 4], k)
    with pytest.raises(ValueError):
        index.insert(NS, [], "00" * 16)
    with pytest.raises(ValueError):
        PrefixIndex(block_size=0)


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed: int) -> None:
    """Random small alphabets make shared prefixes, partial tails and near misses common."""
    rng = random.Random(seed)
    for _ in range(60):
        block = rng.randint(1, 5)
        rows = [[rng.randrange(3) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(0, 12))]
        query = [rng.randrange(3) for _ in range(rng.randint(0, 14))]
        index = PrefixIndex(block_size=block)
        for r in rows:
            index.insert(NS, r, row_key(NS, r))
        best = max((len(r) for r in rows if len(r) <= len(query) and query[: len(r)] == r), default=0)
        assert index.cached_prefix_len(NS, query) == best
        for r in rows[::2]:
            index.remove(row_key(NS, r))
        rest = [r for i, r in enumerate(rows) if i % 2 and r not in rows[::2]]
        best = max((len(r) for r in rest if len(r) <= len(query) and query[: len(r)] == r), default=0)
        assert index.cached_prefix_len(NS, query) == best


def test_lookup_is_fast_on_a_large_index() -> None:
    """A smaller version of bench/bench_prefix_index.py, as a regression guard."""
    import time

    rng = random.Random(0)
    index = PrefixIndex(block_size=16)
    convs = [[rng.randrange(50_000) for _ in range(4_000)] for _ in range(20)]
    for conv in convs:
        for n in rng.sample(range(1, 4_001), 50):
            index.insert(NS, conv[:n], row_key(NS, conv[:n]))
    prompt = convs[5] + [1, 2, 3]
    expected = max(n for n in range(1, 4_001) if row_key(NS, convs[5][:n]) in index)
    start = time.perf_counter()
    for _ in range(20):
        assert index.cached_prefix_len(NS, prompt) == expected
    per_lookup = (time.perf_counter() - start) / 20
    assert per_lookup < 0.005  # about 0.1 ms here; generous for slow CI machines
