"""The handle ``stream()`` returns: iterate (or ``async for``) to get events.

Closing it, or dropping it unfinished, cancels the request, so a consumer that walks away
never leaves a sequence busy.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from .events import CompletionResult, Done, Error, Event

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Request


class EventEnds:
    """What every event handle tracks: the Done (``done``) and whether the stream ended."""

    done: Done | None
    _ended: bool

    def _seen(self, ev: Event) -> Event:
        if isinstance(ev, Done):
            self.done = ev
            self._ended = True
        elif isinstance(ev, Error):
            self._ended = True
        return ev


class Stream(EventEnds):
    """Typed events of one request: ``Token``, ``TokenId``, then ``Done`` or ``Error``."""

    def __init__(self, engine: Engine, request: Request) -> None:
        self._engine = engine
        self._request = request
        self._ended = False
        self.ref = request.ref
        self.model = engine.model_id
        self.done: Done | None = None

    # --- sync iteration ------------------------------------------------------------------
    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        if self._ended:
            raise StopIteration
        try:
            ev = self._request.events.get()
        except KeyboardInterrupt:
            self.cancel()
            raise
        return self._seen(ev)

    # --- async iteration ---------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._ended:
            raise StopAsyncIteration
        q = self._request.events
        try:
            ev = q.get_nowait()
        except queue.Empty:
            try:
                ev = await asyncio.get_running_loop().run_in_executor(None, q.get)
            except asyncio.CancelledError:
                self.cancel()
                raise
        return self._seen(ev)

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
            while not self._request.events.empty():
                ev = self._request.events.get()
                if isinstance(ev, Done):
                    self.done = ev
                elif isinstance(ev, Error):
                    raise ev.reason
        assert self.done is not None
        return CompletionResult.from_done(self.done, self.model, self.ref)

    def __repr__(self) -> str:
        return f"<Stream ref={self.ref} model={self.model!r} phase={self._request.phase}>"
