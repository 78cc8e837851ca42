"""LRU, FIFO and S3-FIFO checked against libCacheSim (the reference simulator), not themselves.

The same seeded Zipf trace is replayed through libcachesim's cache and through the cache
itself: one memory tier in whole rows (each row one chunk). To compare like with like:

* an object is a one-token row; the tier counts its chunk file and its manifest (the
  store's file sizes, in memory too), so libcachesim's object has that size
  (`consider_obj_metadata=False`: it counts only `obj_size`) and the tier's budget is the
  cache size in those bytes;
* S3-FIFO sizes its queues in the bytes of the chunks it ranks, while the tier's budget
  also counts the manifests: with objects of one size its capacity is set to the chunks'
  share of the budget, so its queues hold the rows libcachesim's do (small: 10% of them).
  With objects of several sizes no capacity does that: a row of payload p costs the tier
  chunk(p) + M (M: a one-token manifest, the same for every row) but the queues only
  chunk(p), so the queues' share of the budget is chunk(p) / (chunk(p) + M), a different
  ratio per object, and which queue S3-FIFO evicts from would differ from libcachesim's,
  whose queues and cache count the same obj_size. So S3-FIFO is compared at one object
  size here; its algorithm (csrc/eviction.h, the core this policy and the eviction lab's
  replay share) is compared at several sizes in tests/notebook/test_lab.py;
* a request reads the row when the cache holds it (a hit, as a lookup's read); a miss is
  followed by `put` (libcachesim inserts on every miss);
* sizes stay below the S3-FIFO small queue (10% of the cache): libcachesim refuses to cache
  a larger object while our cache must keep every row it is given (it goes to main);
* LRU recency comes from a clock that ticks on every call, so no two events share a time.

The miss counts must be equal, not close.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import libcachesim as lcs  # a test dependency (pyproject [test]): the reference must run
import pytest

from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunked import ChunkedCache
from workbench.cache.keys import CacheNamespace, row_key
from workbench.cache.policies import get_policy

NS = CacheNamespace("ab" * 32)
SizeOf = Callable[[int], int]
N_OBJECTS, N_REQUESTS = 1_500, 12_000


def zipf_trace(alpha: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    ids = list(range(N_OBJECTS))
    rng.shuffle(ids)  # popularity not correlated with id
    weights = [1.0 / (rank + 1) ** alpha for rank in range(N_OBJECTS)]
    return rng.choices(ids, weights=weights, k=N_REQUESTS)


def unit_size(obj: int) -> int:
    return 1


def mixed_size(obj: int) -> int:
    return 100 * (1 + (obj * 2654435761) % 4)  # 100..400 bytes of payload, fixed per object


def row_bytes(payload: int) -> int:
    """What a one-token row of ``payload`` bytes costs the tier: its chunk and manifest."""
    return chunk_file_size(1, payload) + manifest_size(1, 1)


def reference_misses(name: str, budget: int, trace: list[int], size_of: SizeOf) -> int:
    cache = getattr(lcs, name)(cache_size=budget)
    return sum(not cache.get(lcs.Request(obj_size=row_bytes(size_of(o)), obj_id=o + 1)) for o in trace)


def our_misses(policy: str, budget: int, trace: list[int], size_of: SizeOf) -> int:
    tick = itertools.count()
    made = get_policy(policy)
    store = ChunkStore(None, budget, chunk_size=WHOLE_ROWS, policy=made, clock=lambda: float(next(tick)))
    if policy == "s3fifo":  # unit sizes only: the chunks' share of the budget (module doc)
        n_rows, rest = divmod(budget, row_bytes(1))
        assert not rest
        made.set_capacity(n_rows * chunk_file_size(1, 1))
    cache = ChunkedCache(store)
    keys = {o: row_key(NS.digest(), [o]) for o in set(trace)}
    misses = 0
    for o in trace:
        if keys[o] in cache:
            store.read_row(keys[o])  # a hit: the policy hears of it as from a lookup's read
        else:
            misses += 1
            assert cache.put(NS, [o], [b"x" * size_of(o)]) == keys[o]
    assert cache.counters()["bytes_ram"] <= budget
    return misses


TRACE = zipf_trace(alpha=1.0, seed=42)


@pytest.mark.parametrize("ours, reference", [("lru", "LRU"), ("fifo", "FIFO"), ("s3fifo", "S3FIFO")])
@pytest.mark.parametrize("n_rows", [20, 100, 400])
def test_miss_counts_equal_libcachesim(ours: str, reference: str, n_rows: int) -> None:
    budget = n_rows * row_bytes(1)
    expected = reference_misses(reference, budget, TRACE, unit_size)
    assert our_misses(ours, budget, TRACE, unit_size) == expected
    assert 0 < expected < len(TRACE)


@pytest.mark.parametrize("ours, reference", [("lru", "LRU"), ("fifo", "FIFO")])
@pytest.mark.parametrize("n_rows", [100, 300])
def test_miss_counts_equal_libcachesim_with_object_sizes(ours: str, reference: str, n_rows: int) -> None:
    budget = n_rows * row_bytes(250)  # about n_rows of the rows (100..400 bytes of payload)
    trace = zipf_trace(alpha=0.8, seed=7)
    expected = reference_misses(reference, budget, trace, mixed_size)
    assert our_misses(ours, budget, trace, mixed_size) == expected
    assert 0 < expected < len(trace)
