"""wb.lab.record(): the requests the engine served, captured as a lab trace (real model,
real requests, a few greedy tokens each)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import workbench as wb
from workbench import lab
from workbench.engine import finished
from workbench.engine.events import Done, TokenId
from workbench.errors import RequestTimeout
from workbench.lab import traces

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0.0}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_recorder_captures_complete_stream_and_chat_as_served(model: str) -> None:
    outside = wb.complete(model, "Before the recording", response_tokens=1, **GREEDY)
    with lab.record() as rec, lab.record(model="no-such-model") as elsewhere:
        r = wb.complete(model, "The capital of France is", response_tokens=3, **GREEDY)
        events = list(wb.stream(model, "Once upon a time", response_tokens=2, **GREEDY))
        with lab.record(model=model) as inner:            # nested: its own window
            c = wb.chat(model, [user("Name a color.")], response_tokens=3, **GREEDY)
        assert rec.recording and len(inner) == 1 and not inner.recording
    after = wb.complete(model, "After the recording", response_tokens=1, **GREEDY)
    assert not rec.recording and len(elsewhere) == 0
    done = events[-1]
    assert isinstance(done, Done)
    streamed = tuple(e.id for e in events if isinstance(e, TokenId))

    got = rec.captured
    assert [g.ref for g in got] == [r.ref, got[1].ref, c.ref]
    assert outside.ref not in {g.ref for g in got} and after.ref not in {g.ref for g in got}
    assert got[0].prompt == tuple(wb.tokenize(model, "The capital of France is"))
    assert got[0].prompt == r.context_tokens[: r.stats.prompt_tokens] and got[0].generated == r.tokens
    assert got[1].prompt == tuple(wb.tokenize(model, "Once upon a time"))
    assert got[1].prompt == done.context_tokens[: done.stats.prompt_tokens]
    assert got[1].generated == done.tokens == streamed
    rendered = wb.render_chat_template(model, [user("Name a color.")])
    assert got[2].prompt == tuple(rendered.tokens) and got[2].generated == c.tokens
    assert inner.captured[0].ref == c.ref
    assert all(g.model_id == model and g.finish_reason == "length" for g in got)

    df = rec.requests
    assert list(df.columns) == ["ref", "model", "arrival_s", "prompt_tokens", "generated_tokens", "session",
                                "session_id", "cache_hit_kind", "prefilled_tokens", "prefill_tokens_saved",
                                "finish_reason", "in_trace"]
    assert list(df["ref"]) == [g.ref for g in got]
    assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].is_monotonic_increasing
    assert list(df["prompt_tokens"]) == [r.stats.prompt_tokens, done.stats.prompt_tokens, c.stats.prompt_tokens]
    assert list(df["prefilled_tokens"]) == [r.stats.prefilled_tokens, done.stats.prefilled_tokens,
                                            c.stats.prefilled_tokens]
    assert list(df["cache_hit_kind"]) == [r.stats.cache_hit_kind, done.stats.cache_hit_kind,
                                          c.stats.cache_hit_kind]
    assert list(df["generated_tokens"]) == [3, 2, 3] and df["session"].isna().all() and df["in_trace"].all()

    trace = rec.trace
    assert len(trace) == 3 and trace.literal
    for i, g in enumerate(got):
        assert trace.prompt_token_ids(i) == list(g.prompt)
        # ended by their token limit: the last token was sampled, never decoded (the lab's
        # convention for a reply's last token), so the reply is the generated tokens as they are
        assert trace.reply_token_ids(i) == list(g.generated)
    assert np.allclose(trace.arrival_s, df["arrival_s"].to_numpy()) and (trace.session == -1).all()


@pytest.mark.load(n_seq_max=2)
def test_a_two_turn_chat_replays_with_the_reuse_the_engine_had(fresh_model: str, tmp_path: Path) -> None:
    m = fresh_model
    first = [user("What is the capital of France?")]
    with lab.record(m) as rec:
        c1 = wb.chat(m, first, session_id="rec-chat", response_tokens=6, **GREEDY)
        c2 = wb.chat(m, [*first, {"role": "assistant", "content": c1.content}, user("And of Spain?")],
                     session_id="rec-chat", response_tokens=2, **GREEDY)
    wb.end_session(m, "rec-chat")
    assert c2.stats.cache_hit_kind == "sticky"
    engine_saved = c2.stats.prompt_tokens - c2.stats.prefilled_tokens
    first_kv = c1.stats.prompt_tokens + len(c1.tokens) - (c1.finish_reason == "length")
    assert engine_saved > c1.stats.prompt_tokens        # the turn reused the first one's prompt and reply

    df = rec.requests
    assert list(df["ref"]) == [c1.ref, c2.ref]
    assert list(df["session"]) == [0, 0] and list(df["session_id"]) == ["rec-chat", "rec-chat"]
    assert list(df["prefill_tokens_saved"]) == [c1.stats.prompt_tokens - c1.stats.prefilled_tokens, engine_saved]
    trace = rec.trace
    assert list(trace.session) == [0, 0]
    assert trace.prompt_token_ids(1)[:engine_saved] == list(c1.context_tokens[:engine_saved])
    assert len(trace.reply_token_ids(0)) - 1 == first_kv - c1.stats.prompt_tokens

    path = tmp_path / "chat.npz"
    rec.save(path)
    loaded = traces.load(path)
    for k in ("seg_len", "prompt_ptr", "prompt_segs", "reply_seg", "arrival_s", "session", "pin_segs",
              "reply_ptr", "reply_segs"):
        a, b = getattr(trace, k), getattr(loaded, k)
        assert a is not None and np.array_equal(a, b) and a.dtype == b.dtype, k
    assert (loaded.name, loaded.literal) == (trace.name, trace.literal)

    # the lab (prefix cache only, no sessions) finds the first turn's finish row for the
    # second: the same tokens saved as the engine's sticky session kept
    out = lab.replay(loaded, ["lru"], ["1GiB"], workers=1).iloc[0]
    assert out["requests"] == 2 and out["hits"] == 1 and out["misses"] == 1
    assert out["exact_hits"] + out["partial_hits"] == 1
    assert out["prefill_tokens_saved"] == engine_saved


@pytest.mark.parametrize("deterministic", [
    pytest.param(False, marks=pytest.mark.load()),
    pytest.param(True, marks=pytest.mark.load(deterministic=True))])
def test_without_a_session_the_lab_and_the_engine_agree_on_the_second_turn(fresh_model: str,
                                                                           deterministic: bool) -> None:
    """No session: the engine's second turn restores what the first stored from the prefix
    cache, as the lab's replay of the recording does; kind and saving agree. A deterministic
    model stores the first turn's finish row (the lab's default saves); the default mode
    stores no finish row (docs/architecture.md, "Warm equals cold"): the lab replays that
    with ``saves`` leaving "finish" out."""
    model, first = fresh_model, [user("Say hello.")]
    with lab.record(model) as rec:
        c1 = wb.chat(model, first, response_tokens=4, **GREEDY)
        wb.wait_for_saves(30.0)
        c2 = wb.chat(model, [*first, {"role": "assistant", "content": c1.content}, user("Again.")],
                     response_tokens=1, **GREEDY)
    assert c2.stats.cache_hit_kind in ("partial", "exact")
    saves = lab.SAVE_KINDS if deterministic else [k for k in lab.SAVE_KINDS if k != "finish"]
    out = lab.replay(rec.trace, ["lru"], ["1GiB"], workers=1, saves=saves).iloc[0]
    assert out[f"{c2.stats.cache_hit_kind}_hits"] == 1 and out["misses"] == 1
    assert out["prefill_tokens_saved"] == sum(r.stats.prompt_tokens - r.stats.prefilled_tokens for r in (c1, c2))
    first_kv = c1.stats.prompt_tokens + len(c1.tokens) - (c1.finish_reason == "length")
    reused = c2.stats.prompt_tokens - c2.stats.prefilled_tokens
    assert reused == (first_kv if deterministic else c1.stats.prompt_tokens - 1)


def test_cancelled_and_failed_requests(model: str) -> None:
    with lab.record(model) as rec:
        s = wb.stream(model, "Count: one, two, three,", response_tokens=40, **GREEDY)
        seen = []
        for ev in s:
            if isinstance(ev, TokenId):
                seen.append(ev.id)
                s.cancel()
            if isinstance(ev, Done):
                cancelled = ev
        with pytest.raises(RequestTimeout):
            wb.complete(model, "This one runs out of time", response_tokens=40, timeout_s=0.01, **GREEDY)
    got = rec.captured
    assert [g.finish_reason for g in got] == ["cancelled", "error"]
    assert got[0].generated == cancelled.tokens and len(got[0].generated) >= 1   # what it served
    assert isinstance(got[1].error, RequestTimeout)
    df = rec.requests
    assert list(df["finish_reason"]) == ["cancelled", "error"] and list(df["in_trace"]) == [True, False]
    trace = rec.trace            # the failed request is left out; the cancelled one has no reply
    assert len(trace) == 1 and trace.prompt_token_ids(0) == list(got[0].prompt)
    assert trace.reply_token_ids(0) == []


def test_a_listener_that_raises_breaks_no_request(model: str) -> None:
    def broken(req: finished.FinishedRequest) -> None:
        raise RuntimeError("a buggy listener")

    before = finished.errors()
    finished.add_listener(broken)
    try:
        with lab.record(model) as rec:
            r = wb.complete(model, "The sky is", response_tokens=2, **GREEDY)
            again = wb.complete(model, "The grass is", response_tokens=2, **GREEDY)
    finally:
        finished.remove_listener(broken)
    assert r.finish_reason == "length" and len(r.tokens) == 2 and len(again.tokens) == 2
    assert finished.errors() - before == 2
    assert [g.ref for g in rec.captured] == [r.ref, again.ref]     # other listeners still hear
    assert wb.phase(model) == "idle"
