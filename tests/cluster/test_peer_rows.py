"""PeerRows without a model: two caches over one directory, as two replicas see a shared
tier, in whole rows (the rescan itself, chunk by chunk and with writes in flight:
tests/unit/test_cache_chunk_peer_scan.py). A row one publishes is adopted by the other at
its next look, under its tenant scope only; a row published within the directory's mtime
tick of the last look is not missed; a cache in memory only has no peers."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.cache.chunked import ChunkedCache
from workbench.cache.keys import CacheNamespace
from workbench.cache.shared import PeerRows, build

NS = CacheNamespace("cd" * 32, scope="tenant-a")
NS_B = CacheNamespace("cd" * 32, scope="tenant-b")
TOKENS = list(range(1, 41))


def replica_cache(root: Path) -> ChunkedCache:
    cache = build([{"kind": "disk", "root": str(root), "budget_bytes": None}], storage="rows")
    assert isinstance(cache, ChunkedCache)
    return cache


def put(cache: ChunkedCache, ns: CacheNamespace, tokens: list[int], payload: bytes) -> str:
    key = cache.put(ns, tokens, [payload][cache.missing(ns, tokens):])
    assert key is not None
    return key


def test_a_row_one_cache_publishes_is_adopted_by_the_other_at_its_next_look(tmp_path: Path) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    peers = PeerRows()
    assert peers.adopt(b) == 0 and b.lookup(NS, TOKENS) is None
    key = put(a, NS, TOKENS, b"kv" * 50)
    assert peers.adopt(b) == 1
    hit = b.lookup(NS, TOKENS + [99])
    assert hit is not None and hit.key == key and hit.n_tokens == len(TOKENS)
    assert b.read(hit) == [b"kv" * 50]  # the payload verifies as the peer wrote it
    assert b.lookup(NS_B, TOKENS) is None  # another tenant never sees it
    assert peers.adopt(b) == 0  # nothing new


def test_a_row_published_in_the_same_mtime_tick_as_the_last_look_is_not_missed(tmp_path: Path) -> None:
    a, b = replica_cache(tmp_path), replica_cache(tmp_path)
    peers = PeerRows()
    assert peers.adopt(b) == 0
    before = os.stat(tmp_path).st_mtime_ns
    put(a, NS, TOKENS, b"kv" * 50)
    os.utime(tmp_path, ns=(before, before))  # a coarse clock: the publish left the mtime as it was
    assert peers.adopt(b) == 1 and b.lookup(NS, TOKENS) is not None


def test_a_ram_only_cache_has_no_peer_rows() -> None:
    ram = build([{"kind": "ram", "budget_bytes": 1 << 20}], storage="rows")
    assert isinstance(ram, ChunkedCache)
    put(ram, NS, TOKENS, b"kv" * 50)
    assert PeerRows().adopt(ram) == 0
