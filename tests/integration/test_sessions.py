"""Sticky sessions: warm turns, continuation, busy, reset, idle-pin reclaim."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.errors import NoSession, SessionBusy, TranscriptMismatch

pytestmark = pytest.mark.model

TURN1 = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def next_turn(prev_prompt: str, reply: str, question: str) -> str:
    return f"{prev_prompt}{reply}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.load(n_seq_max=2)
def test_second_turn_is_sticky_and_equals_the_cold_reply(fresh_model):
    m = fresh_model
    r1 = wb.complete(m, TURN1, session_id="chat")
    assert r1.stats.cache_hit_kind == "cold"
    turn2 = next_turn(TURN1, r1.reply, "And of Germany?")
    r2 = wb.complete(m, turn2, session_id="chat")
    assert r2.stats.cache_hit_kind == "sticky"
    assert r2.stats.prefilled_tokens < r2.stats.prompt_tokens / 2
    assert r2.stats.cache_delta["read"] == 0          # the live KV, no cache row was read
    assert wb.last_cache_hit(m)["kind"] == "sticky"
    cold = wb.complete(m, turn2, cache=False)         # same prompt, no session, no cache: full prefill
    assert cold.stats.cache_hit_kind == "cold" and cold.tokens == r2.tokens
    wb.end_session(m, "chat")
    with pytest.raises(NoSession):
        wb.end_session(m, "chat")


@pytest.mark.load(n_seq_max=2)
def test_continue_session_with_and_without_expect_committed(fresh_model):
    m = fresh_model
    r1 = wb.complete(m, TURN1, session_id=7)
    stored = list(r1.context_tokens)[: len(r1.context_tokens)]
    tail = wb.tokenize(m, "<|im_end|>\n<|im_start|>user\nAnd Italy?<|im_end|>\n<|im_start|>assistant\n",
                       add_special=False)
    with pytest.raises(TranscriptMismatch) as e:
        wb.continue_session(m, 7, tail, expect_committed=stored[:-1] + [stored[-1] + 1])
    assert e.value.stored_len == len(stored) and e.value.diverge_at == len(stored) - 1
    r2 = wb.continue_session(m, 7, tail, expect_committed=stored)     # the session was left intact
    assert r2.stats.cache_hit_kind == "sticky" and r2.stats.prefilled_tokens == len(tail)
    assert r2.context_tokens[: len(stored)] == tuple(stored)
    r3 = wb.continue_session(m, 7, wb.tokenize(m, "<|im_end|>\n", add_special=False))
    assert r3.stats.prefilled_tokens == 2
    with pytest.raises(NoSession):
        wb.continue_session(m, "nobody", tail)


@pytest.mark.load(n_seq_max=2)
def test_session_busy_and_reset_while_busy(fresh_model):
    m = fresh_model
    s = wb.stream(m, TURN1, session_id="s", response_tokens=500, ignore_eos=True)
    next(iter(s))
    with pytest.raises(SessionBusy):
        wb.complete(m, TURN1, session_id="s")
    assert wb.reset_session(m, "s") == "recovered"
    events = list(s)
    assert isinstance(events[-1], wb.Error) and type(events[-1].reason).__name__ == "SessionReset"
    assert wb.reset_session(m, "s") == "not_found"
    assert wb.model_info(m)["available_seqs"] == 2
    r = wb.complete(m, TURN1, session_id="s")
    # a new session: no live KV left from the reset one (the prefix cache may still serve it)
    assert r.stats.cache_hit_kind != "sticky" and r.finish_reason == "stop"


@pytest.mark.load(n_seq_max=2)
def test_idle_pins_are_reclaimed_least_recently_used(fresh_model):
    m = fresh_model
    wb.complete(m, TURN1, session_id="a", response_tokens=4)
    rb = wb.complete(m, TURN1, session_id="b", response_tokens=4)
    info = wb.model_info(m)
    assert info["available_seqs"] == 0 and info["pinned_idle_seqs"] == 2
    # a third conversation takes the least recently used idle pin ("a"), not an error
    r = wb.complete(m, "Hello", on_full="error", response_tokens=4)
    assert r.finish_reason == "length"
    assert wb.counters()["sessions_reclaimed"] >= 1
    pins = {s["session_id"]: s["seq"] for s in wb.sessions(m)}
    assert pins["a"] is None and pins["b"] is not None
    # "b" is still warm; "a" comes back cold but still knows its transcript
    turn = next_turn(TURN1, rb.reply, "Why?")
    assert wb.complete(m, turn, session_id="b", response_tokens=4).stats.cache_hit_kind == "sticky"
    back = wb.complete(m, turn, session_id="a", response_tokens=4)
    assert back.stats.cache_hit_kind != "sticky"    # no live KV (the prefix cache may serve it)
