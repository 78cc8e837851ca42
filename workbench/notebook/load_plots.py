"""Figures of serving experiments: latency CDFs, TTFT against arrival time, streamed
throughput over time, hit kinds over time, and the four as one panel.

Each takes per-request data: a `lab.load_test` result (or its ``.requests``), the engine's
own history (`views.history()`, whose ``arrival`` is on the engine's clock and is shifted to
start at 0), or a dict of labelled ones (several systems or settings, one line each; a
`lab.load_sweep` result gives its own). Like `plots`, each returns a `Figure` and takes
``ax=`` to draw into an existing Axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import InvalidOption
from workbench.notebook.plots import figure_and_axes, hit_kinds_over_time
from workbench.notebook.results import HIT_COLOURS, UNKNOWN_COLOUR

CDF_METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
METRIC_LABELS = {"ttft_s": "time to first token", "tpot_s": "time per output token",
                 "itl_s": "inter-token latency", "e2e_s": "end-to-end latency"}
STYLES = {"ttft_s": "-", "tpot_s": "--", "itl_s": ":", "e2e_s": "-."}
PER_REQUEST = ["arrival_s", "ttft_s", "tpot_s", "e2e_s", "itl_s", "cache_hit_kind"]


def per_request(data: Any) -> pd.DataFrame:
    """One row per request with arrival_s (from the first arrival), ttft_s, tpot_s, e2e_s,
    itl_s (each request's gaps) and cache_hit_kind, from a load test result, its requests
    or `views.history()`."""
    df = getattr(data, "requests", data)
    if not isinstance(df, pd.DataFrame) or not {"ttft_s", "itl_s"} <= set(df.columns) or not (
            {"arrival_s", "arrival"} & set(df.columns)):
        raise InvalidOption("data", type(data).__name__, "a lab.load_test result, its .requests, views.history(), "
                            "or a dict of them", "load plots")
    out = pd.DataFrame(index=df.index)
    arrival = df["arrival_s"] if "arrival_s" in df.columns else df["arrival"]
    out["arrival_s"] = arrival - (arrival.min() if "arrival_s" not in df.columns and len(df) else 0.0)
    for col in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        out[col] = df[col] if col in df.columns else np.nan
    out["cache_hit_kind"] = df["cache_hit_kind"] if "cache_hit_kind" in df.columns else None
    return out[PER_REQUEST]


def series(data: Any) -> dict[str, pd.DataFrame]:
    """label -> per-request rows: a dict's entries, a sweep's results, or one unlabelled."""
    many = getattr(data, "results", data)
    if isinstance(many, Mapping):
        return {str(label): per_request(d) for label, d in many.items()}
    return {"": per_request(data)}


def _values(df: pd.DataFrame, metric: str) -> np.ndarray:
    if metric == "itl_s":
        gaps = [np.asarray(a, dtype=np.float64) for a in df["itl_s"] if a is not None and len(a)]
        return np.concatenate(gaps) if gaps else np.empty(0)
    return df[metric].dropna().to_numpy(dtype=np.float64)


def _check_metrics(metrics: Any) -> tuple[str, ...]:
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    for m in names:
        if m not in CDF_METRICS:
            raise InvalidOption("metrics", m, "some of " + ", ".join(CDF_METRICS), "latency_cdf")
    return names


def latency_cdf(data: Any, metrics: str | tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s"), *,
                ax: Any = None) -> Any:
    """Empirical CDF of each latency metric (seconds, log scale): one value per request
    (``itl_s``: every gap), a line per metric and series."""
    names = _check_metrics(metrics)
    fig, ax = figure_and_axes(ax)
    drawn = False
    for i, (label, df) in enumerate(series(data).items()):
        for m in names:
            v = np.sort(_values(df, m))
            v = v[v > 0]
            if not len(v):
                continue
            name = ", ".join(x for x in (label, METRIC_LABELS[m] if len(names) > 1 else "") if x) or METRIC_LABELS[m]
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=f"C{i}", linestyle=STYLES[m],
                    label=name)
            drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.legend(loc="lower right", fontsize="small")
    ax.set_ylim(0, 1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("share of requests (ITL: of gaps)")
    ax.set_title("latency CDF" if len(names) > 1 else f"{METRIC_LABELS[names[0]]} CDF")
    return fig


def ttft_vs_arrival(data: Any, *, ax: Any = None) -> Any:
    """Time to first token of each request against its arrival: a queue that builds shows
    as a rising TTFT. One series is coloured by hit kind (when the target reports it)."""
    fig, ax = figure_and_axes(ax)
    all_series = series(data)
    for i, (label, df) in enumerate(all_series.items()):
        ok = df.dropna(subset=["ttft_s"])
        kinds = ok["cache_hit_kind"].astype("string")
        if len(all_series) == 1 and kinds.notna().any():
            for kind, part in ok.groupby(kinds.fillna("unknown"), sort=True):
                ax.scatter(part["arrival_s"], part["ttft_s"], s=12, color=HIT_COLOURS.get(str(kind), UNKNOWN_COLOUR),
                           label=str(kind))
        else:
            ax.scatter(ok["arrival_s"], ok["ttft_s"], s=12, color=f"C{i}", label=label or None)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="upper left", fontsize="small")
    ax.set_xlabel("arrival (s from the first)")
    ax.set_ylabel("time to first token (s)")
    ax.set_title("TTFT by arrival time")
    return fig


def token_times(df: pd.DataFrame) -> np.ndarray:
    """When each streamed token came, in seconds from the first arrival: the first at
    arrival + TTFT, each later one a gap after the one before."""
    times = []
    for at, ttft, gaps in zip(df["arrival_s"], df["ttft_s"], df["itl_s"]):
        if pd.isna(ttft):
            continue
        first = float(at) + float(ttft)
        times.append(np.concatenate([[first], first + np.cumsum(np.asarray(gaps if gaps is not None else [],
                                                                           dtype=np.float64))]))
    return np.concatenate(times) if times else np.empty(0)


def throughput_over_time(data: Any, *, bin_s: float | None = None, ax: Any = None) -> Any:
    """Tokens streamed per second in bins of ``bin_s`` seconds (default: the run in about 40
    bins), one line per series."""
    if bin_s is not None and (isinstance(bin_s, bool) or not isinstance(bin_s, (int, float)) or not bin_s > 0):
        raise InvalidOption("bin_s", bin_s, "None or a number of seconds > 0", "throughput_over_time")
    fig, ax = figure_and_axes(ax)
    all_times = {label: token_times(df) for label, df in series(data).items()}
    end = max((float(t.max()) for t in all_times.values() if len(t)), default=0.0)
    width = float(bin_s) if bin_s is not None else max(end / 40, 0.05)
    edges = np.arange(0.0, end + width, width)
    for i, (label, t) in enumerate(all_times.items()):
        if len(t) and len(edges) > 1:
            counts, _ = np.histogram(t, bins=edges)
            ax.step(edges[:-1], counts / width, where="post", color=f"C{i}", label=label or None)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlabel("time (s from the first arrival)")
    ax.set_ylabel(f"streamed tokens/s ({width:.2g} s bins)")
    ax.set_title("throughput over time")
    return fig


def hit_kinds(data: Any, *, window: int = 20, ax: Any = None) -> Any:
    """Share of each hit kind over the last ``window`` requests, in arrival order (one
    series); a target that does not report hit kinds (another server) says so."""
    fig, ax = figure_and_axes(ax)
    all_series = series(data)
    df = next(iter(all_series.values())) if len(all_series) == 1 else None
    if df is not None and df["cache_hit_kind"].notna().any():
        hit_kinds_over_time(df.sort_values("arrival_s"), window=window, ax=ax)
    else:
        why = "several series" if df is None else "the target does not report hit kinds"
        ax.text(0.5, 0.5, f"no hit kinds ({why})", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    return fig


def load_panels(data: Any, *, figsize: tuple[float, float] = (11.0, 7.0)) -> Any:
    """A load test's figures in one: latency CDFs, TTFT by arrival, throughput over time and
    hit kinds over time; for several series (a sweep, a dict) the CDFs of TTFT and of TPOT
    apart, a line per series, in place of the CDFs together and the hit kinds."""
    from workbench.notebook.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(2, 2)
    many = len(series(data)) > 1
    latency_cdf(data, ("ttft_s",) if many else ("ttft_s", "tpot_s", "e2e_s"), ax=axes[0][0])
    ttft_vs_arrival(data, ax=axes[0][1])
    throughput_over_time(data, ax=axes[1][0])
    if many:
        latency_cdf(data, ("tpot_s",), ax=axes[1][1])
    else:
        hit_kinds(data, ax=axes[1][1])
    return fig
