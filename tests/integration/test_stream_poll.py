"""Waiting for events in slices (Stream.poll), request_info's live facts, and an `async for`
cut short by a cancelled task: the events that follow are still delivered, in order, and
nothing hangs.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import workbench as wb

pytestmark = pytest.mark.model

LONG = {"response_tokens": 4000, "ignore_eos": True}


def test_poll_returns_none_then_every_event_in_order(model):
    plain = wb.complete(model, "The capital of France is", response_tokens=12, temperature=0)
    s = wb.stream(model, "The capital of France is", response_tokens=12, temperature=0)
    events, empty_polls = [], 0
    while True:
        ev = s.poll(0.001)
        if ev is None:
            empty_polls += 1
            if s.done is not None:
                break
            continue
        events.append(ev)
    assert s.poll(1.0) is None                         # ended: None at once, no wait
    text = "".join(ev.text for ev in events if isinstance(ev, wb.Token))
    assert text == plain.reply and isinstance(events[-1], wb.Done)
    assert [ev.id for ev in events if isinstance(ev, wb.TokenId)] == list(plain.tokens)
    assert empty_polls > 0                             # it did come back empty-handed in between


def test_request_info_tells_admission_and_prefill_progress(model):
    prompt = "word " * 300
    s = wb.stream(model, prompt, response_tokens=2, cache=False)
    seen = []
    while s.done is None:
        try:
            seen.append(wb.request_info(s.ref))
        except wb.errors.UnknownRequest:
            break
        s.poll(0.002)
    for _ in s:
        pass
    admitted = [i for i in seen if i["phase"] != "queued"]
    assert admitted, "request_info never saw the request admitted"
    assert all(i["cache_hit_kind"] is None and i["reused_tokens"] is None for i in seen if i["phase"] == "queued")
    assert all(i["cache_hit_kind"] == "cold" and i["reused_tokens"] == 0 for i in admitted)
    assert all(i["response_tokens"] == 2 for i in seen)
    progress = [i["prefilled_tokens"] for i in admitted]
    assert progress == sorted(progress) and progress[-1] <= s.done.stats.prompt_tokens


def test_async_for_cancelled_task_loses_no_event(model):
    seen: list[object] = []

    async def consume_until_cancelled(stream):
        async for ev in stream:
            seen.append(ev)

    async def main():
        s = wb.stream(model, "Once upon a time", **LONG)
        task = asyncio.ensure_future(consume_until_cancelled(s))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return s

    s = asyncio.run(main())
    rest: list[object] = []                            # read on a thread: a stolen Done would hang it
    reader = threading.Thread(target=lambda: rest.extend(s), daemon=True)
    reader.start()
    reader.join(5.0)
    assert rest and isinstance(rest[-1], wb.Done), "the stream's end never came after the cancelled wait"
    done = rest[-1]
    assert done.finish_reason == "cancelled"
    ids = [ev.id for ev in seen + rest if isinstance(ev, wb.TokenId)]
    assert ids == list(done.tokens), "an event was lost when the awaiting task was cancelled"


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e300, "1", True])
def test_poll_refuses_a_timeout_the_lock_would_raise_on(model, bad):
    with wb.stream(model, "Hi", response_tokens=2) as s:
        with pytest.raises(wb.errors.InvalidOption, match="timeout"):
            s.poll(bad)
