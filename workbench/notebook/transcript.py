"""One generation as the notebook follows it: `Transcript` (what the request's events and
its live facts said so far, rendered by both views in widgets.py) and the loops that drive
a Stream into a view: `consume` (blocking), `consume_async` (a foreground cell that awaits,
so the kernel handles the widget's Cancel click meanwhile) and `consume_in_background`.

Between events the loops ask `workbench.request_info` every `TICK_S` for what the engine
knows already: the cache hit kind from admission on, prefill progress (restored vs
computed tokens), tokens generated of the most asked for.

The kernel's Interrupt (a KeyboardInterrupt, or the cancelled task of an awaiting cell)
cancels the request, waits for its end, shows "cancelled" and raises
`GenerationInterrupted`, which IPython shows as one line and which carries the partial
Result.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import workbench as wb
from workbench.chat import ChatDone, ChatResult
from workbench.engine.events import CompletionResult, Done, Error, Thinking, ThinkingEnd, Token, TokenId
from workbench.errors import UnknownRequest
from workbench.notebook.results import Result, stats_line

TICK_S = 0.25   # how often a running view asks the engine for the request's live facts
POLL_S = 0.02   # how long an awaiting cell sleeps when no event is waiting


class GenerationInterrupted(KeyboardInterrupt):
    """The kernel's Interrupt arrived while a generation streamed; it was cancelled.
    `result` is the partial Result; `var` the variable it was stored in (the magics)."""

    def __init__(self, result: Result, var: str | None = None) -> None:
        self.result = result
        self.var = var
        super().__init__(self.message())

    def message(self) -> str:
        s = self.result.stats
        after = "" if s is None else f" after {s.generated_tokens} token{'' if s.generated_tokens == 1 else 's'}"
        where = f"; the partial result is in `{self.var}`" if self.var else ""
        return f"generation cancelled{after}{where}"

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback: the Interrupt is no crash."""
        return [f"GenerationInterrupted: {self.message()}"]


# --- the state both views render ----------------------------------------------------------

class Transcript:
    """What the events of one request, and its live facts (`observe`), said so far."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.ref: int | None = None
        self.text = ""
        self.thinking = ""
        self.thinking_done = False
        self.n_tokens = 0
        self.state = "running"
        self.hit_kind: str | None = None
        self.done: Done | None = None
        self.error: BaseException | None = None
        self.started_at = time.monotonic()
        self.info: dict[str, Any] = {}  # the newest request_info while it runs
        self.segments: list[tuple[str, bool]] = []  # the streamed text: (piece, from accepted drafts)
        self._drafted = False  # whether the newest TokenId was an accepted draft token
        self.probs: list[tuple[str, float | None]] = []  # logprobs=: (piece, its probability)

    def apply(self, ev: Any) -> str | None:
        """Take one event; return what it was ('token', 'thinking', 'done', 'error') or None."""
        if isinstance(ev, Token):
            self.text += ev.text
            self._add_segment(ev.text)
            if ev.logprob is not None or self.probs:
                self.probs.append((ev.text, None if ev.logprob is None else math.exp(ev.logprob)))
            return "token"
        if isinstance(ev, TokenId):
            self._drafted = bool(getattr(ev, "draft", False))
            self.n_tokens += 1
            return None
        if isinstance(ev, Thinking):
            self.thinking += ev.text
            return "thinking"
        if isinstance(ev, ThinkingEnd):
            self.thinking_done = True
            return "thinking"
        if isinstance(ev, Done):
            self._finish(ev)
            return "done"
        if isinstance(ev, Error):
            self.error = ev.reason
            self.state = "error"
            return "error"
        return None

    def _add_segment(self, text: str) -> None:
        if self.segments and self.segments[-1][1] == self._drafted:
            self.segments[-1] = (self.segments[-1][0] + text, self._drafted)
        else:
            self.segments.append((text, self._drafted))

    def marked_segments(self) -> list[tuple[str, bool]] | None:
        """The reply as (text, from accepted draft tokens) pieces, when any came from drafts
        and the pieces still spell the reply (a chat turn's parsed content may not)."""
        if not any(drafted for _, drafted in self.segments):
            return None
        return self.segments if "".join(t for t, _ in self.segments) == self.text else None

    def prob_segments(self) -> list[tuple[str, float | None]] | None:
        """The reply as (text, probability) pieces (a request with logprobs=), when the
        pieces still spell the reply (a chat turn's parsed content may not)."""
        return self.probs if self.probs and "".join(t for t, _ in self.probs) == self.text else None

    def observe(self, info: dict[str, Any]) -> None:
        """Take a request_info snapshot: the hit kind once admission knows it, progress."""
        if self.state != "running":
            return
        self.info = info
        if info.get("cache_hit_kind") is not None:
            self.hit_kind = info["cache_hit_kind"]

    def _finish(self, ev: Done) -> None:
        self.done = ev
        if isinstance(ev, ChatDone):  # a chat turn: show the parsed message's content
            content = ev.message.get("content")
            if isinstance(content, str) and content:
                self.text = content
            else:
                self.text = ev.reply
            if not self.thinking and ev.thinking:
                self.thinking, self.thinking_done = ev.thinking, True
        else:
            self.text = ev.reply
        self.hit_kind = ev.stats.cache_hit_kind
        self.state = "cancelled" if ev.finish_reason == "cancelled" else "done"

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.state = "error"

    def result(self, ref: int | None = None) -> Result:
        ref = self.ref if ref is None else ref
        if self.done is None:
            return Result(self.text, None, self.thinking, self.error, self.model, ref)
        ref = -1 if ref is None else ref
        if isinstance(self.done, ChatDone):
            raw: CompletionResult = ChatResult.from_chat_done(self.done, self.model, ref)
        else:
            raw = CompletionResult.from_done(self.done, self.model, ref)
        return Result(self.text, raw, self.thinking, None, self.model, ref)

    # -- what the views say ------------------------------------------------------------------
    def tag(self) -> str:
        """'partial', or 'cancelled; cold' / 'error' when it did not finish normally."""
        if self.state in ("cancelled", "error"):
            return self.state if self.hit_kind is None else f"{self.state}; {self.hit_kind}"
        return self.hit_kind or "-"

    def prefill(self) -> tuple[int, int, int] | None:
        """(restored, computed, prompt tokens) while the prompt is being prefilled, else None."""
        info = self.info
        if self.state != "running" or info.get("phase") != "prefilling" or info.get("reused_tokens") is None:
            return None
        return int(info["reused_tokens"]), int(info["prefilled_tokens"]), int(info["prompt_tokens"])

    def prefill_words(self) -> str | None:
        """'2,048 of 8,192 prompt tokens (1,024 restored from cache, 1,024 computed)' while
        the prompt is being prefilled, else None (the views' progress, one wording)."""
        pre = self.prefill()
        if pre is None:
            return None
        restored, computed, total = pre
        return (f"{restored + computed:,} of {total:,} prompt tokens ({restored:,} restored from cache, "
                f"{computed:,} computed)")

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    def live_tps(self) -> float | None:
        """The decode rate so far, from the newest request_info (Request.decode_tps: the
        engine's token times, the rule of the final Stats.decode_tps); None before the
        second token."""
        tps = self.info.get("decode_tps")
        return None if tps is None else float(tps)

    def live_line(self) -> str:
        """'queued · 0.3 s', 'prefill 2,048 of 8,192 prompt tokens (1,024 restored from cache,
        1,024 computed) · 4.1 s', or '12 of 64 tokens · 1.4 s · 45.2 tok/s'."""
        elapsed = f"{self.elapsed_s():.1f} s"
        if self.info.get("phase") == "queued":
            return f"queued · {elapsed}"
        words = self.prefill_words()
        if words is not None:
            return f"prefill {words} · {elapsed}"
        most = self.info.get("response_tokens")
        n = f"{self.n_tokens} of {most}" if most is not None else f"{self.n_tokens}"
        line = f"{n} token{'' if self.n_tokens == 1 and most is None else 's'} · {elapsed}"
        tps = self.live_tps()
        return line if tps is None else f"{line} · {tps:.1f} tok/s"

    def status_line(self) -> str:
        if self.error is not None:
            return f"error: {type(self.error).__name__}: {self.error}"
        if self.done is not None:
            return stats_line(self.done.stats, self.done.finish_reason, self.done.stop_sequence,
                              chat=isinstance(self.done, ChatDone), model=self.model or None)
        return f"{self.state} · {self.live_line()}"


# --- driving a stream ------------------------------------------------------------------------

class _Ticker:
    """Asks the engine for the request's live facts at most every TICK_S, for the view."""

    def __init__(self, stream: Any, view: Any, tick_s: float) -> None:
        self.stream, self.view, self.tick_s = stream, view, tick_s
        self.last = float("-inf")

    def __call__(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.tick_s:
            return
        self.last = now
        try:
            info = wb.request_info(self.stream.ref)
        except UnknownRequest:  # it has just finished: its Done is on the way
            return
        self.view.observe(info)


def _begin(stream: Any, view: Any, tick_s: float) -> _Ticker:
    if hasattr(view, "bind"):
        view.bind(stream)
    ticker = _Ticker(stream, view, tick_s)
    ticker(force=True)
    return ticker


def _end(stream: Any, view: Any) -> Result:
    if view.transcript.state == "running":  # the stream ended without Done/Error (closed)
        view.close()
    return view.transcript.result(stream.ref)


def consume(stream: Any, view: Any, *, tick_s: float = TICK_S, drain_timeout_s: float = 10.0) -> Result:
    """Feed every event of `stream` to `view`; return the Result.

    KeyboardInterrupt: cancel the request, wait (up to `drain_timeout_s`) for its
    Done('cancelled'), show it, and raise GenerationInterrupted(result).
    """
    __tracebackhide__ = True
    ticker = _begin(stream, view, tick_s)
    try:
        while not stream.ended:
            ev = stream.poll(tick_s)
            if ev is not None:
                view.feed(ev)
            ticker()
    except KeyboardInterrupt:
        _interrupted(stream, view, drain_timeout_s)
    return _end(stream, view)


async def consume_async(stream: Any, view: Any, *, tick_s: float = TICK_S,
                        drain_timeout_s: float = 10.0) -> Result:
    """As `consume`, awaiting between events, so the kernel's event loop runs meanwhile
    (ipykernel then dispatches the widget's comm messages: the Cancel click). The cell's
    task cancelled (the kernel's Interrupt in an awaiting cell) acts as KeyboardInterrupt."""
    __tracebackhide__ = True
    ticker = _begin(stream, view, tick_s)
    try:
        while not stream.ended:
            ev = stream.poll(0.0)
            if ev is None:
                ticker()
                await asyncio.sleep(POLL_S)
                continue
            view.feed(ev)
            ticker()
            if view.transcript.n_tokens % 32 == 0:
                await asyncio.sleep(0)  # a long burst of events still lets a click through
    except (KeyboardInterrupt, asyncio.CancelledError):
        _interrupted(stream, view, drain_timeout_s)
    return _end(stream, view)


def _interrupted(stream: Any, view: Any, drain_timeout_s: float) -> None:
    __tracebackhide__ = True
    stream.cancel()
    _drain(stream, view, drain_timeout_s)
    raise GenerationInterrupted(view.transcript.result(stream.ref)) from None


def _drain(stream: Any, view: Any, timeout_s: float) -> None:
    """After a cancel: show the request's last events (its Done('cancelled'))."""
    t = view.transcript
    deadline = time.monotonic() + timeout_s
    try:
        while t.state == "running" and not stream.ended and time.monotonic() < deadline:
            ev = stream.poll(min(0.1, max(0.0, deadline - time.monotonic())))
            if ev is not None:
                view.feed(ev)
    except KeyboardInterrupt:
        pass  # a second Interrupt: stop waiting, the request is already cancelled
    if t.state == "running":
        t.state = "cancelled"
        view.close()


class Background:
    """A generation running on a thread (`%%generate --background`), as its variable holds it
    until it ends: shows 'running · 12 of 64 tokens · 1.4 s', then the Result; `result` is
    None until then, `wait(timeout_s)` returns it (None if it has not ended in time)."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.result: Result | None = None
        self._ended = threading.Event()

    @property
    def running(self) -> bool:
        return not self._ended.is_set()

    def finish(self, result: Result) -> None:
        self.result = result
        self._ended.set()

    def wait(self, timeout_s: float | None = None) -> Result | None:
        self._ended.wait(timeout_s)
        return self.result

    def as_text(self) -> str:
        if self.result is not None:
            return self.result.as_text()
        t = self.view.transcript
        ref = "" if t.ref is None else f" #{t.ref}"
        return f"[{t.tag()}] {t.model}{ref} running in the background · {t.live_line()}"

    def __repr__(self) -> str:
        return repr(self.result) if self.result is not None else f"<Background {self.as_text()}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.as_text())


def consume_in_background(stream: Any, view: Any, on_done: Callable[[Result], None]) -> Background:
    """Consume on a daemon thread (the cell returns at once, so the Cancel button works
    while the request runs); `on_done(result)` is called at the end. Returns the handle
    that shows the running generation, then its Result."""
    handle = Background(view)

    def run() -> None:
        try:
            result = consume(stream, view)
        except BaseException as exc:  # noqa: BLE001 - shown in the view, never lost on a thread
            view.fail(exc)
            result = view.transcript.result(stream.ref)
        handle.finish(result)
        on_done(result)

    threading.Thread(target=run, name=f"workbench-generate-{stream.ref}", daemon=True).start()
    return handle
