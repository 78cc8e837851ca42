"""matplotlib figures for the notebook: each function returns its Figure (built with
`matplotlib.figure.Figure`, not pyplot, so nothing is shown twice or kept in pyplot's
global state); pass `ax=` to draw into an existing Axes instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from workbench.notebook.results import HIT_COLOURS, UNKNOWN_COLOUR
from workbench.notebook.views import HIT_KINDS


def _axes(ax: Any, figsize: tuple[float, float] = (7.0, 4.0)) -> tuple[Any, Any]:
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _stats_of(results: Iterable[Any]) -> pd.DataFrame:
    """CompletionResults (or notebook Results) as rows: hit kind, ttft, prompt tokens."""
    rows = []
    for i, r in enumerate(results):
        s = r.stats
        if s is None:
            continue
        rows.append({"request": i, "cache_hit_kind": s.cache_hit_kind, "ttft_s": s.ttft_s,
                     "prompt_tokens": s.prompt_tokens, "prefilled_tokens": s.prefilled_tokens})
    return pd.DataFrame(rows, columns=["request", "cache_hit_kind", "ttft_s", "prompt_tokens", "prefilled_tokens"])


def ttft_cold_warm(results: Iterable[Any], *, ax: Any = None) -> Any:
    """Time to first token of cold requests beside warm ones (any cache hit), one box per
    hit kind with every request as a dot; the title gives the median speed-up."""
    df = _stats_of(results).dropna(subset=["ttft_s"])
    fig, ax = _axes(ax)
    kinds = [k for k in HIT_KINDS if k in set(df["cache_hit_kind"])]
    kinds += sorted(set(df["cache_hit_kind"]) - set(kinds))
    data = [df.loc[df["cache_hit_kind"] == k, "ttft_s"].to_numpy() * 1000 for k in kinds]
    if kinds:
        box = ax.boxplot(data, tick_labels=kinds, patch_artist=True, showfliers=False)
        for patch, k in zip(box["boxes"], kinds):
            patch.set_facecolor(HIT_COLOURS.get(k, UNKNOWN_COLOUR))
            patch.set_alpha(0.35)
        for x, (k, ys) in enumerate(zip(kinds, data), start=1):
            ax.scatter([x] * len(ys), ys, s=12, color=HIT_COLOURS.get(k, UNKNOWN_COLOUR), zorder=3)
    ax.set_ylabel("time to first token (ms)")
    ax.set_xlabel("cache hit kind")
    cold = df.loc[df["cache_hit_kind"] == "cold", "ttft_s"]
    warm = df.loc[df["cache_hit_kind"] != "cold", "ttft_s"]
    title = "cold vs warm time to first token"
    if len(cold) and len(warm) and warm.median() > 0:
        title += f" (median {cold.median() / warm.median():.1f}x faster warm)"
    ax.set_title(title)
    return fig


def hit_kinds_over_time(data: Iterable[Any] | pd.DataFrame, *, window: int = 20, ax: Any = None) -> Any:
    """Share of each hit kind over the last `window` requests, in request order. `data`:
    CompletionResults / Results, or a DataFrame with a cache_hit_kind column (views.requests,
    lab.measure)."""
    df = data if isinstance(data, pd.DataFrame) else _stats_of(data)
    kinds_seen = df["cache_hit_kind"].astype("string").fillna("cold")
    fig, ax = _axes(ax)
    x = range(1, len(df) + 1)
    shares = []
    labels = [k for k in HIT_KINDS if (kinds_seen == k).any()] or ["cold"]
    for k in labels:
        shares.append((kinds_seen == k).astype(float).rolling(window, min_periods=1).mean().to_numpy())
    if len(df):
        ax.stackplot(list(x), shares, labels=labels, colors=[HIT_COLOURS.get(k, UNKNOWN_COLOUR) for k in labels],
                     alpha=0.8)
        ax.legend(loc="upper left", fontsize="small")
    ax.set_ylim(0, 1)
    ax.set_xlabel("request")
    ax.set_ylabel(f"share (last {window} requests)")
    ax.set_title("cache hit kinds over time")
    return fig


def tier_occupancy(tiers: Any, *, ax: Any = None) -> Any:
    """Used bytes against budget per tier (a TieredCache, a model id or views.tiers())."""
    from workbench.notebook import views
    from workbench.units import format_bytes

    df = tiers if isinstance(tiers, pd.DataFrame) else views.tiers(tiers)
    fig, ax = _axes(ax, (7.0, 1.0 + 0.6 * max(1, len(df))))
    names = list(df.index)[::-1]
    rows = df.loc[names]
    budget = rows["budget_bytes"].astype("Float64").fillna(rows["used_bytes"].astype("Float64")).to_numpy(
        dtype=float, na_value=0.0)
    used = rows["used_bytes"].to_numpy(dtype=float)
    ax.barh(names, budget, color="#e9ecef", edgecolor="#adb5bd", label="budget")
    ax.barh(names, used, color="#0d6efd", label="used")
    for y, (u, b, raw_budget) in enumerate(zip(used, budget, rows["budget_bytes"])):
        note = f"{format_bytes(u)} / {format_bytes(None if pd.isna(raw_budget) else int(raw_budget))}"
        ax.text(max(b, u), y, "  " + note, va="center", fontsize="small")
    ax.set_xlabel("bytes")
    ax.set_title("tier occupancy")
    ax.margins(x=0.35)
    return fig


def eviction_timeline(replay: pd.DataFrame, *, size_bytes: int | None = None,
                      policies: Sequence[str] | None = None, ax: Any = None) -> Any:
    """Cumulative evictions (solid) and hits (dashed) per request for each policy, at one
    cache size (default: the smallest), from `lab.replay(...)` output (its
    attrs['timeline']) or that timeline frame itself."""
    tl = replay.attrs.get("timeline") if "request" not in replay.columns else replay
    if tl is None or not len(tl):
        raise ValueError("no timeline: pass lab.replay(...) output (with timeline_points > 0)")
    size = int(tl["size_bytes"].min()) if size_bytes is None else int(size_bytes)
    tl = tl[tl["size_bytes"] == size]
    if not len(tl):
        raise ValueError(f"the replay has no cache size {size_bytes}")
    from workbench.units import format_bytes

    fig, ax = _axes(ax)
    names = policies or [p for p in dict.fromkeys(tl["policy"].astype(str))]
    for name in names:
        part = tl[tl["policy"].astype(str) == name]
        line, = ax.plot(part["request"], part["evictions"], label=f"{name} evictions")
        ax.plot(part["request"], part["hits"], linestyle="--", color=line.get_color(), alpha=0.7,
                label=f"{name} hits")
    ax.set_xlabel("request")
    ax.set_ylabel("cumulative count")
    ax.set_title(f"evictions and hits over the trace ({format_bytes(size)} cache)")
    ax.legend(fontsize="small", ncol=2)
    return fig


def miss_ratio_curves(replay: pd.DataFrame, *, metric: str = "miss_ratio", ax: Any = None) -> Any:
    """`metric` (miss_ratio, hit_ratio, byte_hit_ratio, prefill_saved_fraction, ...)
    against cache size, one line per policy, log-scale sizes."""
    if metric not in replay.columns:
        raise ValueError(f"no column {metric!r} in the replay output")
    from workbench.units import format_bytes

    fig, ax = _axes(ax)
    for name, part in replay.groupby("policy", observed=True, sort=False):
        part = part.sort_values("size_bytes")
        ax.plot(part["size_bytes"], part[metric], marker="o", label=str(name))
    sizes = sorted(set(replay["size_bytes"]))
    ax.set_xscale("log")
    ax.set_xticks(sizes, [format_bytes(s) for s in sizes], rotation=30, fontsize="small")
    ax.minorticks_off()
    ax.set_xlabel("cache size")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_ylim(0, 1 if replay[metric].max() <= 1 else None)
    ax.set_title(f"{metric.replace('_', ' ')} curves")
    ax.legend(fontsize="small")
    return fig


def strategy_latencies(df: pd.DataFrame, *, figsize: tuple[float, float] = (9.0, 3.5)) -> Any:
    """Mean time to first token and mean inter-token latency per batch strategy, for long
    and short requests apart (workbench.lab.scheduling.compare_strategies' DataFrame)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (col, label) in zip(axes, [("ttft_s", "time to first token (ms)"),
                                       ("itl_s", "mean inter-token latency (ms)")]):
        means = df.pivot_table(index="strategy", columns="kind", values=col, aggfunc="mean", sort=False) * 1000
        if not means.empty:
            means.plot.bar(ax=ax, rot=0)
        ax.set_ylabel(label)
        ax.set_xlabel("")
    axes[0].set_title("first token")
    axes[1].set_title("between tokens")
    return fig
