"""Each plot returns its matplotlib Figure and draws what it says."""

from __future__ import annotations

import itertools

import pandas as pd
from matplotlib.figure import Figure

from .test_widgets import done
from workbench.cache import CacheNamespace, RamTier, TieredCache
from workbench.engine.events import CompletionResult, Stats
from workbench.notebook import plots
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
    assert "faster warm" in ax.get_title()
    assert ax.get_ylabel() == "time to first token (ms)"


def test_hit_kinds_over_time_from_results_and_frames() -> None:
    fig = plots.hit_kinds_over_time(RESULTS, window=2)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["cold", "partial", "exact", "sticky"]
    frame = pd.DataFrame({"cache_hit_kind": ["cold", "sticky", "sticky"]})
    assert isinstance(plots.hit_kinds_over_time(frame), Figure)


def test_tier_occupancy_from_a_cache() -> None:
    tick = itertools.count()
    cache = TieredCache([RamTier("ram", 1000), RamTier("big", None)], clock=lambda: float(next(tick)))
    cache.put(CacheNamespace("ab" * 32), [1, 2], b"x" * 250)
    fig = plots.tier_occupancy(cache)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["big", "ram"]  # fastest on top
    labels = " ".join(t.get_text() for t in ax.texts)
    assert "250 B / 1000 B" in labels and "unbounded" in labels

