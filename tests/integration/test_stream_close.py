"""Closing a Stream (close(), leaving its ``with`` block, dropping it) cancels its request at
once: the sequence is free for the next request, which does not wait for the abandoned
one's response_tokens to run out.

The abandoned requests would generate 4,000 tokens (tens of seconds here); the bound is a
couple of seconds, so a close() that stopped cancelling fails these tests instead of
passing them slowly.
"""

from __future__ import annotations

import gc

import pytest

import workbench as wb
from workbench.errors import UnknownRequest
from waiting import wait_for

pytestmark = pytest.mark.model

LONG = {"response_tokens": 4000, "ignore_eos": True}
BOUND_S = 3.0


def assert_cancelled_at_once(m, ref, cancelled_before):
    """The request is gone, its sequence free, and the model serves the next one now."""
    assert wait_for(lambda: ref not in {r["ref"] for r in wb.requests()}, BOUND_S)
    with pytest.raises(UnknownRequest):
        wb.request_info(ref)
    assert wait_for(lambda: wb.model_info(m)["available_seqs"] == 1, BOUND_S)
    assert wb.counters()["finished_cancelled"] == cancelled_before + 1
    r = wb.complete(m, "Hello", response_tokens=4)      # the only sequence: admitted without a wait
    assert r.stats.queued_s < BOUND_S and r.finish_reason == "length"


@pytest.mark.load(n_seq_max=1)
def test_close_cancels_at_once(fresh_model):
    m = fresh_model
    before = wb.counters()["finished_cancelled"]
    s = wb.stream(m, "Once upon a time", **LONG)
    assert isinstance(next(iter(s)), (wb.TokenId, wb.Token))
    s.close()
    assert list(s) == []                                   # a closed stream yields nothing more
    assert_cancelled_at_once(m, s.ref, before)


@pytest.mark.load(n_seq_max=1)
def test_leaving_the_with_block_cancels_at_once(fresh_model):
    m = fresh_model
    before = wb.counters()["finished_cancelled"]
    with wb.stream(m, "Once upon a time", **LONG) as s:
        for i, _ in enumerate(s):
            if i == 3:
                break
    assert_cancelled_at_once(m, s.ref, before)


@pytest.mark.load(n_seq_max=1)
def test_leaving_the_with_block_on_an_exception_cancels_at_once(fresh_model):
    m = fresh_model
    before = wb.counters()["finished_cancelled"]
    with pytest.raises(KeyError), wb.stream(m, "Once upon a time", **LONG) as s:
        next(iter(s))
        raise KeyError("the consumer failed")
    assert_cancelled_at_once(m, s.ref, before)


@pytest.mark.load(n_seq_max=1)
def test_dropping_an_unfinished_stream_cancels_it(fresh_model):
    m = fresh_model
    before = wb.counters()["finished_cancelled"]
    s = wb.stream(m, "Once upon a time", **LONG)
    next(iter(s))
    ref = s.ref
    del s
    gc.collect()
    assert_cancelled_at_once(m, ref, before)


@pytest.mark.load(n_seq_max=1)
def test_close_after_the_end_changes_nothing(fresh_model):
    m = fresh_model
    before = wb.counters()["finished_cancelled"]
    with wb.stream(m, "Hello", response_tokens=3) as s:
        events = list(s)
    assert isinstance(events[-1], wb.Done) and events[-1].finish_reason == "length"
    s.close()
    assert s.result().finish_reason == "length"
    assert wb.counters()["finished_cancelled"] == before
