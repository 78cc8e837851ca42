"""Per-request time limits, enforced on the model's loop once per tick.

Two request options, each None (no limit) by default:

- ``timeout_s``: the whole request, from submission (the queue wait included) to its last
  event. A request still queued at its deadline leaves the queue; a running one leaves its
  sequence.
- ``token_timeout_s``: between tokens. The clock starts at admission (so the first token's
  wait includes the prefill) and restarts at each generated token. A token that arrives
  later than the limit after the previous one trips it as surely as a token that has not
  come at all: each check compares the newest token's time with the clock's start.

An expired request fails with :class:`~workbench.errors.RequestTimeout`: its stream ends
with ``Error(RequestTimeout)``, never a Done, and ``result()`` / ``complete()`` raise it.
Like any failed request it commits nothing to its session (the session keeps the tokens it
had before; its live KV is let go) and stores no cache row at its end.

The check runs at the start of each tick, between decodes, like cancellation: a limit is
observed within one tick (one decode, bounded by ``decode_budget_ms``; a prefill chunk).

State: ``_clocks``, per running request with a token limit, (clock start, newest token
time seen); the loop thread is its only user.
"""

from __future__ import annotations

import collections
import threading
import time

from ..errors import RequestTimeout
from .request import Request
from .request_table import RequestTable

COUNTER_NAMES = ("request_timeouts", "token_timeouts")


class Timeouts:
    def __init__(self, table: RequestTable, counters: collections.Counter[str], lock: threading.Condition) -> None:
        self._table = table
        self._counters = counters
        self._lock = lock
        self._clocks: dict[int, tuple[float, float | None]] = {}

    def check(self) -> None:
        """Fail every queued or running request past one of its limits."""
        now = time.perf_counter()
        queued: list[Request] = []
        if self._table.pending:   # read without the lock: one queued now is checked next tick
            with self._lock:
                queued = [r for r in self._table.pending if r.opts.timeout_s is not None]
        for req in queued:
            if now - req.submitted_at > req.opts.timeout_s:  # type: ignore[operator]
                self._table.unqueue(req)
                self._expire(req, "timeout_s", req.opts.timeout_s, now - req.submitted_at)  # type: ignore[arg-type]
        clocks: dict[int, tuple[float, float | None]] = {}
        for req in list(self._table.active):
            if req.opts.timeout_s is None and req.opts.token_timeout_s is None:
                continue
            expired = self._expired(req, now, clocks)
            if expired is not None:
                self._expire(req, *expired)
        self._clocks = clocks

    def _expired(self, req: Request, now: float,
                 clocks: dict[int, tuple[float, float | None]]) -> tuple[str, float, float] | None:
        """(option, limit, elapsed) of the first limit ``req`` is past, else None; keeps
        its token clock in ``clocks``."""
        opts = req.opts
        if opts.timeout_s is not None and now - req.submitted_at > opts.timeout_s:
            return "timeout_s", opts.timeout_s, now - req.submitted_at
        limit = opts.token_timeout_s
        if limit is None:
            return None
        start, seen = self._clocks.get(req.ref, (req.admitted_at or now, None))
        newest = req.last_token_at if req.last_token_at is not None else req.first_token_at
        if newest is not None and newest != seen:     # a token came since the last check
            if newest - start > limit:
                return "token_timeout_s", limit, newest - start
            start, seen = newest, newest
        elif now - start > limit:                     # none came, and it is late already
            return "token_timeout_s", limit, now - start
        clocks[req.ref] = (start, seen)
        return None

    def _expire(self, req: Request, option: str, limit: float, elapsed: float) -> None:
        phase = req.phase
        self._counters["token_timeouts" if option == "token_timeout_s" else "request_timeouts"] += 1
        self._table.fail(req, RequestTimeout(req.ref, option, limit, elapsed, phase, len(req.generated)))
