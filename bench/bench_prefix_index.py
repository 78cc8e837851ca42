"""Time PrefixIndex.longest_prefix with 10,000 stored rows and an 8,000-token prompt.

Rows are checkpoints of 200 synthetic 8,000-token conversations, 50 per conversation at
random lengths (so most are not block aligned), plus the shared 1,000-token system prefix
every conversation starts with. Prints the median and p99 lookup time for a full hit
(prompt = a stored conversation plus a new turn), a partial hit on a fresh conversation,
and a miss, with the prompt given as a list of ints and as pre-encoded bytes.

    python bench/bench_prefix_index.py [--rows 10000] [--prompt 8000] [--block 16]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from workbench.cache.keys import CacheNamespace, row_key, token_bytes
from workbench.cache.prefix_index import PrefixIndex


def build(
    n_rows: int, prompt_len: int, block: int, seed: int = 0
) -> tuple[PrefixIndex, bytes, list[list[int]]]:
    rng = random.Random(seed)
    ns = CacheNamespace("ab" * 32, scope="bench").digest()
    index = PrefixIndex(block)
    system = [rng.randrange(150_000) for _ in range(1_000)]
    per_conv = 50
    convs = []
    for _ in range(max(1, n_rows // per_conv)):
        conv = system + [rng.randrange(150_000) for _ in range(prompt_len - len(system))]
        convs.append(conv)
        for n in rng.sample(range(len(system) + 1, prompt_len + 1), per_conv):
            index.insert(ns, conv[:n], row_key(ns, conv[:n]))
    index.insert(ns, system, row_key(ns, system))
    return index, ns, convs


def timeit(fn: Callable[[], object], repeat: int = 300) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--prompt", type=int, default=8_000)
    ap.add_argument("--block", type=int, default=16)
    args = ap.parse_args()
    t0 = time.perf_counter()
    index, ns, convs = build(args.rows, args.prompt, args.block)
    print(f"built {len(index)} rows in {time.perf_counter() - t0:.2f} s (block {args.block})")
    rng = random.Random(1)
    hit = convs[3][: args.prompt - 200] + [rng.randrange(150_000) for _ in range(200)]
    fresh = convs[0][:1_000] + [rng.randrange(150_000) for _ in range(args.prompt - 1_000)]
    miss = [rng.randrange(150_000) for _ in range(args.prompt)]
    for label, prompt in (("deep hit", hit), ("system-prefix hit", fresh), ("miss", miss)):
        match = index.longest_prefix(ns, prompt)
        n = 0 if match is None else match.n_tokens
        med, p99 = timeit(lambda p=prompt: index.longest_prefix(ns, p))
        raw = token_bytes(prompt)
        med_b, p99_b = timeit(lambda r=raw: index.longest_prefix(ns, r))
        print(f"{label:18s} matched {n:5d}/{len(prompt)}  list: median {med:7.1f} us p99 {p99:7.1f} us"
              f"  bytes: median {med_b:7.1f} us p99 {p99_b:7.1f} us")


if __name__ == "__main__":
    main()
