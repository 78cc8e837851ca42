"""The native context's sequences: the one place that takes, frees, reclaims, trims, empties and
resets them.

State: the native context (replaced by :meth:`SeqPool.reset`), the free sequence ids
(ascending, so a free sequence is reused lowest first), and the session table, whose idle
sessions' sequences are reclaimed when none is free (least recently used first; never one
with a request in flight). Callers on other threads read counts under the engine's lock.
``kv_full``: what frees KV cells when the shared KV is full (set by the session commands:
save and free the least recently used idle session); True when it freed some.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from .. import _native
from .sessions import Session, SessionTable


class SeqPool:
    def __init__(self, model: Any, ctx_params: dict[str, Any], sessions: SessionTable,
                 counters: collections.Counter[str], lock: threading.Condition) -> None:
        self._model = model
        self._params = ctx_params
        self._sessions = sessions
        self._counters = counters
        self._lock = lock
        self.ctx: Any = _native.Context(model, ctx_params)
        self._free = list(range(self.ctx.n_seq_max))
        self.kv_full: Callable[[], bool] = _nothing_to_free

    # --- facts (any thread, under the lock) ---------------------------------------------------
    def n_free(self) -> int:
        return len(self._free)

    def n_placeable(self) -> int:
        """Sequences a new request could get now: free ones and idle sessions' ones."""
        return len(self._free) + len(self._sessions.idle_pinned())

    # --- the loop thread ----------------------------------------------------------------------
    def take(self) -> int | None:
        """A free sequence, else the least recently used idle session's; None when neither."""
        with self._lock:
            if self._free:
                return self._free.pop(0)
            idle = self._sessions.idle_pinned()
            if not idle:
                return None
            victim = idle[0]
            seq, victim.seq = victim.seq, None
        assert seq is not None
        self.ctx.seq_rm(seq, -1, -1)
        self._counters["sessions_reclaimed"] += 1
        return seq

    def free(self, seq: int) -> None:
        """Empty ``seq``'s KV and put it back."""
        self.ctx.seq_rm(seq, -1, -1)
        with self._lock:
            self._free.append(seq)
            self._free.sort()

    def release(self, sess: Session) -> None:
        """The session's sequence (if it holds one) goes back; its transcript stays."""
        if sess.seq is not None:
            seq, sess.seq = sess.seq, None
            self.free(seq)

    def release_idle_sessions(self) -> list[Session]:
        """Every idle session's sequence goes back; returns those sessions."""
        with self._lock:
            idle = self._sessions.idle_pinned()
        for sess in idle:
            self.release(sess)
        return idle

    def trim(self, seq: int, keep: int) -> None:
        """Drop ``seq``'s KV from position ``keep`` on (a rollback, or reuse of a prefix)."""
        self.ctx.seq_rm(seq, keep, -1)

    def empty(self, seq: int) -> bool:
        """Empty ``seq``; True when it is verified empty. seq_rm covers positions
        [0, INT32_MAX), so a cell at INT32_MAX survives it: then, when no other sequence
        holds KV, the whole memory is cleared instead (nothing else is lost). False: the
        sequence still holds KV (only if the native state check let such a state through)."""
        ctx = self.ctx
        ctx.seq_rm(seq, -1, -1)
        if ctx.seq_pos_max(seq) == -1:
            return True
        if all(ctx.seq_pos_max(s) == -1 for s in range(ctx.n_seq_max) if s != seq):
            ctx.memory_clear()
        return bool(ctx.seq_pos_max(seq) == -1)

    def reset(self) -> None:
        """A new context: every sequence free, no session holds live KV (after a timeout).
        Under the lock, so a reader holding it (``Engine.info``) never meets the closed one."""
        with self._lock:
            self.ctx.close()
            self.ctx = _native.Context(self._model, self._params)
            self._sessions.unpin_all()
            self._free = list(range(self.ctx.n_seq_max))

    def close(self) -> None:
        self.ctx.close()


def _nothing_to_free() -> bool:
    return False
