"""Every cancelled request ends with one Done('cancelled') and one ``finished_cancelled``
count, whatever it was doing: queued (anywhere in the queue), prefilling or decoding.

A request queued behind others is cancelled while the request ahead of it holds the only
sequence: it must end at once (not when it would have reached the head of the queue), the
others keep their order, and the counter says what the user saw.
"""

from __future__ import annotations

import pytest

import workbench as wb
from waiting import wait_for

pytestmark = pytest.mark.model

BOUND_S = 30.0    # generous for a loaded machine: each test also checks what still runs
HOLD = {"response_tokens": 4000, "ignore_eos": True}     # tens of seconds, quiet or not


def finished(name: str) -> int:
    return wb.counters()[f"finished_{name}"]


@pytest.mark.load(n_seq_max=1, max_queue=4)
def test_a_queued_request_cancelled_behind_others_ends_at_once_and_is_counted(fresh_model):
    m = fresh_model
    cancelled0, length0 = finished("cancelled"), finished("length")
    hold = wb.stream(m, "Once upon a time", **HOLD)
    next(iter(hold))                                              # decoding on the only sequence
    queued = [wb.stream(m, p, response_tokens=3) for p in ("Water boils at", "The sky is", "Two plus two")]
    assert wb.pending_len(m) == 3
    queued[1].cancel()                                            # the middle one: not the head
    assert queued[1].wait(BOUND_S)
    r1 = queued[1].result()
    assert r1.finish_reason == "cancelled" and r1.tokens == () and r1.stats.prefilled_tokens == 0
    assert finished("cancelled") == cancelled0 + 1
    assert wb.request_info(hold.ref)["phase"] == "generating"     # it ended while the long one ran
    assert wb.pending_len(m) == 2
    queued[1].cancel()                                            # again: nothing more is counted
    hold.cancel()                                                 # decoding
    assert hold.result().finish_reason == "cancelled"
    assert [q.result().finish_reason for q in (queued[0], queued[2])] == ["length", "length"]
    assert finished("cancelled") == cancelled0 + 2
    assert finished("length") == length0 + 2


@pytest.mark.load(n_seq_max=1, prefill_chunk_size=64, cache=False)
def test_a_request_cancelled_while_prefilling_is_counted_once(fresh_model):
    m = fresh_model
    before = finished("cancelled")
    long_prompt = " ".join(f"word{i}" for i in range(1200))      # ~4,000 tokens: 60 chunks
    s = wb.stream(m, long_prompt, response_tokens=4)
    assert wait_for(lambda: wb.request_info(s.ref)["prefilled_tokens"] > 0, BOUND_S)
    assert wb.request_info(s.ref)["phase"] == "prefilling"
    s.cancel()
    done = s.result()
    assert done.finish_reason == "cancelled" and done.tokens == ()
    assert 0 < done.stats.prefilled_tokens < done.stats.prompt_tokens
    assert finished("cancelled") == before + 1
    assert wb.complete(m, "Hello", response_tokens=2).finish_reason in ("length", "stop")
    assert finished("cancelled") == before + 1
