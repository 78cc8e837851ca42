"""wb.history(): every finished request an engine served, on the engine's clock, bounded;
views.history() and views.latency() over it."""

from __future__ import annotations

import time

import numpy as np
import pytest

import workbench as wb
from workbench.errors import InvalidOption, RequestTimeout
from workbench.notebook import views

pytestmark = pytest.mark.model

LONG = "The history of the printing press begins in the fifteenth century, when movable type " * 3


def _mine(model: str, refs: set[int]) -> list[dict]:
    return [h for h in wb.history(model) if h["ref"] in refs]


def test_times_are_the_engines_and_agree_with_the_callers_clock(model):
    before = time.perf_counter()
    r = wb.complete(model, "Once upon a time", response_tokens=12, ignore_eos=True, cache=False)
    after = time.perf_counter()
    (h,) = _mine(model, {r.ref})
    assert before <= h["arrival"] <= after
    end = h["arrival"] + h["e2e_s"]
    assert end <= after and after - end < 1.0, "the request ended long before its caller saw it"
    assert h["ttft_s"] == r.stats.ttft_s and h["e2e_s"] == r.stats.total_s
    assert 0 <= h["queued_s"] <= h["ttft_s"] <= h["e2e_s"]
    assert h["generated_tokens"] == len(r.tokens) == 12
    assert len(h["itl_s"]) == 11 and h["itl_s"].dtype == np.float32
    assert abs(float(h["itl_s"].sum()) - r.stats.decode_s) < 1e-3
    assert h["tpot_s"] == pytest.approx(float(h["itl_s"].mean()))


def test_cache_hits_cancels_and_failures_are_recorded(model):
    first = wb.complete(model, LONG, response_tokens=2)
    wb.wait_for_saves()
    again = wb.complete(model, LONG, response_tokens=2)
    s = wb.stream(model, "Count to a thousand:", response_tokens=2000, ignore_eos=True)
    next(iter(s))
    s.cancel()
    cancelled = s.result()
    with pytest.raises(RequestTimeout):
        wb.complete(model, "Count slowly:", response_tokens=5000, ignore_eos=True, timeout_s=0.05)
    rows = {h["ref"]: h for h in wb.history(model)}
    assert rows[first.ref]["cache_hit_kind"] == "cold" and rows[first.ref]["cached_tokens"] == 0
    hit = rows[again.ref]
    assert hit["cache_hit_kind"] == again.stats.cache_hit_kind != "cold"
    assert hit["cached_tokens"] == hit["prompt_tokens"] - hit["prefilled_tokens"] == again.stats.cache_delta["read"] > 0
    assert rows[cancelled.ref]["finish_reason"] == "cancelled"
    failed = [h for h in rows.values() if h["finish_reason"] == "error"][-1]
    assert failed["error"].startswith("RequestTimeout") and failed["ref"] > cancelled.ref


@pytest.mark.load(history_size=2)
def test_the_history_keeps_the_newest_history_size(fresh_model):
    refs = [wb.complete(fresh_model, f"Item {i}:", response_tokens=1).ref for i in range(3)]
    assert [h["ref"] for h in wb.history(fresh_model)] == refs[1:]


@pytest.mark.load(history_size=0)
def test_history_size_0_keeps_none(fresh_model):
    wb.complete(fresh_model, "Hi", response_tokens=1)
    assert wb.history(fresh_model) == []


def test_history_size_is_checked():
    with pytest.raises(InvalidOption) as e:
        wb.load_model(history_size=-1)
    assert e.value.key == "history_size"


def test_views_latency_is_the_percentiles_of_the_history(model):
    refs = {wb.complete(model, f"Tell me about {w}.", response_tokens=6, ignore_eos=True).ref
            for w in ("rain", "snow", "wind")}
    df = views.history(model)
    df = df[df.index.isin(refs)]
    assert list(df.index) == sorted(refs) and df["cache_hit_kind"].dtype.name == "category"
    lat = views.latency(df)
    ttft = df["ttft_s"].to_numpy()
    assert lat.loc["ttft_s", "count"] == 3
    assert lat.loc["ttft_s", "p90"] == pytest.approx(np.percentile(ttft, 90))
    gaps = np.concatenate(list(df["itl_s"]))
    assert lat.loc["itl_s", "count"] == len(gaps) == 15
    assert lat.loc["itl_s", "p99"] == pytest.approx(np.percentile(gaps.astype("float64"), 99))
    grouped = views.latency(df, by="cache_hit_kind")
    assert set(grouped.index.get_level_values("cache_hit_kind")) == set(df["cache_hit_kind"].astype(str))
    with pytest.raises(InvalidOption):
        views.latency(df, metrics=["p99_s"])


def test_a_request_through_the_endpoint_is_in_the_history(model):
    from openai import OpenAI

    with wb.serve(model) as srv:
        client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        before = time.perf_counter()
        r = client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0)
        after = time.perf_counter()
    ref = r.model_extra["workbench"]["requests"][0]["ref"]
    (h,) = _mine(model, {ref})
    assert h["generated_tokens"] == r.usage.completion_tokens and h["prompt_tokens"] == r.usage.prompt_tokens
    assert before <= h["arrival"] and h["arrival"] + h["e2e_s"] <= after
