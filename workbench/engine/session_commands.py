"""Session commands: end, reset, evict. They run on the loop thread between ticks (the
engine queues them with a bounded wait), so they never race a decode.

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


class SessionCommands:
    def __init__(self, sessions: SessionTable, pool: SeqPool, table: RequestTable, saves: SavePoints,
                 counters: collections.Counter[str], lock: threading.Condition) -> None:
        self._sessions = sessions
        self._pool = pool
        self._table = table
        self._saves = saves
        self._counters = counters
        self._lock = lock

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
        saved = 0
        with self._lock:
            idle = self._sessions.idle_pinned()
        for sess in idle:
            if time.monotonic() < deadline and self._saves.save_session(sess, reason):
                saved += 1
            self._pool.release(sess)
            self._counters["cache_evicted_sessions"] += 1
        return saved

    def forget_all(self) -> None:
        """The engine stops: its sessions' rows become ordinary rows."""
        for sess in self._sessions:
            self._saves.session_row(sess, None)

    def _forget(self, sess: Session) -> None:
        self._saves.session_row(sess, None)
        self._pool.release(sess)
