"""Crash safety: a writer killed with SIGKILL at random moments never leaves a bad row.

A child process saves rows through the real TieredCache/DiskTier path in a loop; the test
kills it at a random time, ~20 times, then scans the directory: no tmp file may survive,
and every adopted row must verify and hold exactly the payload its tokens imply.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import textwrap
import time
from pathlib import Path

from crash_kills import kill_at_random, tmp_files

from workbench.cache.format import read_row
from workbench.cache.keys import CacheNamespace, tokens_from_bytes
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier

FP = "ab" * 32

WRITER = textwrap.dedent(
    """
    import hashlib, random, sys
    from workbench.cache.keys import CacheNamespace
    from workbench.cache.tiered import TieredCache
    from workbench.cache.tiers import DiskTier

    root, seed = sys.argv[1], int(sys.argv[2])
    cache = TieredCache([DiskTier("disk", root, None)], policy="lru")
    ns = CacheNamespace(FP)
    rng = random.Random(seed)
    print("ready", flush=True)
    while True:
        tokens = [rng.randrange(1000) for _ in range(rng.randrange(1, 64))]
        seed_bytes = hashlib.sha256(repr(tokens).encode()).digest()
        payload = seed_bytes * rng.randrange(1, 40_000)  # up to ~1.3 MB
        cache.put(ns, tokens, payload)
    """
).replace("FP", repr(FP))


def expected_prefix(tokens: list[int]) -> bytes:
    return hashlib.sha256(repr(tokens).encode()).digest()


def test_sigkill_during_saves_leaves_only_valid_rows(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    rng = random.Random(1234)
    deadline = time.monotonic() + 20
    kills = 0
    for i in range(20):
        if time.monotonic() > deadline:
            break
        assert kill_at_random(WRITER, [str(root), str(i)], rng, 0.08) == -signal.SIGKILL
        kills += 1
    assert kills >= 10

    cache = TieredCache([DiskTier("disk", root, None)], policy="lru")
    report = cache.scan()["disk"]
    names = os.listdir(root)
    assert not tmp_files(root), names
    assert len(names) == len(report.rows) == len(cache) > 0
    # about half the kills land mid-write; the scan must have cleaned those up
    assert report.orphans_removed >= 1
    ns = CacheNamespace(FP)
    for meta, _size in report.rows:
        row = read_row(root / f"{meta.key}.kv", expected_fingerprint=ns.fingerprint_bytes)
        tokens = tokens_from_bytes(row.meta.tokens)
        prefix = expected_prefix(tokens)
        assert row.payload == prefix * (len(row.payload) // 32) and len(row.payload) % 32 == 0
        assert cache.get(meta.key) == row.payload
        assert cache.cached_prefix_len(ns, tokens) == len(tokens)
