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
    tiled: bool = False             # prompt rows on ggml's tiled kernel, as a cold prefill computes them


@dataclass(slots=True)
class Rows:
    """The arrays of one native decode."""

    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    logits: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, req: Request, take: int) -> int:
        """``take`` rows of ``req``'s feed from its n_past; returns the first row's index."""
        assert req.seq is not None
        start = len(self.tokens)
        self.tokens.extend(req.feed[:take])
        self.pos.extend(range(req.n_past, req.n_past + take))
        self.seq.extend([req.seq] * take)
        return start

    def native(self, pad: Pad | None = None) -> tuple[list[int], list[int], list[int], list[int]]:
        """Tokens, positions, sequences and logit flags, with the pad's rows after them."""
        if pad is None:
            return self.tokens, self.pos, self.seq, self.logits
        return (self.tokens + [pad.token] * pad.n, self.pos + list(range(pad.start, pad.start + pad.n)),
                self.seq + [pad.seq] * pad.n, self.logits + [0] * pad.n)


@dataclass(slots=True)
class DecodeBatch:
    """A tick's rows: ``main`` (what is sampled, and everything in deterministic mode) and,
    in the default mode, ``prompt`` (prompt rows that ask for no logits), decoded first on
    ggml's tiled attention kernel with its ``pad`` (engine/kernel_rows.py)."""

    main: Rows = field(default_factory=Rows)
    prompt: Rows = field(default_factory=Rows)
    slices: list[Slice] = field(default_factory=list)
    verifies: bool = False          # some slice has verify rows
    decode_s: float = 0.0           # how long its native decodes took
    reference: bool = False         # main runs on ggml's reference kernels (kernel_rows.py)
    pad: Pad | None = None          # rows added to the prompt decode only, removed after it
    last_prompt: Slice | None = None  # the prompt part's last slice (its sequence takes the pad)

    def __len__(self) -> int:
        return len(self.main) + len(self.prompt)

    @property
    def tokens(self) -> list[int]:
        return self.main.tokens

    @property
    def pos(self) -> list[int]:
        return self.main.pos

    @property
    def seq(self) -> list[int]:
        return self.main.seq

    @property
    def logits(self) -> list[int]:
        return self.main.logits

    def parts(self) -> list[tuple[tuple[list[int], list[int], list[int], list[int]], bool, Pad | None]]:
        """The native decodes of the tick, in order: (rows, reference kernels, pad)."""
        out = []
        if self.prompt.tokens:
            out.append((self.prompt.native(self.pad), False, self.pad))
        if self.main.tokens:
            out.append((self.main.native(), self.reference, None))
        return out

    def add(self, req: Request, take: int, split: bool = False) -> None:
        """``take`` rows of ``req``; ``split``: prompt rows without logits go to ``prompt``."""
        complete = take == len(req.feed)
        if split and req.out_from is None and not complete and _has_prompt_rows(req):
            self.prompt.add(req, take)
            self.prompt.logits.extend([0] * take)
            self.last_prompt = Slice(req, take, None, tiled=True)
            self.slices.append(self.last_prompt)
            return
        start = self.main.add(req, take)
        if req.out_from is not None:
            self._add_verify(req, take, start)
            return
        self.main.logits.extend([0] * (take - 1) + [1 if complete else 0])
        self.slices.append(Slice(req, take, start + take - 1 if complete else None))

    def _add_verify(self, req: Request, take: int, start: int) -> None:
        """Logits on every row at or after the request's ``out_from`` position: a speculating
        sequence's last token + draft, or a verify() request's candidates."""
        assert req.out_from is not None
        first = min(max(req.out_from - req.n_past, 0), take)
        self.main.logits.extend([0] * first + [1] * (take - first))
        self.slices.append(Slice(req, take, None, range(start + first, start + take)))
        self.verifies = True

    def fix_kernels(self, rows: KernelRows) -> None:
        """The kernels and pad of kernel_rows.py: the prompt part pads to the tiled kernel;
        main runs the reference kernels unless it holds prompt rows (a verify() request's)."""
        main_prompt = any(_has_prompt_rows(s.request) for s in self.slices if s.logits_row is not None
                          or s.rows is not None)
        self.reference = rows.reference(main_prompt)
        last = self.last_prompt
        if last is not None:
            req = last.request
            assert req.seq is not None
            self.pad = rows.pad(len(self.prompt), req.seq, req.n_past + last.take, req.feed[last.take - 1])
            if self.pad is None and rows.pad_rows(len(self.prompt)):
                self.untile()   # the last ubatch runs on the row kernel

    def untile(self) -> None:
        """The prompt part does not run wholly on the tiled kernel (no pad: it did not fit)."""
        for s in self.slices:
            s.tiled = False


SCORE_ROWS = 512   # most rows of one scoring request in a decode: each has logits (n_vocab floats)


def view_of(req: Request) -> SeqView:
    """What a strategy sees of a request; a scoring request offers at most SCORE_ROWS rows a
    tick, so the logits a decode holds stay bounded (and its step short)."""
    feed = len(req.feed) if req.score is None else min(len(req.feed), SCORE_ROWS)
    return SeqView(ref=req.ref, phase=req.phase, feed=feed, n_past=req.n_past, boundary=req.boundary,
                   prompt_tokens=len(req.prompt), generated=len(req.generated))


def _has_prompt_rows(req: Request) -> bool:
    """The request decodes KV rows of its prompt before the last token (what rows store)."""
    return req.phase == "prefilling" and req.n_past <= len(req.prompt) - 2


def build_batch(plan: BatchPlan, by_ref: Mapping[int, Request], rows: KernelRows | None = None) -> DecodeBatch:
    """The rows of a plan that :func:`~.scheduler.plan_problem` accepted, with their kernel
    choice when ``rows`` is given."""
    batch = DecodeBatch()
    split = rows is not None and not rows.deterministic
    for t in plan.takes:
        batch.add(by_ref[t.ref], t.n, split)
    if rows is not None:
        batch.fix_kernels(rows)
    return batch
