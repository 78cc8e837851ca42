"""The engine's requests by state, and the one way a request lets go of what it holds.

State: ``pending`` (waiting for a sequence, FIFO), ``active`` (on a sequence, admission
order), ``by_ref`` (every request not yet retired, for cancel and request_info). The loop
thread changes them; other threads add to ``pending`` and read counts under the lock.
"""

from __future__ import annotations

import collections
import threading
import time

from .request import Request
from .seq_pool import SeqPool
from .sessions import SessionTable


class RequestTable:
    def __init__(self, pool: SeqPool, sessions: SessionTable, lock: threading.Condition) -> None:
        self._pool = pool
        self._sessions = sessions
        self._lock = lock
        self.pending: collections.deque[Request] = collections.deque()
        self.active: list[Request] = []
        self.by_ref: dict[int, Request] = {}

    def add(self, req: Request) -> None:
        with self._lock:
            self.pending.append(req)
            self.by_ref[req.ref] = req

    def unqueue(self, req: Request) -> None:
        with self._lock:
            if req in self.pending:
                self.pending.remove(req)

    def take_cancelled(self) -> list[Request]:
        """Every request flagged cancelled: queued ones (anywhere in the queue) leave it,
        running ones stay active until they are retired."""
        with self._lock:
            queued = [r for r in self.pending if r.cancel_requested]
            for req in queued:
                self.pending.remove(req)
            return queued + [r for r in self.active if r.cancel_requested]

    def take_all(self) -> list[Request]:
        """Everything queued or running (the engine is stopping), queue emptied."""
        with self._lock:
            victims = [*self.pending, *self.active]
            self.pending.clear()
        return victims

    def fail(self, req: Request, reason: BaseException) -> None:
        self.retire(req, keep_kv=False)
        req.fail(reason)

    def retire(self, req: Request, keep_kv: bool) -> None:
        """Free what the request holds. Its session keeps the sequence and KV when keep_kv."""
        req.close_sampler()
        if req.spec is not None:
            req.spec.close()    # its numbers stay for the request's Stats
        with self._lock:
            if req in self.active:
                self.active.remove(req)
            self.by_ref.pop(req.ref, None)
            if self._settle_session(req, keep_kv):
                return
        seq = req.release_seq()
        if seq is not None:
            self._pool.free(seq)

    def _settle_session(self, req: Request, keep_kv: bool) -> bool:
        """Release the request's session; True when its sequence stays (pinned to the
        session, or never taken), False when the caller frees it."""
        sess = req.session
        if sess is None or not self._sessions.holds(sess) or sess.busy_ref != req.ref:
            return False
        sess.busy_ref = None
        sess.last_used = time.monotonic()
        if keep_kv and req.seq is not None:
            sess.tokens = (req.prompt + req.generated)[: req.n_past]
            sess.cold_upto = min(req.cold_upto, req.n_past)
            req.release_seq()  # stays pinned to the session
            return True
        if req.seq is None:
            return True     # never admitted: the session's pinned KV is untouched
        sess.seq = None
        return False
