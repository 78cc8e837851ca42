"""Live views of one generation: an ipywidgets panel, or plain text where widgets cannot
show (terminal IPython, nbval, no ipywidgets). Both are fed the same stream events and
say the same things: the reply as it streams, a thinking block, the cache hit kind, a
stats line (ttft, tokens/s, cache read/created, finish reason), and the final state
(done, cancelled, error).

The widget follows tqdm.notebook: it is built and displayed once, then only traits change
(never an Output widget's context manager, which is not safe from other threads), and a
failure is marked visibly (`box_style='danger'`). `consume` drives a Stream into a view;
a KeyboardInterrupt (the kernel's Interrupt) cancels the request, waits for its end, shows
"cancelled" and re-raises as `GenerationInterrupted` carrying the partial Result.
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from workbench.engine.events import CompletionResult, Done, Error, Token
from workbench.notebook.results import (Result, badge_html, reply_html, state_html, stats_line)

DISPLAY_ENV = "WORKBENCH_DISPLAY"  # auto | widget | text
_mode = "auto"


class GenerationInterrupted(KeyboardInterrupt):
    """The kernel's Interrupt arrived while a generation streamed; it was cancelled."""

    def __init__(self, result: Result) -> None:
        super().__init__("generation cancelled by KeyboardInterrupt")
        self.result = result


# --- which view -----------------------------------------------------------------------------

def set_display_mode(mode: str) -> None:
    """'auto' (widgets in a Jupyter kernel when ipywidgets is installed), 'widget', 'text'."""
    global _mode
    if mode not in ("auto", "widget", "text"):
        raise ValueError(f"display mode must be auto, widget or text, got {mode!r}")
    _mode = mode


def display_mode() -> str:
    """The mode in force: the WORKBENCH_DISPLAY environment variable wins over set_display_mode."""
    return os.environ.get(DISPLAY_ENV, _mode)


def widgets_available() -> bool:
    """ipywidgets importable and a frontend that can show them (a Jupyter kernel)."""
    if display_mode() == "text":
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    if display_mode() == "widget":
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_view(model: str = "", *, on_cancel: Callable[[], None] | None = None,
              out: TextIO | None = None) -> Any:
    """A GenerationWidget (displayed) where widgets can show, else a TextView."""
    if widgets_available():
        from IPython.display import display

        w = GenerationWidget(model, on_cancel=on_cancel)
        w.handle = display(_Shown(w), display_id=True)
        return w
    return TextView(model, out=out)


class _Shown:
    """The widget's display: its view, plus a text/plain of what it shows so far, so a
    frontend without widgets (nbconvert, a text diff) still reads the reply and stats."""

    def __init__(self, widget: GenerationWidget) -> None:
        self.widget = widget

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget.box._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.widget.as_text()
        return bundle


# --- the state both views render -------------------------------------------------------------

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
        kind = type(ev).__name__
        if isinstance(ev, Token):
            self.text += ev.text
            return "token"
        if kind == "TokenId":
            self.n_tokens += 1
            return None
        if kind == "Thinking":  # getattr-safe: the engine may not emit these yet
            self.thinking += getattr(ev, "text", "") or ""
            return "thinking"
        if kind == "ThinkingEnd":
            self.thinking_done = True
            return "thinking"
        if isinstance(ev, Done):
            self.done = ev
            message = getattr(ev, "message", None)  # a chat turn's parsed message
            content = message.get("content") if isinstance(message, dict) else None
            self.text = content if isinstance(content, str) and content else ev.reply
            if not self.thinking and getattr(ev, "thinking", ""):
                self.thinking, self.thinking_done = ev.thinking, True
            self.hit_kind = ev.stats.cache_hit_kind
            self.state = "cancelled" if ev.finish_reason == "cancelled" else "done"
            return "done"
        if isinstance(ev, Error):
            self.error = ev.reason
            self.state = "error"
            return "error"
        return None

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.state = "error"

    def result(self, ref: int | None = None) -> Result:
        ref = self.ref if ref is None else ref
        if self.done is None:
            return Result(self.text, None, self.thinking, self.error, self.model, ref)
        ref = -1 if ref is None else ref
        from_chat = getattr(_chat_result_type(), "from_chat_done", None)
        if from_chat is not None and hasattr(self.done, "message"):
            raw = from_chat(self.done, self.model, ref)
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


def _chat_result_type() -> Any:
    """workbench.chat.ChatResult where chat exists (getattr-safe: it is being built)."""
    import importlib

    try:  # the module: `workbench.chat` as an attribute is the chat() function
        module = importlib.import_module("workbench.chat")
    except ImportError:
        return None
    return getattr(module, "ChatResult", None)


# --- the widget ------------------------------------------------------------------------------

class GenerationWidget:
    """One panel per generation: badge, state, Cancel button, thinking (Accordion), reply
    (HTML), stats line. Display `box` once; `feed` events; it updates its traits only."""

    BOX_STYLES = {"running": "info", "done": "success", "cancelled": "warning", "error": "danger"}

    def __init__(self, model: str = "", *, on_cancel: Callable[[], None] | None = None,
                 throttle_s: float = 0.05) -> None:
        import ipywidgets as w

        self.transcript = Transcript(model)
        self.on_cancel = on_cancel
        self.throttle_s = throttle_s
        self.handle: Any = None  # the DisplayHandle when make_view displayed it
        self._last_flush = 0.0
        self._thinking_shown = False
        self._lock = threading.Lock()
        def spaced() -> Any:
            return w.Layout(margin="0 0.5em 0 0")

        self.badge = w.HTML(badge_html(None), layout=spaced())
        self.state = w.HTML(state_html("running"), layout=spaced())
        self.title = w.HTML(f'<span style="color:#6c757d">{html.escape(model)}</span>', layout=spaced())
        self.cancel_button = w.Button(description="Cancel", button_style="warning", icon="stop",
                                      tooltip="cancel this request (workbench.cancel)",
                                      layout=w.Layout(width="auto"))
        self.cancel_button.on_click(self._clicked)
        self.thinking = w.HTML("")
        self.thinking_box = w.Accordion(children=[self.thinking], layout=w.Layout(display="none"))
        self.thinking_box.set_title(0, "thinking")
        self.reply = w.HTML(reply_html(""))
        self.stats = w.HTML("")
        header = w.HBox([self.badge, self.state, self.title, self.cancel_button],
                        layout=w.Layout(align_items="center"))
        self.box = w.VBox([header, self.thinking_box, self.reply, self.stats], box_style="info")

    # -- control -------------------------------------------------------------------------------
    def bind(self, stream: Any) -> None:
        """Wire the Cancel button to workbench.cancel (the Stream, or the request ref of a
        stream wrapper such as a ChatStream) and note the request ref."""
        import workbench as wb
        from workbench.engine.stream import Stream

        self.transcript.ref = stream.ref
        target = stream if isinstance(stream, Stream) else stream.ref
        self.on_cancel = lambda: wb.cancel(target)
        self.title.value = (f'<span style="color:#6c757d">{html.escape(self.transcript.model)} '
                            f'#{stream.ref}</span>')

    def _clicked(self, _button: Any = None) -> None:
        self.cancel_button.disabled = True
        self.cancel_button.description = "Cancelling"
        if self.on_cancel is not None:
            self.on_cancel()

    # -- events --------------------------------------------------------------------------------
    def feed(self, ev: Any) -> None:
        what = self.transcript.apply(ev)
        if what == "token":
            now = time.monotonic()
            if now - self._last_flush >= self.throttle_s:
                self._last_flush = now
                self._render_text()
        elif what == "thinking":
            self._render_thinking()
        elif what in ("done", "error"):
            self.close()

    def fail(self, exc: BaseException) -> None:
        self.transcript.fail(exc)
        self.close()

    def close(self) -> None:
        """Render the final state (idempotent)."""
        with self._lock:
            t = self.transcript
            self._render_text()
            self._render_thinking()
            self.badge.value = badge_html(t.hit_kind)
            self.state.value = state_html(t.state)
            self.stats.value = f'<span style="color:#6c757d;font-size:85%">{html.escape(t.status_line())}</span>'
            self.box.box_style = self.BOX_STYLES.get(t.state, "")
            if t.state != "running":
                self.cancel_button.disabled = True
                self.cancel_button.description = "Cancel"
        if self.handle is not None and t.state != "running":
            self.handle.update(_Shown(self))  # the final text/plain beside the live view

    def as_text(self) -> str:
        """What the widget shows, as TextView would print it."""
        t = self.transcript
        think = f"[thinking] {t.thinking.strip()}\n" if t.thinking else ""
        return f"{think}{t.text}\n[{t.tag()}] {t.status_line()}"

    def _render_text(self) -> None:
        t = self.transcript
        self.reply.value = reply_html(t.text, error=t.state == "error")
        if t.state == "running":
            self.stats.value = f'<span style="color:#6c757d;font-size:85%">{html.escape(t.status_line())}</span>'

    def _render_thinking(self) -> None:
        t = self.transcript
        if t.thinking:
            self.thinking.value = reply_html(t.thinking)
            if not self._thinking_shown:  # open while it streams (the user may close it)
                self._thinking_shown = True
                self.thinking_box.layout.display = None
                self.thinking_box.selected_index = 0
            if t.thinking_done and t.state == "running":
                self.thinking_box.selected_index = None  # collapse once the answer starts


# --- plain text ------------------------------------------------------------------------------

class TextView:
    """The same content as GenerationWidget, printed: tokens as they come, then
    '[<hit kind>] <stats line>' or '[cancelled] ...' / '[error] ...'."""

    def __init__(self, model: str = "", *, out: TextIO | None = None) -> None:
        self.transcript = Transcript(model)
        self.out = out
        self._in_thinking = False
        self._closed = False
        self._printed = ""  # reply text written so far

    def bind(self, stream: Any) -> None:
        self.transcript.ref = stream.ref

    def _write(self, s: str) -> None:
        out = self.out or sys.stdout
        out.write(s)
        out.flush()

    def feed(self, ev: Any) -> None:
        t = self.transcript
        before = len(t.thinking)
        what = t.apply(ev)
        if what == "thinking":
            if not self._in_thinking and t.thinking and not t.thinking_done:
                self._in_thinking = True
                self._write("[thinking] ")
            if t.thinking_done and self._in_thinking:
                self._in_thinking = False
                self._write("\n[/thinking]\n")
            else:
                self._write(t.thinking[before:])
        elif what == "token":
            self._reply(t.text)
        elif what in ("done", "error"):
            self._reply(t.text)
            self.close()

    def _reply(self, text: str) -> None:
        """Write what `text` adds to the printed reply (all of it again if it differs, as a
        chat turn's parsed content may)."""
        if text.startswith(self._printed):
            self._write(text[len(self._printed):])
        else:
            self._write("\n" + text)
        self._printed = text

    def fail(self, exc: BaseException) -> None:
        self.transcript.fail(exc)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        t = self.transcript
        self._write(f"\n[{t.tag()}] {t.status_line()}\n")


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
