"""Speculative decoding in the batched loop: drafts from llama.cpp's drafters, verified in
the same decode as every other sequence's rows.

A request with ``speculative=`` gets a drafter the first time it generates: an
:class:`NgramDrafter` (llama.cpp's common_speculative through ``_native.Speculative``) or a
:class:`~.draft_model.ModelDrafter` (another loaded model's greedy reply, asked for without
waiting: engine/draft_model.py). Each tick, before the plan:

1. ``attach_drafts``: a generating speculative sequence whose feed is its last sampled
   token asks its :class:`~.spec_policy.SpecPolicy` for a draft length (at most n_max,
   the tokens it may still generate and the context; 0 = a plain step) and its drafter for
   that many tokens; the draft joins the feed, and every row from the last token on gets
   logits (``Request.out_from``), a plain step's single row too, so that every step of a
   speculative request comes back here and is timed. The strategy plans these rows like
   any other decode rows (it may take fewer: the rest of the draft is dropped). On a plain
   step while the policy is off, an n-gram drafter is asked for a shadow draft that is
   never verified: how much of it the tokens emitted next matched is told to the policy.
2. ``apply`` after the decode: the request's own sampler samples row by row (llama.cpp's
   ``common_sampler_sample_and_accept_n``): row i's token is accepted while it equals
   draft token i; the first that differs (or the one after a fully accepted draft) is the
   target's own next token. Greedy: every emitted token is the target's argmax. Sampling:
   each token is drawn from the target's distribution given the tokens before it, so the
   output is distributed as plain sampling's. The tokens then go through the same path as
   plain decoding (events, end-of-generation, stop strings, response_tokens, n_ctx), and
   the KV of every row past the last kept token is removed (``SeqPool.trim``): the
   sequence's KV, its session's tokens and the cache rows saved at its finish hold
   accepted tokens only. Accepted draft tokens are emitted as ``TokenId(id, draft=True)``.
   The policy is told what the step verified, accepted and cost.

``verify()`` requests (workbench/speculative.py) use the same verify rows: logits on each
candidate row, the argmax of each kept in ``Request.argmax``.

State: none across requests; each request's :class:`SpecState` (drafter, numbers,
policy) lives on the request.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from ..options import NGRAM_KINDS, SpeculativeOptions
from .batch import DecodeBatch, Slice
from .draft_model import ModelDrafter, check_speculative
from .request import Request
from .results import BatchResults
from .seq_pool import SeqPool
from .spec_policy import SpecPolicy

COUNTER_NAMES = ("spec_steps", "spec_drafted", "spec_accepted")
__all__ = ["COUNTER_NAMES", "Speculation", "check_speculative"]


@dataclass(slots=True)
class SpecNumbers:
    """One request's speculation so far."""

    kind: str
    steps: int = 0                  # drafts verified
    drafted: int = 0                # draft tokens verified
    accepted: int = 0               # of those, accepted
    by_position: list[int] = field(default_factory=list)   # accepted at draft position i
    tried: list[int] = field(default_factory=list)         # verified at draft position i
    draft_lengths: collections.Counter[int] = field(default_factory=collections.Counter)
    draft_s: float = 0.0            # in the drafter
    verify_s: float = 0.0           # decodes that carried its verify rows, and their sampling

    def record(self, n_draft: int, n_accepted: int) -> None:
        self.steps += 1
        self.drafted += n_draft
        self.accepted += n_accepted
        self.draft_lengths[n_draft] += 1
        for pos_list, n in ((self.tried, n_draft), (self.by_position, n_accepted)):
            if len(pos_list) < n_draft:
                pos_list.extend([0] * (n_draft - len(pos_list)))
            for i in range(n):
                pos_list[i] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else None,
            "acceptance_by_position": [a / t if t else None for a, t in zip(self.by_position, self.tried)],
            "accepted_by_position": list(self.by_position),
            "draft_lengths": dict(sorted(self.draft_lengths.items())),
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }


def make_state(req: Request, model: Any) -> SpecState:
    opts = req.opts.speculative
    assert opts is not None
    drafter: NgramDrafter | ModelDrafter
    if opts.draft is not None:
        drafter = ModelDrafter(req.draft_engine, opts, f"{req.model_id}/{req.ref}", prefill_token_s(req, model))
    else:
        drafter = NgramDrafter(model, opts, req.prompt)
    return SpecState(drafter, SpecNumbers(drafter.kind), SpecPolicy(opts.n_min, opts.adaptive))


def prefill_token_s(req: Request, model: Any) -> float | None:
    """A guess at the draft engine's prefill time per token before it measured one: the
    target's own (where it prefilled enough to tell), scaled by the draft model's size."""
    if req.prefilled < 16 or req.prefill_started_at is None or req.prefill_done_at is None:
        return None
    scale = min(1.0, req.draft_engine.model.size / max(1, model.size))
    return scale * (req.prefill_done_at - req.prefill_started_at) / req.prefilled


class NgramDrafter:
    """A request's llama.cpp n-gram drafter (one sequence) and its numbers."""

    cheap = True               # microseconds a draft: one may be asked for and checked unverified

    def __init__(self, model: Any, opts: SpeculativeOptions, prompt: list[int]) -> None:
        assert opts.ngram is not None
        kind = NGRAM_KINDS[opts.ngram]
        self.opts = opts
        self.native = _native.Speculative(model, {"type": kind, "size_n": opts.size_n, "size_m": opts.size_m,
                                                  "min_hits": opts.min_hits})
        self.native.begin(0, prompt)
        self.kind = kind

    def draft(self, history: list[int], last: int, pos: int, n_max: int, ahead: bool = True) -> list[int]:
        return list(self.native.draft(0, history, last, pos, n_max))

    def accepted(self, n: int) -> None:
        self.native.accept(0, n)

    def setup_s(self, history: list[int], last: int, plain_s: float | None) -> float:
        return 0.0                 # a draft at any step, nothing to catch up on

    def take_busy_s(self) -> float:
        return 0.0                 # no work outside draft(): that call is timed

    def pause(self) -> None:
        pass

    def close(self) -> None:
        self.native.close()

    def summary(self) -> dict[str, Any]:
        return {}


@dataclass(slots=True)
class SpecState:
    """A speculative request's drafter, numbers and policy, and its step in flight."""

    drafter: NgramDrafter | ModelDrafter
    numbers: SpecNumbers
    policy: SpecPolicy
    asked: int = 0                  # draft tokens asked for this step
    step_draft_s: float = 0.0       # this step's time in the drafter
    shadow: tuple[int, list[int]] | None = None   # an unverified draft: (tokens it follows, its tokens)

    def draft(self, history: list[int], last: int, pos: int, cap: int) -> list[int]:
        """Up to the policy's length (0: none asked for); a draft under n_min is none. On a
        plain step a cheap drafter may be asked for a shadow draft, checked later against
        what the target emits (``policy.observe_shadow``) and never verified. While the
        policy is off a draft model's engine does nothing for the request (``pause``) but
        for a probe, which asks for that one draft only (``ahead=False``), as the first
        draft request does."""
        if self.shadow is not None:
            self._settle(history, last, final=False)
        setup = self.drafter.setup_s(history, last, self.policy.plain_s)
        self.asked, self.step_draft_s = self.policy.next_length(cap, setup), 0.0
        if self.shadow is not None and self.asked:
            self._settle(history, last, final=True)
        if not self.asked and not self.policy.on:
            self.drafter.pause()
        n = self.asked or (self.policy.shadow_length(cap) if self.drafter.cheap and self.shadow is None else 0)
        if n == 0:
            return []
        t0 = time.perf_counter()
        # drafts ahead only once one was verified: a first draft request (its prefill is
        # the whole context) or a probe asks for its one draft
        tokens = self.drafter.draft(history, last, pos, n, ahead=self.policy.on and self.numbers.steps > 0)
        self.step_draft_s = time.perf_counter() - t0
        self.numbers.draft_s += self.step_draft_s
        if not self.asked:
            self.shadow = (len(history) + 1, tokens) if tokens else None
            return []
        return tokens if len(tokens) >= self.policy.n_min else []

    def _settle(self, history: list[int], last: int, final: bool) -> None:
        """Tell the policy how much of the shadow draft the reply matched, once it has left
        the draft or passed its end (``final``: now, with what the reply has reached). Only
        the tokens since the draft are copied, not the whole context (a plain step's cost)."""
        assert self.shadow is not None
        start, tokens = self.shadow
        since = history[start:] + [last] if start <= len(history) else []  # (history + [last])[start:]
        seen, matched = shadow_match(since, 0, tokens)
        if not final and matched == seen < len(tokens):
            return
        self.policy.observe_shadow(seen, matched)
        self.drafter.accepted(matched)
        self.shadow = None

    def close(self) -> None:
        self.drafter.close()

    def summary(self) -> dict[str, Any]:
        return self.numbers.summary() | self.policy.summary() | self.drafter.summary()


def shadow_match(emitted: list[int], start: int, tokens: list[int]) -> tuple[int, int]:
    """(seen, matched): how many of a draft for the tokens after ``emitted[:start]`` the
    reply has reached, and how many of those it matched in a row."""
    seen = min(len(tokens), max(0, len(emitted) - start))
    matched = 0
    while matched < seen and emitted[start + matched] == tokens[matched]:
        matched += 1
    return seen, matched


def own_time(batch: DecodeBatch) -> bool:
    """Whether the decode's time is a decode step's: no other request's prefill chunk in it."""
    return all(s.rows is not None or s.take == 1 for s in batch.slices)


class Speculation:
    def __init__(self, model: Any, pool: SeqPool, results: BatchResults,
                 counters: collections.Counter[str]) -> None:
        self._model = model
        self._pool = pool
        self._results = results
        self._counters = counters

    # --- before the plan ------------------------------------------------------------------
    def attach_drafts(self, active: list[Request]) -> None:
        """A draft for each generating speculative sequence about to decode its last token."""
        for req in active:
            if (req.opts.speculative is not None and req.phase == "generating" and req.out_from is None
                    and len(req.feed) == 1):
                self._attach(req)

    def _attach(self, req: Request) -> None:
        opts = req.opts.speculative
        assert opts is not None
        # a draft of k tokens yields up to k + 1: no more than the request may still generate,
        # and every row inside the context with room for the token after it
        n_max = min(opts.n_max, req.opts.response_tokens - len(req.generated) - 1,
                    self._pool.ctx.n_ctx - req.n_past - 2)
        if n_max < max(1, opts.n_min):
            return
        spec = make_state(req, self._model) if req.spec is None else req.spec
        history = (req.prompt + req.generated)[: req.n_past]
        req.attach_draft(spec, spec.draft(history, req.feed[0], req.n_past, n_max))

    # --- after the decode -------------------------------------------------------------------
    def apply(self, batch: DecodeBatch) -> None:
        for s in batch.slices:
            if s.rows is None or s.request.score is not None:
                continue                   # plain rows, or a scoring request's (engine/scoring.py)
            if s.request.verify_from is not None:
                self._collect_argmax(s)
            else:
                self._accept(s, batch.decode_s, own_time(batch))

    def _accept(self, s: Slice, decode_s: float, own: bool) -> None:
        """Sample the verify rows in order, keep the accepted run, drop the rest's KV."""
        t0 = time.perf_counter()
        req, rows = s.request, s.rows
        assert rows is not None and req.seq is not None
        base, draft = req.n_past, req.feed[1: s.take]
        tokens: list[int] = []
        for i, row in enumerate(rows):
            drawn = self._results.draw(req, row)
            if drawn is None:
                return                     # sampling failed: the request has failed
            tokens.append(drawn)
            if i >= len(draft) or drawn != draft[i] or self._model.is_eog(drawn):
                break
        reason, j = None, 0
        for j, token in enumerate(tokens):
            req.accepted_upto(base + j + 1)  # the KV holds the last token and the j draft tokens before
            reason = self._results.take(req, token, draft=j < len(draft) and token == draft[j])
            if reason is not None:
                break
        if req.n_past < base + s.take:
            self._pool.trim(req.seq, req.n_past)
        req.next_input(tokens[j])
        self._record(req, len(draft), j, decode_s + time.perf_counter() - t0, own)
        if reason is not None:
            self._results.finish(req, reason)

    def _record(self, req: Request, n_draft: int, n_accepted: int, step_s: float, own: bool) -> None:
        """The policy learns the step (its time only when ``own``); a verified draft counts."""
        spec = req.spec
        assert isinstance(spec, SpecState)
        engine_s = spec.drafter.take_busy_s()     # a draft model's engine's time for it meanwhile
        spec.step_draft_s += engine_s
        spec.numbers.draft_s += engine_s
        spec.policy.observe(spec.asked, n_draft, n_accepted, spec.step_draft_s, step_s if own else None)
        if n_draft == 0:
            return                         # a plain step: measured, nothing verified
        spec.drafter.accepted(n_accepted)
        spec.numbers.record(n_draft, n_accepted)
        spec.numbers.verify_s += step_s
        self._counters["spec_steps"] += 1
        self._counters["spec_drafted"] += n_draft
        self._counters["spec_accepted"] += n_accepted

    def _collect_argmax(self, s: Slice) -> None:
        """A verify() request: the argmax of each of its rows; it ends once all are decoded."""
        req, rows = s.request, s.rows
        assert rows is not None
        self._results.advance(req, s.take)
        for row in rows:
            token = self._results.draw(req, row)
            if token is None:
                return
            req.add_argmax(token)
        if not req.feed:
            self._results.finish(req, "length")
