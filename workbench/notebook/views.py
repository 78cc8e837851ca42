"""pandas views of what the workbench knows: counters, requests, models, sessions, the
KV cache's rows and tiers, and speculative decoding's acceptance and speed-up. Each
returns a DataFrame with fixed columns and dtypes (also when empty) and a meaningful index.

The cache views take a model id (the prefix cache its engine uses, through `model_cache`)
or a cache directly (a `workbench.cache.PrefixCache`: the lab, tests, a cache built by
hand).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

import workbench as wb
from workbench import registry
from workbench import samples as _samples
from workbench.cache import HitKind
from workbench.cache.interface import PrefixCache
from workbench.engine.events import REQUEST_PHASES
from workbench.errors import InvalidOption
from workbench.notebook.display import column_format, table
from workbench.notebook.display import shown as shown  # views.shown(df): a frame's figures as shown
from workbench.units import format_count

HIT_KINDS = tuple(kind.value for kind in HitKind)  # the categories of cache_hit_kind columns
PHASES = REQUEST_PHASES


AnyCache = PrefixCache


def model_cache(model: str) -> AnyCache:
    """The KV prefix cache a loaded model's engine uses (NotLoaded for an unknown id;
    InvalidOption for a model loaded with cache=False, which has none)."""
    kvcache = registry.get(model).kvcache
    if kvcache is None:
        raise InvalidOption("model", model, "a model loaded with the prefix cache (this one has cache=False)")
    return kvcache.cache


def resolve_cache(cache: AnyCache | str | None = None) -> AnyCache:
    """A cache as given, or the cache of a model id (the only loaded model if None)."""
    if isinstance(cache, PrefixCache):
        return cache
    if cache is None:
        loaded = [m["model_id"] for m in wb.list_models()]
        if len(loaded) != 1:
            raise InvalidOption("cache", None, f"a prefix cache (workbench.cache.PrefixCache) or a model id "
                                                  f"({len(loaded)} models are loaded)")
        cache = loaded[0]
    if not isinstance(cache, str):
        raise InvalidOption("cache", cache, "a prefix cache (workbench.cache.PrefixCache) or a model id")
    return model_cache(cache)


def _frame(rows: list[dict[str, Any]], dtypes: dict[str, Any], index: str | list[str] | None) -> pd.DataFrame:
    """The view's DataFrame, marked to show with units in IPython (display.table)."""
    df = pd.DataFrame(rows, columns=list(dtypes))
    df = df.astype(dtypes)
    return table(df.set_index(index) if index is not None else df)


# --- engine -------------------------------------------------------------------------------

def counters(cache: PrefixCache | None = None) -> pd.DataFrame:
    """Engine counters (summed over loaded models), and a cache's when one is given.
    Index (source, name); one int64 column `value`."""
    rows = [{"source": "engine", "name": k, "value": int(v)} for k, v in sorted(wb.counters().items())]
    if cache is not None:
        rows += [{"source": "cache", "name": k, "value": int(v)} for k, v in sorted(cache.counters().items())]
    return _frame(rows, {"source": "category", "name": "string", "value": "int64"}, ["source", "name"])


_REQUEST_DTYPES = {
    "ref": "int64", "model": "string", "phase": pd.CategoricalDtype(PHASES), "seq": "Int64",
    "session_id": "object", "cache_hit_kind": pd.CategoricalDtype(HIT_KINDS), "prompt_tokens": "int64",
    "generated_tokens": "int64", "age_s": "float64", "cancel_requested": "bool", "waiting_for": "string",
}


def requests() -> pd.DataFrame:
    """Queued and running requests of every model, indexed by ref. ``waiting_for``: a queued
    request waiting for another's prefill of its prefix ('request 12', engine/live_share.py)."""
    return _frame(wb.requests(), _REQUEST_DTYPES, "ref")


_HISTORY_DTYPES = {
    "ref": "int64", "model": "string", "cache_scope": "string", "session_id": "object", "arrival": "float64",
    "queued_s": "float64", "ttft_s": "float64", "tpot_s": "float64", "e2e_s": "float64", "itl_s": "object",
    "prompt_tokens": "int64", "cached_tokens": "int64", "prefilled_tokens": "int64", "generated_tokens": "int64",
    "cache_hit_kind": pd.CategoricalDtype(HIT_KINDS), "cache_saved_by": "string", "finish_reason": "string",
    "error": "string",
    "spec_drafted": "Int64", "spec_accepted": "Int64",
}
LATENCY_METRICS = ("queued_s", "ttft_s", "tpot_s", "itl_s", "e2e_s")


def history(model: str | None = None) -> pd.DataFrame:
    """Finished requests (``wb.history``), oldest first, indexed by ref; ``arrival`` in
    seconds on the engine's clock, ``itl_s`` each request's inter-token gaps (an array)."""
    return _frame(wb.history(model), _HISTORY_DTYPES, "ref")


_history_frame = history  # latency()'s default, under a name its argument does not shadow


def latency(history: pd.DataFrame | None = None, by: str | list[str] | None = None,
            metrics: Iterable[str] = LATENCY_METRICS) -> pd.DataFrame:
    """mean / p50 / p90 / p99 (and the count of values) of each latency metric, in seconds,
    over ``history`` (default: ``history()``), per group of ``by`` (e.g. 'cache_hit_kind',
    'model'). ``itl_s`` pools every gap of every request (vLLM's ITL); the others take one
    value per request (requests without one, e.g. a TTFT of a request that failed first,
    are left out)."""
    df = history if history is not None else _history_frame()
    metrics = tuple(metrics)
    for m in metrics:
        if m not in LATENCY_METRICS:
            raise InvalidOption("metrics", m, "some of " + ", ".join(LATENCY_METRICS), "views.latency")
    keys = [by] if isinstance(by, str) else list(by or [])
    groups = df.groupby(keys, observed=True, sort=True) if keys else [((), df)]
    rows = []
    for key, part in groups:
        label = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for m in metrics:
            rows.append({**label, "metric": m, **_percentiles(_values(part, m))})
    out = pd.DataFrame(rows, columns=[*keys, "metric", "count", "mean", "p50", "p90", "p99"])
    return table(out.set_index([*keys, "metric"]))


def _values(df: pd.DataFrame, metric: str) -> Any:
    import numpy as np

    if metric == "itl_s":
        arrays = [a for a in df["itl_s"] if a is not None and len(a)]
        return np.concatenate(arrays).astype("float64") if arrays else np.empty(0)
    return df[metric].dropna().to_numpy(dtype="float64")


def _percentiles(values: Any) -> dict[str, Any]:
    import numpy as np

    if len(values) == 0:
        return {"count": 0, "mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"count": len(values), "mean": float(values.mean()), "p50": float(p50), "p90": float(p90),
            "p99": float(p99)}


_CALL_DTYPES = {"call": "string", "model": "string", "duration_ms": "float64", "ok": "bool", "error": "string",
                "ref": "Int64", "started_at": "float64"}


def calls() -> pd.DataFrame:
    """Facade calls recorded by the timing middleware (``wb.middleware.add(wb.middleware.timing)``),
    oldest first: call, model, duration_ms, ok, error (the exception's class), ref (a
    request's), started_at (epoch s). A stream's row times its creation, not its reading."""
    return _frame(wb.middleware.calls(), _CALL_DTYPES, None)


_MODEL_DTYPES = {  # nullable dtypes: model_info may lack a key on some builds (gpu, chat...)
    "model_id": "string", "params": "string", "desc": "string", "path": "string", "fingerprint": "string",
    "n_params": "Int64", "size_bytes": "Int64", "n_vocab": "Int64", "n_ctx_train": "Int64", "n_ctx": "Int64",
    "n_batch": "Int64", "n_ubatch": "Int64", "n_seq_max": "Int64", "n_threads": "Int64", "flash_attn": "string",
    "type_k": "string", "type_v": "string", "prefill_chunk_size": "Int64", "deterministic": "boolean",
    "available_seqs": "Int64", "phase": "category", "queue_depth": "Int64", "has_chat_template": "boolean",
    "gpu": "object",
}


def models() -> pd.DataFrame:
    """Loaded models (model_info of each), indexed by model_id; extra keys are kept.
    `params` is n_params in words ("135M"); `desc` is llama.cpp's own description, whose
    size ("256M" for SmolLM2-135M) is llama.cpp's size class of the architecture, not a count."""
    infos = wb.list_models()
    extra = sorted({k for info in infos for k in info} - set(_MODEL_DTYPES))
    rows = [{**{k: info.get(k) for k in [*_MODEL_DTYPES, *extra]},
             "params": format_count(info["n_params"]) if info.get("n_params") is not None else None}
            for info in infos]
    return _frame(rows, {**_MODEL_DTYPES, **dict.fromkeys(extra, "object")}, "model_id")


def sessions(model: str) -> pd.DataFrame:
    """A model's sticky sessions, indexed by session_id."""
    return _frame(wb.sessions(model), {"session_id": "object", "seq": "Int64", "tokens": "int64",
                                       "busy_ref": "Int64", "idle_s": "float64"}, "session_id")


# --- cache ------------------------------------------------------------------------------------

MIB = float(1 << 20)

_ROW_DTYPES = {
    "key": "string", "tier": "string", "rank": "Int64", "reason": "category", "n_tokens": "int64",
    "bytes": "int64", "MiB": "float64", "hits": "int64", "age_s": "float64", "idle_s": "float64",
    "pinned": "bool", "live": "bool", "score": "float64", "score_norm": "float64", "tiers": "object",
    "key_preview": "string", "scope": "string", "last_hit_at": "float64", "created_at": "float64",
}


def cache_rows(cache: AnyCache | str | None = None) -> pd.DataFrame:
    """Every cached row, indexed by key, in eviction order within each tier (the next victim
    first: unprotected rows by lowest score, then pinned and live ones).

    `tier` is the fastest tier holding the row, whose policy gives its `score` and whose
    eviction order `rank` is (1 = next victim); `tiers` lists every tier holding a copy.
    `score_norm` places the score between the tier's lowest (0) and highest (1): raw scores
    of time-based policies (lru, frecency) are seconds on the cache clock, alike to many
    digits. `age_s` / `idle_s`: seconds from the row's creation / last use to the snapshot's
    clock reading (`now`, one for all rows; the latest save or hit where a cache gives no
    `now`); ties in score sort by `seq`, the cache's logical clock, as the tier evicts.
    `MiB` is `bytes` / 2**20; `style(df)` shows units."""
    c = resolve_cache(cache)
    order = {t["name"]: i for i, t in enumerate(c.list_tiers())}
    rows = c.rows()
    rows.sort(key=lambda r: (order.get(r["tier"], len(order)), r["pinned"] or r["live"],
                             float("inf") if r["score"] is None else r["score"], r.get("seq", _last_use(r))))
    _add_readable_columns(rows)
    return _frame(rows, _ROW_DTYPES, "key")


def _last_use(row: dict[str, Any]) -> float:
    return float(row["created_at"] if row["last_hit_at"] is None else row["last_hit_at"])


def _add_readable_columns(rows: list[dict[str, Any]]) -> None:
    """rank, score_norm, age_s, idle_s and MiB of rows sorted in eviction order."""
    latest = rows[0]["now"] if rows and "now" in rows[0] else max((_last_use(r) for r in rows), default=0.0)
    scores: dict[Any, list[float]] = {}
    for r in rows:
        if r["score"] is not None:
            scores.setdefault(r["tier"], []).append(r["score"])
    seen: dict[Any, int] = {}
    for r in rows:
        seen[r["tier"]] = seen.get(r["tier"], 0) + 1
        known = scores.get(r["tier"])
        lo, hi = (min(known), max(known)) if known else (0.0, 0.0)
        r.update(rank=None if r["tier"] is None else seen[r["tier"]], MiB=r["bytes"] / MIB,
                 age_s=latest - r["created_at"], idle_s=latest - _last_use(r),
                 score_norm=None if r["score"] is None else ((r["score"] - lo) / (hi - lo) if hi > lo else 0.0))


_CHUNK_DTYPES = {
    "key": "string", "tier": "string", "n_tokens": "int64", "size_bytes": "int64", "refcount": "int64",
    "children": "int64", "leaf": "bool", "protected": "bool", "score": "float64", "hits": "int64", "parent": "string",
}


def cache_chunks(cache: AnyCache | str | None = None) -> pd.DataFrame:
    """Every chunk of a cache (in whole rows, `storage='rows'`, one per row's new KV), indexed
    by key, the next victim first (only leaves are evicted; protected ones last): tier,
    tokens, bytes, refcount (rows naming it), children, score (lower goes first), hits, parent."""
    chunks = resolve_cache(cache).chunk_rows()
    rows = sorted(chunks, key=lambda r: (not r["leaf"], r["protected"], r["score"]))
    return _frame(rows, _CHUNK_DTYPES, "key")


_TIER_DTYPES = {
    "name": "string", "kind": "category", "policy": "string", "budget_bytes": "Int64", "used_bytes": "int64",
    "reserved_bytes": "int64", "rows": "int64", "occupancy": "Float64", "budget_MiB": "Float64",
    "used_MiB": "float64", "percent_full": "Float64", "persistent": "bool", "root": "string",
    "chunks": "int64",
}


def tiers(cache: AnyCache | str | None = None) -> pd.DataFrame:
    """Tiers fastest first, indexed by name: budget, use, occupancy (used / budget; NA when
    unbounded), the same in MiB and percent, policy, ``chunks``: the chunks each holds."""
    c = resolve_cache(cache)
    dtypes = _TIER_DTYPES
    rows = []
    for t in c.list_tiers():
        budget = t.get("budget_bytes")
        full = (t["used_bytes"] / budget) if budget else None
        rows.append({**{k: t.get(k) for k in dtypes}, "occupancy": full,
                     "percent_full": None if full is None else 100 * full,
                     "budget_MiB": None if budget is None else budget / MIB, "used_MiB": t["used_bytes"] / MIB})
    return _frame(rows, dtypes, "name")


# --- display ----------------------------------------------------------------------------------

def style(df: pd.DataFrame) -> Any:
    """A pandas Styler showing a frame in the workbench's one display format
    (`workbench.notebook.display`: bytes as KiB/MiB/GiB, an NA budget as "unbounded",
    shares as percents, seconds to the millisecond, milliseconds, MiB and rates to 0.1,
    counts with thousands separators, unix times as clock times, other figures to four
    significant digits, keys cut to 12 characters), for `to_html` / `to_string` or
    further styling. In IPython the views' frames already show so (`display.shown`); the
    DataFrame keeps its raw numbers."""
    formats = {c: column_format(c, df[c].dtype) for c in df.columns}
    styler = df.style.format(formats)
    if df.index.name == "key":
        styler = styler.format_index(lambda k: str(k)[:12])
    return styler


# --- speculative decoding ---------------------------------------------------------------------

SPEC_OFF = "off"  # the kind of a request that ran without speculation

_SPEC_DTYPES = {
    "request": "int64", "ref": "Int64", "model": "string", "kind": "string", "steps": "int64", "drafted": "int64",
    "accepted": "int64", "acceptance": "Float64", "draft_s": "float64", "verify_s": "float64",
    "generated_tokens": "int64", "decode_tps": "Float64",
}


def speculative(results: Iterable[Any]) -> pd.DataFrame:
    """One row per request (CompletionResults or notebook Results), indexed by its place in
    `results` (`request`; failed ones, without stats, are left out). A request that ran
    without speculation has kind 'off' and zero steps, so plain runs sit beside speculative
    ones. `acceptance` = accepted / drafted (NA without drafts); `draft_s` is time in the
    drafter, `verify_s` the decodes that carried verify rows. Keys of Stats.speculative
    not named here are left out (they stay in `r.stats.speculative`)."""
    rows = []
    for i, r in enumerate(results):
        s = getattr(r, "stats", None)
        if s is None:
            continue
        spec = s.speculative or {}
        rows.append({"request": i, "ref": getattr(r, "ref", None), "model": getattr(r, "model", None),
                     "kind": str(spec.get("kind", SPEC_OFF)) if spec else SPEC_OFF,
                     "steps": int(spec.get("steps", 0)), "drafted": int(spec.get("drafted", 0)),
                     "accepted": int(spec.get("accepted", 0)), "acceptance": spec.get("acceptance"),
                     "draft_s": float(spec.get("draft_s", 0.0)), "verify_s": float(spec.get("verify_s", 0.0)),
                     "generated_tokens": s.generated_tokens, "decode_tps": s.decode_tps})
    return _frame(rows, _SPEC_DTYPES, "request")


_SAMPLE_DTYPES = {
    "sample": "int64", "ref": "Int64", "reply": "string", "generated_tokens": "int64", "mean_logprob": "Float64",
    "finish_reason": "string", "cache_hit_kind": pd.CategoricalDtype(HIT_KINDS), "prefilled_tokens": "int64",
    "ttft_s": "Float64", "seed": "Int64",
}


def samples(results: Iterable[Any]) -> pd.DataFrame:
    """The samples of one call (``complete(..., n=)``, ``chat(..., n=)``, ``%%generate --n``)
    side by side: one row each, indexed by its place in the list (``sample``; best first
    after ``best_of``). ``mean_logprob``: mean log-probability per generated token, the
    ``best_of`` score (NA without logprobs); ``prefilled_tokens``: the prompt tokens the
    sample computed itself (a sample that copied the first one's prompt KV shows 1 and hit
    kind 'shared'); ``seed``: the one it sampled with."""
    rows = []
    for i, r in enumerate(results):
        s = r.stats
        lps = getattr(r, "logprobs", None)
        rows.append({"sample": i, "ref": getattr(r, "ref", None), "reply": getattr(r, "content", None) or r.reply,
                     "generated_tokens": s.generated_tokens, "mean_logprob": _samples.score(r) if lps else None,
                     "finish_reason": r.finish_reason, "cache_hit_kind": s.cache_hit_kind,
                     "prefilled_tokens": s.prefilled_tokens, "ttft_s": s.ttft_s, "seed": s.seed})
    return _frame(rows, _SAMPLE_DTYPES, "sample")


def _position_counts(spec: dict[str, Any]) -> list[tuple[int, int]]:
    """(tried, accepted) at each draft position of one request's Stats.speculative: a draft
    of length L tries positions 1..L, so tried comes from draft_lengths."""
    lengths = {int(k): int(v) for k, v in (spec.get("draft_lengths") or {}).items()}
    longest = max((n for n, c in lengths.items() if c), default=0)
    tried = [sum(c for n, c in lengths.items() if n > p) for p in range(longest)]
    accepted = [int(a) for a in spec.get("accepted_by_position") or []]
    if not accepted:  # older stats: the rates only
        accepted = [round((rate or 0.0) * t) for rate, t in zip(spec.get("acceptance_by_position") or [], tried)]
    accepted += [0] * (longest - len(accepted))
    return list(zip(tried, accepted[:longest]))


def speculative_positions(results: Iterable[Any], *, by: str = "kind") -> pd.DataFrame:
    """Acceptance by draft position (1 = the first token of a draft): `tried` drafts that
    reached the position, `accepted` those whose token there was accepted, and
    `acceptance` = accepted / tried. by='kind' sums the requests of each kind, indexed
    (kind, position); by='request' gives each request's own, indexed (request, position),
    with its kind as a column. Requests without speculation have no positions."""
    if by not in ("kind", "request"):
        raise InvalidOption("by", by, "'kind' or 'request'")
    counts: dict[tuple[Any, int], list[Any]] = {}
    for i, r in enumerate(results):
        s = getattr(r, "stats", None)
        spec = (s.speculative if s is not None else None) or {}
        kind = str(spec.get("kind", SPEC_OFF))
        for p, (tried, accepted) in enumerate(_position_counts(spec), start=1):
            row = counts.setdefault((kind if by == "kind" else i, p), [kind, 0, 0])
            row[1] += tried
            row[2] += accepted
    rows = [{by: key, "position": p, "kind": kind, "tried": t, "accepted": a, "acceptance": a / t if t else None}
            for (key, p), (kind, t, a) in counts.items()]
    dtypes: dict[str, Any] = {by: "string" if by == "kind" else "int64", "position": "int64"}
    if by == "request":
        dtypes["kind"] = "string"
    dtypes.update({"tried": "int64", "accepted": "int64", "acceptance": "Float64"})
    return _frame([{k: row[k] for k in dtypes} for row in rows], dtypes, [by, "position"])


_SPEEDUP_DTYPES = {
    "prompt": "string", "setting": "string", "runs": "int64", "tps": "float64", "plain_tps": "Float64",
    "speedup": "Float64", "acceptance": "Float64",
}


def speculative_speedup(runs: Mapping[str, Iterable[Any] | Mapping[str, Iterable[Any]]]) -> pd.DataFrame:
    """Speed-up of speculative decoding over plain decoding of the same prompt, indexed
    (prompt, setting). `runs` maps a prompt class to its results, either a list (settings
    are the requests' kinds) or a dict of setting label -> results. Plain runs (kind
    'off') are the baseline: `plain_tps` is their median decode tok/s, `tps` a setting's
    median, `speedup` = tps / plain_tps (NA without plain runs); `acceptance` is the
    setting's accepted / drafted over its runs; `runs` counts them."""
    rows = []
    for prompt, given in runs.items():
        groups: dict[str, list[Any]] = {}
        if isinstance(given, Mapping):
            for label, results in given.items():
                groups[str(label)] = list(results)
        else:
            for r in given:
                s = getattr(r, "stats", None)
                groups.setdefault(str((s.speculative or {}).get("kind", SPEC_OFF)) if s else SPEC_OFF, []).append(r)
        frames = {label: speculative(results) for label, results in groups.items()}
        plain = pd.concat([f for f in frames.values() if len(f) and (f["kind"] == SPEC_OFF).all()] or
                          [speculative([])])["decode_tps"].dropna()
        plain_tps = float(plain.median()) if len(plain) else None
        for label, f in frames.items():
            if not len(f) or (f["kind"] == SPEC_OFF).all():
                continue
            tps = float(f["decode_tps"].dropna().median())
            drafted = int(f["drafted"].sum())
            rows.append({"prompt": prompt, "setting": label, "runs": len(f), "tps": tps, "plain_tps": plain_tps,
                         "speedup": tps / plain_tps if plain_tps else None,
                         "acceptance": int(f["accepted"].sum()) / drafted if drafted else None})
    return _frame(rows, _SPEEDUP_DTYPES, ["prompt", "setting"])


# --- generated tokens and their log-probabilities ----------------------------------------------

_TOKEN_DTYPES = {"position": "int64", "id": "int64", "text": "string", "logprob": "float64", "prob": "float64",
                 "rank": "Int64", "alternatives": "object"}


def tokens(result: Any) -> pd.DataFrame:
    """One row per generated token of a result of a request made with ``logprobs=N``
    (a CompletionResult, ChatResult or notebook Result), indexed by `position` in the reply:
    its `id`, `text`, `logprob` and `prob` (= exp(logprob)), its `rank` among the N most
    likely tokens there (1 = the most likely; NA when not among them, or N = 0), and those
    `alternatives` as a list of (text, prob), most likely first."""
    logprobs = getattr(result, "logprobs", None)
    if logprobs is None:
        raise InvalidOption("result", type(result).__name__, "the result of a request made with logprobs=N")
    rows = []
    for i, lp in enumerate(logprobs):
        ranks = [k for k, t in enumerate(lp.top, 1) if t.id == lp.id]
        rows.append({"position": i, "id": lp.id, "text": lp.text, "logprob": lp.logprob,
                     "prob": math.exp(lp.logprob), "rank": ranks[0] if ranks else None,
                     "alternatives": [(t.text, math.exp(t.logprob)) for t in lp.top]})
    return _frame(rows, _TOKEN_DTYPES, "position")
