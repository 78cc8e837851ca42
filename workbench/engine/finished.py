"""Finished-request listeners: who wants to hear of every request an engine served.

When a request ends (a Done: stop, length or cancelled; or an Error), the engine's loop
thread builds one small frozen `FinishedRequest` and hands it to each registered listener,
*before* the request's last event reaches its caller: a caller that has seen its result
knows every listener has seen the request. With no listener this costs one check
(`if finished.listeners:` in `Request.finish` / `Request.fail`) and builds nothing.

    from workbench.engine import finished
    seen = []
    finished.add_listener(seen.append)
    ...                                    # requests run
    finished.remove_listener(seen.append)

A listener runs on an engine's loop thread (each loaded model has its own), so keep it
O(1): append to a list, count. It must not call back into the engine and wait. A listener
that raises never breaks the loop or the request: the error is counted (`errors()`),
logged once per listener, and the request's result is delivered as it is.

Users: `workbench.lab.record` (a notebook's workload as a lab trace); a serving history
could use it the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .events import Stats

log = logging.getLogger(__name__)

Listener = Callable[["FinishedRequest"], Any]

# read without a lock on the loop threads (one attribute load); replaced whole, never mutated
listeners: tuple[Listener, ...] = ()
_lock = threading.Lock()
_errors = 0
_logged: set[int] = set()   # ids of the listeners (while registered) whose first error was logged


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """One request as the engine served it.

    ``prompt``: the token ids the engine ran (for ``continue_session``, the session's
    tokens + the new ones); ``generated``: the tokens it generated and delivered (without
    the end-of-generation token that may have ended it; a cancelled request's tokens so
    far; a failed one's up to its failure). ``kv_tokens``: how many of prompt + generated
    the sequence's KV held at the end (its n_past: all of them when the model ended it,
    one less when it ran out of tokens or hit a stop string, since the last sampled token
    is never decoded). ``submitted_at`` / ``finished_at``: ``time.perf_counter()``, one
    clock for every engine. ``finish_reason``: "stop", "length", "cancelled", or "error"
    (then ``error`` is the exception its Error event carries). ``stats``: the Done's
    Stats (for an error, the request's numbers at its failure).
    """

    ref: int
    model_id: str
    prompt: tuple[int, ...]
    generated: tuple[int, ...]
    kv_tokens: int
    submitted_at: float
    finished_at: float
    session_id: Hashable | None
    cache_scope: str
    cache: bool                      # the request used the prefix cache (its `cache` option)
    finish_reason: str
    stats: Stats
    error: BaseException | None = None

    @property
    def cache_hit_kind(self) -> str:
        """A `workbench.cache.HitKind` value (cold for a request failed before admission)."""
        return self.stats.cache_hit_kind

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def prefilled_tokens(self) -> int:
        return self.stats.prefilled_tokens


def add_listener(fn: Listener) -> None:
    """Call ``fn(FinishedRequest)`` for every request any engine finishes from now on
    (on that engine's loop thread). Adding the same function twice calls it twice."""
    global listeners
    if not callable(fn):
        raise TypeError(f"a listener must be callable, got {fn!r}")
    with _lock:
        listeners = (*listeners, fn)
        _logged.discard(id(fn))


def remove_listener(fn: Listener) -> None:
    """Stop calling ``fn`` (one registration of it); ValueError if it is not registered.
    A request finishing on another thread at this moment may still reach it once."""
    global listeners
    with _lock:
        current = list(listeners)
        for i, f in enumerate(current):
            if f is fn or f == fn:
                del current[i]
                listeners = tuple(current)
                _logged.discard(id(fn))
                return
    raise ValueError(f"{fn!r} is not a finished-request listener")


def errors() -> int:
    """How many times a listener raised (since the process started)."""
    return _errors


def notify(record: FinishedRequest) -> None:
    """Hand ``record`` to every listener; a listener's exception is counted and logged
    (once per listener), never raised."""
    global _errors
    for fn in listeners:
        try:
            fn(record)
        except Exception:  # noqa: BLE001 - a listener must never break the loop thread
            with _lock:
                _errors += 1
                first = id(fn) not in _logged
                _logged.add(id(fn))
            if first:
                log.exception("finished-request listener %r raised (counted in finished.errors(); "
                              "further errors of it are not logged)", fn)
