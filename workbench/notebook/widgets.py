"""Live views of one generation: an ipywidgets panel, or plain text where widgets cannot
show (terminal IPython, nbval, no ipywidgets). Both are fed the same stream events and
say the same things: the reply as it streams, a thinking block, the cache hit kind, a
stats line (ttft, tokens/s, cache tokens read/stored, finish reason), and the final state
(done, cancelled, error).

The widget follows tqdm.notebook: it is built and displayed once, then only traits change
(never an Output widget's context manager, which is not safe from other threads), and a
failure is marked visibly (`box_style='danger'`). What the views render, and the loop that
feeds them a Stream, are in transcript.py.
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from workbench.notebook.results import badge_html, reply_html, state_html
from workbench.notebook.transcript import Transcript

DISPLAY_ENV = "WORKBENCH_DISPLAY"  # auto | widget | text
_mode = "auto"


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
