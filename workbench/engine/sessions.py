"""Sticky sessions: a conversation pinned to one sequence so its KV cells stay live.

The loop thread owns the table; other threads read it only under the engine's lock.
A session remembers the tokens committed to its sequence's KV (``tokens``) even when its
sequence has been reclaimed for someone else (``seq is None``), so ``continue_session``
and ``expect_committed`` keep working after a reclaim (the next turn then re-prefills).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Session:
    session_id: Hashable
    seq: int | None = None
    tokens: list[int] = field(default_factory=list)
    busy_ref: int | None = None
    last_used: float = field(default_factory=time.monotonic)
    scope: str = "default"           # cache scope of its last request (for evict saves)
    live_key: str | None = None      # its newest cache row, marked live while the session exists

    def info(self) -> dict[str, object]:
        return {"session_id": self.session_id, "seq": self.seq, "tokens": len(self.tokens),
                "busy_ref": self.busy_ref, "idle_s": time.monotonic() - self.last_used}


class SessionTable:
    def __init__(self) -> None:
        self._by_id: dict[Hashable, Session] = {}

    def get(self, session_id: Hashable) -> Session | None:
        return self._by_id.get(session_id)

    def get_or_create(self, session_id: Hashable) -> Session:
        sess = self._by_id.get(session_id)
        if sess is None:
            sess = self._by_id[session_id] = Session(session_id)
        return sess

    def drop(self, session_id: Hashable) -> Session | None:
        return self._by_id.pop(session_id, None)

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


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
