"""Small value types shared by the cache modules.

`SaveReason` says why a row was written (it is persisted in the row file, so its numeric
values are part of the on-disk format and must never be renumbered). `HitKind` classifies a
lookup. `Match` is what a prefix lookup returns. `RowStats` is the mutable bookkeeping the
cache keeps for every row; eviction policies read it and never write it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SaveReason(enum.IntEnum):
    """Why a row was saved; stored as one byte in the row header."""

    COLD = 1          # a checkpoint taken during a cold prefill
    CONTINUED = 2     # a checkpoint taken while continuing a cached prefix
    FINISH = 3        # the full prompt+reply at the end of a request
    EVICT = 4         # saved because the live sequence was being evicted
    SHUTDOWN = 5      # saved while the engine shut down
    AGENT_PREFIX = 6  # the shared system+tools prefix; pinned (one per namespace)

    @classmethod
    def parse(cls, value: SaveReason | str | int) -> SaveReason:
        """Accept a member, its lower-case name or its number; name the valid ones if not."""
        if isinstance(value, SaveReason):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        valid = ", ".join(m.name.lower() for m in cls)
        raise ValueError(f"unknown save reason {value!r}; valid: {valid}")


SAVED_BY_BYTES = 28   # the room a row's manifest has for the id of the model that saved it


def stored_model_id(model_id: str) -> str:
    """``model_id`` as a row records who saved it (chunk_format.py): its UTF-8 cut to
    SAVED_BY_BYTES between characters. Compare a row's ``saved_by`` with this, not the id."""
    return model_id.encode("utf-8")[:SAVED_BY_BYTES].decode("utf-8", errors="ignore")


def reusable(prompt_len: int) -> int:
    """The most cached tokens a prompt of `prompt_len` tokens can reuse: all but its last,
    which is always decoded again, alone, for its logits (the n - 1 rule, written once)."""
    return prompt_len - 1


class HitKind(str, enum.Enum):
    """How much of a request's prompt was served from KV computed before: THE definition,
    used by the engine (Stats.cache_hit_kind, its hits_* counters), `ChunkedCache.lookup`
    (its hits_exact / hits_partial / misses_cold) and the eviction lab's replay.

    A prompt's last token is always decoded again (its logits are sampled from), so a row
    that holds all of the prompt but its last token is as good as one holding all of it.
    """

    COLD = "cold"                  # nothing reused
    PARTIAL = "partial"            # a longest-prefix walk found a row shorter than the prompt
    EXACT = "exact"                # the row asked for by key (parent_key), or one covering the
                                   # prompt, all but at most its last token
    STICKY = "sticky"              # a session's live KV (the longest common prefix with the prompt),
                                   # or its own row restored after it lost its sequence
    CONTINUATION = "continuation"  # continue_session: the new tokens follow the session's KV
    SHARED = "shared"              # copied from another live sequence of the same cache scope
                                   # (a running request or an idle session: engine/live_share.py)

    @classmethod
    def of(cls, matched: int, prompt_len: int, *, by_key: bool = False) -> HitKind:
        """The kind of a cached row of `matched` tokens found for a prompt of `prompt_len`;
        `by_key`: the caller named the row (erllama's token-exact resume from a finish key)."""
        if matched <= 0:
            return cls.COLD
        return cls.EXACT if by_key or matched >= reusable(prompt_len) else cls.PARTIAL

    @property
    def counter(self) -> str:
        """The engine's counter for requests of this kind (hits_cold, hits_exact, ...)."""
        return f"hits_{self.value}"


@dataclass(slots=True, frozen=True)
class Match:
    """The longest stored row whose tokens are a prefix of the query.

    `tier`: the fastest tier holding the row, where its caller fills it in; `None` when
    the match comes straight from a `PrefixIndex`.
    """

    key: str
    n_tokens: int
    tier: str | None = None


@dataclass(slots=True)
class RowStats:
    """Mutable per-row bookkeeping, owned and updated by the cache under its lock.

    `seq` is a logical access clock (bumped on insert and on every hit) used to break ties
    between equal priorities deterministically, so eviction order never depends on dict
    order or on two events sharing a timestamp.
    """

    key: str
    size_bytes: int
    n_tokens: int
    created_at: float
    last_hit_at: float | None = None
    hits: int = 0
    pinned: bool = False
    live: bool = False
    tier: str | None = None
    reason: SaveReason = SaveReason.FINISH
    seq: int = 0

    @property
    def last_used_at(self) -> float:
        """The last hit, or the creation time for a row never hit."""
        return self.created_at if self.last_hit_at is None else self.last_hit_at

    @property
    def protected(self) -> bool:
        """Pinned and live rows are evicted only when nothing else frees enough."""
        return self.pinned or self.live
