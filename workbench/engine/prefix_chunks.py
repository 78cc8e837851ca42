"""The engine's side of the chunked prefix cache (``configure_cache(storage='chunks')``):
a save cuts only the chunks the cache lacks out of llama.cpp, a restore joins a stored
chain into the sequence.

* **Save.** ``ChunkedCache.missing`` says from which chunk the row is not stored; only
  chunks from there are copied out (``kv_chunks.cut(first=...)``, on the loop thread, the
  GIL released), then handed to the cache (synchronously, or to its writer pool). A state
  the cut refuses (a SWA window cache, a recurrent model: ``KvChunksRefused``) is not saved
  (``cache_chunk_cut_refused``).
* **Restore.** The chain's payloads are verified by the store (checksums, keys recomputed);
  the native join checks keys, positions and layout again before llama.cpp sees the state,
  ending at the match's length (a row served by a longer chunk's first positions, a prompt
  that leaves a chunk). A refused join, or a state llama.cpp does not take, empties the
  sequence, removes the chain (``rejected_bad_state``), counts ``cache_restore_failed``
  and the request runs cold, as a refused row does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..cache import CorruptReason, HitKind, SaveReason
from ..cache.chunked import ChunkedCache
from ..cache.keys import CacheNamespace
from ..errors import KvChunksRefused
from . import kv_chunks


def restore_chunks(cache: ChunkedCache, pool: Any, seq: int, prompt: list[int], ns: CacheNamespace,
                   parent_key: str | None, max_payload: int | None,
                   counters: Any) -> tuple[int, HitKind, str | None, str | None, int | None] | None:
    """Join the longest stored prefix of ``prompt`` into ``seq``: (tokens, hit kind, row key
    or None for a chain no row names, tier, where a shared prefix ends: the tokens when the
    row is pinned, an agent prefix), or None (nothing usable, or refused)."""
    hit, by_key = cache.find_prefix(ns, prompt, parent_key)
    if hit is None:
        return None
    pieces = cache.read(hit, max_payload)
    if pieces is None:
        return None
    pool.trim(seq, 0)
    start = time.perf_counter_ns()
    try:
        nread = kv_chunks.load(pool.ctx, seq, pieces, hit.chunks, n_tokens=hit.n_tokens)
    except KvChunksRefused:
        nread = 0
    cache.record_ns("unpack_ns", time.perf_counter_ns() - start)
    ctx = pool.ctx
    if nread <= 0 or ctx.seq_pos_min(seq) != 0 or ctx.seq_pos_max(seq) != hit.n_tokens - 1:
        pool.trim(seq, 0)
        if not pool.empty(seq):
            counters["cache_seq_not_cleared"] += 1
        cache.reject_chain(hit.chunks, CorruptReason.BAD_STATE)
        counters["cache_restore_failed"] += 1
        return None
    shared = hit.n_tokens if hit.key is not None and cache.is_pinned(hit.key) else None
    return hit.n_tokens, HitKind.of(hit.n_tokens, len(prompt), by_key=by_key), hit.key, hit.tier, shared


def save_chunks(cache: ChunkedCache, ctx: Any, seq: int, tokens: list[int], ns: CacheNamespace, key: str,
                reason: SaveReason, *, sync: bool, live: bool, counters: Any,
                marks: Sequence[int] = ()) -> str | None:
    """Save the row of ``seq`` (which holds exactly ``tokens``, its shared prefixes ending at
    ``marks``) under ``key``, a row the cache does not hold yet (``EngineCache.save`` deals
    with a stored one): its key, or None when the save was dropped, refused or failed."""
    plan = cache.plan(ns, tokens, marks)
    start = time.perf_counter_ns()
    try:
        pieces = kv_chunks.cut(ctx, seq, plan.keys, cache.chunk_size, plan.first, plan.ends) \
            if plan.first < len(plan.keys) else []
    except KvChunksRefused:
        counters["cache_chunk_cut_refused"] += 1
        return None
    cache.record_ns("pack_ns", time.perf_counter_ns() - start)
    if sync:
        return cache.put(ns, tokens, pieces, reason, live=live, ends=plan.ends)
    return key if cache.put_async(ns, tokens, pieces, reason, live=live, ends=plan.ends) else None
