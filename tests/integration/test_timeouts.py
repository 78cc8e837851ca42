"""Per-request time limits on the real default model: ``timeout_s`` (queue wait + whole
request) and ``token_timeout_s`` (between tokens). An expired request is cancelled on the
engine, its stream ends with Error(RequestTimeout) (never a Done), and its sequence serves
the next request at once."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

import workbench as wb
from workbench.engine.scheduler import DecodeFirst
from workbench.errors import InvalidOption, RequestTimeout
from waiting import wait_for

pytestmark = pytest.mark.model

LONG = {"response_tokens": 4000, "ignore_eos": True}   # tens of seconds if nothing stopped it


def assert_free_and_serving(m, baseline):
    """Nothing left running or queued, the sequence free, and the next request gets the
    same greedy reply as before the timeout, without waiting."""
    assert wait_for(lambda: wb.model_info(m)["available_seqs"] == 1)
    assert [r for r in wb.requests() if r["model"] == m] == [] and wb.pending_len(m) == 0
    r = wb.complete(m, "Once upon a time", response_tokens=8)
    assert r.tokens == baseline.tokens and r.stats.queued_s < 1.0


@pytest.mark.load(n_seq_max=1)
def test_a_token_timeout_ends_the_stream_with_an_error_and_frees_the_sequence(fresh_model):
    m = fresh_model
    baseline = wb.complete(m, "Once upon a time", response_tokens=8)
    before = wb.counters()["token_timeouts"]
    # the first token counts from admission (the prefill takes well over 0.1 ms)
    s = wb.stream(m, "Once upon a time", token_timeout_s=1e-4, **LONG)
    events = list(s)
    assert isinstance(events[-1], wb.Error) and not any(isinstance(e, wb.Done) for e in events)
    err = events[-1].reason
    assert isinstance(err, RequestTimeout) and isinstance(err, TimeoutError)
    assert err.option == "token_timeout_s" and err.ref == s.ref and err.limit_s == 1e-4
    assert "token_timeout_s" in str(err) and s.done is None and s.ended
    with pytest.raises(RequestTimeout):
        s.result()                                  # a timed-out stream never reads as finished
    assert wb.counters()["token_timeouts"] == before + 1
    assert_free_and_serving(m, baseline)


class StallOnce(DecodeFirst):
    """decode_first, whose plan() stalls the model's loop once for STALL_S when armed: a slow
    user strategy (or any stall of the loop) between two tokens of a running request."""

    name = "stall_once"
    STALL_S = 6.0

    def __init__(self) -> None:
        self.armed = threading.Event()

    def plan(self, active, budget):
        if self.armed.is_set():
            self.armed.clear()
            time.sleep(self.STALL_S)
        return super().plan(active, budget)


STALL = StallOnce()


@pytest.mark.load(n_seq_max=1, batch_strategy=STALL)
def test_a_stall_between_two_tokens_trips_the_token_timeout(fresh_model):
    """Tokens come every 10 ms to 2 s on this (loaded) machine; a 6 s stall of the loop after
    the second token trips a 3 s token timeout mid-reply, and the model serves on."""
    m = fresh_model
    baseline = wb.complete(m, "Once upon a time", response_tokens=8)   # also warms the fresh context
    a = wb.stream(m, "Once upon a time", token_timeout_s=3.0, **LONG)
    ids = [ev.id for ev in itertools.islice((e for e in a if isinstance(e, wb.TokenId)), 2)]
    assert ids == list(baseline.tokens[:2])
    STALL.armed.set()
    rest = list(a)
    err = rest[-1].reason
    assert isinstance(err, RequestTimeout) and err.option == "token_timeout_s" and err.phase == "generating"
    assert err.generated_tokens >= 2 and err.elapsed_s > 3.0 and a.done is None
    assert_free_and_serving(m, baseline)


@pytest.mark.load(n_seq_max=1)
def test_timeout_s_bounds_the_whole_request_and_commits_nothing_to_its_session(fresh_model):
    m = fresh_model
    baseline = wb.complete(m, "Once upon a time", response_tokens=8)
    first = wb.complete(m, "Hello there", response_tokens=4, session_id="t")
    stored = [s["tokens"] for s in wb.sessions(m) if s["session_id"] == "t"]
    assert stored == [len(first.context_tokens) - 1]  # the last token is sampled, not in the KV yet
    before = wb.counters()["request_timeouts"]
    t0 = time.monotonic()
    with pytest.raises(RequestTimeout) as e:
        wb.complete(m, "Hello there, tell me a story", timeout_s=2.0, session_id="t", **LONG)
    took = time.monotonic() - t0
    assert e.value.option == "timeout_s" and e.value.phase == "generating" and e.value.generated_tokens > 0
    assert 2.0 <= e.value.elapsed_s and took < 7.0   # 4,000 tokens would take a minute
    assert wb.counters()["request_timeouts"] == before + 1
    sess = [s for s in wb.sessions(m) if s["session_id"] == "t"]
    assert [s["tokens"] for s in sess] == stored and sess[0]["busy_ref"] is None
    wb.end_session(m, "t")
    assert_free_and_serving(m, baseline)


@pytest.mark.load(n_seq_max=1)
def test_timeout_s_covers_the_queue_wait(fresh_model):
    m = fresh_model
    hog = wb.stream(m, "Once upon a time", **LONG)
    assert isinstance(next(hog), (wb.TokenId, wb.Token))
    queued = wb.stream(m, "Hello", timeout_s=0.2, response_tokens=4)
    t0 = time.monotonic()
    events = list(queued)
    assert time.monotonic() - t0 < 5.0
    err = events[-1].reason
    assert isinstance(err, RequestTimeout) and err.phase == "queued" and err.generated_tokens == 0
    assert events == [events[-1]] and wb.pending_len(m) == 0
    assert wb.request_info(hog.ref)["phase"] == "generating"   # the running request goes on
    hog.close()
    assert wait_for(lambda: wb.model_info(m)["available_seqs"] == 1)


def test_generous_limits_change_nothing(model):
    plain = wb.complete(model, "The capital of France is", response_tokens=12)
    limited = wb.complete(model, "The capital of France is", response_tokens=12, timeout_s=120, token_timeout_s=60)
    assert limited.tokens == plain.tokens and limited.finish_reason == plain.finish_reason


@pytest.mark.parametrize("key", ["timeout_s", "token_timeout_s"])
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_limits_are_refused_before_the_engine_sees_them(model, key, bad):
    with pytest.raises(InvalidOption) as e:
        wb.stream(model, "Hello", **{key: bad})
    assert e.value.key == key and "seconds > 0" in str(e.value)


def test_a_timed_out_chat_stream_raises_the_timeout_again_from_result(model):
    s = wb.chat_stream(model, [{"role": "user", "content": "Tell me a story."}], token_timeout_s=1e-4, **LONG)
    events = list(s)
    assert isinstance(events[-1], wb.Error) and isinstance(events[-1].reason, RequestTimeout)
    with pytest.raises(RequestTimeout):
        s.result()
