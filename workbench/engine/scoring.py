"""Scoring requests (``wb.score``, ``wb.loglikelihood``, ``wb.perplexity``): a prompt decoded
with logits on every row from ``ScoreState.start`` on, no token generated.

Each such row's log-probability of the prompt's next token is read from the raw logits of
the decode that produced it (``_native.score_rows``: no sampler, so no temperature,
penalty or bias), with its rank and, if asked, its most likely alternatives. The rows ride
the scheduler like a verify() request's (``Request.out_from``): batched with other
sequences' work, a long prompt over several ticks. A restore from the prefix cache stops
at ``start`` (admission.py): positions before it need no logits, the rest are decoded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _native
from ..errors import ScoringFailed
from .batch import DecodeBatch, Slice


@dataclass
class ScoreState:
    """What a scoring request collects: for each scored position p (its token is the
    prompt's token p + 1), the logprob, rank and top alternatives, in position order."""

    start: int                      # first position with logits: the first scored token is start + 1
    top: int = 0                    # alternatives kept per position
    parts: list[tuple[Any, ...]] = field(default_factory=list)  # (positions, logprob, rank, top ids, top lps)

    def arrays(self) -> tuple[Any, Any, Any, Any, Any]:
        """positions, logprob (float64), rank (int32), top ids (n, top), top logprobs (n, top)."""
        if not self.parts:
            return (np.empty(0, np.int64), np.empty(0), np.empty(0, np.int32),
                    np.empty((0, self.top), np.int32), np.empty((0, self.top), np.float32))
        cols = list(zip(*self.parts))
        return tuple(np.concatenate(c) for c in cols)  # type: ignore[return-value]


class Scoring:
    """After a decode: the scored rows of each scoring request, then its progress (it
    ends, 'length', once its prompt is decoded)."""

    def __init__(self, pool: Any, table: Any, results: Any) -> None:
        self._pool = pool
        self._table = table
        self._results = results

    def apply(self, batch: DecodeBatch) -> None:
        for s in batch.slices:
            if s.rows is not None and s.request.score is not None:
                self._collect(s)

    def _collect(self, s: Slice) -> None:
        req, rows = s.request, s.rows
        assert rows is not None
        state: ScoreState = req.score
        first_pos = req.n_past + (s.take - len(rows))      # rows are the slice's last len(rows)
        positions = np.arange(first_pos, first_pos + len(rows), dtype=np.int64)
        keep = positions + 1 < len(req.prompt)               # the last prompt token predicts nothing scored
        if keep.any():
            idx = [r for r, k in zip(rows, keep) if k]
            targets = [req.prompt[p + 1] for p in positions[keep]]
            try:
                lp, rank, ids, lps = _native.score_rows(self._pool.ctx, idx, targets, state.top)
            except (ValueError, _native.NativeError) as e:
                self._table.fail(req, ScoringFailed(f"reading the logprobs failed: {e}"))
                return
            state.parts.append((positions[keep], lp, rank, ids, lps))
        self._results.advance(req, s.take)
        if not req.feed:
            req.prefill_done(time.perf_counter())
            self._results.finish(req, "length")
