"""A bounded writer pool: saves run in the background and never block the caller.

The engine fires saves from its loop thread; waiting for a disk write there would stall
every sequence. `submit` therefore takes a slot without waiting: when `max_pending` saves
are already queued or running it returns False and counts `saves_dropped` (a dropped save
only costs a future cache miss).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workbench.cache.counters import Counters

log = logging.getLogger(__name__)


class SaveQueue:
    """At most `max_pending` saves queued or running, on `max_workers` threads."""

    def __init__(self, max_workers: int = 2, max_pending: int = 8, counters: Counters | None = None) -> None:
        if max_workers < 1 or max_pending < 1:
            raise ValueError("max_workers and max_pending must be >= 1")
        self.max_pending = max_pending
        self.counters = counters if counters is not None else Counters()
        self._slots = threading.BoundedSemaphore(max_pending)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="workbench-save")
        self._idle = threading.Condition()
        self._pending = 0
        self._closed = False

    @property
    def pending(self) -> int:
        """Saves queued or running now."""
        with self._idle:
            return self._pending

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Queue `fn(*args, **kwargs)`; False (and `saves_dropped` += 1) when full or closed."""
        if self._closed or not self._slots.acquire(blocking=False):
            self.counters.inc("saves_dropped")
            return False
        with self._idle:
            self._pending += 1
        try:
            self._pool.submit(self._run, fn, args, kwargs)
        except RuntimeError:  # shut down between the check and the submit
            self._done()
            self.counters.inc("saves_dropped")
            return False
        return True

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            self.counters.inc("saves_failed")
            log.exception("background cache save failed")
        finally:
            self._done()

    def _done(self) -> None:
        self._slots.release()
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, wait: bool = True) -> None:
        """Refuse new saves; optionally wait for the pending ones."""
        self._closed = True
        self._pool.shutdown(wait=wait)
