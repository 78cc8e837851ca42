"""lab.load_test: open-loop arrivals to the in-process engine or an OpenAI-compatible URL,
measured by the client; checked against the engine's own history."""

from __future__ import annotations

import math
import random

import pytest

import workbench as wb
from workbench import lab
from workbench.errors import InvalidOption
from workbench.lab import traces

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
    assert set(df["cache_hit_kind"]) <= {"cold", "partial", "exact"}
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
