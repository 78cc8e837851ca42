"""The native rows of one decode, built from a checked :class:`~.scheduler.BatchPlan`.

The engine, not the strategy, turns a plan into token / position / sequence / logits
arrays, from the requests' own state: a strategy names requests and counts, nothing more.
A slice asks for logits on its last row exactly when it takes the rest of its feed (the
last prompt token, or a generated token), since only then is there a token to sample;
a request with verify rows (``out_from``) asks for logits on each of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .kernel_rows import KernelRows, Pad
from .request import Request
from .scheduler import BatchPlan, SeqView


@dataclass(slots=True)
class Slice:
    """``take`` tokens of one request's feed at positions n_past.., output row if sampled."""

    request: Request
    take: int
    logits_row: int | None          # batch index whose logits are sampled, None = no sample
    rows: range | None = None       # verify rows: every one has logits (engine/speculation.py)


@dataclass(slots=True)
class DecodeBatch:
    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    logits: list[int] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    verifies: bool = False          # some slice has verify rows
    decode_s: float = 0.0           # how long its native decode took
    reference: bool = False         # run on ggml's reference kernels (kernel_rows.py)
    pad: Pad | None = None          # rows added to the decode only, removed after it

    def __len__(self) -> int:
        return len(self.tokens)

    def native_rows(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """Tokens, positions, sequences and logit flags of the native decode: the rows and
        the pad."""
        if self.pad is None:
            return self.tokens, self.pos, self.seq, self.logits
        p = self.pad
        return (self.tokens + [p.token] * p.n, self.pos + list(range(p.start, p.start + p.n)),
                self.seq + [p.seq] * p.n, self.logits + [0] * p.n)

    def fix_kernels(self, rows: KernelRows) -> None:
        """The kernel choice and pad of kernel_rows.py for these rows."""
        prompt = [s for s in self.slices if _has_prompt_rows(s.request)]
        self.reference = rows.reference(len(self), bool(prompt))
        if prompt and not self.reference:
            last = prompt[-1]
            req = last.request
            assert req.seq is not None
            self.pad = rows.pad(len(self), req.seq, req.n_past + last.take, req.feed[last.take - 1])

    def add(self, req: Request, take: int) -> None:
        assert req.seq is not None
        start = len(self.tokens)
        self.tokens.extend(req.feed[:take])
        self.pos.extend(range(req.n_past, req.n_past + take))
        self.seq.extend([req.seq] * take)
        complete = take == len(req.feed)
        if req.out_from is not None:
            self._add_verify(req, take, start)
            return
        self.logits.extend([0] * (take - 1) + [1 if complete else 0])
        self.slices.append(Slice(req, take, start + take - 1 if complete else None))

    def _add_verify(self, req: Request, take: int, start: int) -> None:
        """Logits on every row at or after the request's ``out_from`` position: a speculating
        sequence's last token + draft, or a verify() request's candidates."""
        assert req.out_from is not None
        first = min(max(req.out_from - req.n_past, 0), take)
        self.logits.extend([0] * first + [1] * (take - first))
        self.slices.append(Slice(req, take, None, range(start + first, start + take)))
        self.verifies = True


def view_of(req: Request) -> SeqView:
    return SeqView(ref=req.ref, phase=req.phase, feed=len(req.feed), n_past=req.n_past, boundary=req.boundary,
                   prompt_tokens=len(req.prompt), generated=len(req.generated))


def _has_prompt_rows(req: Request) -> bool:
    """The request decodes KV rows of its prompt before the last token (what rows store)."""
    return req.phase == "prefilling" and req.n_past <= len(req.prompt) - 2


def build_batch(plan: BatchPlan, by_ref: Mapping[int, Request], rows: KernelRows | None = None) -> DecodeBatch:
    """The rows of a plan that :func:`~.scheduler.plan_problem` accepted, with their kernel
    choice when ``rows`` is given."""
    batch = DecodeBatch()
    for t in plan.takes:
        batch.add(by_ref[t.ref], t.n)
    if rows is not None:
        batch.fix_kernels(rows)
    return batch
