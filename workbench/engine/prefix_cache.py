"""The engine's side of the KV prefix cache: namespaces, restores at admission, saves.

One process-wide :class:`~workbench.cache.TieredCache` (``workbench.cache.shared``) serves
every loaded model; a row's
key folds in the model fingerprint, the KV-layout context parameters and the caller's
``cache_scope``, so rows are only ever reused where the KV would be identical. The loop
thread calls :meth:`EngineCache.restore` and :meth:`EngineCache.save`; both move KV state
through llama.cpp's own per-sequence serialisation (``state_seq_get`` / ``state_seq_set``).
Saves copy the state on the loop thread (a native call, GIL released) and hand the bytes to
the cache's bounded writer pool; a full pool drops the save (``saves_dropped``). With
``configure_cache(storage='chunks')`` the shared cache is a ``ChunkedCache`` and both go
through ``prefix_chunks`` (only missing chunks cut; chains joined).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _native
from ..cache import CacheNamespace, CorruptReason, HitKind, SaveReason, row_key
from ..cache.chunked import ChunkedCache
from ..cache.shared import PrefixCache, shared_cache
from ..options import ROPE_KEYS
from .prefix_chunks import restore_chunks, save_chunks

# --- restoring a sequence's state ---------------------------------------------------------

# Bounds of llama.cpp's sequence state (see max_state_bytes): per cell, K and V rows at most
# twice n_embd wide per layer (GQA only narrows them; some models' head dims widen them) in
# f32, plus the cell's position and sequence ids; per sequence, a fixed allowance for headers
# and the recurrent state of hybrid models.
STATE_CELL_BYTES = 64
STATE_FIXED_BYTES = 256 << 20


def _load_state(ctx: Any, seq: int, payload: bytes, n_tokens: int) -> bool:
    """Hand a verified row's state to llama.cpp; True when the sequence then holds exactly the
    positions 0 .. n_tokens - 1. The native layer refuses a malformed state (positions past
    n_ctx, cell counts, sizes) with ValueError before llama.cpp reads it; llama.cpp itself
    returns 0 (or fewer bytes than given) for what it refuses."""
    try:
        nread = ctx.state_seq_set(seq, payload)
    except ValueError:
        return False
    return (nread == len(payload) and ctx.seq_pos_min(seq) == 0
            and ctx.seq_pos_max(seq) == n_tokens - 1)


# --- one engine's view ---------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class Restored:
    n_tokens: int
    kind: HitKind       # exact | partial
    key: str | None     # None: a chain of chunks no row names (chunk storage)
    tier: str | None
    shared_end: int | None = None  # chunk storage: n_tokens when the row is a pinned (agent) prefix


@dataclass(slots=True, frozen=True)
class CachedPrefix:
    """What the prefix cache holds of a prompt (``wb.cached_prefix``), a probe: ``tokens``, the
    leading tokens a restore would load; ``bytes``, the KV those tokens take in the model's
    context (``tokens`` x its KV bytes per token, whatever the storage keeps on disk);
    ``tier``, where the restore would read from; ``kind``, the hit kind a request for the
    prompt would get (cold, partial, exact); ``key``, the row that serves it, None for a
    chain of chunks no row names (chunk storage) or nothing cached."""

    tokens: int
    bytes: int
    tier: str | None
    kind: str
    key: str | None


def kv_bytes_per_token(ctx: Any) -> int:
    """The KV bytes one token takes in ``ctx``: llama.cpp's KV buffers (the context bytes of
    its memory breakdown) over the cells they hold (``n_ctx``)."""
    return sum(b["context"] for b in _native.memory_breakdown(ctx)) // max(1, ctx.n_ctx)


@dataclass(slots=True, frozen=True)
class Saved:
    key: str
    new: bool           # False: the row was cached already, nothing was stored


class EngineCache:
    """Restores and saves for one loaded model (its fingerprint and KV layout)."""

    def __init__(self, fingerprint: str, quantisation: str, ctx_params: Mapping[str, Any],
                 counters: Any, kv_width: int | None = None) -> None:
        self.fingerprint = fingerprint
        self.kv_width = kv_width  # n_layer * n_embd: bounds the size of a sequence's state
        self.quantisation = quantisation
        # the KV layout, and what computed it: another llama.cpp build (kernels, state format)
        # or backend gives other bits, so its rows would break warm == cold
        backend = "cuda" if _native.cuda and ctx_params.get("n_gpu_layers", 0) != 0 else "cpu"
        # RoPE/YaRN overrides rotate K differently: part of the layout when set (absent: defaults);
        # so do ggml's reference kernels (deterministic=True): their KV has other bits than the
        # default kernels', and a row of one mode restored in the other breaks warm == cold
        layout = ("type_k", "type_v", "flash_attn", *(k for k in (*ROPE_KEYS, "reference_kernels")
                                                      if k in ctx_params))
        self.kv_params = tuple(sorted([*((k, ctx_params[k]) for k in layout),
                                       ("llama_commit", _native.llama_commit), ("backend", backend)]))
        self.counters = counters
        self.adapters: tuple[tuple[str, float], ...] = ()
        self._namespaces: dict[str, CacheNamespace] = {}

    def set_adapters(self, adapters: tuple[tuple[str, float], ...]) -> None:
        """The applied LoRA set (sha256, scale) in order: part of every namespace from now."""
        self.adapters = adapters
        self._namespaces = {}

    @property
    def cache(self) -> PrefixCache:
        return shared_cache()

    def namespace(self, scope: str) -> CacheNamespace:
        ns = self._namespaces.get(scope)
        if ns is None:
            ns = self._namespaces[scope] = CacheNamespace(
                self.fingerprint, adapters=self.adapters, quantisation=self.quantisation,
                kv_params=self.kv_params, scope=scope)
        return ns

    def restore(self, pool: Any, seq: int, prompt: list[int], scope: str, parent_key: str | None) -> Restored | None:
        """Load the longest cached prefix of ``prompt`` into ``seq`` (of the SeqPool
        ``pool``); None when nothing usable."""
        cache = self.cache
        ns = self.namespace(scope)
        if isinstance(cache, ChunkedCache):
            got = restore_chunks(cache, pool, seq, prompt, ns, parent_key,
                                 self.max_state_bytes(cache.chunk_size), self.counters)
            return None if got is None else Restored(*got)
        # waits briefly for a row the writer pool has not stored yet (the previous turn's
        # finish row, say)
        match, by_key = cache.find_prefix(ns, prompt, parent_key)
        if match is None:
            return None
        payload = cache.get(match.key, max_payload=self.max_state_bytes(match.n_tokens))
        if payload is None:
            return None
        pool.trim(seq, 0)
        start = time.perf_counter_ns()
        loaded = _load_state(pool.ctx, seq, payload, match.n_tokens)
        cache.record_ns("unpack_ns", time.perf_counter_ns() - start)
        if not loaded:
            # refused (a malformed state, more cells than this context holds): the sequence
            # is emptied, the row leaves every tier so no later request or process meets it,
            # and this request starts cold
            if not pool.empty(seq):
                self.counters["cache_seq_not_cleared"] += 1
            cache.reject(match.key, CorruptReason.BAD_STATE)
            self.counters["cache_restore_failed"] += 1
            return None
        kind = HitKind.of(match.n_tokens, len(prompt), by_key=by_key)
        return Restored(match.n_tokens, kind, match.key, match.tier)

    def max_state_bytes(self, n_tokens: int) -> int | None:
        """The most bytes llama.cpp's state of `n_tokens` cells can take in this model: a
        row file that claims more is refused before it is read (a sparse 40 GiB file)."""
        if self.kv_width is None:
            return None
        return STATE_FIXED_BYTES + n_tokens * (STATE_CELL_BYTES + 2 * 2 * 4 * self.kv_width)

    def key_for(self, tokens: Sequence[int], scope: str) -> str:
        return row_key(self.namespace(scope).digest(), tokens)

    def save(self, ctx: Any, seq: int, tokens: list[int], scope: str, reason: SaveReason, *,
             sync: bool = False, live: bool = False, marks: Sequence[int] = ()) -> Saved | None:
        """Save the KV of ``seq`` (which holds exactly ``tokens``); None when the save was
        dropped or failed. A row already cached is not copied again (``Saved.new`` False).
        ``live``: the row is a live session's KV (evicted only when nothing else frees enough).
        ``marks``: where shared prefixes end in ``tokens`` (chunk storage ends a chunk there)."""
        cache = self.cache
        ns = self.namespace(scope)
        key = row_key(ns.digest(), tokens)
        if key in cache:
            return self._keep_stored(key, reason, live)
        if isinstance(cache, ChunkedCache):
            stored = save_chunks(cache, ctx, seq, tokens, ns, key, reason, sync=sync, live=live,
                                 counters=self.counters, marks=marks)
            return None if stored is None else Saved(stored, new=True)
        start = time.perf_counter_ns()
        payload = ctx.state_seq_get(seq)
        cache.record_ns("pack_ns", time.perf_counter_ns() - start)
        if sync:
            stored = cache.put(ns, tokens, payload, reason, live=live)
            return None if stored is None else Saved(stored, new=True)
        return Saved(key, new=True) if cache.put_async(ns, tokens, payload, reason, live=live) else None

    def _keep_stored(self, key: str, reason: SaveReason, live: bool) -> Saved:
        """A save of a row the cache holds (either storage) copies nothing: the row is pinned
        when it is an agent prefix and marked live for a live session."""
        if reason is SaveReason.AGENT_PREFIX:
            self.cache.pin(key)
        if live:
            self.cache.set_live(key)
        return Saved(key, new=False)

    def set_live(self, key: str | None, live: bool) -> None:
        if key is not None:
            self.cache.set_live(key, live)

    def cached_prefix_len(self, tokens: Sequence[int], scope: str) -> int:
        return self.cache.cached_prefix_len(self.namespace(scope), tokens)

    def cached_prefix(self, tokens: Sequence[int], scope: str, ctx: Any) -> CachedPrefix:
        """What the cache holds of ``tokens`` (see CachedPrefix); no counters move."""
        cache, ns = self.cache, self.namespace(scope)
        if isinstance(cache, ChunkedCache):
            hit = cache.probe(ns, tokens)
            n, tier = (0, None) if hit is None else (hit.n_tokens, hit.tier)  # the chain a restore reads
        else:
            n, tier = cache.cached_prefix_len(ns, tokens), None
        kind = HitKind.of(n, len(tokens)).value
        if n == 0:
            return CachedPrefix(0, 0, None, kind, None)
        key: str | None = row_key(ns.digest(), list(tokens[:n]))
        if key not in cache:
            key = None  # a chain of chunks no row names (or the row went meanwhile)
        elif tier is None:
            tier = next((r["tier"] for r in cache.rows() if r["key"] == key), None)
        return CachedPrefix(n, n * kv_bytes_per_token(ctx), tier, kind, key)
