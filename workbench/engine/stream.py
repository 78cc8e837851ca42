"""The handle ``stream()`` returns: iterate (or ``async for``) to get events.

Closing it, or dropping it unfinished, cancels the request, so a consumer that walks away
never leaves a sequence busy.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from ..options import check_number
from .events import CompletionResult, Done, Error, Event

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Request


class EventEnds:
    """What every event handle tracks: the Done (``done``) or the Error's reason (``error``)
    and whether the stream ended; and what every one does: ``close`` it. Code that only
    ends handles (the middleware chain closing the streams it made but did not return)
    needs this type, not each kind of stream (Stream, chat's ThinkingStream, ...)."""

    done: Done | None
    error: BaseException | None = None
    _ended: bool

    @property
    def ended(self) -> bool:
        """True once the last event (Done or Error) was handed out, or the stream was closed."""
        return self._ended

    def _seen(self, ev: Event) -> Event:
        if isinstance(ev, Done):
            self.done = ev
            self._ended = True
        elif isinstance(ev, Error):
            self.error = ev.reason
            self._ended = True
        return ev

    def close(self) -> None:
        """Stop consuming: the request is cancelled if it has not ended."""
        raise NotImplementedError


class Stream(EventEnds):
    """Typed events of one request: ``Token``, ``TokenId``, then ``Done`` or ``Error``."""

    def __init__(self, engine: Engine, request: Request) -> None:
        self._engine = engine
        self._request = request
        self._ended = False
        self.ref = request.ref
        self.model = engine.model_id
        self.done: Done | None = None
        # events taken off the request's queue, not yet handed out: a wait cut short (a
        # cancelled await, an Interrupt) leaves its event here, in order, never lost
        self._stash: collections.deque[Event] = collections.deque()
        self._taking = threading.Lock()  # one taker at a time keeps the order

    # --- taking events -----------------------------------------------------------------
    def _take(self, timeout: float | None) -> bool:
        """Make sure the next event is in the stash, waiting up to `timeout` seconds (None:
        until it comes); False when none came in time."""
        if self._stash:
            return True
        if not self._taking.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            if not self._stash:
                item = self._request.events.get(timeout=timeout)
                if isinstance(item, tuple):   # a token's events, queued together (Request.emit_token)
                    self._stash.extend(item)
                else:
                    self._stash.append(item)
            return True
        except queue.Empty:
            return False
        finally:
            self._taking.release()

    def poll(self, timeout: float | None = 0.0) -> Event | None:
        """The next event if one comes within `timeout` seconds (0: only one already
        there; None: wait for it), else None; None also once the stream has ended. Lets a
        consumer that must stay responsive (a notebook cell) wait in short slices."""
        if timeout is not None:  # Lock.acquire / Queue.get refuse nan, < 0 and > TIMEOUT_MAX
            timeout = check_number("timeout", timeout, 0.0, threading.TIMEOUT_MAX, where="Stream.poll")
        if self._ended or not self._take(timeout):
            return None
        return self._seen(self._stash.popleft())

    # --- sync iteration ------------------------------------------------------------------
    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        if self._ended:
            raise StopIteration
        try:
            self._take(None)
        except KeyboardInterrupt:
            self.cancel()
            raise
        return self._seen(self._stash.popleft())

    # --- async iteration ---------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._ended:
            raise StopAsyncIteration
        if not self._take(0.0):
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._take, None)
            except asyncio.CancelledError:
                self.cancel()  # the waiting thread stashes the next event; the Done follows
                raise
        return self._seen(self._stash.popleft())

    # --- control -----------------------------------------------------------------------
    def cancel(self) -> None:
        """Idempotent; the stream still ends with ``Done(finish_reason='cancelled')``."""
        self._engine.cancel(self._request)

    def close(self) -> None:
        """Stop consuming: cancels the request if it has not ended."""
        if not self._ended:
            self.cancel()
            self._ended = True

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._ended:
                self._engine.cancel(self._request)
        except Exception:
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has ended (its last event is queued); False on timeout."""
        return self._request.finished.wait(timeout)

    def result(self) -> CompletionResult:
        """Consume the remaining events and return the completion (raises on Error)."""
        for ev in self:
            if isinstance(ev, Error):
                raise ev.reason
        if self.done is None:  # closed before the end
            self._request.finished.wait()
            while self._take(0.0):
                ev = self._stash.popleft()
                if isinstance(ev, Done):
                    self.done = ev
                elif isinstance(ev, Error):
                    raise ev.reason
        if self.error is not None:  # its Error was already handed out: a failed stream never reads as done
            raise self.error
        assert self.done is not None
        return CompletionResult.from_done(self.done, self.model, self.ref)

    def __repr__(self) -> str:
        return f"<Stream ref={self.ref} model={self.model!r} phase={self._request.phase}>"
