"""Hand-made caches for the notebook layer's tests: the real cache in whole rows (each row one
chunk of its own; rows of distinct tokens share nothing), in memory, on a clock of the
test's, its rows put with stand-in payloads. A row costs the tier its chunk file and its
manifest (``row_bytes``): the store counts file sizes, in memory too."""

from __future__ import annotations

from collections.abc import Callable

from workbench.cache import CacheNamespace
from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunked import ChunkedCache
from workbench.cache.types import SaveReason


def whole_rows(budget: int | None = None, policy: str = "lru",
               clock: Callable[[], float] | None = None) -> ChunkedCache:
    kw = {} if clock is None else {"clock": clock}
    return ChunkedCache(ChunkStore(None, budget, chunk_size=WHOLE_ROWS, policy=policy, **kw))


def put(cache: ChunkedCache, ns: CacheNamespace, tokens: list[int], payload: bytes,
        reason: str = "finish") -> str:
    key = cache.put(ns, tokens, [payload][cache.missing(ns, tokens):], SaveReason.parse(reason))
    assert key is not None
    return key


def hit(cache: ChunkedCache, ns: CacheNamespace, tokens: list[int]) -> None:
    """A restore's read of the row of exactly ``tokens``."""
    found = cache.lookup(ns, tokens)
    assert found is not None and found.n_tokens == len(tokens) and cache.read(found) is not None


def row_bytes(n_tokens: int, payload: int) -> int:
    """What a row of one chunk costs its tier."""
    return chunk_file_size(n_tokens, payload) + manifest_size(n_tokens, 1)
