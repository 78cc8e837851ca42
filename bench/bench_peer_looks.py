#!/usr/bin/env python3
"""What a replica's look at a shared tier costs after a peer published one row
(``cache.shared.PeerRows``, docs/cluster.md "Shared tier"): two caches in one process over
one real directory, no model (stand-in payloads).

* whole rows: the full start-up ``scan`` of the tier against ``adopt_files`` of the new
  row's name only (what a look does since);
* chunk storage: the adopt-only rescan (``ChunkedCache.adopt_peer_files``) adopting one new
  row of two chunks among ``--rows`` rows of two chunks each.

Medians of 10 looks; times depend on the machine's load (say it with the numbers).

    python bench/bench_peer_looks.py --rows 1000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from workbench.cache import keys
from workbench.cache.chunked import ChunkedCache, chunked_cache
from workbench.cache.keys import CacheNamespace
from workbench.cache.shared import PeerRows
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier

NS = CacheNamespace("cd" * 32)
CHUNK = 16


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def rows(n: int) -> str:
    with tempfile.TemporaryDirectory() as d:
        a, b = (TieredCache([DiskTier("disk", Path(d), None)]) for _ in range(2))
        for i in range(n):
            a.put(NS, [i + 1, 7, 7, 7], b"x" * 64)
        peers = PeerRows()
        peers.adopt(b)
        full, new = [], []
        for j in range(10):
            a.put(NS, [10**6 + j, 1, 2], b"y" * 64)
            t = time.perf_counter()
            b.scan()
            full.append(time.perf_counter() - t)
        for j in range(10):
            a.put(NS, [2 * 10**6 + j, 1, 2], b"y" * 64)
            t = time.perf_counter()
            assert peers.adopt(b, force=True) == 1
            new.append(time.perf_counter() - t)
    return f"rows, {n} in the tier: full scan {median_ms(full):.2f} ms, the new name only {median_ms(new):.2f} ms"


def save(cache: ChunkedCache, tokens: list[int]) -> None:
    first = cache.missing(NS, tokens)
    cache.put(NS, tokens, [k * 8 for k in keys.chunk_keys(NS.digest(), tokens, CHUNK)][first:])


def chunks(n: int) -> str:
    with tempfile.TemporaryDirectory() as d:
        a, b = (chunked_cache([(DiskTier("disk", Path(d), None), None)], "lru", CHUNK) for _ in range(2))
        for i in range(n):
            save(a, [i + 1] * (2 * CHUNK))
        peers = PeerRows()
        peers.adopt(b)
        looks = []
        for j in range(10):
            save(a, [10**6 + j] * (2 * CHUNK))
            t = time.perf_counter()
            assert peers.adopt(b, force=True) == 1
            looks.append(time.perf_counter() - t)
    return f"chunks, {2 * n} chunk files + {n} manifests: a look adopting one new row {median_ms(looks):.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000, help="rows in the tier before the looks")
    args = ap.parse_args()
    print(rows(args.rows))
    print(chunks(args.rows // 2))


if __name__ == "__main__":
    main()
