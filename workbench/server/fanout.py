"""The events of a response's requests (n choices, several prompts) as one async sequence,
and the rule that a client who goes away cancels them.

Each request's handle (a Stream or ChatStream) is read by a task of its own on the server's
event loop (the handle's ``async for`` waits in the loop's executor), and its events are
merged in arrival order as ``(choice index, event)``. Closing the Fanout (the response ended,
failed, or the client disconnected) cancels every request that has not ended: its sequence
is free within one engine tick.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed its connection before its response was ready (the app answers it
    with a bare 499 nobody reads; its requests were cancelled)."""


class Fanout:
    def __init__(self, handles: Sequence[Any], open_fanouts: set[Fanout]) -> None:
        self.handles = list(handles)
        self._registry = open_fanouts  # the server's: stop() cancels what is still open
        open_fanouts.add(self)
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._open = len(self.handles)
        self._peeked: tuple[int, Any] | None = None
        self._tasks = [asyncio.create_task(self._pump(i, h)) for i, h in enumerate(self.handles)]

    async def _pump(self, index: int, handle: Any) -> None:
        try:
            async for ev in handle:
                self._queue.put_nowait((index, ev))
        finally:
            self._queue.put_nowait((index, None))  # this request's events have ended

    async def peek(self) -> Any:
        """The first event (None if every request ended without one); ``events`` still
        yields it."""
        while self._peeked is None and self._open:
            index, ev = await self._queue.get()
            if ev is None:
                self._open -= 1
            else:
                self._peeked = (index, ev)
        return None if self._peeked is None else self._peeked[1]

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """(index, event) until every request has ended."""
        if self._peeked is not None:
            first, self._peeked = self._peeked, None
            yield first
        while self._open:
            index, ev = await self._queue.get()
            if ev is None:
                self._open -= 1
                continue
            yield index, ev

    def cancel_requests(self) -> None:
        """Cancel the requests (any thread); their events go on to their Done."""
        for h in self.handles:
            h.cancel()

    def close(self) -> None:
        """Cancel whatever has not ended; idempotent."""
        self._registry.discard(self)
        for t in self._tasks:
            t.cancel()
        for h in self.handles:
            h.close()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or CancelledError once the client has gone away first (the caller's
    ``finally`` then cancels its requests)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise ClientGone()
    finally:
        gone.cancel()


async def _disconnect(request: Request) -> None:
    """Return when the client has closed its connection (the body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
