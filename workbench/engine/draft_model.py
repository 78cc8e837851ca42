"""Drafts from another loaded model (``speculative={'draft': id}``), without blocking the
target's loop.

:class:`ModelDrafter` asks the draft model's own engine for its greedy reply to the
target's tokens so far, as a request on a session of that engine (scope
``speculative-draft``, one session per target request, ended with it): each draft
prefills only what is new since the last, and the draft model's sequences are batched
there with its other work. The target never waits for it: a draft in flight is looked at
when the target asks for the next one, and until it is back the target decodes plainly.

A draft request is for tokens X and generates up to FLIGHT_DRAFTS drafts' worth; whatever
it has generated so far, g, is used as it goes. When the target has reached C and C is X
followed by the first m tokens of g (the target emitted what the draft model predicted,
by plain steps meanwhile), g past m is the draft for C (nothing yet while the draft model
is behind); when C has left X + g, the draft request is cancelled and forgotten. Once a
draft request is done and what is left of it is handed out, the next is asked for, for
the target's tokens plus that draft (as if it will all be accepted): when it is, the next
draft is under way already.

What it costs is the policy's to weigh (engine/spec_policy.py): the draft engine's time
for this request's draft requests (each one's wall time from its first prefill to its last
token: that engine works on it all along, on the cores the target decodes on when they
share a CPU) is handed to the policy step by step (``take_busy_s``) as drafter time, and
before a draft request that must prefill tokens the draft session does not hold, the
policy is told what that would cost (``setup_s``: those tokens at the draft engine's
measured prefill time per token; before one, the target's own scaled by the draft
model's size over the target's; without that, 1/16 of a plain step) and asks for the
draft only once its slack covers it. While the policy is off the request in flight is
cancelled (``pause``), and a probe asks for one draft, not FLIGHT_DRAFTS.

``p_min``: the draft ends before the first token whose probability under the draft model
(the softmax of its logits as sampled, through the draft request's ``logprobs``) is
below ``p_min``, as llama.cpp's draft-simple does, and the draft request stops there.

State: one target request's draft request (at most one at a time: they share a session)
and counts; used from the target's loop thread only.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .. import _native
from ..errors import InvalidOption, WorkbenchError
from ..options import RequestOptions, SpeculativeOptions
from .spec_costs import Cost

DRAFT_SCOPE = "speculative-draft"
FLIGHT_DRAFTS = 4          # a draft request generates this many drafts' worth, used as it goes
MAX_FLIGHT = 64            # and at most so many tokens
CLOSE_WAIT_S = 2.0         # at the request's end: how long a cancelled draft may take to stop
PRIOR_PREFILL = 1 / 16     # a draft engine's prefill per token, in target plain steps, before any is measured
MEASURE_PREFILL = 16       # a draft request's prefill measures the per-token cost from so many tokens on


def check_speculative(opts: SpeculativeOptions | None, target: Any, draft: Any) -> None:
    """A draft model is given (the facade looked it up), is not the target itself (its loop
    would wait on itself), and passes llama.cpp's vocabulary check against the target."""
    if opts is None or opts.draft is None:
        return
    if draft is None:
        raise InvalidOption("speculative", {"draft": opts.draft}, "the id of a loaded model")
    if draft is target:
        raise InvalidOption("speculative", {"draft": opts.draft},
                            "another loaded model than the target (load a second instance to draft with the same file)")
    try:
        _native.Speculative(target.model, {"type": "draft-simple"}, draft.ctx.n_seq_max, target.ctx, draft.ctx).close()
    except ValueError as e:
        raise InvalidOption("speculative", {"draft": opts.draft},
                            f"a draft model whose vocabulary matches the target's (llama.cpp: {e})") from None


def extends(context: list[int], made_for: list[int]) -> bool:
    """Whether ``context`` is ``made_for`` or goes on from it."""
    return len(context) >= len(made_for) and context[: len(made_for)] == made_for


def continuation(context: list[int], made_for: list[int], tokens: list[int]) -> list[int] | None:
    """What of a draft ``tokens`` (so far) made for ``made_for`` is past ``context``: []
    while the draft is not past it, None when the context has left made_for + tokens."""
    if not extends(context, made_for):
        return None
    n, m = len(made_for), len(context) - len(made_for)
    k = min(m, len(tokens))
    return tokens[m:] if context[n: n + k] == tokens[:k] else None


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def busy_s(req: Any) -> float:
    """A draft request's wall time on its engine so far: from its first prefill (its
    admission where that is not stamped) to its last token once finished (to now while it
    runs, or once finished without one: cancelled while prefilling)."""
    start = req.prefill_started_at or req.admitted_at
    if start is None:
        return 0.0
    now = time.perf_counter()
    end = (req.last_token_at or req.prefill_done_at or now) if req.finished.is_set() else now
    return max(0.0, end - start)


def confident(tokens: list[int], logprobs: list[float], p_min: float) -> list[int]:
    """``tokens`` up to (not with) the first whose probability is below ``p_min``."""
    if p_min <= 0.0:
        return tokens
    floor = math.log(p_min)
    for i, lp in enumerate(logprobs[: len(tokens)]):
        if lp < floor:
            return tokens[:i]
    return tokens


class ModelDrafter:
    """One target request's drafts from a draft model's engine, asynchronously."""

    cheap = False              # a draft costs the draft engine a request: none is asked for unverified

    def __init__(self, engine: Any, opts: SpeculativeOptions, name: str, prefill_tok_s: float | None = None) -> None:
        self.engine, self.opts, self.session = engine, opts, name
        self.kind = f"draft:{engine.model_id}"
        self._flight: tuple[list[int], Any] | None = None   # (tokens drafted for, its request)
        self._leaving: Any = None  # a cancelled draft request: the session is free once it ends
        self._charging: list[list[Any]] = []   # [draft request, its busy seconds handed out so far]
        self._synced: list[int] = []           # what the draft session's KV holds, as far as known
        self._prefill = Cost()     # the draft engine's prefill per token, measured
        self._prior_prefill = prefill_tok_s    # before that: the target's own
        self.failures = 0          # draft requests the draft engine refused
        self.not_ready = 0         # drafts asked for while none had tokens past the target's (plain steps)
        self.stale = 0             # drafts the target left (it emitted another token than the draft's)
        self.requests = 0          # draft requests submitted
        self.paused = 0            # draft requests cancelled because the policy went off
        self.engine_s = 0.0        # the draft engine's time for them, handed to the policy
        self.engine_tokens = 0     # tokens they prefilled and generated

    def draft(self, history: list[int], last: int, pos: int, n_max: int, ahead: bool = True) -> list[int]:
        """What the draft in flight has past the target's tokens, at most n_max; the next
        draft request is asked for once it is spent, for FLIGHT_DRAFTS drafts where
        ``ahead``, else (a probe) for this one only and only while there is none."""
        context = history + [last]
        rest = self._rest(context)
        tokens = (rest or [])[:n_max]
        spent = self._flight is None or (self._flight[1].finished.is_set() and len(rest or []) <= n_max)
        if spent and (ahead or not tokens) and (self._leaving is None or self._leaving.finished.is_set()):
            self._submit(context + tokens, n_max, FLIGHT_DRAFTS if ahead else 1)
        if not tokens:
            self.not_ready += 1
        return tokens

    def setup_s(self, history: list[int], last: int, plain_s: float | None) -> float:
        """The draft engine's estimated time to prefill what a draft request for the
        target's tokens would find missing from its session (0 while one is in flight
        for them: that is under way)."""
        if self._flight is not None and self._rest(history + [last]) is not None:
            return 0.0
        missing = len(history) + 1 - common_prefix(self._synced, history)
        tok_s = self._prefill.value or self._prior_prefill or PRIOR_PREFILL * (plain_s or 0.0)
        return missing * tok_s

    def take_busy_s(self) -> float:
        """The draft engine's time for this request's draft requests since the last call."""
        total, running = 0.0, []
        for entry in self._charging:
            req, charged = entry
            done = req.finished.is_set()
            now = busy_s(req)
            total += now - charged
            entry[1] = now
            if done:
                self._finished(req)
            else:
                running.append(entry)
        self._charging = running
        self.engine_s += total
        return total

    def _finished(self, req: Any) -> None:
        """A draft request is over: its tokens count, its prefill measures the engine."""
        self.engine_tokens += req.prefilled + len(req.generated)
        if req.prefilled >= MEASURE_PREFILL and req.prefill_started_at and req.prefill_done_at:
            self._prefill.add((req.prefill_done_at - req.prefill_started_at) / req.prefilled)

    def pause(self) -> None:
        """The policy is off: the draft request in flight, if still running, is cancelled."""
        if self._flight is not None and not self._flight[1].finished.is_set():
            self.paused += 1
            self._leave()

    def _rest(self, context: list[int]) -> list[int] | None:
        """What the draft in flight (running or done) has past ``context``; a draft the
        target has left is cancelled and forgotten."""
        if self._flight is None:
            return None
        made_for, req = self._flight
        rest = continuation(context, made_for, self._so_far(req))
        if rest is None:
            self.stale += 1
            self._leave()
        return rest

    def _so_far(self, req: Any) -> list[int]:
        """The draft request's tokens so far, up to (not with) its first under p_min; one
        under p_min ends the draft request (nothing past it would be used)."""
        tokens = list(req.generated)
        if self.opts.p_min <= 0.0:
            return tokens
        logprobs = [lp.logprob for lp in list(req.logprobs)]
        sure = confident(tokens[: len(logprobs)], logprobs, self.opts.p_min)
        if len(sure) < min(len(tokens), len(logprobs)):
            self.engine.cancel(req)
        return sure

    def _leave(self) -> None:
        assert self._flight is not None
        made_for, req = self._flight
        self._synced = made_for + list(req.generated)
        self._flight = None
        if not req.finished.is_set():
            self.engine.cancel(req)
            self._leaving = req

    def _submit(self, prompt: list[int], n_max: int, drafts: int) -> None:
        opts = RequestOptions(response_tokens=min(MAX_FLIGHT, drafts * n_max), cache=False,
                              session_id=self.session, cache_scope=DRAFT_SCOPE,
                              logprobs=0 if self.opts.p_min > 0 else None)
        if self._flight is not None:
            self._synced = self._flight[0] + list(self._flight[1].generated)
        self._flight = None
        try:
            req = self.engine.submit(prompt, opts)
        except WorkbenchError:
            self.failures += 1    # the draft model is busy, full or gone: no draft this time
            return
        self._flight = (prompt, req)
        self._charging.append([req, 0.0])
        self.requests += 1

    def accepted(self, n: int) -> None:
        pass

    def close(self) -> None:
        for req in (self._flight[1] if self._flight else None, self._leaving):
            if req is not None:
                self.engine.cancel(req)
                req.finished.wait(CLOSE_WAIT_S)
        self.take_busy_s()        # the stats count the draft engine's whole time and tokens
        try:
            self.engine.end_session(self.session, DRAFT_SCOPE)
        except (WorkbenchError, TimeoutError):
            pass    # no session yet, or the draft model is gone: nothing to free

    def summary(self) -> dict[str, Any]:
        return {"draft_not_ready": self.not_ready, "draft_stale": self.stale, "draft_failures": self.failures,
                "draft_requests": self.requests, "draft_paused": self.paused, "draft_engine_s": self.engine_s,
                "draft_engine_tokens": self.engine_tokens}
