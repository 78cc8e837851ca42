"""Eviction policies: small strategies that rank rows; the cache owns the bookkeeping.

A policy returns a sortable priority for a row; the cache evicts the lowest first. The
cache sorts by (protected, priority, seq): pinned and live rows come after every other row
whatever their priority, and `RowStats.seq` (a logical access clock) breaks ties, so equal
priorities fall back to least-recently-used.

Optional hooks, called by the cache after it updated the row's `RowStats`:
`on_admit(row)` (a new row is about to be stored; before room is made), `on_insert(row)`,
`on_hit(row)`, `on_evict(row)` (the cache chose to evict it), `on_remove(row)` (it left the
tier for any reason), `set_capacity(bytes | None)` (bound to a tier with that budget). A
policy that cannot be written as a priority (S3-FIFO) also provides
`victim(is_protected) -> key | None` and chooses victims itself.

Stateful policies keep per-tier state: give each tier its own instance (`get_policy` with a
name or a class makes a fresh one).

Formulas (t = row.last_used_at: the last hit, or the creation time):
    lru       t
    fifo      the order rows were stored in (hits change nothing; libCacheSim's FIFO)
    lfu       hits                      (ties: least recently used first)
    frecency  t + credit * log2(1 + hits) * 0.5 ** ((now - t) / half_life)
              credit = 3600 s, half_life = 6 h: each doubling of the hit count moves the
              row one hour "forward in time", and that bonus halves every 6 h without use
    gdsf      L + freq * cost / size    computed at insert and on each hit, where
              freq = hits + 1, cost = n_tokens (prefill saved), size = size_bytes, and
              L (inflation) = the priority of the last evicted row

The formulas with arithmetic (frecency, gdsf) and S3-FIFO are computed in csrc/eviction.h
(`workbench._native.evict`), their one definition, shared with the eviction lab's native
replay (lab/native.py); lru, lfu and fifo are the row's own fields. A built-in policy says
how the lab replays it natively (`native_spec`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from workbench._native import evict as _evict
from workbench.cache.s3fifo import S3FIFO
from workbench.cache.types import RowStats

PriorityFn = Callable[[RowStats, float], float]
#: How the eviction lab's native replay runs a built-in policy (`native_spec()`: its name and
#: parameters, or None when it cannot: a subclass, or an instance that already holds state)
NativeSpec = tuple[str, dict[str, float]]


@runtime_checkable
class EvictionPolicy(Protocol):
    """What the cache needs from a policy; the hooks listed in the module doc are optional."""

    name: str

    def priority(self, row: RowStats, now: float) -> float:
        """Lower is evicted first."""
        ...


class LRU:
    """Least recently used: the oldest last use goes first."""

    name = "lru"

    def priority(self, row: RowStats, now: float) -> float:
        return row.last_used_at

    def native_spec(self) -> NativeSpec | None:
        return ("lru", {}) if type(self) is LRU else None


class FIFO:
    """First in, first out: the row stored earliest goes first; hits change nothing.
    A row the policy never saw stored (no `on_insert`) ranks before every stored one."""

    name = "fifo"
    time_invariant = True   # a row's rank changes only when it is stored (the lab's event ranking)

    def __init__(self) -> None:
        self._order: dict[str, int] = {}
        self._next = 0

    def on_insert(self, row: RowStats) -> None:
        self._order[row.key] = self._next
        self._next += 1

    def on_remove(self, row: RowStats) -> None:
        self._order.pop(row.key, None)

    def priority(self, row: RowStats, now: float) -> float:
        return float(self._order.get(row.key, -1))

    def native_spec(self) -> NativeSpec | None:
        return ("fifo", {}) if type(self) is FIFO and not self._order and not self._next else None


class LFU:
    """Least frequently used: the fewest hits go first (ties: least recently used)."""

    name = "lfu"

    def priority(self, row: RowStats, now: float) -> float:
        return float(row.hits)

    def native_spec(self) -> NativeSpec | None:
        return ("lfu", {}) if type(self) is LFU else None


class Frecency:
    """Recency pushed forward by a hit bonus that decays with a half-life (erllama 0.9)."""

    name = "frecency"

    def __init__(self, credit_s: float = 3600.0, half_life_s: float = 6 * 3600.0) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self.credit_s = credit_s
        self.half_life_s = half_life_s

    def priority(self, row: RowStats, now: float) -> float:
        return _evict.frecency_priority(row.last_used_at, row.hits, now, self.credit_s, self.half_life_s)

    def native_spec(self) -> NativeSpec | None:
        if type(self) is not Frecency:
            return None
        return ("frecency", {"credit_s": float(self.credit_s), "half_life_s": float(self.half_life_s)})


class GDSF:
    """GreedyDual-Size-Frequency: keep rows that save much prefill per byte and are reused."""

    name = "gdsf"

    def __init__(self) -> None:
        self.inflation = 0.0
        self._h: dict[str, float] = {}

    def _value(self, row: RowStats) -> float:
        return _evict.gdsf_value(self.inflation, row.hits, row.n_tokens, row.size_bytes)

    def on_insert(self, row: RowStats) -> None:
        self._h[row.key] = self._value(row)

    def on_hit(self, row: RowStats) -> None:
        self._h[row.key] = self._value(row)

    def on_evict(self, row: RowStats) -> None:
        self.inflation = max(self.inflation, self._h.get(row.key, self.inflation))

    def on_remove(self, row: RowStats) -> None:
        self._h.pop(row.key, None)

    def priority(self, row: RowStats, now: float) -> float:
        h = self._h.get(row.key)
        return self._value(row) if h is None else h

    def native_spec(self) -> NativeSpec | None:
        return ("gdsf", {}) if type(self) is GDSF and not self.inflation and not self._h else None


class FunctionPolicy:
    """A plain `(row, now) -> float` function used as a policy."""

    def __init__(self, fn: PriorityFn, name: str | None = None) -> None:
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "custom"))

    def priority(self, row: RowStats, now: float) -> float:
        return float(self.fn(row, now))


POLICIES: dict[str, type] = {
    "fifo": FIFO,
    "frecency": Frecency,
    "gdsf": GDSF,
    "lfu": LFU,
    "lru": LRU,
    "s3fifo": S3FIFO,
}

PolicySpec = str | EvictionPolicy | type | PriorityFn

#: The policy a cache gets when none is named. Chosen by evidence (docs/cache.md, "Choosing
#: the default policy (chunk model)"): on the lab's chat trace lru saves 89.6% of prefill at
#: 4.7 GiB against frecency's 18.6%, is best or tied on the agent traces, and gdsf, a close
#: second, needs size hooks a custom tier may not give.
DEFAULT_POLICY = "lru"


Hook = Callable[[RowStats], None]
Victim = Callable[..., "str | None"]


def _noop(row: RowStats) -> None:
    return None


def bind_hooks(policy: EvictionPolicy, budget: int | None) -> tuple[Hook, Hook, Hook, Hook, Hook, Victim | None]:
    """A tier's view of its policy's optional hooks: (on_admit, on_insert, on_hit, on_evict,
    on_remove), a no-op for each the policy lacks, and its ``victim`` or None; tells the
    policy the tier's budget (``set_capacity``) when it asks for it."""
    hooks = tuple(getattr(policy, name, None) or _noop
                  for name in ("on_admit", "on_insert", "on_hit", "on_evict", "on_remove"))
    set_capacity = getattr(policy, "set_capacity", None)
    if set_capacity is not None:
        set_capacity(budget)
    return (*hooks, getattr(policy, "victim", None))  # type: ignore[return-value]


def get_policy(spec: PolicySpec) -> EvictionPolicy:
    """A policy from a registered name, an instance, a class, or a `(row, now)` function.

    Names and classes give a fresh instance; an instance is returned as is. An unknown name
    raises ValueError naming the valid ones.
    """
    if isinstance(spec, str):
        cls = POLICIES.get(spec.lower())
        if cls is None and spec.lower() in ("belady", "optimal"):
            raise ValueError(f"{spec!r} needs the future: it is the eviction lab's offline optimum "
                             f"(workbench.lab.replay(..., ['belady'])), not a policy a cache can run; "
                             f"valid: {', '.join(sorted(POLICIES))}")
        if cls is None:
            raise ValueError(f"unknown eviction policy {spec!r}; valid: {', '.join(sorted(POLICIES))}")
        return cls()
    if isinstance(spec, type):
        obj = spec()
        if not isinstance(obj, EvictionPolicy):
            raise TypeError(f"{spec.__name__} has no name/priority, so it is not an eviction policy")
        return obj
    if isinstance(spec, EvictionPolicy):
        return spec
    if callable(spec):
        return FunctionPolicy(spec)
    raise TypeError(f"cannot make an eviction policy from {spec!r}")
