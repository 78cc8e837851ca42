"""One generation as the notebook follows it: `Transcript` (what the request's events said
so far, rendered by both views in widgets.py) and `consume`, which drives a Stream into a
view. A KeyboardInterrupt (the kernel's Interrupt) cancels the request, waits for its end,
shows "cancelled" and re-raises as `GenerationInterrupted` carrying the partial Result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from workbench.chat import ChatDone, ChatResult
from workbench.engine.events import CompletionResult, Done, Error, Thinking, ThinkingEnd, Token, TokenId
from workbench.notebook.results import Result, stats_line


class GenerationInterrupted(KeyboardInterrupt):
    """The kernel's Interrupt arrived while a generation streamed; it was cancelled."""

    def __init__(self, result: Result) -> None:
        super().__init__("generation cancelled by KeyboardInterrupt")
        self.result = result


# --- the state both views render ----------------------------------------------------------

class Transcript:
    """What the events of one request said so far."""

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

    def apply(self, ev: Any) -> str | None:
        """Take one event; return what it was ('token', 'thinking', 'done', 'error') or None."""
        if isinstance(ev, Token):
            self.text += ev.text
            return "token"
        if isinstance(ev, TokenId):
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

    def tag(self) -> str:
        """'partial', or 'cancelled; cold' / 'error' when it did not finish normally."""
        if self.state in ("cancelled", "error"):
            return self.state if self.hit_kind is None else f"{self.state}; {self.hit_kind}"
        return self.hit_kind or "-"

    def status_line(self) -> str:
        if self.error is not None:
            return f"error: {type(self.error).__name__}: {self.error}"
        if self.done is not None:
            return stats_line(self.done.stats, self.done.finish_reason)
        return f"{self.state} · {self.n_tokens} token{'' if self.n_tokens == 1 else 's'}"


# --- driving a stream ------------------------------------------------------------------------

def consume(stream: Any, view: Any, *, drain_timeout_s: float = 10.0) -> Result:
    """Feed every event of `stream` to `view`; return the Result.

    KeyboardInterrupt: cancel the request, wait (up to `drain_timeout_s`) for its
    Done('cancelled'), show it, and raise GenerationInterrupted(result).
    """
    __tracebackhide__ = True
    if hasattr(view, "bind"):
        view.bind(stream)
    try:
        for ev in stream:
            view.feed(ev)
    except KeyboardInterrupt:
        stream.cancel()
        _drain(stream, view, drain_timeout_s)
        raise GenerationInterrupted(view.transcript.result(stream.ref)) from None
    if view.transcript.state == "running":  # the stream ended without Done/Error (closed)
        view.close()
    return view.transcript.result(stream.ref)


def _drain(stream: Any, view: Any, timeout_s: float) -> None:
    """After a cancel: show the request's last events (its Done('cancelled'))."""
    t = view.transcript
    try:
        if t.state == "running" and stream.wait(timeout_s):
            for ev in stream:
                view.feed(ev)
    except KeyboardInterrupt:
        pass  # a second Interrupt: stop waiting, the request is already cancelled
    if t.state == "running":
        t.state = "cancelled"
        view.close()


def consume_in_background(stream: Any, view: Any, on_done: Callable[[Result], None]) -> threading.Thread:
    """Consume on a daemon thread (the cell returns at once, so the Cancel button works
    while the request runs); `on_done(result)` is called at the end."""

    def run() -> None:
        try:
            result = consume(stream, view)
        except BaseException as exc:  # noqa: BLE001 - shown in the view, never lost on a thread
            view.fail(exc)
            result = view.transcript.result(stream.ref)
        on_done(result)

    th = threading.Thread(target=run, name=f"workbench-generate-{stream.ref}", daemon=True)
    th.start()
    return th
