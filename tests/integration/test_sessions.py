"""Sticky sessions: warm turns, continuation, busy, reset, idle-pin reclaim."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.errors import ContextOverflow, NoSession, SessionBusy, TranscriptMismatch

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
    # read counts the tokens of the live KV the turn kept (tokens, not rows)
    assert r2.stats.cache_delta["read"] == r2.stats.prompt_tokens - r2.stats.prefilled_tokens > 0
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
    assert r2.stats.cache_hit_kind == "continuation" and r2.stats.prefilled_tokens == len(tail)
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
    ra = wb.complete(m, TURN1, session_id="a", response_tokens=4)
    rb = wb.complete(m, TURN1, session_id="b", response_tokens=4)
    info = wb.model_info(m)
    assert info["available_seqs"] == 0 and info["pinned_idle_seqs"] == 2
    # a third conversation takes the least recently used idle pin ("a"), not an error
    r = wb.complete(m, "Hello", on_full="error", response_tokens=4)
    assert r.finish_reason == "length"
    assert wb.counters()["sessions_reclaimed"] >= 1
    pins = {s["session_id"]: s["seq"] for s in wb.sessions(m)}
    assert pins["a"] is None and pins["b"] is not None
    # "b" is still warm; "a" lost its sequence but knows its transcript, and its own row
    # (cache_saves.py) gives its KV back: sticky again, only the new message read
    turn = next_turn(TURN1, rb.reply, "Why?")
    assert wb.complete(m, turn, session_id="b", response_tokens=4).stats.cache_hit_kind == "sticky"
    tail = wb.tokenize(m, "<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n",
                       add_special=False)
    back = wb.complete(m, list(ra.context_tokens) + tail, session_id="a", response_tokens=4)
    assert back.stats.cache_hit_kind == "sticky" and back.stats.prefilled_tokens <= len(tail) + 1


# --- a session belongs to its cache scope (tenant) -------------------------------------------

A, B = {"cache_scope": "tenant-a"}, {"cache_scope": "tenant-b"}


@pytest.mark.load(n_seq_max=3)
def test_same_session_id_in_another_scope_is_another_session(fresh_model):
    """Tenant B guessing tenant A's session id gets a cold session of its own: no live KV of
    A's, a full prefill (prefilled_tokens tells it nothing about A's transcript)."""
    m = fresh_model
    ra = wb.complete(m, TURN1, session_id="chat", **A)
    turn2 = next_turn(TURN1, ra.reply, "And of Germany?")       # B's guess of A's transcript
    rb = wb.complete(m, turn2, session_id="chat", **B)
    assert rb.stats.cache_hit_kind == "cold"
    assert rb.stats.prefilled_tokens == rb.stats.prompt_tokens
    assert rb.tokens == wb.complete(m, turn2, cache=False).tokens      # what a cold run computes (3rd seq)
    both = sorted((s["cache_scope"], s["session_id"]) for s in wb.sessions(m))
    assert both == [("tenant-a", "chat"), ("tenant-b", "chat")]
    assert [s["cache_scope"] for s in wb.sessions(m, cache_scope="tenant-b")] == ["tenant-b"]
    # A's session was not touched by B's turn: its live KV still serves A
    ra2 = wb.complete(m, turn2, session_id="chat", **A)
    assert ra2.stats.cache_hit_kind == "sticky" and ra2.stats.prefilled_tokens < ra2.stats.prompt_tokens / 2
    assert ra2.tokens == rb.tokens


@pytest.mark.load(n_seq_max=2)
def test_another_scope_cannot_end_reset_or_continue_a_session(fresh_model):
    m = fresh_model
    ra = wb.complete(m, TURN1, session_id=7, **A)
    with pytest.raises(NoSession):
        wb.end_session(m, 7, **B)
    with pytest.raises(NoSession):
        wb.end_session(m, 7)                                  # the default scope is another scope too
    assert wb.reset_session(m, 7, **B) == "not_found"
    tail = wb.tokenize(m, "<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n", add_special=False)
    with pytest.raises(NoSession):                            # not TranscriptMismatch: that would leak its length
        wb.continue_session(m, 7, tail, expect_committed=[1, 2, 3], **B)
    assert wb.sessions(m, **B) == []
    (sa,) = wb.sessions(m, **A)
    assert sa["seq"] is not None and sa["tokens"] == len(ra.context_tokens)
    r = wb.continue_session(m, 7, tail, expect_committed=list(ra.context_tokens), **A)
    assert r.stats.cache_hit_kind == "continuation" and r.stats.prefilled_tokens == len(tail)
    wb.end_session(m, 7, **A)
    assert wb.sessions(m) == []


@pytest.mark.load(n_seq_max=2)
def test_session_busy_never_hands_another_scope_the_ref(fresh_model):
    m = fresh_model
    sa = wb.stream(m, TURN1, session_id="s", response_tokens=400, ignore_eos=True, **A)
    next(iter(sa))
    # B's "s" is its own session: it runs on the other sequence, not SessionBusy with A's ref
    sb = wb.stream(m, TURN1, session_id="s", response_tokens=400, ignore_eos=True, **B)
    next(iter(sb))
    with pytest.raises(SessionBusy) as e:
        wb.complete(m, TURN1, session_id="s", **B)
    assert e.value.ref == sb.ref != sa.ref
    with pytest.raises(SessionBusy) as e:
        wb.end_session(m, "s", **B)
    assert e.value.ref == sb.ref
    assert wb.reset_session(m, "s", **B) == "recovered"       # B's own session only
    assert isinstance(list(sb)[-1], wb.Error)
    busy = {s["cache_scope"]: s["busy_ref"] for s in wb.sessions(m)}
    assert busy == {"tenant-a": sa.ref}                       # A's request runs on
    sa.close()


# --- the shared KV is full: idle sessions make room -----------------------------------------

def long_turn(topic: str, facts: int = 34) -> str:
    """About 8 tokens a fact: 34 facts, ~270 tokens."""
    return ("<|im_start|>user\n" + " ".join(f"Fact {i} about {topic}." for i in range(facts))
            + "<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture
def ram_cache():
    wb.configure_cache([{"kind": "ram", "budget_bytes": 512 * 2**20}])
    yield
    wb.configure_cache([{"kind": "ram"}])


@pytest.mark.load(n_ctx=1024, n_seq_max=4)
def test_a_full_kv_saves_and_frees_the_least_recently_used_idle_session(fresh_model, ram_cache):
    """Three idle sessions hold ~840 of the 1,024 shared KV cells; a new ~270-token request
    needs more: the least recently used session ("a") is saved to the cache (reason evict)
    and freed instead of the request failing, the others keep their KV, and a's next turn
    restores from the cache and replies as it would have without the interruption. In the
    default mode: deterministic mode gives each sequence a KV stream of its own, which no
    other session's cells fill."""
    m = fresh_model
    n = 8
    # what a's second turn replies when nothing interrupts it (no cache, no session)
    a1 = wb.complete(m, long_turn("the sea"), response_tokens=n, cache=False)
    a_turn2 = next_turn(long_turn("the sea"), a1.reply, "Say it shorter.")
    expected = wb.complete(m, a_turn2, response_tokens=n, cache=False).tokens
    first = {sid: wb.complete(m, long_turn(topic), session_id=sid, response_tokens=n)
             for sid, topic in (("a", "the sea"), ("b", "the moon"), ("c", "the forest"))}
    assert first["a"].reply == a1.reply and wb.model_info(m)["pinned_idle_seqs"] == 3
    assert wb.wait_for_saves()
    # the cache loses every row (churn): the sessions' KV lives only in their sequences now
    wb.evict_bytes(sum(row["bytes"] for row in wb.cache_rows()))
    assert wb.cache_rows() == []
    a_tokens = {s["session_id"]: s["tokens"] for s in wb.sessions(m)}["a"]
    before = wb.counters().get("kv_full_evictions", 0)

    new = wb.complete(m, long_turn("the desert"), response_tokens=n)
    assert new.finish_reason == "length" and len(new.tokens) == n
    assert wb.counters()["kv_full_evictions"] - before == 1
    seqs = {s["session_id"]: s["seq"] for s in wb.sessions(m)}
    assert seqs["a"] is None and seqs["b"] is not None and seqs["c"] is not None
    saved = [row for row in wb.cache_rows() if row["reason"] == "evict"]
    assert [(row["n_tokens"], row["live"]) for row in saved] == [(a_tokens, True)]

    back = wb.complete(m, a_turn2, session_id="a", response_tokens=n)
    # the session's own row, restored by key: sticky (test_prefix_cache, own rows)
    assert back.stats.cache_hit_kind == "sticky"
    assert back.stats.prompt_tokens - back.stats.prefilled_tokens == a_tokens
    assert back.tokens == expected
    # b kept its KV: its next turn is sticky
    b_turn2 = next_turn(long_turn("the moon"), first["b"].reply, "Say it shorter.")
    assert wb.complete(m, b_turn2, session_id="b", response_tokens=n).stats.cache_hit_kind == "sticky"


@pytest.mark.load(n_ctx=1024, n_seq_max=4)
def test_a_full_kv_without_idle_sessions_fails_the_newest_request(fresh_model):
    """A request in flight holds ~700 of the 1,024 shared KV cells and no session is idle:
    a newer ~400-token prompt does not fit beside it and fails with ContextOverflow, while
    the older one goes on decoding."""
    m = fresh_model
    older = wb.stream(m, long_turn("the sea", facts=88), response_tokens=200, ignore_eos=True, cache=False)
    events = iter(older)
    next(events)
    newer = list(wb.stream(m, long_turn("the moon", facts=50), response_tokens=4, cache=False))
    assert isinstance(newer[-1], wb.Error) and isinstance(newer[-1].reason, ContextOverflow)
    assert "full" in str(newer[-1].reason)
    assert sum(isinstance(next(events), wb.Token) for _ in range(4)) == 2   # Token, TokenId, ...: it goes on
    older.cancel()
    assert older.result().finish_reason == "cancelled"
