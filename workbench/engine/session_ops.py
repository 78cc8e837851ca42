"""Session commands of the engine: end, reset, evict. A mixin of :class:`Engine`.

Public methods run on any thread and hand the work to the loop thread (``_call``) with a
bounded wait; the underscored ones run on the loop thread between ticks.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from ..cache import SaveReason
from ..errors import NoSession, SessionBusy, SessionReset

COMMAND_TIMEOUT_S = 5.0


class SessionOps:
    def end_session(self, session_id: Hashable, scope: str) -> None:
        self._call(lambda: self._end_session(session_id, scope))

    def reset_session(self, session_id: Hashable, scope: str) -> str:
        """Force-drop a session (its in-flight request ends with SessionReset)."""
        return self._call(lambda: self._reset_session(session_id, scope), interrupt=True)

    def evict(self, reason: SaveReason = SaveReason.EVICT) -> int:
        """Save every idle session's live KV to the prefix cache and release its sequence
        (the session keeps its transcript; its next turn restores from the cache). Bounded
        by evict_save_timeout_ms; returns the rows saved."""
        return self._call(lambda: self._evict_sessions(reason), interrupt=False,
                          timeout=self.cfg.evict_save_timeout_ms / 1000 + COMMAND_TIMEOUT_S)

    def session_info(self, scope: str | None = None) -> list[dict[str, Any]]:
        """Every session, or those of one cache scope."""
        with self._cv:
            return [s.info() for s in self.sessions if scope is None or s.scope == scope]

    # --- sessions (run on the loop thread through _call) ------------------------------------
    def _end_session(self, session_id: Hashable, scope: str) -> None:
        sess = self.sessions.get(session_id, scope)
        if sess is None:
            raise NoSession(session_id)
        if sess.busy_ref is not None:
            raise SessionBusy(session_id, sess.busy_ref)
        self.sessions.drop(session_id, scope)
        self._session_row(sess, None)
        self._free_session_seq(sess)

    def _reset_session(self, session_id: Hashable, scope: str) -> str:
        sess = self.sessions.drop(session_id, scope)
        if sess is None:
            return "not_found"
        req = self.requests.get(sess.busy_ref) if sess.busy_ref is not None else None
        if req is not None:
            with self._cv:
                if req in self.pending:
                    self.pending.remove(req)
            if req.seq == sess.seq:
                sess.seq = None  # the request's retire frees it
            self._retire(req, keep_kv=False)
            req.fail(SessionReset(f"session {session_id!r} was reset"))
        self._session_row(sess, None)
        self._free_session_seq(sess)
        self.counters["sessions_reset"] += 1
        return "recovered"

    def _evict_sessions(self, reason: SaveReason) -> int:
        deadline = time.monotonic() + self.cfg.evict_save_timeout_ms / 1000
        saved = 0
        with self._cv:
            idle = self.sessions.idle_pinned()
        for sess in idle:
            if self.kvcache is not None and sess.tokens and time.monotonic() < deadline:
                row = self.kvcache.save(self.ctx, sess.seq, sess.tokens, sess.scope, reason, sync=True, live=True)
                if row is not None:
                    saved += 1
                    self._session_row(sess, row.key)
            self._free_session_seq(sess)
            self.counters["cache_evicted_sessions"] += 1
        return saved

    def _free_session_seq(self, sess: Any) -> None:
        if sess.seq is not None:
            self.ctx.seq_rm(sess.seq, -1, -1)
            with self._cv:
                self._free_seqs.append(sess.seq)
                self._free_seqs.sort()
            sess.seq = None
