"""Each plot returns its matplotlib Figure and draws what it says."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.figure import Figure

from .caches import put, whole_rows
from .test_widgets import done
from workbench.cache import CacheNamespace
from workbench.cache.chunk_format import chunk_file_size
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache
from workbench.engine.events import CompletionResult, Stats
from workbench.notebook import plots, views
from workbench.notebook.results import Result


def result(kind: str, ttft: float, ref: int) -> CompletionResult:
    d = done(kind=kind)
    s = Stats(**{**{f: getattr(d.stats, f) for f in d.stats.__dataclass_fields__}, "ttft_s": ttft})
    return CompletionResult(d.reply, d.tokens, d.context_tokens, d.finish_reason, None, s, "m", ref)


RESULTS = [result("cold", 0.40, 1), result("cold", 0.50, 2), result("sticky", 0.05, 3),
           result("partial", 0.10, 4), result("exact", 0.04, 5), result("sticky", 0.06, 6)]


def test_ttft_cold_vs_warm() -> None:
    fig = plots.ttft_cold_warm([*RESULTS[:3], Result.of(RESULTS[3]), *RESULTS[4:]])
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cold", "partial", "exact", "sticky"]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "time to first token (ms, log scale)"
    # every request a dot, at its ttft in ms
    dots = [list(c.get_offsets()[:, 1]) for c in ax.collections]
    assert dots == [pytest.approx(ms) for ms in ([400, 500], [100], [40], [50, 60])]
    # median cold 450 ms / median warm 55 ms (of 50, 100, 40, 60)
    assert plots.speedup([0.4, 0.5], [0.05, 0.10, 0.04, 0.06]) == pytest.approx(450 / 55)
    assert f"(median {450 / 55:.1f}x faster warm)" in ax.get_title() and "8.2x" in ax.get_title()
    # each warm kind: median cold / its median
    assert [t.get_text() for t in ax.texts] == [f"{450 / r:.1f}x faster" for r in (100, 40, 55)]


def test_no_speedup_without_cold_requests() -> None:
    ax = plots.ttft_cold_warm(RESULTS[2:]).axes[0]
    assert "faster" not in ax.get_title() and not ax.texts
    assert plots.speedup([], [1.0]) is None and plots.speedup([1.0], [0.0]) is None


def top_edges(ax: Any) -> list[list[float]]:
    """The top of each stacked band, per x (its highest vertex there)."""
    out = []
    for band in ax.collections:
        v = band.get_paths()[0].vertices
        out.append([float(v[v[:, 0] == x, 1].max()) for x in sorted(set(v[:, 0]))])
    return out


def test_hit_kinds_over_time_from_results_and_frames() -> None:
    fig = plots.hit_kinds_over_time(RESULTS, window=2)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["cold", "partial", "exact", "sticky"]
    # kinds cold cold sticky partial exact sticky, shares over the last two, stacked in that order
    assert top_edges(ax) == [[1, 1, .5, 0, 0, 0], [1, 1, .5, .5, .5, 0], [1, 1, .5, .5, 1, .5], [1] * 6]
    frame = pd.DataFrame({"cache_hit_kind": ["cold", "sticky", "sticky"]})
    assert top_edges(plots.hit_kinds_over_time(frame, window=2).axes[0]) == [[1, .5, 0], [1, 1, 1]]


def test_tier_occupancy_shows_percent_full(tmp_path: Path) -> None:
    tick = itertools.count()
    tiers = [ChunkTier.memory("ram", 1000, "lru"), ChunkTier.directory(tmp_path / "big", "big", None, "lru")]
    cache = ChunkedCache(ChunkStore(tiers=tiers, chunk_size=WHOLE_ROWS, clock=lambda: float(next(tick))))
    put(cache, CacheNamespace("ab" * 32), [1, 2], b"x" * (250 - chunk_file_size(2, 0)))   # a RAM copy of 250 B
    fig = plots.tier_occupancy(cache)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["big", "ram"]  # fastest on top
    widths = [p.get_width() for p in ax.patches]
    assert widths == [0, 100, 0, 25]  # the budgets (big has none), then the use: ram 25% full
    big = f"{views.tiers(cache).loc['big', 'used_bytes']} B"   # the chunk and the row's manifest
    assert [t.get_text().strip() for t in ax.texts] == [f"{big} / unbounded", "25%: 250 B / 1000 B"]
    assert views.tiers(cache).loc["ram", "percent_full"] == 25


def replay_frame() -> pd.DataFrame:
    """Three policies at three sizes; lfu's curve is frecency's."""
    curves = {"lru": [0.9, 0.6, 0.3], "frecency": [0.8, 0.5, 0.2], "lfu": [0.8, 0.5, 0.2]}
    rows = [{"policy": p, "size_bytes": size, "miss_ratio": y}
            for p, ys in curves.items() for size, y in zip([4 << 20, 1 << 20, 16 << 20], [ys[1], ys[0], ys[2]])]
    df = pd.DataFrame(rows)
    df["policy"] = df["policy"].astype("category")
    return df


def test_miss_ratio_curves_plot_the_frame_and_name_identical_curves() -> None:
    df = replay_frame()
    ax = plots.miss_ratio_curves(df).axes[0]
    assert len(ax.lines) == 3
    for line, name in zip(ax.lines, ["lru", "frecency", "lfu"]):
        part = df[df["policy"] == name].sort_values("size_bytes")
        assert list(line.get_xdata()) == list(part["size_bytes"])
        assert list(line.get_ydata()) == list(part["miss_ratio"])
    assert len({line.get_marker() for line in ax.lines}) == 3
    assert len({line.get_linestyle() for line in ax.lines}) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["lru", "frecency", "lfu (identical to frecency)"]


def timeline_frame(policies: list[str]) -> pd.DataFrame:
    rows = [{"policy": p, "size_bytes": 1 << 20, "request": r, "evictions": i * r, "hits": r // (i + 1)}
            for i, p in enumerate(policies) for r in (10, 20, 30)]
    return pd.DataFrame(rows)


def test_eviction_timeline_small_multiples_for_five_policies() -> None:
    names = ["lru", "lfu", "frecency", "gdsf", "s3fifo"]
    tl = timeline_frame(names)
    fig = plots.eviction_timeline(tl)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == names
    assert all(ax.get_shared_y_axes().joined(panels[0], ax) for ax in panels)
    for ax, name in zip(panels, names):
        part = tl[tl["policy"] == name]
        evictions, hits = ax.lines
        assert list(evictions.get_ydata()) == list(part["evictions"]) and hits.get_linestyle() == "--"
        assert list(hits.get_ydata()) == list(part["hits"]) and list(hits.get_xdata()) == [10, 20, 30]
    assert "1.0 MiB cache" in fig.get_suptitle()
    one = plots.eviction_timeline(tl, ax=Figure().add_subplot())  # into a given Axes: one panel, all lines
    assert len(one.axes[0].lines) == 10


def test_eviction_timeline_errors() -> None:
    with pytest.raises(ValueError, match="no cache size 5"):
        plots.eviction_timeline(timeline_frame(["lru"]), size_bytes=5)
    with pytest.raises(ValueError, match="no timeline"):
        plots.eviction_timeline(pd.DataFrame({"policy": []}))


def test_chunk_storage_shows_shared_bytes_by_tier() -> None:
    from workbench.cache import keys
    from workbench.cache.chunk_store import ChunkStore
    from workbench.cache.chunked import ChunkedCache

    cache = ChunkedCache(ChunkStore(None, None, chunk_size=16))
    ns = CacheNamespace("ab" * 32)
    for tail in ([7] * 9, [8] * 9):
        tokens = list(range(32)) + tail    # two rows over two shared chunks
        pieces = [k * 20 for k in keys.chunk_keys(ns.digest(), tokens, 16)]
        cache.put(ns, tokens, pieces[cache.missing(ns, tokens):])
    sizes = {c["key"]: (c["size_bytes"], c["refcount"]) for c in cache.chunk_rows()}
    shared = sum(b for b, refs in sizes.values() if refs == 2)
    own = sum(b for b, refs in sizes.values() if refs == 1)
    ax = plots.chunk_storage(cache).axes[0]
    unit, scale = plots.byte_unit(shared + own)
    assert ax.get_xlabel() == f"stored ({unit})"          # the axis in the unit of the bars' labels
    assert [p.get_width() * scale for p in ax.patches] == pytest.approx([shared, own]) and shared and own
    assert ax.get_xlim()[1] > (shared + own) / scale      # room for the label after the bar
    whole = shared * 2 + own
    assert f"{1.0 * whole / (shared + own):.1f}x" in ax.get_title() and "2 rows" in ax.get_title()
    rows = whole_rows(10_000)                               # whole rows: a chunk each, none shared
    put(rows, CacheNamespace("ab" * 32), [1, 2, 3], b"kv" * 50)
    assert [p.get_width() for p in plots.chunk_storage(rows).axes[0].patches][0] == 0


def test_miss_ratio_curves_fit_the_axis_to_the_data() -> None:
    """Miss ratios under 0.3 are not drawn on a 0-1 axis; the axis still starts at 0."""
    df = replay_frame()
    df["miss_ratio"] = df["miss_ratio"] * 0.3            # 0.06 .. 0.27
    bottom, top = plots.miss_ratio_curves(df).axes[0].get_ylim()
    assert bottom == 0 and 0.27 < top < 0.3
    high = replay_frame().assign(miss_ratio=lambda d: 0.9 + d["miss_ratio"] / 10)   # 0.92 .. 0.99
    bottom, top = plots.miss_ratio_curves(high).axes[0].get_ylim()
    assert 0.85 < bottom < 0.92 and 0.99 < top <= 1.03


def test_nearly_coinciding_curves_are_told_apart() -> None:
    """A curve within 1% of the axis of an earlier one everywhere (lfu beside frecency, a
    user's policy beside lru) says so and is drawn as a ring under it, not on top of it."""
    df = replay_frame()
    df.loc[df["policy"] == "lfu", "miss_ratio"] += 0.001
    ax = plots.miss_ratio_curves(df).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["lru", "frecency", "lfu (overlaps frecency: within 0.001)"]
    frecency, lfu = ax.lines[1], ax.lines[2]
    assert lfu.get_zorder() < frecency.get_zorder()                      # beneath the line it would hide
    assert lfu.get_markersize() > frecency.get_markersize() and lfu.get_markerfacecolor() == "none"
    assert lfu.get_marker() != frecency.get_marker() and lfu.get_linestyle() != frecency.get_linestyle()
    apart = replay_frame()
    apart.loc[apart["policy"] == "lfu", "miss_ratio"] += 0.05           # 6% of the axis apart: no note
    assert "lfu" in [t.get_text() for t in plots.miss_ratio_curves(apart).axes[0].get_legend().get_texts()]


def drawn_boxes(fig: Any) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def overlap(a: Any, b: Any) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_strategy_latencies_labels_do_not_collide_and_the_legend_covers_no_bar() -> None:
    rows = [{"strategy": s, "kind": k, "ttft_s": t, "itl_s": t / 10, "generated_tokens": 8}
            for s, t in [("decode_first", 1.6), ("prefill_first", 2.9), ("round_robin", 2.1),
                         ("ShortestPromptFirst", 4.5)] for k in ("short", "long")]
    fig = plots.strategy_latencies(pd.DataFrame(rows))
    renderer = drawn_boxes(fig)
    left, right = fig.axes
    names = [t for t in left.get_yticklabels() if t.get_text()]
    assert [t.get_text() for t in names] == ["decode_first", "prefill_first", "round_robin", "ShortestPromptFirst"]
    boxes = [t.get_window_extent(renderer) for t in names]
    assert not any(overlap(a, b) for a, b in itertools.combinations(boxes, 2))
    assert not [t for t in right.get_yticklabels() if t.get_visible() and t.get_text()]   # named once
    assert left.get_legend() is None and right.get_legend() is None and len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for ax in fig.axes for p in ax.patches]
    assert bars and not any(overlap(legend, bar) for bar in bars)
    assert left.get_xlabel() == "time to first token (ms)"


def test_ttft_cold_warm_labels_a_shared_y_axis_once() -> None:
    fig = Figure(layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    for ax in axes:
        plots.ttft_cold_warm(RESULTS, ax=ax)
    assert [ax.get_ylabel() for ax in axes] == ["time to first token (ms, log scale)", "", ""]
    alone = plots.ttft_cold_warm(RESULTS).axes[0]
    assert alone.get_ylabel() == "time to first token (ms, log scale)"
