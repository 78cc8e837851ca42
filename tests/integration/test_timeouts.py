"""Per-request time limits on the real default model: ``timeout_s`` (queue wait + whole
request) and ``token_timeout_s`` (between tokens). An expired request is cancelled on the
engine, its stream ends with Error(RequestTimeout) (never a Done), and its sequence serves
the next request at once."""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench.errors import InvalidOption, RequestTimeout

pytestmark = pytest.mark.model

LONG = {"response_tokens": 4000, "ignore_eos": True}   # tens of seconds if nothing stopped it


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


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


@pytest.mark.load(n_seq_max=2, prefill_chunk_size=None)
def test_a_token_stalled_behind_a_long_prefill_trips_the_token_timeout(fresh_model):
    """A generates; B's 600-token prompt is prefilled in one decode (no chunking), so A's
    next token comes seconds after its last one: A times out mid-reply, B is unharmed."""
    m = fresh_model
    a = wb.stream(m, "Once upon a time", token_timeout_s=0.5, **LONG)
    ids = []
    for ev in a:
        if isinstance(ev, wb.TokenId):
            ids.append(ev.id)
        if len(ids) == 3:
            break
    b = wb.stream(m, "the cat sat on the mat. " * 100, response_tokens=4)
    rest = list(a)
    assert isinstance(rest[-1], wb.Error) and isinstance(rest[-1].reason, RequestTimeout)
    err = rest[-1].reason
    assert err.option == "token_timeout_s" and err.phase == "generating" and err.generated_tokens >= 3
    assert err.elapsed_s > 0.5
    assert b.result().stats.generated_tokens == 4
    assert wait_for(lambda: wb.model_info(m)["available_seqs"] == 2)


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
        wb.complete(m, "Hello there, tell me a story", timeout_s=0.3, session_id="t", **LONG)
    took = time.monotonic() - t0
    assert e.value.option == "timeout_s" and e.value.phase == "generating" and e.value.generated_tokens > 0
    assert 0.3 <= e.value.elapsed_s and took < 3.0
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
    assert time.monotonic() - t0 < 2.0
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
