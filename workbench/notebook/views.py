"""pandas views of what the workbench knows: counters, requests, models, sessions, and the
KV cache's rows and tiers. Each returns a DataFrame with fixed columns and dtypes (also
when empty) and a meaningful index.

The cache views take a model id (its engine's `workbench.cache.TieredCache`, through
`model_cache`) or a TieredCache directly (the lab, tests, a cache built by hand).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

import workbench as wb
from workbench import registry
from workbench.cache import HitKind, TieredCache
from workbench.engine.events import REQUEST_PHASES
from workbench.errors import InvalidOption

HIT_KINDS = tuple(kind.value for kind in HitKind)  # the categories of cache_hit_kind columns
PHASES = REQUEST_PHASES


def model_cache(model: str) -> TieredCache:
    """The KV prefix cache a loaded model's engine uses (NotLoaded for an unknown id;
    InvalidOption for a model loaded with cache=False, which has none)."""
    kvcache = registry.get(model).kvcache
    if kvcache is None:
        raise InvalidOption("model", model, "a model loaded with the prefix cache (this one has cache=False)")
    return kvcache.cache


def resolve_cache(cache: TieredCache | str | None = None) -> TieredCache:
    """A TieredCache as given, or the cache of a model id (the only loaded model if None)."""
    if isinstance(cache, TieredCache):
        return cache
    if cache is None:
        loaded = [m["model_id"] for m in wb.list_models()]
        if len(loaded) != 1:
            raise InvalidOption("cache", None, f"a TieredCache or a model id ({len(loaded)} models are loaded)")
        cache = loaded[0]
    if not isinstance(cache, str):
        raise InvalidOption("cache", cache, "a TieredCache or a model id")
    return model_cache(cache)


def _frame(rows: list[dict[str, Any]], dtypes: dict[str, Any], index: str | list[str] | None) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(dtypes))
    df = df.astype(dtypes)
    return df.set_index(index) if index is not None else df


# --- engine -------------------------------------------------------------------------------

def counters(cache: TieredCache | None = None) -> pd.DataFrame:
    """Engine counters (summed over loaded models), and a cache's when one is given.
    Index (source, name); one int64 column `value`."""
    rows = [{"source": "engine", "name": k, "value": int(v)} for k, v in sorted(wb.counters().items())]
    if cache is not None:
        rows += [{"source": "cache", "name": k, "value": int(v)} for k, v in sorted(cache.counters().items())]
    return _frame(rows, {"source": "category", "name": "string", "value": "int64"}, ["source", "name"])


_REQUEST_DTYPES = {
    "ref": "int64", "model": "string", "phase": pd.CategoricalDtype(PHASES), "seq": "Int64",
    "session_id": "object", "cache_hit_kind": pd.CategoricalDtype(HIT_KINDS), "prompt_tokens": "int64",
    "generated_tokens": "int64", "age_s": "float64", "cancel_requested": "bool",
}


def requests() -> pd.DataFrame:
    """Queued and running requests of every model, indexed by ref."""
    return _frame(wb.requests(), _REQUEST_DTYPES, "ref")


_MODEL_DTYPES = {  # nullable dtypes: model_info may lack a key on some builds (gpu, chat...)
    "model_id": "string", "desc": "string", "path": "string", "fingerprint": "string", "n_params": "Int64",
    "size_bytes": "Int64", "n_vocab": "Int64", "n_ctx_train": "Int64", "n_ctx": "Int64", "n_batch": "Int64",
    "n_ubatch": "Int64", "n_seq_max": "Int64", "n_threads": "Int64", "flash_attn": "string",
    "type_k": "string", "type_v": "string", "prefill_chunk_size": "Int64", "available_seqs": "Int64",
    "phase": "category", "queue_depth": "Int64", "has_chat_template": "boolean", "gpu": "object",
}


def models() -> pd.DataFrame:
    """Loaded models (model_info of each), indexed by model_id; extra keys are kept."""
    infos = wb.list_models()
    extra = sorted({k for info in infos for k in info} - set(_MODEL_DTYPES))
    rows = [{k: info.get(k) for k in [*_MODEL_DTYPES, *extra]} for info in infos]
    return _frame(rows, {**_MODEL_DTYPES, **dict.fromkeys(extra, "object")}, "model_id")


def sessions(model: str) -> pd.DataFrame:
    """A model's sticky sessions, indexed by session_id."""
    return _frame(wb.sessions(model), {"session_id": "object", "seq": "Int64", "tokens": "int64",
                                       "busy_ref": "Int64", "idle_s": "float64"}, "session_id")


# --- cache ------------------------------------------------------------------------------------

_ROW_DTYPES = {
    "key": "string", "key_preview": "string", "scope": "string", "n_tokens": "int64", "bytes": "int64",
    "tier": "string", "tiers": "object", "reason": "category", "hits": "int64", "last_hit_at": "float64",
    "created_at": "float64", "pinned": "bool", "live": "bool", "score": "float64",
}


def cache_rows(cache: TieredCache | str | None = None) -> pd.DataFrame:
    """Every cached row with its eviction score under its top tier's policy, indexed by key,
    in eviction order within each tier (the next victim first: unprotected, lowest score).
    Times are the cache clock's seconds (unix time for the engine's cache)."""
    c = resolve_cache(cache)
    order = {t["name"]: i for i, t in enumerate(c.list_tiers())}
    rows = c.rows()
    rows.sort(key=lambda r: (order.get(r["tier"], len(order)), r["pinned"] or r["live"],
                             float("inf") if r["score"] is None else r["score"]))
    return _frame(rows, _ROW_DTYPES, "key")


_TIER_DTYPES = {
    "name": "string", "kind": "category", "policy": "string", "budget_bytes": "Int64", "used_bytes": "int64",
    "reserved_bytes": "int64", "rows": "int64", "occupancy": "Float64", "persistent": "bool", "root": "string",
}


def tiers(cache: TieredCache | str | None = None) -> pd.DataFrame:
    """Tiers fastest first, indexed by name: budget, use, occupancy (used / budget; NA when
    unbounded), policy."""
    c = resolve_cache(cache)
    rows = []
    for t in c.list_tiers():
        budget = t.get("budget_bytes")
        rows.append({**{k: t.get(k) for k in _TIER_DTYPES},
                     "occupancy": (t["used_bytes"] / budget) if budget else None})
    return _frame(rows, _TIER_DTYPES, "name")
