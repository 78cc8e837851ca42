"""Sticky sessions: a conversation pinned to one sequence so its KV cells stay live.

The loop thread owns the table; other threads read it only under the engine's lock.
A session remembers the tokens committed to its sequence's KV (``tokens``) even when its
sequence has been reclaimed for someone else (``seq is None``), so ``continue_session``
and ``expect_committed`` keep working after a reclaim (the next turn then re-prefills).

A session is named by its cache scope (tenant) and its id together: a request, end or reset
under another scope never finds, reuses, ends or resets it (the same id there names a
session of that scope's own).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Session:
    session_id: Hashable
    scope: str = "default"           # its cache scope: part of its identity, and of its rows
    seq: int | None = None
    tokens: list[int] = field(default_factory=list)
    busy_ref: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    live_key: str | None = None      # its newest cache row, marked live while the session exists
    own_row: bool = False            # live_key is one of its own rows (cache_saves.py)
    own_id: str = field(default_factory=lambda: uuid.uuid4().hex)   # names its own rows' namespace
    cold_upto: int = 0               # leading tokens whose KV a cold prefill computes alike (cache_saves.py)

    def info(self) -> dict[str, object]:
        return {"session_id": self.session_id, "cache_scope": self.scope, "seq": self.seq, "tokens": len(self.tokens),
                "busy_ref": self.busy_ref, "idle_s": time.monotonic() - self.last_used}


class SessionTable:
    """Sessions by (cache scope, session id)."""

    def __init__(self) -> None:
        self._by_id: dict[tuple[str, Hashable], Session] = {}

    def get(self, session_id: Hashable, scope: str) -> Session | None:
        return self._by_id.get((scope, session_id))

    def get_or_create(self, session_id: Hashable, scope: str) -> Session:
        sess = self._by_id.get((scope, session_id))
        if sess is None:
            sess = self._by_id[(scope, session_id)] = Session(session_id, scope)
        return sess

    def drop(self, session_id: Hashable, scope: str) -> Session | None:
        return self._by_id.pop((scope, session_id), None)

    def holds(self, sess: Session) -> bool:
        """Is this very session still in the table (not ended or reset)?"""
        return self._by_id.get((sess.scope, sess.session_id)) is sess

    def __iter__(self):
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def idle_pinned(self) -> list[Session]:
        """Sessions holding a sequence with nothing in flight, least recently used first."""
        return sorted((s for s in self._by_id.values() if s.seq is not None and s.busy_ref is None),
                      key=lambda s: s.last_used)

    def unpin_all(self) -> None:
        """The context was recreated: no session holds live KV any more."""
        for s in self._by_id.values():
            s.seq = None


def common_prefix(a: list[int], b: list[int], block: int = 256) -> int:
    """The length of the longest common prefix of ``a`` and ``b``: whole blocks compared as
    slices first (at C speed: a 2,000-token prompt is a few comparisons), then one by one."""
    n = min(len(a), len(b))
    i = 0
    while i + block <= n and a[i:i + block] == b[i:i + block]:
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i
