"""Session commands: end, reset, evict; and making room when the shared KV is full. The
commands run on the loop thread between ticks (the engine queues them with a bounded
wait), so they never race a decode; `make_room` runs on the loop thread after a decode
found no free KV cells (the pool's ``kv_full`` hook, registered here).

State: none of its own; it acts on the session table through the sequence pool (their
sequences), the request table (a reset session's request) and the save points (their rows).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Hashable

from ..cache import SaveReason
from ..errors import NoSession, SessionBusy, SessionReset
from .cache_saves import SavePoints
from .request_table import RequestTable
from .seq_pool import SeqPool
from .sessions import Session, SessionTable

COUNTER_NAMES = ("kv_full_evictions",)   # idle sessions saved and freed because the KV was full


class SessionCommands:
    def __init__(self, sessions: SessionTable, pool: SeqPool, table: RequestTable, saves: SavePoints,
                 counters: collections.Counter[str], lock: threading.Condition) -> None:
        self._sessions = sessions
        self._pool = pool
        self._table = table
        self._saves = saves
        self._counters = counters
        self._lock = lock
        pool.kv_full = self.make_room

    def end(self, session_id: Hashable, scope: str) -> None:
        sess = self._sessions.get(session_id, scope)
        if sess is None:
            raise NoSession(session_id)
        if sess.busy_ref is not None:
            raise SessionBusy(session_id, sess.busy_ref)
        self._sessions.drop(session_id, scope)
        self._forget(sess)

    def reset(self, session_id: Hashable, scope: str) -> str:
        """Force-drop a session; its request (queued or running) fails with SessionReset."""
        sess = self._sessions.drop(session_id, scope)
        if sess is None:
            return "not_found"
        req = self._table.by_ref.get(sess.busy_ref) if sess.busy_ref is not None else None
        if req is not None:
            self._table.unqueue(req)
            if req.seq == sess.seq:
                sess.seq = None  # the request's retire frees it
            self._table.fail(req, SessionReset(f"session {session_id!r} was reset"))
        self._forget(sess)
        self._counters["sessions_reset"] += 1
        return "recovered"

    def evict(self, reason: SaveReason, timeout_s: float) -> int:
        """Save every idle session's live KV as a row and release its sequence (the session
        keeps its transcript; its next turn restores from the cache). Saves stop after
        ``timeout_s``; returns the rows saved."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            idle = self._sessions.idle_pinned()
        return sum(self._evict_one(sess, reason, deadline) for sess in idle)

    def make_room(self) -> bool:
        """The shared KV is full: save the least recently used idle session's KV (reason
        evict; a row already cached is not written again) and free its cells, so the batch
        can run again. False when no session is idle: then a request must yield."""
        with self._lock:
            idle = self._sessions.idle_pinned()
        if not idle:
            return False
        self._evict_one(idle[0], SaveReason.EVICT, None)
        self._counters["kv_full_evictions"] += 1
        return True

    def _evict_one(self, sess: Session, reason: SaveReason, deadline: float | None) -> bool:
        """Save (before ``deadline``, if any) and release an idle session's sequence; True
        when a row was saved."""
        saved = (deadline is None or time.monotonic() < deadline) and self._saves.save_session(sess, reason)
        self._pool.release(sess)
        self._counters["cache_evicted_sessions"] += 1
        return saved

    def forget_all(self) -> None:
        """The engine stops: its sessions' rows become ordinary rows (their own rows go)."""
        for sess in self._sessions:
            self._saves.session_row(sess, None)

    def _forget(self, sess: Session) -> None:
        self._saves.session_row(sess, None)
        self._pool.release(sess)
