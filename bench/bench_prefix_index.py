"""Time the longest-prefix lookup with 10,000 stored rows and an 8,000-token prompt.

Rows are checkpoints of 200 synthetic 8,000-token conversations, 50 per conversation at
random lengths (so most are not block aligned), plus the shared 1,000-token system prefix
every conversation starts with. Prints the median and p99 lookup time for a full hit
(prompt = a stored conversation plus a new turn), a partial hit on a fresh conversation,
and a miss, with the prompt given as a list of ints and as pre-encoded bytes.

Whole rows: ``PrefixIndex.longest_prefix``. ``--chunk-size N``: the same rows in chunk
storage (a ``ChunkedCache`` over a ``ChunkStore`` in memory, chunks of N positions with
stand-in payloads: a lookup never reads them), timing ``ChunkStore.lookup`` (the catalog:
prefix index over manifests, then the chain of the prompt's full chunks and the stored
chunk continuing it) and ``ChunkedCache.lookup`` (what the engine calls: lock, counters,
the tier of the chain).

    python bench/bench_prefix_index.py [--rows 10000] [--prompt 8000] [--block 16]
    python bench/bench_prefix_index.py --chunk-size 256
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from workbench.cache.chunk_store import ChunkStore
from workbench.cache.chunked import ChunkedCache
from workbench.cache.keys import CacheNamespace, row_key, token_bytes
from workbench.cache.prefix_index import PrefixIndex


NAMESPACE = CacheNamespace("ab" * 32, scope="bench")


def rows_of(n_rows: int, prompt_len: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """(every row's tokens, the conversations they checkpoint)."""
    rng = random.Random(seed)
    system = [rng.randrange(150_000) for _ in range(1_000)]
    per_conv = 50
    convs, rows = [], []
    for _ in range(max(1, n_rows // per_conv)):
        conv = system + [rng.randrange(150_000) for _ in range(prompt_len - len(system))]
        convs.append(conv)
        rows += [conv[:n] for n in rng.sample(range(len(system) + 1, prompt_len + 1), per_conv)]
    rows.append(system)
    return rows, convs


def build(n_rows: int, prompt_len: int, block: int, seed: int = 0) -> tuple[PrefixIndex, bytes, list[list[int]]]:
    ns = NAMESPACE.digest()
    index = PrefixIndex(block)
    rows, convs = rows_of(n_rows, prompt_len, seed)
    for r in rows:
        index.insert(ns, r, row_key(ns, r))
    return index, ns, convs


def build_chunked(n_rows: int, prompt_len: int, chunk_size: int,
                  seed: int = 0) -> tuple[ChunkStore, ChunkedCache, list[list[int]]]:
    """The rows in chunk storage, in memory: (the store, the cache over it, the conversations)."""
    store = ChunkStore(None, None, chunk_size=chunk_size)
    cache = ChunkedCache(store)
    rows, convs = rows_of(n_rows, prompt_len, seed)
    for r in rows:
        first = cache.missing(NAMESPACE, r)
        cache.put(NAMESPACE, r, [b"\0" * 16] * (-(-len(r) // chunk_size) - first))
    return store, cache, convs


def timeit(fn: Callable[[], object], repeat: int = 300) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def prompts(convs: list[list[int]], prompt_len: int) -> list[tuple[str, list[int]]]:
    rng = random.Random(1)
    hit = convs[3][: prompt_len - 200] + [rng.randrange(150_000) for _ in range(200)]
    fresh = convs[0][:1_000] + [rng.randrange(150_000) for _ in range(prompt_len - 1_000)]
    miss = [rng.randrange(150_000) for _ in range(prompt_len)]
    return [("deep hit", hit), ("system-prefix hit", fresh), ("miss", miss)]


def main_rows(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    index, ns, convs = build(args.rows, args.prompt, args.block)
    print(f"built {len(index)} rows in {time.perf_counter() - t0:.2f} s (block {args.block})")
    for label, prompt in prompts(convs, args.prompt):
        match = index.longest_prefix(ns, prompt)
        n = 0 if match is None else match.n_tokens
        med, p99 = timeit(lambda p=prompt: index.longest_prefix(ns, p))
        raw = token_bytes(prompt)
        med_b, p99_b = timeit(lambda r=raw: index.longest_prefix(ns, r))
        print(f"{label:18s} matched {n:5d}/{len(prompt)}  list: median {med:7.1f} us p99 {p99:7.1f} us"
              f"  bytes: median {med_b:7.1f} us p99 {p99_b:7.1f} us")


def main_chunked(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    store, cache, convs = build_chunked(args.rows, args.prompt, args.chunk_size)
    print(f"built {len(store.rows)} rows over {len(store.chunks)} chunks of {args.chunk_size} "
          f"in {time.perf_counter() - t0:.2f} s")
    ns = NAMESPACE.digest()
    for label, prompt in prompts(convs, args.prompt):
        match = store.lookup(ns, prompt)
        n = 0 if match is None else match.n_tokens
        med, p99 = timeit(lambda p=prompt: store.lookup(ns, p))
        med_c, p99_c = timeit(lambda p=prompt: cache.lookup(NAMESPACE, p))
        print(f"{label:18s} matched {n:5d}/{len(prompt)}  ChunkStore.lookup: median {med:7.1f} us p99 {p99:7.1f} us"
              f"  ChunkedCache.lookup: median {med_c:7.1f} us p99 {p99_c:7.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--prompt", type=int, default=8_000)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--chunk-size", type=int, default=None, help="the rows in chunk storage, chunks of N")
    args = ap.parse_args()
    if args.chunk_size is None:
        main_rows(args)
    else:
        main_chunked(args)


if __name__ == "__main__":
    main()
