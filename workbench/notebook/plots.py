"""matplotlib figures for the notebook: each function returns its Figure (built with
`matplotlib.figure.Figure`, not pyplot, so nothing is shown twice or kept in pyplot's
global state; `workbench.notebook.figure.Figure`, which shows itself as a PNG in IPython
without `%matplotlib inline`); pass `ax=` to draw into an existing Axes instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from workbench.notebook.results import HIT_COLOURS, UNKNOWN_COLOUR
from workbench.notebook.views import HIT_KINDS


def figure_and_axes(ax: Any, figsize: tuple[float, float] = (7.0, 4.0)) -> tuple[Any, Any]:
    """(ax's Figure, ax), or a new Figure of ``figsize`` inches with one Axes."""
    if ax is not None:
        return ax.figure, ax
    from workbench.notebook.figure import Figure

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
    hit kind with every request as a dot, on a log axis (warm is often 100x faster). Each
    warm kind is labelled with its speed-up (median cold / median of that kind); the title
    gives median cold / median warm over all warm requests."""
    df = _stats_of(results).dropna(subset=["ttft_s"])
    fig, ax = figure_and_axes(ax)
    kinds = [k for k in HIT_KINDS if k in set(df["cache_hit_kind"])]
    kinds += sorted(set(df["cache_hit_kind"]) - set(kinds))
    data = [df.loc[df["cache_hit_kind"] == k, "ttft_s"].to_numpy() * 1000 for k in kinds]
    if kinds:
        _boxes_and_dots(ax, kinds, data)
    if len(df) and (df["ttft_s"] > 0).all():
        _log_scale(ax)
    label_y_once(ax, "time to first token (ms, log scale)" if ax.get_yscale() == "log" else "time to first token (ms)")
    ax.set_xlabel("cache hit kind")
    cold = df.loc[df["cache_hit_kind"] == "cold", "ttft_s"].to_numpy() * 1000
    _label_speedups(ax, cold, kinds, data)
    ratio = speedup(cold, df.loc[df["cache_hit_kind"] != "cold", "ttft_s"].to_numpy() * 1000)
    title = "cold vs warm time to first token"
    ax.set_title(title + (f" (median {ratio:.1f}x faster warm)" if ratio is not None else ""))
    return fig


def label_y_once(ax: Any, label: str) -> None:
    """``ax``'s y label, unless it shares its y axis with a panel to its left in the same
    figure (subplots(..., sharey=True)): a shared axis is labelled once, on the left."""
    x0 = ax.get_position().x0
    left = [a for a in ax.get_shared_y_axes().get_siblings(ax)
            if a is not ax and a.figure is ax.figure and a.get_position().x0 < x0 - 1e-9]
    ax.set_ylabel("" if left else label)


def _boxes_and_dots(ax: Any, kinds: list[str], data: list[Any]) -> None:
    box = ax.boxplot(data, tick_labels=kinds, patch_artist=True, showfliers=False)
    for patch, k in zip(box["boxes"], kinds):
        patch.set_facecolor(HIT_COLOURS.get(k, UNKNOWN_COLOUR))
        patch.set_alpha(0.35)
    for x, (k, ys) in enumerate(zip(kinds, data), start=1):
        ax.scatter([x] * len(ys), ys, s=12, color=HIT_COLOURS.get(k, UNKNOWN_COLOUR), zorder=3)


def _log_scale(ax: Any) -> None:
    """A log y axis labelled 1, 2, 5, 10, 20, 50, ... (not 10^1), other ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _label_speedups(ax: Any, cold: Any, kinds: list[str], data: list[Any]) -> None:
    """"12.3x faster" above each warm kind's box (median cold / median of that kind)."""
    for x, (kind, ys) in enumerate(zip(kinds, data), start=1):
        ratio = None if kind == "cold" else speedup(cold, ys)
        if ratio is not None:
            ax.annotate(f"{ratio:.1f}x faster", (x, float(pd.Series(ys).max())), xytext=(0, 6),
                        textcoords="offset points", ha="center", va="bottom", fontsize="small")


def speedup(cold: Any, warm: Any) -> float | None:
    """median(cold) / median(warm) (None without both, or with a zero warm median)."""
    cold, warm = pd.Series(cold, dtype=float), pd.Series(warm, dtype=float)
    if not len(cold) or not len(warm) or not warm.median() > 0:
        return None
    return float(cold.median() / warm.median())


def hit_kinds_over_time(data: Iterable[Any] | pd.DataFrame, *, window: int = 20, ax: Any = None) -> Any:
    """Share of each hit kind over the last `window` requests, in request order. `data`:
    CompletionResults / Results, or a DataFrame with a cache_hit_kind column (views.requests,
    lab.measure)."""
    df = data if isinstance(data, pd.DataFrame) else _stats_of(data)
    kinds_seen = df["cache_hit_kind"].astype("string").fillna("cold")
    fig, ax = figure_and_axes(ax)
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
    """Percent of its budget each tier holds (a prefix cache, a model id or views.tiers()),
    labelled with used / budget bytes; an unbounded tier has no percent, only its use."""
    from workbench.notebook import views
    from workbench.units import format_bytes

    df = tiers if isinstance(tiers, pd.DataFrame) else views.tiers(tiers)
    fig, ax = figure_and_axes(ax, (7.0, 1.0 + 0.6 * max(1, len(df))))
    rows = df.loc[list(df.index)[::-1]]  # fastest on top
    names = [str(n) for n in rows.index]
    full = (100 * rows["used_bytes"] / rows["budget_bytes"].astype("Float64")).to_numpy(dtype=float, na_value=0.0)
    bounded = rows["budget_bytes"].notna().to_numpy()
    ax.barh(names, [100.0 if b else 0.0 for b in bounded], color="#e9ecef", edgecolor="#adb5bd", label="budget")
    ax.barh(names, full, color="#0d6efd", label="used")
    for y, (used, budget, pct) in enumerate(zip(rows["used_bytes"], rows["budget_bytes"], full)):
        note = f"{format_bytes(used)} / {format_bytes(None if pd.isna(budget) else budget)}"
        ax.text(100, y, "  " + ("" if pd.isna(budget) else f"{pct:.0f}%: ") + note, va="center", fontsize="small")
    ax.set_xlim(0, 150)  # room for the labels
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.set_xlabel("percent of the tier's budget in use")
    ax.set_title("tier occupancy")
    return fig


def chunk_storage(cache: Any = None, *, ax: Any = None) -> Any:
    """Chunk storage by tier (a cache or a model id; whole rows too, each row's new KV one chunk):
    per tier, the bytes of chunks several rows name (shared) beside those of chunks one row
    or none names; a chunk held by two tiers counts in each. The title sets the distinct
    bytes against what the rows would take stored whole (each row's chunks counted again)."""
    from workbench.notebook import views
    from workbench.units import format_bytes

    c = views.resolve_cache(cache)
    chunks = c.chunk_rows()
    rows = c.rows()
    names = [str(t["name"]) for t in c.list_tiers()][::-1]  # fastest on top
    fig, ax = figure_and_axes(ax, (7.0, 1.0 + 0.6 * max(1, len(names))))
    shared = [sum(k["size_bytes"] for k in chunks if n in k["tiers"] and k["refcount"] > 1) for n in names]
    own = [sum(k["size_bytes"] for k in chunks if n in k["tiers"] and k["refcount"] <= 1) for n in names]
    unit, scale = byte_unit(max((a + b for a, b in zip(shared, own)), default=0))
    ax.barh(names, [a / scale for a in shared], color="#198754", label="shared by several rows")
    ax.barh(names, [b / scale for b in own], left=[a / scale for a in shared], color="#adb5bd",
            label="one row's (or none's)")
    for y, (a, b) in enumerate(zip(shared, own)):
        ax.text((a + b) / scale, y, f"  {format_bytes(a + b)}", va="center", fontsize="small")
    ax.set_xlim(0, 1.3 * max((a + b for a, b in zip(shared, own)), default=0) / scale or 1.0)  # room for labels
    distinct = sum(k["size_bytes"] for k in chunks)
    whole = sum(r["bytes"] for r in rows)
    ratio = f" ({whole / distinct:.1f}x)" if distinct else ""
    ax.set_title(f"chunk storage: {format_bytes(distinct)} stored; {len(rows)} rows whole: {format_bytes(whole)}"
                 + ratio)
    ax.set_xlabel(f"stored ({unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    return fig


def byte_unit(largest: float) -> tuple[str, float]:
    """The unit an axis of byte sizes up to ``largest`` is drawn in (as `format_bytes`
    writes that size), and its size in bytes: ("MiB", 2**20)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if largest >= scale:
            return unit, float(scale)
    return "B", 1.0


def eviction_timeline(replay: pd.DataFrame, *, size_bytes: int | None = None,
                      policies: Sequence[str] | None = None, ax: Any = None) -> Any:
    """Cumulative evictions (solid) and hits (dashed) per request for each policy, at one
    cache size (default: the smallest), from `lab.replay(...)` output (its
    attrs['timeline']) or that timeline frame itself. More than two policies (and no `ax`)
    get one small panel each, with shared axes."""
    tl = replay.attrs.get("timeline") if "request" not in replay.columns else replay
    if tl is None or not len(tl):
        raise ValueError("no timeline: pass lab.replay(...) output (with timeline_points > 0)")
    size = int(tl["size_bytes"].min()) if size_bytes is None else int(size_bytes)
    tl = tl[tl["size_bytes"] == size]
    if not len(tl):
        raise ValueError(f"the replay has no cache size {size_bytes}")
    from workbench.units import format_bytes

    names = list(policies or dict.fromkeys(tl["policy"].astype(str)))
    title = f"evictions and hits over the trace ({format_bytes(size)} cache)"
    if ax is None and len(names) > 2:
        return _timeline_panels(tl, names, title)
    fig, ax = figure_and_axes(ax)
    for name in names:
        _timeline_lines(ax, tl[tl["policy"].astype(str) == name], name)
    ax.set_xlabel("request")
    ax.set_ylabel("cumulative count")
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=2)
    return fig


def _timeline_lines(ax: Any, part: pd.DataFrame, name: str, colour: str | None = None) -> None:
    line, = ax.plot(part["request"], part["evictions"], color=colour, label=f"{name} evictions")
    ax.plot(part["request"], part["hits"], linestyle="--", color=line.get_color(), alpha=0.7, label=f"{name} hits")


def _timeline_panels(tl: pd.DataFrame, names: list[str], title: str) -> Any:
    from workbench.notebook.figure import Figure

    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig = Figure(figsize=(3.4 * cols, 2.4 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for i, (ax, name) in enumerate(zip(axes, names)):
        _timeline_lines(ax, tl[tl["policy"].astype(str) == name], name, f"C{i}")
        ax.set_title(name, fontsize="medium")
        ax.legend(["evictions", "hits"], fontsize="x-small", loc="upper left")
    for ax in axes[len(names):]:
        ax.set_visible(False)
    for ax in axes[max(0, len(names) - cols):len(names)]:  # the lowest panel of each column
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.supxlabel("request")
    fig.supylabel("cumulative count")
    fig.suptitle(title)
    return fig


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


OPTIMAL = "optimal"  # the lab's offline optimum (policy='belady'), drawn as the bound


OVERLAP = 0.01  # curves no further apart than this share of the y axis anywhere are drawn as one would see them: one


def miss_ratio_curves(replay: pd.DataFrame, *, metric: str = "miss_ratio", ax: Any = None) -> Any:
    """`metric` (miss_ratio, hit_ratio, byte_hit_ratio, prefill_saved_fraction, ...)
    against cache size, one line per policy (each its own marker and line style), log-scale
    sizes, the y axis fitted to the values (from 0 unless they all lie far above it). A
    policy whose curve equals an earlier one's, or stays within 1% of the axis of it
    everywhere (two lines one would see as one), says so in the legend ("identical to lru",
    "overlaps lru: within 0.001") and is drawn under it with a larger hollow marker, so both
    show. The offline optimum (policy 'optimal', `lab.replay(..., ['belady'])`) is a black
    dashed line, "optimal (Belady)", drawn under the others: the bound they are measured
    against."""
    if metric not in replay.columns:
        raise ValueError(f"no column {metric!r} in the replay output")
    from workbench.units import format_bytes

    fig, ax = figure_and_axes(ax)
    values = replay[metric].astype(float)
    limits = fitted_limits(values, bounded=bool(len(values.dropna())) and values.min() >= 0 and values.max() <= 1)
    tolerance = OVERLAP * (limits[1] - limits[0]) if limits is not None else 0.0
    drawn: dict[str, pd.Series] = {}
    i = 0
    for name, part in replay.groupby("policy", observed=True, sort=False):
        curve = part.sort_values("size_bytes").set_index("size_bytes")[metric].astype(float)
        near, gap = _nearest_curve(curve, drawn)
        overlaps = near is not None and gap <= tolerance
        note = "" if not overlaps else (f" (identical to {near})" if gap == 0 else
                                       f" (overlaps {near}: within {gap:.1g})")
        if str(name) == OPTIMAL:
            ax.plot(curve.index, curve.to_numpy(), color="black", linestyle="--", linewidth=1.5, marker="",
                    zorder=1.5, label="optimal (Belady)" + note)
        else:
            style: dict[str, Any] = {"marker": MARKERS[i % len(MARKERS)], "linestyle": LINESTYLES[i % len(LINESTYLES)],
                                     "markerfacecolor": "none" if i % 2 else None, "zorder": 2}
            if overlaps:  # beneath the line it would hide, a ring around that line's marker
                style.update(markersize=11, markerfacecolor="none", markeredgewidth=1.6, linewidth=3.0, alpha=0.6,
                             zorder=1.8)
            ax.plot(curve.index, curve.to_numpy(), label=str(name) + note, **style)
            i += 1
        drawn[str(name)] = curve
    sizes = sorted(set(replay["size_bytes"]))
    ax.set_xscale("log")
    ax.set_xticks(sizes, [format_bytes(s) for s in sizes], rotation=30, fontsize="small")
    ax.minorticks_off()
    ax.set_xlabel("cache size")
    ax.set_ylabel(metric.replace("_", " "))
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_title(f"{metric.replace('_', ' ')} curves")
    ax.legend(fontsize="small")
    return fig


def _nearest_curve(curve: pd.Series, drawn: dict[str, pd.Series]) -> tuple[str | None, float]:
    """The drawn curve over the same sizes closest to ``curve`` (by its largest difference
    at any size), and that difference; (None, inf) when none has the same sizes."""
    best: tuple[str | None, float] = (None, float("inf"))
    for name, other in drawn.items():
        if not other.index.equals(curve.index):
            continue
        gap = 0.0 if other.equals(curve) else float((other - curve).abs().max())
        if gap == gap and gap < best[1]:
            best = (name, gap)
    return best


def fitted_limits(values: Any, *, bounded: bool = False, pad: float = 0.06) -> tuple[float, float] | None:
    """y limits that fit ``values``: from 0 (or, for values all far above 0, from a little
    under the lowest) to a little over the highest; a share (``bounded``) no higher than just
    over 1. None without finite values."""
    v = pd.Series(values, dtype=float)
    v = v[v.abs() != float("inf")].dropna()
    if not len(v):
        return None
    lo, hi = float(v.min()), float(v.max())
    bottom = 0.0 if lo >= 0 and (hi == 0 or lo <= 0.5 * hi) else lo
    span = (hi - bottom) or abs(hi) or 1.0
    top = hi + pad * span
    if bounded:
        top = min(top, 1.0 + pad / 2)
    return (bottom - pad * span if bottom != 0 else 0.0), top


def strategy_latencies(df: pd.DataFrame, *, figsize: tuple[float, float] = (9.0, 3.5)) -> Any:
    """Mean time to first token and mean inter-token latency per batch strategy, for long
    and short requests apart (workbench.lab.scheduling.compare_strategies' DataFrame):
    horizontal bars, the strategies named once on the shared axis at the left, one legend
    above the panels."""
    from workbench.notebook.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (col, label) in zip(axes, [("ttft_s", "time to first token (ms)"),
                                       ("itl_s", "mean inter-token latency (ms)")]):
        means = df.pivot_table(index="strategy", columns="kind", values=col, aggfunc="mean", sort=False) * 1000
        if not means.empty:
            means.plot.barh(ax=ax, legend=False, color=[f"C{i}" for i in range(len(means.columns))])
        ax.set_xlabel(label)
        ax.set_ylabel("")
        ax.tick_params(axis="y", which="minor", left=False)
    axes[0].invert_yaxis()  # the first strategy on top (the axis is shared)
    axes[0].set_title("first token")
    axes[1].set_title("between tokens")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncol=len(labels), fontsize="small",
                   title="requests", title_fontsize="small", frameon=False)
    return fig


# --- speculative decoding ---------------------------------------------------------------------

def speculative_acceptance(data: Iterable[Any] | pd.DataFrame, *, ax: Any = None) -> Any:
    """Acceptance by draft position, one line per speculation kind (or per request), from
    CompletionResults / Results or a `views.speculative_positions` frame (by kind or by
    request); each point is accepted / tried at that position."""
    from workbench.notebook import views

    df = data if isinstance(data, pd.DataFrame) else views.speculative_positions(data)
    fig, ax = figure_and_axes(ax)
    group = df.index.names[0]
    for i, (name, part) in enumerate(df.groupby(level=group, sort=False)):
        part = part.droplevel(group)
        ax.plot(part.index.to_numpy(), part["acceptance"].to_numpy(dtype=float, na_value=float("nan")),
                marker=MARKERS[i % len(MARKERS)], linestyle=LINESTYLES[i % len(LINESTYLES)],
                label=f"{group} {name}" if group == "request" else str(name))
    if len(df):
        positions = sorted(set(df.index.get_level_values("position")))
        ax.set_xticks(positions if len(positions) <= 20 else positions[::-(-len(positions) // 20)])
        ax.legend(fontsize="small")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position (1 = first drafted token)")
    ax.set_ylabel("acceptance (accepted / tried)")
    ax.set_title("speculative acceptance by draft position")
    return fig


def speculative_speedup(data: Any, *, ax: Any = None) -> Any:
    """Speed-up of speculative over plain decoding (decode tok/s, speculative / plain),
    one group of bars per prompt class and a bar per setting, each labelled "1.4x"; a
    dashed line at 1 is plain decoding. `data`: a `views.speculative_speedup` frame or the
    runs mapping it takes."""
    from workbench.notebook import views

    df = data if isinstance(data, pd.DataFrame) else views.speculative_speedup(data)
    fig, ax = figure_and_axes(ax)
    table = df["speedup"].astype("Float64").unstack("setting", sort=False) if len(df) else pd.DataFrame()
    prompts = [str(p) for p in table.index]
    settings = [str(s) for s in table.columns]
    width = 0.8 / max(1, len(settings))
    for j, setting in enumerate(settings):
        xs = [i + (j - (len(settings) - 1) / 2) * width for i in range(len(prompts))]
        ys = table[setting].to_numpy(dtype=float, na_value=float("nan"))
        bars = ax.bar(xs, ys, width=width, label=setting, color=f"C{j}")
        ax.bar_label(bars, labels=["" if y != y else f"{y:.2f}x" for y in ys], fontsize="small", padding=2)
    ax.axhline(1.0, color="#6c757d", linestyle="--", linewidth=1, label="plain decoding")
    top = table.max().max() if len(table) else None
    ax.set_ylim(0, 1.15 * max(1.0, 0.0 if top is None or pd.isna(top) else float(top)))  # room for the labels
    ax.set_xticks(range(len(prompts)), prompts)
    ax.set_ylabel("decode tok/s, speculative / plain")
    ax.set_xlabel("prompt")
    ax.set_title("speed-up of speculative decoding over plain")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
