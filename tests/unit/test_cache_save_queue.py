"""SaveQueue: bounded, never blocks the caller, counts what it drops or what fails."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from workbench.cache.chunk_backends import ChunkMemory
from workbench.cache.chunk_format import ChunkMeta
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache
from workbench.cache.counters import Counters
from workbench.cache.keys import CacheNamespace
from workbench.cache.policies import get_policy
from workbench.cache.save_queue import SaveQueue

NS = CacheNamespace("ab" * 32)


def test_full_queue_drops_without_blocking() -> None:
    counters = Counters()
    queue = SaveQueue(max_workers=1, max_pending=2, counters=counters)
    gate = threading.Event()
    done: list[int] = []

    def save(i: int) -> None:
        gate.wait(5)
        done.append(i)

    assert queue.submit(save, 1) and queue.submit(save, 2)
    start = time.perf_counter()
    assert not queue.submit(save, 3)
    assert not queue.submit(save, 4)
    assert time.perf_counter() - start < 0.5  # refused at once (a wait would take 5 s)
    assert counters.get("saves_dropped") == 2 and queue.pending == 2
    gate.set()
    assert queue.drain(5)
    assert sorted(done) == [1, 2] and queue.pending == 0
    assert queue.submit(save, 5)  # slots are given back
    assert queue.drain(5)
    queue.close()
    assert not queue.submit(save, 6)
    assert counters.get("saves_dropped") == 3


def test_failures_are_counted_and_free_their_slot() -> None:
    queue = SaveQueue(max_workers=1, max_pending=1)

    def boom() -> None:
        raise OSError("disk full")

    assert queue.submit(boom)
    assert queue.drain(5)
    assert queue.counters.get("saves_failed") == 1
    assert queue.submit(lambda: None)
    queue.close()


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        SaveQueue(max_pending=0)


class SlowMemory(ChunkMemory):
    """Chunks in memory, each write held until ``gate`` is set."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def write_chunk(self, meta: ChunkMeta, payload: bytes) -> int:
        self.gate.wait(5)
        return super().write_chunk(meta, payload)


def test_put_async_uses_the_bounded_pool(tmp_path: Path) -> None:
    gate = threading.Event()
    store = ChunkStore(tiers=[ChunkTier(SlowMemory(gate), None, get_policy("lru"))], chunk_size=WHOLE_ROWS)
    cache = ChunkedCache(store, save_workers=1, max_pending_saves=2)
    results = [cache.put_async(NS, [i], [b"kv"]) for i in range(1, 5)]
    assert results == [True, True, False, False]
    assert cache.counters()["saves_dropped"] == 2
    gate.set()
    cache.close()
    assert len(cache) == 2 and cache.counters()["saves_finish"] == 2
