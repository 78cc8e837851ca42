"""The engine's side of the KV prefix cache: namespaces, restores at admission, saves.

One process-wide prefix cache (``workbench.cache.shared``; the ``PrefixCache`` interface,
chunk storage by default) serves every loaded model; a row's key folds in the model
fingerprint, the KV-layout context parameters and the caller's ``cache_scope``, so rows are
only ever reused where the KV would be identical. The loop thread calls
:meth:`EngineCache.restore` and :meth:`EngineCache.save`; each goes down to the cache once,
with the sequence as a ``kv_access.SeqKv`` (the adapter the cache moves KV through:
llama.cpp's per-sequence state, or its chunks). Saves copy the KV on the loop thread (a
native call, GIL released) and hand the bytes to the cache's bounded writer pool; a full
pool drops the save (``saves_dropped``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _native
from ..cache import CacheNamespace, HitKind, SaveReason, row_key
from ..cache.interface import PrefixCache, Restored, Saved
from ..cache.shared import shared_cache
from ..options import ROPE_KEYS
from .kv_access import SeqKv

# Bounds of llama.cpp's sequence state (see max_state_bytes): per cell, K and V rows at most
# twice n_embd wide per layer (GQA only narrows them; some models' head dims widen them) in
# f32, plus the cell's position and sequence ids; per sequence, a fixed allowance for headers
# and the recurrent state of hybrid models.
STATE_CELL_BYTES = 64
STATE_FIXED_BYTES = 256 << 20

__all__ = ["CachedPrefix", "EngineCache", "Restored", "Saved", "kv_bytes_per_token"]


# --- one engine's view ---------------------------------------------------------------------

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
    its memory breakdown) over the cells they hold (``n_cells``: every sequence's)."""
    return sum(b["context"] for b in _native.memory_breakdown(ctx)) // max(1, ctx.n_cells)


class EngineCache:
    """Restores and saves for one loaded model (its fingerprint and KV layout)."""

    def __init__(self, fingerprint: str, quantisation: str, ctx_params: Mapping[str, Any],
                 counters: Any, kv_width: int | None = None, model_id: str = "") -> None:
        self.fingerprint = fingerprint
        self.model_id = model_id  # recorded with each row it saves (who saved a hit's row)
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

    def namespace(self, scope: str, own: str | None = None) -> CacheNamespace:
        """The rows of ``scope``; ``own``: a session's own rows (its ``Session.own_id``), KV
        that only that session restores (cache_saves.py), never found by another request."""
        if own is not None:   # one per session: not kept here
            return CacheNamespace(self.fingerprint, adapters=self.adapters, quantisation=self.quantisation,
                                  kv_params=(*self.kv_params, ("session_own", own)), scope=scope)
        ns = self._namespaces.get(scope)
        if ns is None:
            ns = self._namespaces[scope] = CacheNamespace(
                self.fingerprint, adapters=self.adapters, quantisation=self.quantisation,
                kv_params=self.kv_params, scope=scope)
        return ns

    def restore(self, pool: Any, seq: int, prompt: list[int], scope: str, parent_key: str | None,
                own: str | None = None) -> Restored | None:
        """Load the longest cached prefix of ``prompt`` into ``seq`` (of the SeqPool
        ``pool``); None when nothing usable (a prefix llama.cpp refuses leaves the cache and
        the request runs cold). ``own``: from that session's own rows."""
        return self.cache.restore(self.namespace(scope, own), prompt, parent_key, SeqKv(pool, seq, self.counters),
                                  self.max_state_bytes)

    def max_state_bytes(self, n_tokens: int) -> int | None:
        """The most bytes llama.cpp's state of `n_tokens` cells can take in this model: a
        row file that claims more is refused before it is read (a sparse 40 GiB file)."""
        if self.kv_width is None:
            return None
        return STATE_FIXED_BYTES + n_tokens * (STATE_CELL_BYTES + 2 * 2 * 4 * self.kv_width)

    def key_for(self, tokens: Sequence[int], scope: str) -> str:
        return row_key(self.namespace(scope).digest(), tokens)

    def save(self, pool: Any, seq: int, tokens: list[int], scope: str, reason: SaveReason, *,
             sync: bool = False, live: bool = False, marks: Sequence[int] = (), own: str | None = None) -> Saved | None:
        """Save the KV of ``seq`` (which holds exactly ``tokens``); None when the save was
        dropped or failed. A row already cached is not copied again (``Saved.new`` False).
        ``live``: the row is a live session's KV (evicted only when nothing else frees enough).
        ``marks``: where shared prefixes end in ``tokens`` (chunk storage ends a chunk there).
        ``own``: among that session's own rows (see ``namespace``)."""
        return self.cache.save(self.namespace(scope, own), tokens, SeqKv(pool, seq, self.counters), reason,
                               sync=sync, live=live, marks=marks, saved_by=self.model_id)

    def remove(self, key: str) -> None:
        self.cache.remove(key)

    def set_live(self, key: str | None, live: bool) -> None:
        if key is not None:
            self.cache.set_live(key, live)

    def cached_prefix_len(self, tokens: Sequence[int], scope: str) -> int:
        return self.cache.cached_prefix_len(self.namespace(scope), tokens)

    def cached_prefix(self, tokens: Sequence[int], scope: str, ctx: Any) -> CachedPrefix:
        """What the cache holds of ``tokens`` (see CachedPrefix); no counters move."""
        cache, ns = self.cache, self.namespace(scope)
        held = cache.held(ns, tokens)
        n = held.n_tokens
        kind = HitKind.of(n, len(tokens)).value
        if n == 0:
            return CachedPrefix(0, 0, None, kind, None)
        key: str | None = row_key(ns.digest(), list(tokens[:n]))
        if key not in cache:
            key = None  # a chain of chunks no row names (or the row went meanwhile)
        return CachedPrefix(n, n * kv_bytes_per_token(ctx), held.tier, kind, key)
