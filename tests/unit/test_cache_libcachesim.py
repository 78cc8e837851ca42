"""LRU, FIFO and S3-FIFO checked against libCacheSim (the reference simulator), not themselves.

The same seeded Zipf trace is replayed through libcachesim's cache and through a one-tier
TieredCache (RamTier whose budget is the cache size in bytes). To compare like with like:

* an object is a one-token row whose payload has the object's size in bytes (RAM tiers
  account payload bytes only, libcachesim with `consider_obj_metadata=False` counts only
  `obj_size`);
* a request is `get(key)`; a miss is followed by `put` (libcachesim inserts on every miss);
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

from workbench.cache.keys import CacheNamespace, row_key
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import RamTier

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
    return 1 + (obj * 2654435761) % 4  # 1..4 bytes, fixed per object


def reference_misses(name: str, cache_size: int, trace: list[int], size_of: SizeOf) -> int:
    cache = getattr(lcs, name)(cache_size=cache_size)
    return sum(not cache.get(lcs.Request(obj_size=size_of(o), obj_id=o + 1)) for o in trace)


def our_misses(policy: str, cache_size: int, trace: list[int], size_of: SizeOf) -> int:
    tick = itertools.count()
    cache = TieredCache([RamTier("ram", cache_size)], policy=policy, clock=lambda: float(next(tick)))
    ns = NS.digest()
    keys = {o: row_key(ns, [o]) for o in set(trace)}
    misses = 0
    for o in trace:
        if cache.get(keys[o]) is None:
            misses += 1
            assert cache.put(NS, [o], b"x" * size_of(o)) == keys[o]
    assert cache.counters()["bytes_ram"] <= cache_size
    return misses


TRACE = zipf_trace(alpha=1.0, seed=42)


@pytest.mark.parametrize("ours, reference", [("lru", "LRU"), ("fifo", "FIFO"), ("s3fifo", "S3FIFO")])
@pytest.mark.parametrize("cache_size", [20, 100, 400])
def test_miss_counts_equal_libcachesim(ours: str, reference: str, cache_size: int) -> None:
    expected = reference_misses(reference, cache_size, TRACE, unit_size)
    assert our_misses(ours, cache_size, TRACE, unit_size) == expected
    assert 0 < expected < len(TRACE)


@pytest.mark.parametrize("ours, reference", [("lru", "LRU"), ("fifo", "FIFO"), ("s3fifo", "S3FIFO")])
@pytest.mark.parametrize("cache_size", [100, 300])
def test_miss_counts_equal_libcachesim_with_object_sizes(ours: str, reference: str, cache_size: int) -> None:
    trace = zipf_trace(alpha=0.8, seed=7)
    expected = reference_misses(reference, cache_size, trace, mixed_size)
    assert our_misses(ours, cache_size, trace, mixed_size) == expected
