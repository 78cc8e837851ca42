"""The speculative decoding views and plots: one row per request, acceptance by draft
position, speed-up over plain decoding; the plots draw the views' numbers."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from matplotlib.figure import Figure

from workbench.engine.events import CompletionResult, Stats
from workbench.notebook import plots, views
from workbench.notebook.results import Result


def spec(kind: str, steps: list[tuple[int, int]], **extra: Any) -> dict[str, Any]:
    """Stats.speculative as the engine writes it (docs/speculative.md), after (drafted,
    accepted) steps."""
    longest = max(n for n, _ in steps)
    tried = [sum(1 for n, _ in steps if n > p) for p in range(longest)]
    accepted = [sum(1 for _, a in steps if a > p) for p in range(longest)]
    lengths: dict[int, int] = {}
    for n, _ in steps:
        lengths[n] = lengths.get(n, 0) + 1
    drafted, taken = sum(n for n, _ in steps), sum(a for _, a in steps)
    return {"kind": kind, "steps": len(steps), "drafted": drafted, "accepted": taken,
            "acceptance": taken / drafted, "acceptance_by_position": [a / t for a, t in zip(accepted, tried)],
            "accepted_by_position": accepted, "draft_lengths": dict(sorted(lengths.items())),
            "draft_s": 0.01 * len(steps), "verify_s": 0.1 * len(steps), **extra}


def result(ref: int, tps: float | None, speculative: dict[str, Any] | None = None, generated: int = 40,
           ) -> CompletionResult:
    stats = Stats(prompt_tokens=20, generated_tokens=generated, prefilled_tokens=20, ttft_s=0.05, prefill_s=0.05,
                  prefill_tps=400.0, decode_s=1.0, decode_tps=tps, total_s=1.05, queued_s=0.0, seed=None,
                  speculative=speculative)
    return CompletionResult("reply", (1, 2), (9, 1, 2), "length", None, stats, "m", ref)


# simple: drafts of 4, 4 and 2 tokens; cache: drafts of 3 and 1
SIMPLE = spec("simple", [(4, 4), (4, 1), (2, 2)])
CACHE = spec("cache", [(3, 0), (1, 1)], decisions=["on"], off_steps=2)  # keys the views do not know
RESULTS = [result(7, 100.0), result(8, 150.0, SIMPLE), Result.of(result(9, 90.0, CACHE))]


def test_one_row_per_request_with_plain_runs_as_off() -> None:
    df = views.speculative(RESULTS)
    assert df.index.name == "request" and list(df.index) == [0, 1, 2]
    assert list(df["ref"]) == [7, 8, 9] and list(df["kind"]) == ["off", "simple", "cache"]
    assert list(df["steps"]) == [0, 3, 2]
    assert list(df["drafted"]) == [0, 10, 4] and list(df["accepted"]) == [0, 7, 1]
    assert pd.isna(df.loc[0, "acceptance"]) and list(df["acceptance"][1:]) == [0.7, 0.25]
    assert list(df["draft_s"]) == pytest.approx([0.0, 0.03, 0.02])
    assert list(df["verify_s"]) == pytest.approx([0.0, 0.3, 0.2])
    assert list(df["decode_tps"]) == [100.0, 150.0, 90.0] and list(df["generated_tokens"]) == [40] * 3
    assert "decisions" not in df.columns and "off_steps" not in df.columns


def test_a_failed_request_is_left_out() -> None:
    failed = Result("", None, error=RuntimeError("boom"))
    df = views.speculative([failed, RESULTS[1]])
    assert list(df.index) == [1] and list(df["kind"]) == ["simple"]


def test_empty_views_keep_their_dtypes() -> None:
    df = views.speculative([])
    assert len(df) == 0 and df.index.name == "request"
    assert df["kind"].dtype == "string" and df["steps"].dtype == "int64"
    assert str(df["acceptance"].dtype) == "Float64" and str(df["ref"].dtype) == "Int64"
    assert df.dtypes.equals(views.speculative(RESULTS).dtypes)
    for by in ("kind", "request"):
        pos = views.speculative_positions(RESULTS[:1], by=by)  # a plain run has no positions
        assert len(pos) == 0 and pos.index.names == [by, "position"]
        assert pos.dtypes.equals(views.speculative_positions(RESULTS, by=by).dtypes)
        assert pos["tried"].dtype == "int64" and str(pos["acceptance"].dtype) == "Float64"
    up = views.speculative_speedup({})
    assert len(up) == 0 and up.index.names == ["prompt", "setting"]
    assert str(up["speedup"].dtype) == "Float64" and up["runs"].dtype == "int64"


def test_acceptance_by_draft_position() -> None:
    df = views.speculative_positions(RESULTS)
    assert df.index.names == ["kind", "position"]
    simple = df.loc["simple"]
    # drafts of 4, 4, 2 tokens reach positions 1-2 three times, 3-4 twice; accepted 4, 1, 2
    assert list(simple.index) == [1, 2, 3, 4]
    assert list(simple["tried"]) == [3, 3, 2, 2] and list(simple["accepted"]) == [3, 2, 1, 1]
    assert list(simple["acceptance"]) == [1.0, 2 / 3, 0.5, 0.5]
    assert list(df.loc["cache", "tried"]) == [2, 1, 1] and list(df.loc["cache", "accepted"]) == [1, 0, 0]
    # summed over positions: the request's drafted and accepted
    rows = views.speculative(RESULTS).set_index("kind")
    for kind in ("simple", "cache"):
        assert df.loc[kind, "tried"].sum() == rows.loc[kind, "drafted"]
        assert df.loc[kind, "accepted"].sum() == rows.loc[kind, "accepted"]


def test_positions_by_kind_sum_the_requests_and_by_request_keep_them_apart() -> None:
    other = result(10, 120.0, spec("simple", [(2, 0)]))
    by_kind = views.speculative_positions([*RESULTS, other])
    assert list(by_kind.loc["simple", "tried"]) == [4, 4, 2, 2]
    assert list(by_kind.loc["simple", "accepted"]) == [3, 2, 1, 1]
    by_request = views.speculative_positions([*RESULTS, other], by="request")
    assert by_request.index.names == ["request", "position"]
    assert list(by_request.loc[3, "tried"]) == [1, 1] and list(by_request.loc[3, "kind"]) == ["simple"] * 2
    assert list(by_request.loc[1, "tried"]) == [3, 3, 2, 2]
    with pytest.raises(Exception, match="'kind' or 'request'"):
        views.speculative_positions(RESULTS, by="model")


def runs() -> dict[str, Any]:
    return {
        "copy code": [result(1, 100.0), result(2, 110.0), result(3, 160.0, SIMPLE), result(4, 200.0, SIMPLE),
                      result(5, 90.0, CACHE)],
        "story": {"plain": [result(6, 120.0)], "simple n3": [result(7, 60.0, spec("simple", [(3, 0)]))]},
        "no baseline": [result(8, 50.0, SIMPLE)],
    }


def test_speedup_over_plain_of_the_same_prompt() -> None:
    df = views.speculative_speedup(runs())
    assert list(df.index) == [("copy code", "simple"), ("copy code", "cache"), ("story", "simple n3"),
                              ("no baseline", "simple")]
    assert list(df["runs"]) == [2, 1, 1, 1]
    assert list(df["plain_tps"][:3]) == [105.0, 105.0, 120.0] and pd.isna(df["plain_tps"].iloc[3])
    assert list(df["tps"]) == [180.0, 90.0, 60.0, 50.0]
    assert list(df["speedup"][:3]) == pytest.approx([180 / 105, 90 / 105, 0.5])
    assert pd.isna(df["speedup"].iloc[3])
    assert list(df["acceptance"]) == [0.7, 0.25, 0.0, 0.7]  # accepted / drafted over the setting's runs


def test_acceptance_plot_draws_the_positions_frame() -> None:
    fig = plots.speculative_acceptance(RESULTS)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    df = views.speculative_positions(RESULTS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["simple", "cache"]
    for line, kind in zip(ax.lines, ["simple", "cache"]):
        assert list(line.get_xdata()) == list(df.loc[kind].index)
        assert list(line.get_ydata()) == pytest.approx(list(df.loc[kind, "acceptance"]))
    assert ax.lines[0].get_marker() != ax.lines[1].get_marker()
    assert ax.get_ylim() == (0, 1.05)
    per_request = plots.speculative_acceptance(views.speculative_positions(RESULTS, by="request")).axes[0]
    assert [t.get_text() for t in per_request.get_legend().get_texts()] == ["request 1", "request 2"]


def test_speedup_plot_bars_are_the_frames_speedups() -> None:
    df = views.speculative_speedup(runs())
    ax = plots.speculative_speedup(df).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["copy code", "story", "no baseline"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["plain decoding", "simple", "cache",
                                                                   "simple n3"]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    table = df["speedup"].unstack("setting", sort=False)
    for setting, heights in bars.items():
        assert heights == pytest.approx(list(table[setting].to_numpy(dtype=float, na_value=float("nan"))),
                                        nan_ok=True)
    assert bars["simple"][0] == pytest.approx(180 / 105)
    labels = [t.get_text() for t in ax.texts]
    assert f"{180 / 105:.2f}x" in labels and "0.50x" in labels
    assert [line.get_ydata()[0] for line in ax.lines] == [1.0]  # plain decoding
    # the plot takes the runs mapping too
    again = plots.speculative_speedup(runs()).axes[0]
    assert [p.get_height() for p in again.containers[0].patches] == pytest.approx(bars["simple"], nan_ok=True)


def test_plots_of_nothing_are_empty_figures() -> None:
    assert not plots.speculative_acceptance([]).axes[0].lines
    assert not plots.speculative_speedup({}).axes[0].patches


def test_positions_from_the_rates_alone() -> None:
    rates_only = {k: v for k, v in SIMPLE.items() if k != "accepted_by_position"}
    df = views.speculative_positions([result(1, 100.0, rates_only)])
    assert list(df.loc["simple", "accepted"]) == [3, 2, 1, 1]


def test_speedup_bars_leave_room_for_their_labels() -> None:
    ax = plots.speculative_speedup(runs()).axes[0]
    assert ax.get_ylim()[1] == pytest.approx(1.15 * 180 / 105)
