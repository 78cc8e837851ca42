"""Live views of one generation: an ipywidgets panel, or plain text where widgets cannot
show (terminal IPython, nbval, no ipywidgets). Both are fed the same stream events and
request_info snapshots and say the same things: the reply as it streams, a thinking block,
the cache hit kind (from admission on), prefill progress, a live line (tokens of the most
asked for, elapsed time, tok/s), then the stats line (ttft, tokens/s, cache tokens
read/stored, why it ended in words) and the final state (done, cancelled, error).

The widget follows tqdm.notebook: it is built and displayed once, then only traits change
(never an Output widget's context manager, which is not safe from other threads); its
state is the colour of its left border. What the views render, and the loops that feed
them a Stream, are in transcript.py.
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from workbench.notebook.results import (STATE_COLOURS, UNKNOWN_COLOUR, badge_html, muted_html, reply_html,
                                        state_html)
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
              out: TextIO | None = None, live_cancel: bool = True) -> Any:
    """A GenerationWidget (displayed) where widgets can show, else a TextView.
    `live_cancel=False`: a click could not reach the kernel while this runs (a blocking
    cell), so the widget shows its Cancel button disabled with a hint instead."""
    if widgets_available():
        from IPython.display import display

        w = GenerationWidget(model, on_cancel=on_cancel, live_cancel=live_cancel)
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

CANCEL_HINT = ("a click cannot reach the kernel while this cell runs: use the kernel's Interrupt "
               "(stop button), or run the cell with --background")
PROGRESS_DELAY_S = 0.5  # a prefill shorter than this shows no progress bar


class GenerationWidget:
    """One panel per generation: badge, state, Cancel button, prefill progress, thinking
    (Accordion), reply (HTML), stats line. Display `box` once; `feed` events and `observe`
    live facts; it updates its traits only. Its state shows as the colour of the panel's
    left border (box_style frames do not render in JupyterLab 4 with ipywidgets 8)."""

    BOX_STYLES = {"running": "info", "done": "success", "cancelled": "warning", "error": "danger"}

    def __init__(self, model: str = "", *, on_cancel: Callable[[], None] | None = None,
                 throttle_s: float = 0.05, live_cancel: bool = True) -> None:
        import ipywidgets as w

        self.transcript = Transcript(model)
        self.on_cancel = on_cancel
        self.throttle_s = throttle_s
        self.live_cancel = live_cancel
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
                                      tooltip="cancel this request (workbench.cancel)" if live_cancel else CANCEL_HINT,
                                      disabled=not live_cancel, layout=w.Layout(width="auto"))
        self.cancel_button.on_click(self._clicked)
        self.hint = w.HTML("" if live_cancel else muted_html("Interrupt to stop, or --background for Cancel"))
        self.progress = w.IntProgress(value=0, min=0, max=1, description="prefill", layout=w.Layout(width="16em"))
        self.progress_label = w.HTML("")
        self.thinking = w.HTML("")
        self.thinking_box = w.Accordion(children=[self.thinking], layout=w.Layout(display="none"))
        self.thinking_box.set_title(0, "thinking")
        self.reply = w.HTML(reply_html(""))
        self.stats = w.HTML(muted_html(self.transcript.status_line()))
        header = w.HBox([self.badge, self.state, self.title, self.cancel_button, self.hint],
                        layout=w.Layout(align_items="center"))
        self.progress_row = w.HBox([self.progress, self.progress_label],
                                   layout=w.Layout(align_items="center", display="none"))
        self.box = w.VBox([header, self.progress_row, self.thinking_box, self.reply, self.stats], box_style="info",
                          layout=w.Layout(border_left=f"4px solid {STATE_COLOURS['running']}",
                                          padding="0.2em 0.6em"))

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
        if self.transcript.state != "running" or self.cancel_button.disabled:
            return  # a click after the end, a second click, or on a button that cannot act
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

    def observe(self, info: dict[str, Any]) -> None:
        """A request_info snapshot: show the hit kind, prefill progress, the live line."""
        t = self.transcript
        t.observe(info)
        if t.state != "running":
            return
        with self._lock:
            self.badge.value = badge_html(t.hit_kind)
            self._render_progress()
            self.stats.value = muted_html(t.status_line())

    def fail(self, exc: BaseException) -> None:
        self.transcript.fail(exc)
        self.close()

    def close(self) -> None:
        """Render the final state (idempotent)."""
        with self._lock:
            t = self.transcript
            self._render_text()
            self._render_thinking()
            self._render_progress()
            self.badge.value = badge_html(t.hit_kind)
            self.state.value = state_html(t.state)
            self.stats.value = muted_html(t.status_line())
            self.box.box_style = self.BOX_STYLES.get(t.state, "")
            self.box.layout.border_left = f"4px solid {STATE_COLOURS.get(t.state, UNKNOWN_COLOUR)}"
            if t.state != "running":  # a finished generation shows no Cancel button
                self.cancel_button.disabled = True
                self.cancel_button.layout.display = "none"
                self.hint.value = ""
        if self.handle is not None and t.state != "running":
            self.handle.update(_Shown(self))  # the final text/plain beside the live view

    def as_text(self) -> str:
        """What the widget shows, as TextView would print it."""
        t = self.transcript
        think = f"[thinking] {t.thinking.strip()}\n" if t.thinking else ""
        return f"{think}{t.text}\n[{t.tag()}] {t.status_line()}"

    def _render_text(self) -> None:
        t = self.transcript
        self.reply.value = reply_html(t.text, error=t.state == "error", segments=t.marked_segments(),
                                      probs=t.prob_segments())
        if t.state == "running":
            self.stats.value = muted_html(t.status_line())

    def _render_progress(self) -> None:
        t = self.transcript
        pre = t.prefill()
        if pre is None or t.elapsed_s() < PROGRESS_DELAY_S:
            self.progress_row.layout.display = "none"
            return
        restored, computed, total = pre
        self.progress.max = max(1, total)
        self.progress.value = min(total, restored + computed)
        self.progress_row.layout.display = None
        self.progress_label.value = muted_html(t.prefill_words() or "")

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
    '[<hit kind>] <stats line>' or '[cancelled] ...' / '[error] ...'. A prefill that takes
    longer than `progress_delay_s` prints its progress on one line (rewritten with \\r)."""

    def __init__(self, model: str = "", *, out: TextIO | None = None, progress_delay_s: float = 1.0) -> None:
        self.transcript = Transcript(model)
        self.out = out
        self.progress_delay_s = progress_delay_s
        self._in_thinking = False
        self._closed = False
        self._progress_shown = False
        self._printed = ""  # reply text written so far

    def bind(self, stream: Any) -> None:
        self.transcript.ref = stream.ref

    def _write(self, s: str) -> None:
        out = self.out or sys.stdout
        out.write(s)
        out.flush()

    def observe(self, info: dict[str, Any]) -> None:
        t = self.transcript
        t.observe(info)
        words = t.prefill_words()
        if words is not None and t.elapsed_s() >= self.progress_delay_s:
            self._progress_shown = True
            self._write(f"\r[prefill] {words}")
        elif words is None:
            self._end_progress()

    def _end_progress(self) -> None:
        if self._progress_shown:
            self._progress_shown = False
            self._write("\n")

    def feed(self, ev: Any) -> None:
        t = self.transcript
        before = len(t.thinking)
        what = t.apply(ev)
        if what is not None:
            self._end_progress()
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
        self._end_progress()
        t = self.transcript
        self._write(f"\n[{t.tag()}] {t.status_line()}\n")
