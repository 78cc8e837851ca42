"""The command channel: work other threads hand the model's loop, run between ticks.

A command is a function (a session end / reset / evict) that must run on the loop thread
because it touches what the loop owns. The caller queues it under the engine's lock and
waits for its answer, bounded: a loop that is wedged in a long decode, or gone, must not
hang the caller.

State: ``_queue``, the commands not yet run, in arrival order, each with the Future its
caller waits on; guarded by the engine's lock.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

COMMAND_TIMEOUT_S = 5.0


class CommandQueue:
    def __init__(self, model_id: str, lock: threading.Condition) -> None:
        self._model_id = model_id
        self._lock = lock
        self._queue: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, fn: Callable[[], Any]) -> Future:
        """Queue ``fn`` (the caller holds the lock and wakes the loop)."""
        fut: Future = Future()
        self._queue.append((fn, fut))
        return fut

    def answer(self, fut: Future, timeout: float) -> Any:
        """The command's result (or its exception), waited for at most ``timeout`` s."""
        try:
            return fut.result(timeout)
        except TimeoutError:
            raise TimeoutError(f"model {self._model_id!r}: the loop did not answer within "
                               f"{timeout:.0f} s") from None

    def run_all(self) -> None:
        """Loop thread: run every queued command, each one's error going to its caller."""
        if not self._queue:   # most ticks: no lock taken (one put later is run next tick)
            return
        while True:
            with self._lock:
                if not self._queue:
                    return
                fn, fut = self._queue.popleft()
            try:
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - the command's error is its caller's
                fut.set_exception(e)

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """The loop is ending: every queued command's caller gets ``make_error()``."""
        with self._lock:
            waiting = list(self._queue)
            self._queue.clear()
        for _, fut in waiting:
            fut.set_exception(make_error())
