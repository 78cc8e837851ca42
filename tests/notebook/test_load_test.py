"""lab.load_test: open-loop arrivals to the in-process engine or an OpenAI-compatible URL,
measured by the client; checked against the engine's own history."""

from __future__ import annotations

import _thread
import math
import random
import threading
import time

import numpy as np
import pytest
from IPython.lib.pretty import pretty

import workbench as wb
from workbench import lab
from workbench.errors import InvalidOption
from workbench.lab import traces
from workbench.notebook import load_plots, views
from waiting import wait_for

pytestmark = pytest.mark.model

TRACE = traces.multi_turn_chats(12, seed=3)
SMALL = {"response_tokens": 4, "max_prompt_tokens": 128, "progress": False}


def _expected_arrivals(rate: float, seed: int, n: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def test_in_process_poisson_run_is_measured_and_agrees_with_the_engine(model):
    r = lab.load_test(model, TRACE, rate=20, seed=7, **SMALL)
    df = r.requests
    assert list(df["arrival_s"]) == pytest.approx(_expected_arrivals(20, 7, len(TRACE)))
    assert r.summary["sent"] == r.summary["completed"] == len(TRACE) and r.summary["failed"] == 0
    assert (df["generated_tokens"] == 4).all() and (df["prompt_tokens"] <= 128).all()
    assert (df["sent_s"] >= df["arrival_s"] - 1e-3).all(), "a request was sent before its arrival"
    history = {h["ref"]: h for h in wb.history(model)}
    for row in df.itertuples():
        h = history[row.ref]
        # the client's E2E holds the engine's (submission to the end), plus the hand-over either side
        assert h["e2e_s"] <= row.e2e_s + 1e-3
        assert row.e2e_s - h["e2e_s"] < 1.0
        assert row.cache_hit_kind == h["cache_hit_kind"] and row.cached_tokens == h["cached_tokens"]
    assert r.summary["ttft_s_p99"] >= r.summary["ttft_s_p50"] > 0
    assert r.summary["output_throughput"] == pytest.approx(4 * len(TRACE) / r.summary["duration_s"])


def test_an_endpoint_is_driven_the_same_way(model):
    with wb.serve(model) as srv:
        r = lab.load_test(srv.url, TRACE, rate=20, seed=7, **SMALL)
    df = r.requests
    assert r.summary["completed"] == len(TRACE) and (df["generated_tokens"] == 4).all()
    history = {h["ref"]: h for h in wb.history(model)}
    assert all(history[ref]["prompt_tokens"] == n for ref, n in zip(df["ref"], df["prompt_tokens"]))
    # concurrent requests under one system prompt: restored from the cache, or copied live from
    # a request still running (live prefix sharing)
    assert set(df["cache_hit_kind"]) <= {"cold", "partial", "exact", "shared"}
    assert (df["cached_tokens"] == [history[ref]["cached_tokens"] for ref in df["ref"]]).all()


def test_duration_stops_the_arrivals(model):
    r = lab.load_test(model, traces.multi_turn_chats(200, seed=1), rate=40, seed=2, duration_s=0.25, **SMALL)
    due = [t for t in _expected_arrivals(40, 2, 200) if t < 0.25]
    assert r.summary["sent"] == len(due) < 200


def test_goodput_counts_the_requests_within_every_slo(model):
    strict = lab.load_test(model, TRACE, rate=50, slo={"ttft_s": 1e-6}, **SMALL)
    assert strict.summary["goodput"] == 0 and not strict.requests["meets_slo"].any()
    loose = lab.load_test(model, TRACE, rate=50, slo={"ttft_s": 600, "e2e_s": 600}, **SMALL)
    assert loose.requests["meets_slo"].all()
    assert loose.summary["goodput"] == pytest.approx(loose.summary["request_throughput"])


def test_max_concurrency_1_never_overlaps_two_requests(model):
    r = lab.load_test(model, TRACE, rate=100, max_concurrency=1, **SMALL)
    spans = sorted(zip(r.requests["sent_s"], r.requests["end_s"]))
    assert all(later[0] >= earlier[1] - 1e-3 for earlier, later in zip(spans, spans[1:]))
    assert (r.requests["sent_s"] > r.requests["arrival_s"] + 0.005).any(), "the cap never held a request"


def test_failed_requests_are_counted_not_raised(model):
    with wb.serve(model) as srv:
        r = lab.load_test(srv.url, TRACE, rate=50, model="not-served", **SMALL)
    assert r.summary["failed"] == len(TRACE) and r.summary["completed"] == 0
    assert r.requests["error"].str.contains("404").all() and math.isnan(r.summary["ttft_s_p50"])


@pytest.mark.parametrize("kwargs, key", [
    ({"rate": 0}, "rate"), ({"duration_s": -1}, "duration_s"), ({"max_concurrency": 0}, "max_concurrency"),
    ({"slo": {"ttft": 1}}, "slo"), ({"response_tokens": 1.5}, "response_tokens"),
])
def test_bad_arguments_name_themselves(model, kwargs, key):
    with pytest.raises(InvalidOption) as e:
        lab.load_test(model, TRACE, **kwargs)
    assert e.value.key == key


def test_a_workload_must_be_a_trace(model):
    with pytest.raises(InvalidOption) as e:
        lab.load_test(model, ["hello"])
    assert e.value.key == "workload"


def test_a_scope_for_a_url_target_is_refused(model):
    with pytest.raises(InvalidOption) as e:
        lab.load_test("http://127.0.0.1:9", TRACE, cache_scope="t1")
    assert e.value.key == "cache_scope"
    with pytest.raises(InvalidOption) as e:
        lab.load_test(model, TRACE, cache_scope="")
    assert e.value.key == "cache_scope"


def test_ctrl_c_stops_the_run_and_keeps_what_was_measured(model):
    """A notebook's Interrupt is SIGINT in the kernel's main thread: interrupt_main raises it
    there as Ctrl-C would. The run returns its partial result and leaves nothing running."""
    long_run = {"rate": 4, "seed": 1, "duration_s": 60, "response_tokens": 400, "max_prompt_tokens": 64,
                "progress": False}
    timer = threading.Timer(2.0, _thread.interrupt_main)
    timer.start()
    t0 = time.perf_counter()
    try:
        r = lab.load_test(model, traces.multi_turn_chats(400, seed=1), **long_run)
    finally:
        timer.cancel()
    assert time.perf_counter() - t0 < 20, "the interrupt did not stop the run"
    assert r.interrupted and 0 < r.summary["sent"] < 240
    assert r.requests["error"].fillna("").str.contains("cancelled").any()   # what was in flight
    assert wait_for(lambda: not [q for q in wb.requests() if q["model"] == model], timeout=10)
    assert "interrupted" in pretty(r)


# --- plots -------------------------------------------------------------------------------------------

def test_the_plots_draw_what_was_measured(model):
    r = lab.load_test(model, TRACE, rate=20, seed=7, **SMALL)
    df = r.requests
    fig = r.plot()
    cdf, scatter, throughput, kinds = fig.axes
    ttft_line = next(line for line in cdf.get_lines() if "first token" in line.get_label())
    assert max(ttft_line.get_xdata()) == pytest.approx(df["ttft_s"].max()) and ttft_line.get_ydata()[-1] == 1
    points = np.concatenate([c.get_offsets() for c in scatter.collections])
    want = df[["arrival_s", "ttft_s"]].to_numpy()
    assert np.allclose(points[np.lexsort(points.T[::-1])], want[np.lexsort(want.T[::-1])])
    [line] = throughput.get_lines()
    width = float(np.diff(line.get_xdata())[0])
    streamed = sum(1 + len(gaps) for gaps in df["itl_s"])           # every token event the client saw
    assert float(np.sum(line.get_ydata()) * width) == pytest.approx(streamed)
    assert {t.get_text() for t in kinds.get_legend().get_texts()} == set(df["cache_hit_kind"])


def test_the_engine_history_plots_on_the_same_figures(model):
    lab.load_test(model, TRACE, rate=20, seed=7, **SMALL)
    hist = views.history(model).tail(len(TRACE))
    assert load_plots.per_request(hist)["arrival_s"].min() == 0
    assert len(load_plots.load_panels(hist).axes) == 4
    other_server = r_without_kinds(hist)
    [kinds_axes] = load_plots.hit_kinds(other_server).axes
    assert "does not report hit kinds" in kinds_axes.texts[0].get_text()
    with pytest.raises(InvalidOption) as e:
        load_plots.latency_cdf(hist, "ttft_ms")
    assert e.value.key == "metrics"


def r_without_kinds(hist):
    return hist.assign(cache_hit_kind=None)


# --- several settings in one call ----------------------------------------------------------------

def test_a_sweep_runs_each_setting_on_a_fresh_scope_and_unloads_what_it_loaded(model):
    loaded_before = {m["model_id"] for m in wb.list_models()}
    lab.load_test(model, TRACE, rate=20, seed=7, **SMALL)   # rows of this trace in the default scope
    sweep = lab.load_sweep({"one sequence": {"n_seq_max": 1}, "as loaded": model, "again": model}, TRACE,
                           base={"model_path": wb.model_info(model)["path"]}, rate=20, seed=7, **SMALL)
    assert {m["model_id"] for m in wb.list_models()} == loaded_before
    s = sweep.summary
    assert list(s.index) == ["one sequence", "as loaded", "again"] and (s["completed"] == len(TRACE)).all()
    assert s.loc["one sequence", "n_seq_max"] == 1 and s.loc["as loaded", "target"] == model
    assert set(sweep.requests.index.get_level_values("setting")) == set(s.index)
    for label, r in sweep.results.items():   # no setting starts warm from another's (or the test's) rows
        assert r.requests.loc[0, "cache_hit_kind"] == "cold" and r.requests.loc[0, "cached_tokens"] == 0, label
        assert s.loc[label, "goodput"] == r.summary["goodput"] and s.loc[label, "ttft_s_p99"] == r.summary["ttft_s_p99"]
    assert len(sweep.plot().axes) == 4


@pytest.mark.parametrize("settings, options, key", [
    ({}, {}, "settings"), ({"a": 3}, {}, "settings['a']"), ({"a": {"n_seq_max": 0}}, {}, "n_seq_max"),
    ({"a": {"configure_cache": "lru"}}, {}, "settings['a'].configure_cache"),
    ({"a": "m"}, {"cache_scope": "x"}, "cache_scope"),
])
def test_a_sweeps_bad_arguments_name_themselves(model, settings, options, key):
    loaded_before = {m["model_id"] for m in wb.list_models()}
    with pytest.raises(InvalidOption) as e:
        lab.load_sweep(settings, TRACE, **options, **SMALL)
    assert e.value.key == key
    assert {m["model_id"] for m in wb.list_models()} == loaded_before
