"""workbench.engine.finished: the finished-request listeners (no model: Requests built by
hand and finished or failed as the loop would)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from workbench.engine import finished
from workbench.engine.events import Done, Error, Stats
from workbench.engine.finished import FinishedRequest
from workbench.engine.request import Request, next_ref
from workbench.errors import InvalidOption
from workbench.lab.recording import record
from workbench.options import RequestOptions


@pytest.fixture(autouse=True)
def no_listeners() -> Iterator[None]:
    """Each test starts and ends with no listener (a leftover would see other tests' requests)."""
    saved = finished.listeners
    finished.listeners = ()
    yield
    finished.listeners = saved


def request(prompt: list[int] | None = None, **opts: object) -> Request:
    return Request(ref=next_ref(), model_id="m", prompt=prompt or [1, 2, 3], opts=RequestOptions(**opts), seed=7)


def events(req: Request) -> list[object]:
    out = []
    while not req.events.empty():
        out.append(req.events.get())
    return out


def test_a_finished_request_reaches_every_listener_with_what_it_served() -> None:
    a: list[FinishedRequest] = []
    b: list[FinishedRequest] = []
    finished.add_listener(a.append)
    finished.add_listener(b.append)
    req = request([5, 6, 7], session_id="s", cache_scope="t")
    req.generated = [10, 11]
    req.n_past = 4
    req.prefilled = 3
    done = req.finish("length")
    assert len(a) == len(b) == 1 and a[0] is b[0]
    rec = a[0]
    assert rec.ref == req.ref and rec.model_id == "m"
    assert rec.prompt == (5, 6, 7) and rec.generated == (10, 11) and rec.kv_tokens == 4
    assert rec.session_id == "s" and rec.cache_scope == "t" and rec.cache is True
    assert rec.finish_reason == "length" and rec.error is None
    assert rec.stats is done.stats
    assert rec.prompt_tokens == 3 and rec.prefilled_tokens == 3 and rec.cache_hit_kind == "cold"
    assert rec.submitted_at == req.submitted_at <= rec.finished_at
    with pytest.raises(AttributeError):
        rec.prompt = ()  # type: ignore[misc]  # frozen


def test_a_cancelled_request_reports_the_tokens_it_served() -> None:
    seen: list[FinishedRequest] = []
    finished.add_listener(seen.append)
    req = request()
    req.generated = [9]
    req.finish("cancelled")
    assert seen[0].finish_reason == "cancelled" and seen[0].generated == (9,)


def test_a_failed_request_reports_its_error() -> None:
    seen: list[FinishedRequest] = []
    finished.add_listener(seen.append)
    req = request()
    err = RuntimeError("boom")
    req.fail(err)
    assert seen[0].finish_reason == "error" and seen[0].error is err and seen[0].generated == ()
    assert seen[0].stats.prompt_tokens == 3
    assert [type(e) for e in events(req)] == [Error]


def test_listeners_hear_before_the_caller_can_see_the_result() -> None:
    order: list[str] = []
    req = request()
    finished.add_listener(lambda r: order.append("listener" if not req.finished.is_set() and req.events.empty()
                                                else "late"))
    req.finish("stop")
    assert order == ["listener"]


def test_a_listener_that_raises_breaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[FinishedRequest] = []

    def bad(r: FinishedRequest) -> None:
        raise ValueError("listener bug")

    finished.add_listener(bad)
    finished.add_listener(seen.append)
    before = finished.errors()
    with caplog.at_level(logging.ERROR, logger="workbench.engine.finished"):
        for _ in range(3):
            req = request()
            req.generated = [4]
            done = req.finish("stop")
            got = events(req)
            assert isinstance(got[-1], Done) and got[-1] is done and done.tokens == (4,)
            assert req.finished.is_set()
        req = request()
        req.fail(KeyError("x"))
        assert isinstance(events(req)[-1], Error)
    assert len(seen) == 4                      # the next listener still hears every request
    assert finished.errors() - before == 4
    assert sum("listener bug" in r.getMessage() or "raised" in r.getMessage() for r in caplog.records) == 1


def test_no_listener_no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a listener the hook builds no record and calls nothing."""
    def must_not_run(*a: object, **k: object) -> None:
        raise AssertionError("the hook ran without a listener")

    monkeypatch.setattr(finished, "FinishedRequest", must_not_run)
    monkeypatch.setattr(finished, "notify", must_not_run)
    monkeypatch.setattr(Request, "_tell_listeners", must_not_run)
    req = request()
    req.finish("stop")
    request().fail(RuntimeError("x"))
    assert isinstance(events(req)[-1], Done)


def test_add_and_remove() -> None:
    seen: list[FinishedRequest] = []
    finished.add_listener(seen.append)
    finished.add_listener(seen.append)        # twice: called twice
    request().finish("stop")
    assert len(seen) == 2
    finished.remove_listener(seen.append)     # one registration (bound methods compare equal)
    request().finish("stop")
    assert len(seen) == 3
    finished.remove_listener(seen.append)
    assert finished.listeners == ()
    request().finish("stop")
    assert len(seen) == 3
    with pytest.raises(ValueError, match="not a finished-request listener"):
        finished.remove_listener(seen.append)
    with pytest.raises(TypeError):
        finished.add_listener(42)  # type: ignore[arg-type]


def test_a_record_that_cannot_be_built_does_not_keep_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**k: object) -> None:
        raise TypeError("no record")

    finished.add_listener(lambda r: None)
    monkeypatch.setattr(finished, "FinishedRequest", broken)
    req = request()
    req.finish("stop")
    assert isinstance(events(req)[-1], Done) and req.finished.is_set()


# --- the lab's recorder over the hook (workbench/lab/recording.py), records made by hand ---------

def served(model: str = "m", prompt: tuple[int, ...] = (1, 2, 3), generated: tuple[int, ...] = (7, 8),
           kv: int | None = None, reason: str = "length", session: str | None = None, at: float | None = None,
           cache: bool = True) -> FinishedRequest:
    now = time.perf_counter() if at is None else at
    kv = len(prompt) + len(generated) - 1 if kv is None else kv
    stats = Stats(prompt_tokens=len(prompt), generated_tokens=len(generated), prefilled_tokens=len(prompt),
                  ttft_s=None, prefill_s=0.0, prefill_tps=None, decode_s=0.0, decode_tps=None, total_s=0.0,
                  queued_s=0.0, seed=None)
    return FinishedRequest(ref=next_ref(), model_id=model, prompt=prompt, generated=generated, kv_tokens=kv,
                           submitted_at=now, finished_at=now, session_id=session, cache_scope="default",
                           cache=cache, finish_reason=reason, stats=stats,
                           error=RuntimeError("x") if reason == "error" else None)


def test_the_recorder_turns_records_into_a_trace() -> None:
    early = served(at=0.0)                                   # submitted before the recording started
    with record() as rec:
        finished.notify(early)
        finished.notify(served(generated=(7, 8), reason="length", session="a"))           # last token not decoded
        finished.notify(served(generated=(7, 8), kv=5, reason="stop", session="b"))       # ended by the model
        finished.notify(served(generated=(7, 8, 9), kv=5, reason="stop", session="a"))   # a stop string
        finished.notify(served(generated=(7,), reason="cancelled"))
        finished.notify(served(reason="error"))
        finished.notify(served(cache=False))
    finished.notify(served())                                # after it stopped
    assert len(rec) == 6 and finished.listeners == ()
    df = rec.requests
    assert list(df["finish_reason"]) == ["length", "stop", "stop", "cancelled", "error", "length"]
    assert list(df["in_trace"]) == [True, True, True, True, False, False]
    assert list(df["session"].astype(object).where(df["session"].notna(), None)) == [0, 1, 0, None, None, None]
    t = rec.trace
    assert len(t) == 4 and list(t.session) == [0, 1, 0, -1]
    assert [t.reply_token_ids(i) for i in range(4)] == [[7, 8], [7, 8, 8], [7, 8, 9], []]
    # (the model is not loaded: its eos is unknown, so the never-decoded token repeats the last one)
    assert t.arrival_s[0] == 0.0 and (t.arrival_s[1:] >= 0).all()


def test_the_recorder_wants_one_model_per_trace() -> None:
    rec = record().start()
    try:
        finished.notify(served(model="a"))
        finished.notify(served(model="b"))
    finally:
        rec.stop()
    with pytest.raises(ValueError, match="several models"):
        _ = rec.trace
    assert len(rec.to_trace("b")) == 1 and rec.models == ["a", "b"]
    only_b = record("b")
    with only_b:
        finished.notify(served(model="a"))
        finished.notify(served(model="b"))
    assert [r.model_id for r in only_b.captured] == ["b"]
    with pytest.raises(RuntimeError, match="already recording"):
        with only_b:
            only_b.start()
    with pytest.raises(InvalidOption):
        record(3)  # type: ignore[arg-type]
