"""The eviction lab: replay a request trace through the KV prefix cache's index and
eviction policies at several byte budgets, without a model, and compare policies.

For each request, in arrival order (the clock is the trace's arrival time in seconds):

1. look up the longest cached prefix of the prompt (none for a one-token prompt, as the
   engine): exact (all of the prompt but at most its last token), partial or cold; a hit
   is a read (hit count and last use move, as the cache's restore);
2. count the prefill it saves: min(matched, prompt - 1) tokens (the engine always decodes
   the last prompt token again, for its logits): the number the engine reports as
   prompt_tokens - prefilled_tokens;
3. store the rows the engine would save: checkpoints, the agent prefix (pinned), the
   prompt without its last token, the prompt + reply (without its end-of-turn token) at
   finish (rules in `plan.py`, after the engine's `SavePoints.plan` and `SavePoints.at_finish`).

KV costs bytes_per_token bytes a token (default 23,040: SmolLM2-135M's f16 K+V per token).
The cache is, by default, the chunk model (`chunksim.ChunkSimCache`: the rules of the chunked
cache, `ChunkedCache` over one `ChunkStore`: rows as manifests over chunks of the cache's
DEFAULT_CHUNK_SIZE (64) tokens, a shared prefix stored once, chain lookups, leaves evicted
first, the store's file sizes,
checked against the real store by tests/unit/test_lab_vs_store.py); with chunk_size=None
the whole-row model (`simcache.SimCache`, a row of n tokens costing n * bytes_per_token).
Both are built from the cache's own Catalog, PrefixIndex, Level and policies, one tier,
without payloads. Sticky sessions are not modelled (the lab is
about the prefix cache); `replay(..., model=...)` measures the real engine beside it.
"""

from __future__ import annotations

import copy
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from workbench.cache.chunk_store import DEFAULT_CHUNK_SIZE  # the lab replays the real cache's default
from workbench.cache.policies import EvictionPolicy, PolicySpec, get_policy
from workbench.cache.types import HitKind
from workbench.errors import InvalidOption
from workbench.lab.belady import LABEL as OPTIMAL
from workbench.lab.belady import Belady, FutureUses, is_belady
from workbench.lab.native import native_plan
from workbench.lab.plan import SAVE_KINDS, Plan, build_plan, check_saves, run_plan
from workbench.lab.simcache import ranking_mode
from workbench.lab.traces import Trace
from workbench.units import parse_bytes

DEFAULT_BYTES_PER_TOKEN = 23_040  # SmolLM2-135M: 30 layers * 2 (K, V) * 192 * 2 bytes (f16)
DEFAULT_POLICIES: tuple[str, ...] = ("lru", "lfu", "frecency", "gdsf", "s3fifo")
TIMELINE_COLUMNS = ["policy", "size_bytes", "request", "time_s", "used_bytes", "rows", "evictions", "hits", "misses"]

__all__ = ["DEFAULT_BYTES_PER_TOKEN", "DEFAULT_POLICIES", "SAVE_KINDS", "Plan", "build_plan", "by_budget",
           "default_sizes", "measure", "plot_miss_ratio_curves", "replay"]


def replay(trace: Trace | Sequence[Sequence[int]], policies: Iterable[PolicySpec] = DEFAULT_POLICIES,
           sizes: Iterable[int | str] | int | str | None = None, *,
           bytes_per_token: int = DEFAULT_BYTES_PER_TOKEN, saves: Iterable[str] = SAVE_KINDS,
           checkpoint_every: int | None = 2048, min_tokens: int = 16, checkpoint_min: int = 0,
           checkpoint_max: int | None = None, model: str | None = None,
           response_tokens: int = 4, sessions: bool = True, workers: int | None = None,
           timeline_points: int = 200, chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> Any:
    """Replay `trace` through each policy at each byte budget; one DataFrame row per pair.

    `policies`: names, classes, instances (deep-copied per budget, the original is left
    alone) or `(row, now) -> priority` functions, as `get_policy` takes them; a function
    whose priority ignores `now` may say so with `fn.time_invariant = True` (faster).
    'belady' (lab only, labelled "optimal"): the offline optimum, Belady's rule with the
    trace's future (`belady.py`), the bound the other policies are measured against.
    `sizes`: byte budgets (ints or '2GiB'); None = 8 budgets from 0.5% to 50% of what the
    trace would store without eviction. `trace` may also be a list of token-id sequences.
    `saves` (a subset of checkpoint, agent_prefix, prompt, finish), `checkpoint_every`
    (None = no checkpoints), `checkpoint_min` / `checkpoint_max` (checkpoints only at
    positions inside that band, in tokens; None = no upper bound) and `min_tokens` are the
    engine's load options cold_checkpoint_interval, cold_min_tokens, cold_max_tokens and
    cache_min_tokens, applied by the engine's own save rule (cache/save_rule.py).

    Columns: policy (categorical, in the given order), size_bytes, requests, hits,
    exact_hits, partial_hits, misses, hit_ratio, miss_ratio, byte_hit_ratio (matched /
    prompt tokens), prompt_tokens, prefill_tokens_saved, prefill_saved_fraction,
    rows_saved, saves_too_large, evictions, evicted_bytes, rows_end, bytes_end, seconds.
    `df.attrs['timeline']`: used bytes, rows and cumulative evictions / hits / misses every
    len/`timeline_points` requests; `df.attrs['params']`: the replay's settings.

    With `model` (a loaded model id) the trace also runs for real, in order, through
    `workbench.complete` (its token ids, `response_tokens` each, greedy; chats and agent
    tasks on sticky sessions when `sessions`), adding measured_* columns (the same on every
    row) and `df.attrs['measured']` / `df.attrs['requests']` (per request, measured beside
    simulated). Keep those traces short: it is real inference.

    `workers`: processes for the (policy, size) pairs; None = the usable cores (forked, so
    functions need not pickle), 1 = in this process.

    The plan (what every request looks up and saves, cut into chunks) is built once per
    call and kept for the next `replay` of the same trace object with the same settings
    (the last two plans, while their trace lives): a second call with other policies or
    budgets starts replaying at once. Built-in policies replay natively (`native.py`).

    `chunk_size` (tokens, default the cache's DEFAULT_CHUNK_SIZE, 64): the chunk model (`chunksim.py`, the chunk store's
    rules): rows are manifests over chunks keyed by `keys.chunk_keys`, a shared prefix
    stored once, lookups of rows or chains of chunks, leaves evicted first, the policy
    scoring chunks, bytes the store's file sizes; adds the columns chunks_end,
    logical_bytes_end (the cached rows as whole rows), shared_bytes_end, chunks_written,
    chunks_reused, chunks_collected, chunk_ties (equal agreements, broken to the chunk used last).
    None: the whole-row model (`simcache.py`: every row stored in full and shared with no
    other, erllama's storage and libCacheSim's objects: the baseline chunk sharing is
    measured against; the cache's ``storage='rows'`` shares a row with the rows it extends).
    """
    import pandas as pd

    if not isinstance(trace, Trace):
        trace = Trace.from_prompts(list(trace))
    if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, int) or bytes_per_token < 1:
        raise ValueError(f"bytes_per_token must be an int >= 1, got {bytes_per_token!r}")
    specs: list[PolicySpec] = (list(policies) if not isinstance(policies, (str, type)) and not callable(policies)
                               else [policies])
    if not specs:
        raise ValueError("replay needs at least one policy")
    labels = _labels(specs)
    # make each policy once now: an unknown name fails here with get_policy's message
    made = [None if is_belady(spec) else _fresh_policy(spec) for spec in specs]
    slow = [p is not None and ranking_mode(p) in ("pure", "full") for p in made]
    plan = _plan(trace, saves=check_saves(saves), checkpoint_every=checkpoint_every,
                 min_tokens=min_tokens, checkpoint_min=checkpoint_min, checkpoint_max=checkpoint_max,
                 chunk_size=chunk_size)
    budgets = _budgets(sizes, plan, bytes_per_token)
    every = max(1, len(trace) // timeline_points) if timeline_points else 0
    jobs = [(p, s) for p in range(len(specs)) for s in budgets]
    # the optimum's future (one unbounded replay), made once here: forked workers inherit it
    future = FutureUses.of(plan) if any(is_belady(spec) for spec in specs) else None
    if plan.chunks is not None and any(_native_spec(p) is not None for p in made):
        native_plan(plan)   # the native replay's arrays, once here: forked workers inherit them
    task = _Task(plan, specs, bytes_per_token, every, model is not None, future)
    # slowest first, so the worker processes finish together
    order = sorted(range(len(jobs)), key=lambda j: (not slow[jobs[j][0]], -jobs[j][1]))
    results: list[dict[str, Any]] = [{}] * len(jobs)
    for j, res in zip(order, _map(task, [jobs[j] for j in order], workers)):
        results[j] = res
    rows: list[dict[str, Any]] = []
    timeline: list[tuple[Any, ...]] = []
    per_request: list[tuple[int, str, int, str, int]] = []
    for (p, size), res in zip(jobs, results):
        timeline.extend((labels[p], size, *point) for point in res.pop("_timeline"))
        per_request.extend((i, labels[p], size, kind, sv) for i, (kind, sv) in enumerate(res.pop("_requests")))
        rows.append({"policy": labels[p], "size_bytes": size, **res})
    df = pd.DataFrame(rows)
    df["policy"] = pd.Categorical(df["policy"], categories=labels)
    df = df.astype({"size_bytes": "int64"})
    tl = pd.DataFrame(timeline, columns=TIMELINE_COLUMNS)
    tl["policy"] = pd.Categorical(tl["policy"], categories=labels)
    df.attrs["timeline"] = tl
    df.attrs["params"] = {"trace": trace.name, "requests": len(trace),
                          "bytes_per_token": bytes_per_token, "saves": check_saves(saves),
                          "checkpoint_every": checkpoint_every, "checkpoint_min": checkpoint_min,
                          "checkpoint_max": checkpoint_max, "min_tokens": min_tokens, "chunk_size": chunk_size,
                          "footprint_bytes": plan.footprint_tokens * bytes_per_token}
    if model is not None:
        _add_measured(df, trace, model, response_tokens, sessions, per_request)
    from workbench.notebook.display import table  # shown with units in IPython; the figures stay raw

    return table(df)


def by_budget(df: Any, metric: str = "miss_ratio") -> Any:
    """``replay``'s ``metric`` as a table: a row per budget (``size_bytes``), a column per
    policy in the replay's order; shown in the metric's display format (a ratio as a
    percent, bytes in MiB), the figures raw."""
    if metric not in getattr(df, "columns", ()) or metric in ("policy", "size_bytes"):
        raise InvalidOption("metric", metric, "a figure column of lab.replay's frame (miss_ratio, "
                            "prefill_saved_fraction, ...)", "lab.by_budget")
    from workbench.notebook.display import table

    out = df.pivot(index="size_bytes", columns="policy", values=metric)
    return table(out[list(dict.fromkeys(df["policy"]))], values=metric)


def plot_miss_ratio_curves(df: Any, *, metric: str = "miss_ratio", ax: Any = None) -> Any:
    """Miss ratio (or another ratio column) against cache size, one line per policy."""
    from workbench.notebook.plots import miss_ratio_curves

    return miss_ratio_curves(df, metric=metric, ax=ax)


def default_sizes(plan: Plan, bytes_per_token: int, points: int = 8) -> list[int]:
    """`points` budgets spaced geometrically from 0.5% to 50% of the plan's footprint."""
    total = max(1, plan.footprint_tokens * bytes_per_token)
    lo, hi = 0.005, 0.5
    return sorted({max(bytes_per_token, int(total * lo * (hi / lo) ** (k / max(1, points - 1))))
                   for k in range(points)})


# --- internals ------------------------------------------------------------------------------------

_PLANS: OrderedDict[tuple[int, tuple[tuple[str, Any], ...]], tuple[weakref.ref[Trace], Plan]] = OrderedDict()
PLANS_KEPT = 2  # the plans of the last replays, for the next replay of the same trace and settings


def _plan(trace: Trace, **settings: Any) -> Plan:
    """`build_plan`, kept for the next replay of the same trace object with the same settings
    (a plan is read-only to replays; at 64-token chunks a production trace's takes seconds
    to build): the last PLANS_KEPT, each as long as its trace lives."""
    key = (id(trace), tuple(sorted(settings.items())))
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is trace:
        _PLANS.move_to_end(key)
        return hit[1]
    plan = build_plan(trace, **settings)
    _PLANS[key] = (weakref.ref(trace, lambda _: _PLANS.pop(key, None)), plan)
    while len(_PLANS) > PLANS_KEPT:
        _PLANS.popitem(last=False)
    return plan

def _budgets(sizes: Iterable[int | str] | int | str | None, plan: Plan, bpt: int) -> list[int]:
    if sizes is None:
        return default_sizes(plan, bpt)
    out = sorted({parse_bytes(s) for s in ([sizes] if isinstance(sizes, (int, str)) else sizes)})
    if not out:
        raise ValueError("replay needs at least one cache size")
    return out


def _labels(specs: list[PolicySpec]) -> list[str]:
    labels: list[str] = []
    for spec in specs:
        if is_belady(spec):
            base = OPTIMAL
        elif isinstance(spec, str):
            base = spec.lower()
        else:
            base = getattr(spec, "name", None) or getattr(spec, "__name__", None) or type(spec).__name__
            base = "custom" if base == "<lambda>" else str(base)
        label, k = base, 2
        while label in labels:
            label, k = f"{base}#{k}", k + 1
        labels.append(label)
    return labels


def _native_spec(policy: EvictionPolicy | None) -> Any:
    """The policy's `native_spec()` (None: it replays through the Python chunk model)."""
    spec_of = getattr(policy, "native_spec", None)
    return None if spec_of is None else spec_of()


def _fresh_policy(spec: PolicySpec, future: FutureUses | None = None) -> EvictionPolicy:
    """A policy of its own for one replay: instances are deep-copied (policies keep state);
    the optimum ('belady') is made over `future`, the replay's plan's, whatever it was given."""
    if is_belady(spec):
        if future is None:
            raise ValueError("the optimal policy ('belady') needs the trace's future: lab.replay makes it")
        return Belady(future)
    if not isinstance(spec, type) and isinstance(spec, EvictionPolicy):
        return copy.deepcopy(spec)
    return get_policy(spec)


@dataclass
class _Task:
    plan: Plan
    specs: list[PolicySpec]
    bytes_per_token: int
    timeline_every: int
    record: bool
    future: FutureUses | None = None   # the plan's future uses, when a policy is the optimum

    def __call__(self, job: tuple[int, int]) -> dict[str, Any]:
        p, size = job
        return run_plan(self.plan, _fresh_policy(self.specs[p], self.future), size, self.bytes_per_token,
                        timeline_every=self.timeline_every, record=self.record)


_FORKED: _Task | None = None  # the task, inherited by forked workers (nothing is pickled)


def _forked_call(job: tuple[int, int]) -> dict[str, Any]:
    assert _FORKED is not None
    return _FORKED(job)


def _map(task: _Task, jobs: list[tuple[int, int]], workers: int | None) -> list[dict[str, Any]]:
    global _FORKED
    n = min(len(jobs), workers if workers is not None else _usable_cores())
    if n <= 1 or len(task.plan.prompts) * len(jobs) < 20_000 or not hasattr(os, "fork"):
        return [task(job) for job in jobs]
    import multiprocessing

    _FORKED = task
    try:
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_forked_call, jobs, chunksize=1))
    finally:
        _FORKED = None


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


# --- measured side by side ----------------------------------------------------------------------

def measure(trace: Trace, model: str, *, response_tokens: int = 4, sessions: bool = True,
            complete: Callable[..., Any] | None = None) -> Any:
    """Run every request of `trace` for real, in order, and return one row per request
    with what the engine reports: prompt_tokens, prefilled_tokens, prefill_tokens_saved
    (prompt - prefilled), cache_hit_kind, ttft_s. Requests with a session id run on a
    sticky session (when `sessions`); agent prefixes are passed as prefix_checkpoint_len
    where the engine has that option. Sessions used are ended afterwards."""
    import pandas as pd

    import workbench as wb
    from workbench.options import RequestOptions, option_names

    run = complete or wb.complete
    n_vocab = wb.model_info(model)["n_vocab"]
    if not trace.literal and trace.token_range[1] > n_vocab:
        raise ValueError(f"the trace draws token ids up to {trace.token_range[1]}, past the vocabulary of "
                         f"{model!r} ({n_vocab})")
    has_prefix_opt = "prefix_checkpoint_len" in option_names(RequestOptions)
    tag = f"lab-{os.getpid()}-{time.monotonic_ns()}"
    used: set[str] = set()
    rows = []
    try:
        for i in range(len(trace)):
            req = trace[i]
            opts: dict[str, Any] = {"response_tokens": response_tokens, "temperature": 0.0}
            if sessions and req.session is not None:
                opts["session_id"] = f"{tag}-{req.session}"
                used.add(opts["session_id"])
            if has_prefix_opt and req.pin_segments:
                opts["prefix_checkpoint_len"] = sum(int(trace.seg_len[s]) for s in req.prompt[:req.pin_segments])
            s = run(model, trace.prompt_token_ids(i), **opts).stats
            rows.append({"request": i, "session": req.session, "prompt_tokens": s.prompt_tokens,
                         "prefilled_tokens": s.prefilled_tokens,
                         "prefill_tokens_saved": s.prompt_tokens - s.prefilled_tokens,
                         "cache_hit_kind": s.cache_hit_kind, "ttft_s": s.ttft_s})
    finally:
        for sid in used:
            try:
                wb.end_session(model, sid)
            except Exception:  # noqa: BLE001 - already gone or reclaimed: nothing to free
                pass
    df = pd.DataFrame(rows, columns=["request", "session", "prompt_tokens", "prefilled_tokens",
                                     "prefill_tokens_saved", "cache_hit_kind", "ttft_s"])
    return df.astype({"request": "int64", "session": "Int64", "prompt_tokens": "int64",
                      "prefilled_tokens": "int64", "prefill_tokens_saved": "int64",
                      "cache_hit_kind": pd.CategoricalDtype([k.value for k in HitKind]),
                      "ttft_s": "float64"}).set_index("request")


def _add_measured(df: Any, trace: Trace, model: str, response_tokens: int, sessions: bool,
                  per_request: list[tuple[int, str, int, str, int]]) -> None:
    import pandas as pd

    m = measure(trace, model, response_tokens=response_tokens, sessions=sessions)
    total = int(m["prompt_tokens"].sum())
    saved = int(m["prefill_tokens_saved"].sum())
    df["measured_requests"] = len(m)
    df["measured_hit_ratio"] = float((m["cache_hit_kind"] != "cold").mean()) if len(m) else 0.0
    df["measured_prefill_tokens_saved"] = saved
    df["measured_prefill_saved_fraction"] = saved / total if total else 0.0
    for kind in HitKind:
        df[f"measured_{kind.value}"] = int((m["cache_hit_kind"] == kind.value).sum())
    sim = pd.DataFrame(per_request, columns=["request", "policy", "size_bytes", "sim_hit_kind",
                                             "sim_prefill_tokens_saved"])
    measured = m[["cache_hit_kind", "prefill_tokens_saved"]].rename(columns={
        "cache_hit_kind": "measured_hit_kind", "prefill_tokens_saved": "measured_prefill_tokens_saved"})
    df.attrs["measured"] = m
    df.attrs["requests"] = sim.merge(measured, left_on="request", right_index=True, how="left")
