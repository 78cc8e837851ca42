"""The one interface of the prefix cache, and the one adapter it moves KV through.

:class:`PrefixCache` is what every caller outside this package talks to (the engine's
``EngineCache``, the notebook views and magics, ``cache_admin``): restore a prefix into a
sequence, save a sequence's KV, probe, pins and live marks, rows, chunks, tiers, info.
``ChunkedCache`` implements it, for both storages (``storage='chunks'``, the default, and
``'rows'``: whole-row chunks); callers ask the cache what it is (``storage``), never an
``isinstance`` on an implementation.

:class:`SequenceKv` is the adapter the cache moves KV through: one sequence of one
llama.cpp context, as the engine exposes it (``engine/kv_access.py``). A save goes down
once (engine -> cache, which asks the adapter for the chunks it does not hold yet); a
restore likewise (the cache reads and verifies, the adapter joins and loads). The adapter
owns the engine's counters of what llama.cpp refused.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workbench.cache.format import CorruptReason
from workbench.cache.keys import CacheNamespace, Tokens
from workbench.cache.policies import PolicySpec
from workbench.cache.queued import PendingSaves
from workbench.cache.tiers import Tier
from workbench.cache.types import HitKind, SaveReason

#: The most payload bytes a restore reads for a state of n tokens (None: no bound).
MaxPayload = Callable[[int], "int | None"]


class SequenceKv(Protocol):
    """One sequence of a llama.cpp context (engine/kv_access.py)."""

    def cut(self, keys: Sequence[bytes], chunk_size: int, first: int, ends: Sequence[int]) -> list[bytes] | None:
        """Chunks ``first ..`` of the sequence's state (None: the state cannot be cut)."""
        ...

    def load_chunks(self, pieces: Sequence[bytes], keys: Sequence[bytes], n_tokens: int) -> bool:
        """Join verified chunks and restore the first ``n_tokens`` positions; True when the
        sequence then holds exactly positions 0 .. n_tokens - 1. False: refused, the
        sequence emptied."""
        ...


@dataclass(slots=True, frozen=True)
class Restored:
    """A prefix restored into a sequence."""

    n_tokens: int
    kind: HitKind       # exact | partial
    key: str | None     # None: a chain of chunks no row names
    tier: str | None
    shared_end: int | None = None  # n_tokens when the row is a pinned (agent) prefix
    saved_by: str | None = None    # the id of the model whose save wrote it ("": not recorded)
    saved_at: float | None = None  # when (a unix time)


@dataclass(slots=True, frozen=True)
class Saved:
    key: str
    new: bool           # False: the row was cached already, nothing was stored


@dataclass(slots=True, frozen=True)
class Held:
    """What a probe finds of a prompt: the leading tokens a restore would load, where from."""

    n_tokens: int
    tier: str | None


class PrefixCache(abc.ABC):
    """The prefix cache as its callers see it (see the module's docstring)."""

    pending: PendingSaves  # its saves queued on the writer pool
    tier_generation: int   # +1 at each add_tier / remove_tier

    @property
    @abc.abstractmethod
    def storage(self) -> str:
        """'chunks' or 'rows' (whole-row chunks)."""

    # -- the engine's calls ----------------------------------------------------------------
    @abc.abstractmethod
    def restore(self, namespace: CacheNamespace, prompt: list[int], parent_key: str | None, kv: SequenceKv,
                max_payload: MaxPayload) -> Restored | None:
        """Load the longest cached prefix of ``prompt`` into ``kv`` (``parent_key``: a row
        named by the caller, an exact hit when it is a prefix); None when nothing usable
        (a prefix llama.cpp refuses leaves the cache)."""

    @abc.abstractmethod
    def save(self, namespace: CacheNamespace, tokens: list[int], kv: SequenceKv, reason: SaveReason, *,
             sync: bool = False, live: bool = False, marks: Sequence[int] = (), saved_by: str = "") -> Saved | None:
        """Save the KV of ``kv`` (which holds exactly ``tokens``); None when dropped or failed.
        A row held already is not copied again (pinned when an agent prefix, marked live for
        a live session). ``marks``: where shared prefixes end (a chunk ends there);
        ``saved_by``: the id of the model saving it, recorded with the row."""

    def keep_stored(self, key: str, reason: SaveReason, live: bool) -> Saved:
        """A save of a row held already copies nothing: the row is pinned when it is an
        agent prefix and marked live for a live session."""
        if reason is SaveReason.AGENT_PREFIX:
            self.pin(key)
        if live:
            self.set_live(key)
        return Saved(key, new=False)

    @abc.abstractmethod
    def held(self, namespace: CacheNamespace, tokens: Tokens) -> Held:
        """What a restore of ``tokens`` would load; a probe: no counters move."""

    # -- rows, pins, live marks -------------------------------------------------------------
    @abc.abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def keys(self) -> list[str]: ...

    @abc.abstractmethod
    def remove(self, key: str) -> bool: ...

    @abc.abstractmethod
    def reject(self, key: str, reason: CorruptReason) -> bool: ...

    @abc.abstractmethod
    def pin(self, key: str) -> str | None: ...

    @abc.abstractmethod
    def unpin(self, key: str) -> bool: ...

    @abc.abstractmethod
    def set_live(self, key: str, live: bool = True) -> bool: ...

    @abc.abstractmethod
    def cached_prefix_len(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> int: ...

    @abc.abstractmethod
    def evict_bytes(self, n: int, tier: str | None = None) -> int: ...

    # -- tiers ------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_tier(self, tier: Tier, policy: PolicySpec | None = None, *, position: int | None = None) -> None:
        """Add a tier; a persistent one is scanned (its rows adopted)."""

    @abc.abstractmethod
    def remove_tier(self, name: str, *, purge: bool = False) -> int: ...

    @abc.abstractmethod
    def tier_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A tier spec as this cache takes it (a shm or disk tier without a root gets its
        default directory)."""

    @abc.abstractmethod
    def adopt_peer_files(self, memo: Any = None) -> Any:
        """Adopt what live peers (other processes sharing the directories) published since
        the last look, deleting nothing (``shared.PeerRows``)."""

    # -- views --------------------------------------------------------------------------------
    @abc.abstractmethod
    def rows(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def chunk_rows(self) -> list[dict[str, Any]]:
        """One dict per chunk."""

    @abc.abstractmethod
    def list_tiers(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def counters(self) -> dict[str, int]: ...

    @abc.abstractmethod
    def info(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def scan(self) -> Mapping[str, Any]:
        """Adopt what the persistent tiers hold (start-up); what each scan found."""

    # -- lookups and background saves ------------------------------------------------------
    @abc.abstractmethod
    def lookup(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> Any:
        """The longest stored prefix of ``tokens`` (a hit with ``n_tokens``, or None); counts
        the hit kind."""

    @abc.abstractmethod
    def match_key(self, namespace: CacheNamespace | bytes, tokens: Tokens, key: str) -> Any:
        """Row ``key`` when it is in ``namespace`` and a prefix of ``tokens`` (an exact hit,
        counted); None, counting nothing, otherwise."""

    def find_prefix(self, namespace: CacheNamespace | bytes, tokens: Tokens,
                    parent_key: str | None = None) -> tuple[Any, bool]:
        """What a restore of ``tokens`` reads (``PendingSaves.find_prefix``)."""
        return self.pending.find_prefix(namespace, tokens, parent_key, self.match_key, self.lookup)

    def put_async(self, namespace: CacheNamespace, tokens: Tokens, payload: Any,
                  reason: SaveReason | str = SaveReason.FINISH, **kwargs: Any) -> bool:
        """``put`` on the bounded writer pool; False (saves_dropped) when it is full."""
        return self.pending.submit(namespace, tokens, payload, reason, **kwargs)

    def wait_for_queued(self, namespace: CacheNamespace | bytes, tokens: Tokens, key: str | None = None,
                        timeout: float = 0.5) -> bool:
        return self.pending.wait_for(namespace, tokens, key, timeout)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        """Wait until the writer pool has no save pending; False on timeout."""
        return self.pending.drain(timeout)

    @abc.abstractmethod
    def close(self, wait: bool = True) -> None: ...
