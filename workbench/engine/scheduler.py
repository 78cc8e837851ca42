"""Batch strategies: which rows of which running requests go into a tick's one decode.

A strategy sees a read-only snapshot of each running request (:class:`SeqView`, in
admission order) and the tick's :class:`Budget`, and returns a :class:`BatchPlan`: how
many tokens of each request's feed to decode. The engine checks the plan
(:func:`plan_problem`) and builds the native rows itself (batch.py), so a strategy cannot
corrupt a request or crash the decode; a bad plan fails the running requests with
:class:`~workbench.errors.InvalidBatchPlan`.

Built in, chosen by ``load_model(batch_strategy=...)``:

- ``decode_first`` (default): a decode row for every generating sequence, then prefill
  chunks in admission order. Decoders advance every tick; a long prompt cannot starve them.
- ``prefill_first``: prefill chunks first, then decode rows in what is left. Lower time to
  first token for new prompts, at the decoders' expense when the batch is full.
- ``round_robin``: each tick starts one request later in admission order, giving each its
  decode row or prefill chunk in turn until the batch is full (fair when rows are scarce).

Two rules bind every strategy and are written once, here: a prefill chunk is capped at
``budget.chunk`` tokens per tick by the built-ins (chunked prefill) and must END AT, never
cross, the request's next cache save point (``boundary``: the KV there is saved); all
rows together are at most ``budget.n_batch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..options import BATCH_STRATEGIES
from .events import RequestPhase

GENERATING: RequestPhase = "generating"
PREFILLING: RequestPhase = "prefilling"


@dataclass(slots=True, frozen=True)
class SeqView:
    """What a strategy sees of one running request (a snapshot; changing it changes nothing)."""

    ref: int
    phase: RequestPhase        # 'prefilling' or 'generating'
    feed: int                  # tokens waiting to enter the KV (a generating sequence: 1, or
                               # 1 + its draft when speculating; a shorter take drops the rest)
    n_past: int                # tokens of this sequence already in the KV
    boundary: int | None       # next save point: a prefill chunk must end at or before it
    prompt_tokens: int
    generated: int


@dataclass(slots=True, frozen=True)
class Budget:
    n_batch: int               # rows one decode may carry, all requests together
    chunk: int | None          # the built-ins' cap on one prompt's rows per tick; None = no cap


@dataclass(slots=True, frozen=True)
class Take:
    """Decode the next ``n`` tokens of request ``ref``'s feed."""

    ref: int
    n: int


@dataclass(slots=True)
class BatchPlan:
    takes: list[Take] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(t.n for t in self.takes)

    def add(self, view: SeqView, n: int) -> None:
        self.takes.append(Take(view.ref, n))


@runtime_checkable
class BatchStrategy(Protocol):
    def plan(self, active: Sequence[SeqView], budget: Budget) -> BatchPlan: ...


# --- the rules, once ----------------------------------------------------------------------

def prefill_take(view: SeqView, room: int, budget: Budget) -> int:
    """The rows of ``view``'s next prefill chunk given ``room`` rows left: capped by the
    chunk size, ended exactly at the next save point."""
    take = min(view.feed, room, budget.chunk or view.feed)
    if view.boundary is not None and view.n_past < view.boundary < view.n_past + take:
        take = view.boundary - view.n_past
    return take


def plan_problem(plan: Any, active: Sequence[SeqView], budget: Budget) -> str | None:
    """What is wrong with ``plan`` for these requests, or None when the engine may run it."""
    if not isinstance(plan, BatchPlan) or not isinstance(plan.takes, (list, tuple)):
        return f"plan() returned {type(plan).__name__}, not a BatchPlan"
    by_ref = {v.ref: v for v in active}
    seen: set[int] = set()
    rows = 0
    for t in plan.takes:
        if not isinstance(t, Take) or not _is_int(t.ref) or not _is_int(t.n):
            return f"{t!r} is not a Take(ref: int, n: int)"
        v = by_ref.get(t.ref)
        if v is None:
            return f"request {t.ref} is not running"
        if t.ref in seen:
            return f"request {t.ref} appears twice"
        seen.add(t.ref)
        if not 0 < t.n <= v.feed:
            return f"request {t.ref}: a take of {t.n} tokens (it has {v.feed} to decode; at least 1)"
        if v.boundary is not None and v.n_past < v.boundary < v.n_past + t.n:
            return (f"request {t.ref}: a chunk of {t.n} from position {v.n_past} crosses its save point "
                    f"at {v.boundary}")
        rows += t.n
        if rows > budget.n_batch:
            return f"more rows than n_batch ({budget.n_batch})"
    if rows == 0 and any(v.feed for v in active):
        return "an empty plan while requests wait: the loop would never progress"
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --- building blocks and the built-in strategies -------------------------------------------

def add_decode_rows(plan: BatchPlan, active: Sequence[SeqView], budget: Budget) -> None:
    """A row for each generating sequence, in order, while they fit; then a speculating
    sequence's draft rows (feed > 1: its last token + draft) in what is left, in order."""
    decoders = [v for v in active if v.phase == GENERATING and v.feed]
    room = budget.n_batch - plan.rows
    decoders = decoders[: max(room, 0)]
    room -= len(decoders)
    for v in decoders:
        extra = min(v.feed - 1, room)
        room -= extra
        plan.add(v, 1 + extra)


def add_prefill_chunks(plan: BatchPlan, active: Sequence[SeqView], budget: Budget) -> None:
    """The next chunk of each prefilling prompt, in order, in what is left of the batch."""
    for v in active:
        if v.phase != PREFILLING or not v.feed:
            continue
        room = budget.n_batch - plan.rows
        if room <= 0:
            break
        plan.add(v, prefill_take(v, room, budget))


class DecodeFirst:
    name = "decode_first"

    def plan(self, active: Sequence[SeqView], budget: Budget) -> BatchPlan:
        plan = BatchPlan()
        add_decode_rows(plan, active, budget)
        add_prefill_chunks(plan, active, budget)
        return plan


class PrefillFirst:
    name = "prefill_first"

    def plan(self, active: Sequence[SeqView], budget: Budget) -> BatchPlan:
        plan = BatchPlan()
        add_prefill_chunks(plan, active, budget)
        add_decode_rows(plan, active, budget)
        return plan


class RoundRobin:
    """Starts one request later each tick; each gets its decode row or prefill chunk in turn."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def plan(self, active: Sequence[SeqView], budget: Budget) -> BatchPlan:
        plan = BatchPlan()
        if not active:
            return plan
        k = self._turn % len(active)
        self._turn += 1
        for v in [*active[k:], *active[:k]]:
            room = budget.n_batch - plan.rows
            if room <= 0:
                break
            if v.feed and v.phase == GENERATING:
                plan.add(v, min(v.feed, room))      # a draft may be cut short to fit
            elif v.feed and v.phase == PREFILLING:
                plan.add(v, prefill_take(v, room, budget))
        return plan


_BUILT_IN: dict[str, type[DecodeFirst | PrefillFirst | RoundRobin]] = {
    cls.name: cls for cls in (DecodeFirst, PrefillFirst, RoundRobin)}
assert tuple(_BUILT_IN) == BATCH_STRATEGIES


def strategy_for(option: str | BatchStrategy) -> BatchStrategy:
    """A fresh built-in strategy by name (each model its own: round_robin has state), or the
    user's object itself (LoadConfig checked it has a callable ``plan``)."""
    if isinstance(option, str):
        return _BUILT_IN[option]()
    return option


def strategy_name(strategy: object) -> str:
    """A strategy's ``name``, else its class name (never raises: a user's object)."""
    try:
        name = getattr(strategy, "name", None)
    except Exception:  # noqa: BLE001 - a user's property that raises
        name = None
    return name if isinstance(name, str) else type(strategy).__name__
