"""The live views, fed events directly: the widget's traits, the plain-text twin, the
Result's reprs. One real-model test: the Cancel button cancels the running request."""

from __future__ import annotations

import html
import io

import pytest

import workbench as wb
from workbench.cache import HitKind
from workbench.engine.events import CompletionResult, Done, Error, Stats, Thinking, ThinkingEnd, Token, TokenId
from workbench.notebook import transcript, widgets
from workbench.notebook.results import HIT_COLOURS, STATE_COLOURS, Result, reply_html
from workbench.notebook.widgets import GenerationWidget, TextView


def stats(kind: str = "partial", **kw: object) -> Stats:
    base = dict(prompt_tokens=40, generated_tokens=3, prefilled_tokens=8, ttft_s=0.0421, prefill_s=0.01,
                prefill_tps=800.0, decode_s=0.02, decode_tps=100.0, total_s=0.07, queued_s=0.0, seed=1,
                cache_hit_kind=kind, cache_delta={"read": 32, "created": 1})
    base.update(kw)
    return Stats(**base)  # type: ignore[arg-type]


def done(reply: str = "Hello world", reason: str = "stop", kind: str = "partial") -> Done:
    return Done(reply, (1, 2, 3), (9, 1, 2, 3), reason, None, stats(kind))  # type: ignore[arg-type]


def feed(view: object, events: list[object]) -> None:
    for ev in events:
        view.feed(ev)  # type: ignore[attr-defined]


def test_widget_streams_then_shows_hit_kind_and_stats() -> None:
    w = GenerationWidget("m", throttle_s=0.0)
    assert w.box.box_style == "info" and "running" in w.state.value
    feed(w, [TokenId(1), Token("Hello")])
    assert "Hello" in w.reply.value and "running · 1 token · " in w.stats.value
    feed(w, [TokenId(2), Token(" world")])
    assert "Hello world" in w.reply.value and "running · 2 tokens · " in w.stats.value
    feed(w, [done()])
    assert "Hello world" in w.reply.value
    assert "partial" in w.badge.value and HIT_COLOURS["partial"] in w.badge.value
    assert "ttft 42 ms" in w.stats.value and "100.0 tok/s" in w.stats.value
    assert "cache: 32 tokens read, 1 stored · end of turn" in w.stats.value
    assert w.box.box_style == "success" and "done" in w.state.value
    assert w.box.layout.border_left == f"4px solid {STATE_COLOURS['done']}"  # what JupyterLab 4 shows
    assert w.cancel_button.disabled and w.cancel_button.layout.display == "none"
    assert w.thinking_box.layout.display == "none"  # no thinking events: the block stays hidden


def running_info(**kw: object) -> dict[str, object]:
    info: dict[str, object] = {"phase": "prefilling", "cache_hit_kind": "partial", "prompt_tokens": 400,
                               "reused_tokens": 100, "prefilled_tokens": 50, "response_tokens": 64}
    info.update(kw)
    return info


def test_live_facts_show_before_the_end() -> None:
    w = GenerationWidget("m", throttle_s=0.0)
    assert "…" in w.badge.value
    w.transcript.started_at -= 2.0  # a prefill that has run two seconds
    w.observe(running_info())
    assert "partial" in w.badge.value and HIT_COLOURS["partial"] in w.badge.value  # known at admission
    assert w.progress_row.layout.display is None and (w.progress.value, w.progress.max) == (150, 400)
    assert "150 of 400 prompt tokens (100 restored from cache, 50 computed)" in w.progress_label.value
    assert "prefill 150 of 400 prompt tokens" in w.stats.value and "2.0 s" in w.stats.value
    w.observe(running_info(phase="generating", prefilled_tokens=300))
    assert w.progress_row.layout.display == "none"
    feed(w, [TokenId(1), Token("a"), TokenId(2), Token("b"), TokenId(3), Token("c")])
    w.observe(running_info(phase="generating", prefilled_tokens=300, decode_tps=45.25))
    assert "running · 3 of 64 tokens · " in w.stats.value and "45.2 tok/s" in w.stats.value
    feed(w, [done("abc", reason="length")])
    assert "max tokens reached" in w.stats.value
    w.observe(running_info(phase="generating", cache_hit_kind="cold"))  # late snapshots change nothing
    assert "partial" in w.badge.value and "max tokens reached" in w.stats.value


def test_a_short_prefill_shows_no_bar() -> None:
    w = GenerationWidget("m")
    w.observe(running_info())  # just started: under PROGRESS_DELAY_S
    assert w.progress_row.layout.display == "none"


@pytest.mark.parametrize(("reason", "stop", "words"), [
    ("stop", None, "end of turn"), ("stop", ",", "stopped at stop sequence ','"),
    ("length", None, "max tokens reached"), ("cancelled", None, "cancelled")])
def test_why_it_ended_is_said_in_words(reason: str, stop: str | None, words: str) -> None:
    d = Done("x", (1,), (1,), reason, stop, stats())  # type: ignore[arg-type]
    w = GenerationWidget()
    feed(w, [d])
    assert w.stats.value.endswith(f"· {html.escape(words)}</span>")
    assert Result.of(CompletionResult.from_done(d, "m", 1)).summary().endswith(f"· {words}")


def test_a_reply_ended_before_its_first_token_says_why() -> None:
    """EOG sampled first: the words say so (a chat turn without the %%chat hint); a stop
    string hit at once, or a reply with tokens, keep their usual words."""
    from workbench.notebook.results import stats_line

    empty = stats(generated_tokens=0, decode_tps=None)
    why = "the model ended its turn at once (its first token was end-of-generation)"
    assert stats_line(empty, "stop", None, chat=True).endswith(f" · {why}")
    assert stats_line(empty, "stop", None).endswith(f" · {why}; a chat model usually needs its chat "
                                                    "template: try %%chat (or workbench.chat)")
    assert stats_line(empty, "stop", ",").endswith("stopped at stop sequence ','")
    assert stats_line(stats(), "stop", None).endswith(" · end of turn")
    w = TextView("m", out=io.StringIO())
    feed(w, [Done("", (), (9,), "stop", None, empty)])  # type: ignore[arg-type]
    assert w.out.getvalue().endswith(f"{why}; a chat model usually needs its chat template: try %%chat "  # type: ignore[union-attr]
                                     "(or workbench.chat)\n")


def test_the_last_tokens_show_despite_the_throttle() -> None:
    w = GenerationWidget("m", throttle_s=60.0)
    feed(w, [TokenId(1), Token("first")])  # the first flush
    feed(w, [TokenId(2), Token(" second"), TokenId(3), Token(" third")])
    assert "second" not in w.reply.value  # held back by the throttle
    feed(w, [done("first second third")])
    assert "first second third" in w.reply.value and w.as_text().startswith("first second third\n")


def test_each_hit_kind_has_its_own_colour() -> None:
    assert set(HIT_COLOURS) == {k.value for k in HitKind} and len(set(HIT_COLOURS.values())) == len(HitKind)
    for kind in HIT_COLOURS:
        w = GenerationWidget()
        feed(w, [done(kind=kind)])
        assert HIT_COLOURS[kind] in w.badge.value and f"wb-hit-{kind}" in w.badge.value


def test_thinking_block_fills_and_collapses() -> None:
    w = GenerationWidget(throttle_s=0.0)
    feed(w, [Thinking("Let me think. "), Thinking("Two plus two.")])
    assert w.thinking_box.layout.display is None  # shown
    assert "Let me think. Two plus two." in w.thinking.value
    assert w.thinking_box.titles == ("thinking",)
    feed(w, [ThinkingEnd(""), Token("4"), done("4")])
    assert w.thinking_box.selected_index is None and "4" in w.reply.value


def test_errors_are_marked_like_a_danger_bar() -> None:
    w = GenerationWidget(throttle_s=0.0)
    feed(w, [Token("part"), Error(wb.errors.DecodeFailed("llama_decode returned -3"))])
    assert w.box.box_style == "danger" and "error" in w.state.value
    assert "DecodeFailed" in w.stats.value and "part" in w.reply.value
    result = w.transcript.result(7)
    assert not result.ok and result.finish_reason == "error" and result.reply == "part"


def test_cancelled_state_and_the_cancel_button_callback() -> None:
    calls = []
    w = GenerationWidget(on_cancel=lambda: calls.append(1))
    assert not w.cancel_button.disabled
    w.cancel_button.click()
    assert calls == [1] and w.cancel_button.disabled and w.cancel_button.description == "Cancelling"
    feed(w, [Token("abc"), done("abc", reason="cancelled", kind="cold")])
    assert w.box.box_style == "warning" and "cancelled" in w.state.value
    assert w.cancel_button.layout.display == "none"  # gone, not a stuck "Cancelling"
    w.cancel_button.click()  # a click that arrives after the end
    assert calls == [1]


def test_a_cancel_that_cannot_act_is_shown_disabled_with_the_hint() -> None:
    calls = []
    w = GenerationWidget(on_cancel=lambda: calls.append(1), live_cancel=False)
    assert w.cancel_button.disabled and "Interrupt" in w.cancel_button.tooltip
    assert "--background" in w.cancel_button.tooltip and "Interrupt" in w.hint.value
    w.cancel_button.click()
    assert calls == []
    feed(w, [done()])
    assert w.hint.value == "" and w.cancel_button.layout.display == "none"


def test_text_view_prints_a_long_prefill_on_one_line() -> None:
    out = io.StringIO()
    v = TextView("m", out=out, progress_delay_s=0.0)
    v.observe(running_info(prefilled_tokens=50))
    v.observe(running_info(prefilled_tokens=250))
    feed(v, [TokenId(1), Token("Hi"), done("Hi")])
    lines = out.getvalue().split("\n")
    assert lines[0] == ("\r[prefill] 150 of 400 prompt tokens (100 restored from cache, 50 computed)"
                        "\r[prefill] 350 of 400 prompt tokens (100 restored from cache, 250 computed)")
    assert lines[1] == "Hi"
    quiet = io.StringIO()
    TextView("m", out=quiet).observe(running_info())  # a prefill under a second prints nothing
    assert quiet.getvalue() == ""


def test_text_view_says_the_same_things() -> None:
    out = io.StringIO()
    v = TextView("m", out=out)
    feed(v, [Thinking("hmm"), ThinkingEnd(""), TokenId(1), Token("Hello"), Token(" world"), done()])
    text = out.getvalue()
    assert text.startswith("[thinking] hmm\n[/thinking]\nHello world\n")
    assert "[partial] ttft 42 ms · 100.0 tok/s · 40 prompt (8 prefilled) + 3 generated · cache: 32 tokens " \
           "read, 1 stored · end of turn" in text
    out2 = io.StringIO()
    v2 = TextView(out=out2)
    feed(v2, [Token("x"), Error(ValueError("boom"))])
    assert out2.getvalue() == "x\n[error] error: ValueError: boom\n"


def test_result_reprs() -> None:
    raw = CompletionResult.from_done(done("Paris <b>", kind="exact"), "m", 12)
    r = Result.of(raw, thinking="capital of France")
    assert r.reply == "Paris <b>" and r.cache_hit_kind == "exact" and r.finish_reason == "stop"
    assert r.tokens == (1, 2, 3)  # read through from the CompletionResult
    html = r._repr_html_()
    assert "Paris &lt;b&gt;" in html and HIT_COLOURS["exact"] in html and "<details>" in html
    assert "ttft 42 ms" in html
    assert repr(r).startswith("<Result model='m' ref=12 finish=stop hit=exact reply='Paris <b>'")
    from IPython.lib.pretty import pretty

    text = pretty(r)
    assert "[thinking] capital of France" in text and "[exact] ttft 42 ms" in text
    failed = Result("par", error=RuntimeError("x"), model="m")
    assert "error: RuntimeError: x" in failed.as_text() and failed.stats is None


def test_display_mode_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(widgets.DISPLAY_ENV, raising=False)
    assert not widgets.widgets_available()  # no Jupyter kernel here
    monkeypatch.setenv(widgets.DISPLAY_ENV, "widget")
    assert widgets.widgets_available()
    assert isinstance(widgets.make_view("m"), GenerationWidget)
    monkeypatch.setenv(widgets.DISPLAY_ENV, "text")
    assert isinstance(widgets.make_view("m"), TextView)
    with pytest.raises(ValueError):
        widgets.set_display_mode("fancy")


@pytest.mark.model
def test_cancel_button_cancels_the_request(model: str) -> None:
    s = wb.stream(model, "Write a very long story about a dragon:", response_tokens=400, ignore_eos=True)
    w = GenerationWidget(model)
    w.bind(s)
    assert f"#{s.ref}" in w.title.value
    first = next(s)
    w.feed(first)
    w.cancel_button.click()  # -> workbench.cancel(stream)
    result = transcript.consume(s, w)
    assert result.finish_reason == "cancelled" and result.stats.generated_tokens < 400
    assert w.box.box_style == "warning"


def test_display_bundle_carries_the_text_too() -> None:
    w = GenerationWidget("m", throttle_s=0.0)
    feed(w, [Thinking("hmm"), ThinkingEnd(""), Token("Hi"), done("Hi", kind="sticky")])
    assert w.as_text() == ("[thinking] hmm\nHi\n[sticky] ttft 42 ms · 100.0 tok/s · 40 prompt (8 prefilled) + "
                           "3 generated · cache: 32 tokens read, 1 stored · end of turn")
    bundle = widgets._Shown(w)._repr_mimebundle_()
    assert bundle["text/plain"] == w.as_text()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == w.box.model_id


@pytest.mark.model
def test_cancel_button_on_a_chat_stream(model: str) -> None:
    s = wb.chat_stream(model, [{"role": "user", "content": "Write a long poem about the sea."}],
                       response_tokens=300, ignore_eos=True)
    w = GenerationWidget(model)
    w.bind(s)
    w.feed(next(s))
    w.cancel_button.click()  # -> workbench.cancel(ref): a ChatStream is not a Stream
    result = transcript.consume(s, w)
    assert result.finish_reason == "cancelled" and result.stats.generated_tokens < 300


def test_thinking_opens_while_it_streams() -> None:
    w = GenerationWidget(throttle_s=0.0)
    feed(w, [Thinking("step one")])
    assert w.thinking_box.selected_index == 0
    feed(w, [ThinkingEnd("")])
    assert w.thinking_box.selected_index is None


@pytest.mark.model
def test_widget_reply_equals_the_result_and_the_badge_comes_early(model: str) -> None:
    """With a throttle that holds back most flushes, the final reply shown is the Result's;
    the hit kind is on the badge before the generation ends (from request_info)."""
    s = wb.stream(model, "Write a long story about a lighthouse keeper:", response_tokens=120,
                  ignore_eos=True, cache=False)
    w = GenerationWidget(model, throttle_s=0.5)
    badge_before_done: list[str] = []
    real_feed = w.feed

    def feed_and_watch(ev: object) -> None:
        if isinstance(ev, Done):
            badge_before_done.append(w.badge.value)
        real_feed(ev)

    w.feed = feed_and_watch  # type: ignore[method-assign]
    result = transcript.consume(s, w, tick_s=0.05)
    assert result.reply and w.reply.value == reply_html(result.reply)
    assert w.as_text().startswith(result.reply + "\n")
    assert badge_before_done and "wb-hit-cold" in badge_before_done[0]


@pytest.mark.model
def test_live_and_final_tok_s_are_one_figure(model: str) -> None:
    """The live tok/s and the final one are the same rule on the same (the engine's)
    timestamps: a view that falls behind the stream (here it is slow to take the first
    token, so the next ones queue up and reach it in a burst) still shows the rate the
    stats line ends with, not the rate at which the events reached it."""
    import re
    import time

    s = wb.stream(model, "Write a long story about a lighthouse keeper:", response_tokens=120,
                  ignore_eos=True, cache=False)
    w = GenerationWidget(model, throttle_s=0.0)
    live: list[str] = []
    real_feed = w.feed

    def slow_feed(ev: object) -> None:
        if isinstance(ev, TokenId) and w.transcript.n_tokens == 0:  # the view falls behind a third
            deadline = time.monotonic() + 60  # of the reply: those events then reach it at once
            while wb.request_info(s.ref)["generated_tokens"] < 40 and time.monotonic() < deadline:
                time.sleep(0.01)
        real_feed(ev)
        if not isinstance(ev, Done):
            live.append(w.stats.value)

    w.feed = slow_feed  # type: ignore[method-assign]
    result = transcript.consume(s, w, tick_s=0.0)
    rates = [float(m.group(1)) for v in live if (m := re.search(r"([0-9.]+) tok/s", v))]
    final = float(re.search(r"([0-9.]+) tok/s", w.stats.value).group(1))  # type: ignore[union-attr]
    assert rates and result.stats.decode_tps is not None
    assert final == pytest.approx(result.stats.decode_tps, abs=0.05)
    assert rates[-1] == pytest.approx(final, rel=0.05)


def test_accepted_draft_tokens_are_marked_in_the_reply() -> None:
    w = GenerationWidget("m", throttle_s=0.0)
    feed(w, [TokenId(1), Token("Hello"), TokenId(2, draft=True), Token(" wor"), TokenId(3, draft=True), Token("ld"),
             TokenId(4), Token("!")])
    assert w.reply.value == reply_html("Hello world!", segments=[("Hello", False), (" world", True), ("!", False)])
    assert 'class="wb-draft"' in w.reply.value and ">&#x27;" not in w.reply.value
    spec = {"kind": "ngram-simple", "drafted": 5, "accepted": 2}
    d = Done("Hello world!", (1, 2, 3, 4), (1, 2, 3, 4), "length", None, stats(speculative=spec))  # type: ignore[arg-type]
    feed(w, [d])
    assert w.reply.value.count('class="wb-draft"') == 1  # still marked after the end
    assert "speculative ngram-simple: 2 of 5 drafted tokens accepted" in w.stats.value
    plain = GenerationWidget("m", throttle_s=0.0)
    feed(plain, [TokenId(1), Token("Hi"), done("Hi")])
    assert "wb-draft" not in plain.reply.value


@pytest.mark.model
def test_a_speculative_stream_shows_its_accepted_drafts(model: str) -> None:
    from tests.integration.test_speculative import COPY  # a reply that copies code from its prompt

    w = GenerationWidget(model, throttle_s=0.0)
    fixed = {"ngram": "cache", "adaptive": False}  # always draft: acceptance not left to timing
    result = transcript.consume(wb.stream(model, COPY, response_tokens=64, speculative=fixed), w)
    spec = result.stats.speculative
    assert spec["accepted"] > 0 and 'class="wb-draft"' in w.reply.value
    marked = "".join(t for t, drafted in w.transcript.segments if drafted)
    assert 0 < len(marked) < len(result.reply)  # the target's own tokens stay unmarked
