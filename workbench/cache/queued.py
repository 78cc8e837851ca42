"""Background saves: the bounded writer pool behind a cache's `put_async`, and the brief wait
of a lookup for a queued row that would serve it.

A cache HAS a :class:`PendingSaves` (`ChunkedCache`), made with
what it needs of its host and nothing more: the host's lock (the queue's bookkeeping moves
under it, with the catalog it is compared with), its counters, what is stored (the longest
stored prefix, whether a row key is stored), and two callables, the host's `put` (what a
queued save runs) and `set_live` (a live mark asked for while the save was queued).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from workbench.cache import keys
from workbench.cache.counters import Counters
from workbench.cache.keys import CacheNamespace, Tokens
from workbench.cache.save_queue import SaveQueue
from workbench.cache.types import SaveReason


class StoredPrefixes(Protocol):
    """What the wait needs of the host's catalog: the longest stored prefix (an object with
    ``n_tokens``, or None) and whether a row key is stored."""

    def longest_prefix(self, namespace: bytes, tokens: bytes) -> Any: ...

    def __contains__(self, key: object) -> bool: ...


#: A lookup: (namespace, tokens) -> a hit with ``n_tokens``, or None.
Lookup = Callable[[Any, Tokens], Any]


class PendingSaves:
    """Saves queued on the writer pool and not stored yet, by row key."""

    def __init__(self, lock: threading.RLock, counters: Counters, stored: StoredPrefixes,
                 put: Callable[..., Any], set_live: Callable[[str, bool], Any], *,
                 workers: int = 2, max_pending: int = 8) -> None:
        self._lock = lock
        self._counters = counters
        self._stored = stored
        self._put = put
        self._set_live = set_live
        self._workers = workers
        self._max_pending = max_pending
        # key -> (namespace, tokens, an event set when the save is stored or given up)
        self._queued: dict[str, tuple[bytes, bytes, threading.Event]] = {}
        self._live_wanted: dict[str, bool] = {}
        self._saves: SaveQueue | None = None  # made on first use

    def submit(self, namespace: CacheNamespace, tokens: Tokens, payload: Any,
               reason: SaveReason | str = SaveReason.FINISH, **kwargs: Any) -> bool:
        """The host's `put` on the bounded writer pool; False (saves_dropped += 1) if the pool
        is full. `payload`: what the host's `put` stores (a state, or chunk payloads)."""
        ns, raw = namespace.digest(), keys.token_bytes(tokens)
        key = keys.row_key_from_bytes(ns, raw) if raw else None
        done = threading.Event()
        with self._lock:
            if self._saves is None:
                self._saves = SaveQueue(self._workers, self._max_pending, self._counters)
            saves = self._saves
            if key is not None and key not in self._queued:
                self._queued[key] = (ns, raw, done)
            else:
                key = None  # an identical save is already queued: its entry stands

        def job() -> None:
            try:
                self._put(namespace, tokens, payload, reason, **kwargs)
            finally:
                self._unqueue(key, done)

        if saves.submit(job):
            return True
        self._unqueue(key, done)
        return False

    def _unqueue(self, key: str | None, done: threading.Event) -> None:
        if key is not None:
            with self._lock:
                if self._queued.get(key, (None, None, None))[2] is done:
                    del self._queued[key]
                wanted = self._live_wanted.pop(key, None)
                if wanted is not None:
                    self._set_live(key, wanted)
        done.set()

    def defer_live(self, key: str, live: bool) -> bool:
        """For a row not held yet (called under the host's lock): when a save of it is queued,
        keep the live mark for when it lands and return True. A session ended while its last
        save is still queued must not leave that row live (protected) for ever."""
        if key not in self._queued:
            return False
        self._live_wanted[key] = live
        return True

    def wait_for(self, namespace: CacheNamespace | bytes, tokens: Tokens, key: str | None = None,
                 timeout: float = 0.5) -> bool:
        """Wait (at most `timeout` s) for a row that was queued and that would serve `tokens`
        better than what is stored: row `key`, or a longer prefix of `tokens`. True if it
        waited. A request that follows the one that saved (a next turn, a parent_key resume)
        then finds the row instead of racing the writer."""
        if not self._queued:    # the common case: nothing queued, no walk (a racy read is fine)
            return False
        raw = keys.token_bytes(tokens)
        ns = keys.digest_of(namespace)
        with self._lock:
            stored = self._stored.longest_prefix(ns, raw)
            best = 0 if stored is None else stored.n_tokens * 4
            wait_on = None
            for k, (qns, qraw, ev) in self._queued.items():
                if qns != ns or not raw.startswith(qraw):
                    continue
                if k == key and key not in self._stored:
                    wait_on = ev
                    break
                if len(qraw) > best:
                    best, wait_on = len(qraw), ev
        if wait_on is None:
            return False
        start = time.perf_counter_ns()
        wait_on.wait(timeout)
        self._counters.inc("queued_wait_ns", time.perf_counter_ns() - start)
        return True

    def find_prefix(self, namespace: CacheNamespace | bytes, tokens: Tokens, parent_key: str | None,
                    match_key: Callable[[Any, Tokens, str], Any], lookup: Lookup) -> tuple[Any, bool]:
        """The stored prefix a request restores: row `parent_key` when it is a prefix of
        `tokens` (the host's `match_key`), else the longest stored prefix (its `lookup`),
        after the brief wait for a queued save that would serve better. (hit or None,
        whether the hit came by `parent_key`)."""
        self.wait_for(namespace, tokens, parent_key)
        hit = match_key(namespace, tokens, parent_key) if parent_key is not None else None
        if hit is not None:
            return hit, True
        return lookup(namespace, tokens), False

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the writer pool has no save pending; False on timeout."""
        with self._lock:
            saves = self._saves
        return True if saves is None else saves.drain(timeout)

    def close(self, wait: bool = True) -> None:
        """Finish (or abandon) the pending saves."""
        if self._saves is not None:
            self._saves.close(wait=wait)
