#!/usr/bin/env python3
"""What a replica's look at a shared tier costs after a peer published one row
(``cache.shared.PeerRows``, docs/cluster.md "Shared tier"): two caches in one process over
one real directory, no model (stand-in payloads).

* chunk storage: the adopt-only rescan (``ChunkedCache.adopt_peer_files``) adopting one new
  row of two chunks among ``--rows`` / 2 rows of two chunks each;
* whole rows (``storage='rows'``, one chunk a row): the same rescan adopting one new row
  among ``--rows`` rows.

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
from workbench.cache.chunk_store import WHOLE_ROWS
from workbench.cache.chunked import ChunkedCache, chunked_cache
from workbench.cache.keys import CacheNamespace
from workbench.cache.shared import PeerRows
from workbench.cache.tiers import DiskTier

NS = CacheNamespace("cd" * 32)
CHUNK = 16


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def save(cache: ChunkedCache, tokens: list[int]) -> None:
    n_chunks = len(keys.chunk_ends(len(tokens), cache.chunk_size))
    cache.put(NS, tokens, [b"kv" * 32] * (n_chunks - cache.missing(NS, tokens)))


def looks(n: int, chunk_size: int, length: int) -> float:
    """Median ms of a look adopting one new row of ``length`` tokens among ``n`` rows."""
    with tempfile.TemporaryDirectory() as d:
        a, b = (chunked_cache([(DiskTier("disk", Path(d), None), None)], "lru", chunk_size) for _ in range(2))
        for i in range(n):
            save(a, [i + 1] * length)
        peers = PeerRows()
        peers.adopt(b)
        times = []
        for j in range(10):
            save(a, [10**6 + j] * length)
            t = time.perf_counter()
            assert peers.adopt(b, force=True) == 1
            times.append(time.perf_counter() - t)
    return median_ms(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000, help="rows in the tier before the looks")
    args = ap.parse_args()
    n = args.rows // 2
    print(f"chunks, {2 * n} chunk files + {n} manifests: a look adopting one new row "
          f"{looks(n, CHUNK, 2 * CHUNK):.2f} ms")
    print(f"whole rows, {args.rows} chunk files + {args.rows} manifests: a look adopting one new row "
          f"{looks(args.rows, WHOLE_ROWS, 2 * CHUNK):.2f} ms")


if __name__ == "__main__":
    main()
