"""Thinking (reasoning) blocks carved out of a request's text stream.

A reasoning model writes ``<think> ... </think>`` (its markers) before its answer. The
engine loop knows nothing of this: :class:`ThinkingStream` wraps a finished-or-running
:class:`~workbench.engine.stream.Stream` and rewrites its events on the consumer's thread.

    Token(text) inside the markers   ->  Thinking(text)
    the end marker (or the budget)   ->  one ThinkingEnd(signature)
    everything else                  ->  unchanged (TokenId, Token, Done, Error)

Markers are matched on the text, so a marker that spans several tokens (or arrives split
across token pieces) is recognised: text that could still be the start of the marker we
are waiting for is held back until it either completes it or cannot. A block is
recognised only at the start of the reply (after whitespace), or from the first token when
the prompt already ends with the start marker (``inside=True``); one block per request.

The budget counts ``TokenId`` events that arrive while the block is open. When it is spent
the block is closed (``ThinkingEnd``) and later text is routed as ordinary ``Token`` text;
the end marker, when it comes, is dropped. Chat pairs this with the request option
``reasoning_budget``: llama.cpp's reasoning-budget sampler forces the end marker right after
the same N tokens, so the marker dropped here is the forced one and the model itself stops
thinking.

The signature is HMAC-SHA256 (hex) of the thinking text's UTF-8 bytes under the model's
``thinking_signing_key``, or '' when no key is set.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from ..engine.events import Done, Event, Thinking, ThinkingEnd, Token, TokenId
from ..engine.stream import EventEnds, Stream
from ..errors import InvalidOption

_BEFORE, _THINKING, _CUT, _AFTER = "before", "thinking", "cut", "after"


def thinking_signature(key: bytes | None, text: str) -> str:
    """HMAC-SHA256 hex digest of ``text`` under ``key``; '' without a key."""
    if not key:
        return ""
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(slots=True, frozen=True)
class ThinkingMarkers:
    start: str
    end: str


def budget_option(given: Any, markers: ThinkingMarkers, tokens: int, inside: bool) -> dict[str, Any]:
    """The ``reasoning_budget`` request option that closes a block of ``markers`` after
    ``tokens`` tokens, so the model itself stops thinking: llama.cpp's budget sampler forces
    the end marker into the reply (and the KV). ``inside``: the prompt already opened the
    block (start '' = from the first token). ``given``: the caller's own reasoning_budget
    option, as passed, refused unless None."""
    if given is not None:
        raise InvalidOption("reasoning_budget", given,
                            "None with thinking_budget_tokens (which sets it from the thinking markers)")
    return {"tokens": tokens, "start": "" if inside else markers.start, "end": markers.end}


def special_markers(native_model: Any, markers: tuple[str, ...]) -> tuple[str, ...]:
    """The markers that are one special (control) token of this model (rendered as '' unless shown)."""
    out = []
    for s in markers:
        ids = native_model.tokenize(s, False, True) if s else []
        if len(ids) == 1 and native_model.token_to_piece(ids[0], False) != native_model.token_to_piece(ids[0], True):
            out.append(s)
    return tuple(out)


def shown_specials(render_special: bool | tuple[str, ...], shown: tuple[str, ...]) -> dict[str, Any]:
    """The request option change that adds ``shown`` to ``render_special`` (the request's, as
    built), as llama.cpp's server shows preserved tokens: the splitter and the parser need
    the markers' text, which control tokens otherwise render as ''. {} when nothing changes."""
    if not shown or render_special is True:
        return {}
    return {"render_special": tuple(dict.fromkeys((*(render_special or ()), *shown)))}


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ThinkingSplitter:
    """The state machine: text pieces in, Token / Thinking / ThinkingEnd events out.

    States: before (waiting for the start marker at the head of the reply), thinking
    (inside the block), cut (the budget closed the block; waiting to drop the model's own
    end marker), after (plain text).
    """

    def __init__(self, markers: ThinkingMarkers, *, inside: bool = False, budget: int | None = None,
                 key: bytes | None = None) -> None:
        if not markers.end:
            raise ValueError("a thinking end marker must be non-empty")
        self._start, self._end = markers.start, markers.end
        self._budget = budget
        self._key = key
        self._state = _THINKING if (inside or not markers.start) else _BEFORE
        self._held = ""
        self._strip_next = self._state == _THINKING
        self._raw_len = 0
        self.tokens = 0                     # thinking tokens counted so far
        self.thinking = ""                  # the text emitted as Thinking
        self.text = ""                      # the text emitted as Token (outside the block)
        self.signature: str | None = None   # set when the block closes
        self.cut_at: int | None = None      # reply offset where the budget closed the block
        self.dropped_at: int | None = None  # reply offset of the end marker dropped after a cut

    @property
    def state(self) -> str:
        return self._state

    def count_token(self) -> None:
        """A TokenId arrived; it counts against the budget while the block is open."""
        if self._state == _THINKING:
            self.tokens += 1

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self._raw_len += len(text)
        self._held += text
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Event]:
        """The request ended: release what was held back; close an unterminated block."""
        out: list[Event] = []
        held, self._held = self._held, ""
        if self._state == _THINKING:
            self._think(held, out)
            self._close(out)
            self._state = _AFTER
        elif held:
            self._say(held, out)
        return out

    def reply_for_parser(self, reply: str) -> str:
        """The reply as a chat parser should see it: after a budget cut, the end marker is
        moved to the cut, so the text past the budget parses as the answer."""
        if self.cut_at is None:
            return reply
        head, tail = reply[: self.cut_at], reply[self.cut_at:]
        if self.dropped_at is not None:
            at = self.dropped_at - self.cut_at
            tail = tail[:at] + tail[at + len(self._end):]
        return head + self._end + tail

    # --- one step of the machine; True when it should run again -----------------------
    def _step(self, out: list[Event]) -> bool:
        if self._state == _BEFORE:
            return self._step_before()
        if self._state == _THINKING:
            return self._step_thinking(out)
        if self._state == _CUT:
            return self._step_cut(out)
        return self._step_after(out)

    def _step_before(self) -> bool:
        head = self._held.lstrip()
        if head.startswith(self._start):
            self._held = head[len(self._start):]
            self._state = _THINKING
            self._strip_next = True
            return True
        if self._start.startswith(head):
            return False  # whitespace or part of the marker so far: wait
        self._state = _AFTER
        return True

    def _step_thinking(self, out: list[Event]) -> bool:
        if self._strip_next:
            self._held = self._held.lstrip()
            if not self._held:
                return self._check_budget(out)
            self._strip_next = False
        at = self._held.find(self._end)
        if at >= 0:
            self._think(self._held[:at], out)
            self._held = self._held[at + len(self._end):]
            self._close(out)
            self._state = _AFTER
            self._strip_next = True
            return True
        keep = _partial_suffix(self._held, self._end)
        self._think(self._held[: len(self._held) - keep], out)
        self._held = self._held[len(self._held) - keep:]
        return self._check_budget(out)

    def _check_budget(self, out: list[Event]) -> bool:
        if self._budget is None or self.tokens < self._budget:
            return False
        self._think(self._held, out)
        self._held = ""
        self._close(out)
        self.cut_at = self._raw_len
        self._state = _CUT
        return False

    def _step_cut(self, out: list[Event]) -> bool:
        at = self._held.find(self._end)
        if at >= 0:
            self.dropped_at = self._raw_len - len(self._held) + at
            self._say(self._held[:at], out)
            self._held = self._held[at + len(self._end):]
            self._state = _AFTER
            return True
        keep = _partial_suffix(self._held, self._end)
        if len(self._held) > keep:
            self._say(self._held[: len(self._held) - keep], out)
            self._held = self._held[len(self._held) - keep:]
        return False

    def _step_after(self, out: list[Event]) -> bool:
        if self._strip_next:
            self._held = self._held.lstrip()
            if not self._held:
                return False
            self._strip_next = False
        self._say(self._held, out)
        self._held = ""
        return False

    def _say(self, text: str, out: list[Event]) -> None:
        if text:
            self.text += text
            out.append(Token(text))

    def _think(self, text: str, out: list[Event]) -> None:
        if text:
            self.thinking += text
            out.append(Thinking(text))

    def _close(self, out: list[Event]) -> None:
        self.signature = thinking_signature(self._key, self.thinking)
        out.append(ThinkingEnd(self.signature))


class ThinkingStream(EventEnds):
    """A Stream's events with thinking blocks split out (see the module docstring).

    With ``splitter=None`` the events pass through unchanged. Iterate it (or ``async for``)
    like a Stream; ``cancel``/``close``/``wait`` and ``with`` act on the wrapped request.
    Subclasses may replace the final Done through :meth:`_on_done`.
    """

    def __init__(self, stream: Stream, splitter: ThinkingSplitter | None) -> None:
        self.stream = stream
        self.splitter = splitter
        self.ref = stream.ref
        self.model = stream.model
        self.done: Done | None = None
        self._pending: collections.deque[Event] = collections.deque()
        self._ended = False

    # --- the transformation ----------------------------------------------------------------
    def _convert(self, ev: Event) -> None:
        sp = self.splitter
        if isinstance(ev, TokenId):
            if sp is not None:
                sp.count_token()
            self._pending.append(ev)
        elif isinstance(ev, Token):
            self._pending.extend(sp.feed(ev.text) if sp is not None else (ev,))
        elif isinstance(ev, Done):
            if sp is not None:
                self._pending.extend(sp.finish())
            self._pending.append(self._on_done(ev))
        else:
            self._pending.append(ev)

    def _on_done(self, done: Done) -> Done:
        return done

    def _emit(self) -> Event:
        return self._seen(self._pending.popleft())

    # --- iteration ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while not self._pending:
            if self._ended:
                raise StopIteration
            self._convert(next(self.stream))
        return self._emit()

    def poll(self, timeout: float | None = 0.0) -> Event | None:
        """As Stream.poll: the next event within `timeout` seconds, else None."""
        while not self._pending:
            if self._ended:
                return None
            ev = self.stream.poll(timeout)
            if ev is None:
                return None
            self._convert(ev)
            timeout = 0.0  # an event that showed nothing yet (a held-back piece): no more waiting
        return self._emit()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        while not self._pending:
            if self._ended:
                raise StopAsyncIteration
            self._convert(await self.stream.__anext__())
        return self._emit()

    # --- control -----------------------------------------------------------------------
    def cancel(self) -> None:
        self.stream.cancel()

    def close(self) -> None:
        self.stream.close()
        self._ended = True
        self._pending.clear()

    def wait(self, timeout: float | None = None) -> bool:
        return self.stream.wait(timeout)

    def __enter__(self) -> ThinkingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drain(self) -> list[Event]:
        """Wait for the end without waking per token, then return every remaining event."""
        try:
            while not self.stream.wait(0.25):
                pass
        except KeyboardInterrupt:
            self.cancel()
            raise
        return list(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} ref={self.ref} model={self.model!r}>"

