"""Plans one tick: a single batch mixing decode rows and prefill chunks of all sequences.

Decode rows go first so every generating sequence advances each tick; prefill chunks fill
what is left of ``n_batch``, each prompt capped at ``chunk`` tokens per tick so a long
prompt cannot starve the decoders (chunked prefill). A chunk also ends exactly at the
request's next cache save point (``boundary``), so the KV there can be saved. Pure
function of its inputs: the loop applies the plan, tests check it without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Schedulable(Protocol):
    seq: int | None
    feed: list[int]
    n_past: int
    phase: str


@dataclass(slots=True)
class Slice:
    """``take`` tokens of one request's feed at positions n_past.., output row if sampled."""

    request: Schedulable
    take: int
    logits_row: int | None          # batch index whose logits are sampled, None = no sample


@dataclass(slots=True)
class BatchPlan:
    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    logits: list[int] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, req: Schedulable, take: int) -> None:
        assert req.seq is not None
        start = len(self.tokens)
        self.tokens.extend(req.feed[:take])
        self.pos.extend(range(req.n_past, req.n_past + take))
        self.seq.extend([req.seq] * take)
        complete = take == len(req.feed)
        self.logits.extend([0] * (take - 1) + [1 if complete else 0])
        self.slices.append(Slice(req, take, start + take - 1 if complete else None))


def plan_batch(active: Sequence[Schedulable], n_batch: int, chunk: int | None) -> BatchPlan:
    """Build the batch for one tick from the active requests (admission order)."""
    plan = BatchPlan()
    for req in active:
        if req.phase == "generating" and req.feed:
            if len(plan) + len(req.feed) > n_batch:
                break
            plan.add(req, len(req.feed))
    for req in active:
        if req.phase != "prefilling" or not req.feed:
            continue
        room = n_batch - len(plan)
        if room <= 0:
            break
        take = min(len(req.feed), room, chunk if chunk else len(req.feed))
        boundary = getattr(req, "boundary", None)
        if boundary is not None and req.n_past < boundary < req.n_past + take:
            take = boundary - req.n_past     # stop exactly at a save point
        plan.add(req, take)
    return plan
