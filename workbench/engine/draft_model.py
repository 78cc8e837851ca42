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

``p_min``: the draft ends before the first token whose probability under the draft model
(the softmax of its logits as sampled, through the draft request's ``logprobs``) is
below ``p_min``, as llama.cpp's draft-simple does, and the draft request stops there.

State: one target request's draft request (at most one at a time: they share a session)
and counts; used from the target's loop thread only.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _native
from ..errors import InvalidOption, WorkbenchError
from ..options import RequestOptions, SpeculativeOptions

DRAFT_SCOPE = "speculative-draft"
FLIGHT_DRAFTS = 4          # a draft request generates this many drafts' worth, used as it goes
MAX_FLIGHT = 64            # and at most so many tokens
CLOSE_WAIT_S = 2.0         # at the request's end: how long a cancelled draft may take to stop


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

    def __init__(self, engine: Any, opts: SpeculativeOptions, name: str) -> None:
        self.engine, self.opts, self.session = engine, opts, name
        self.kind = f"draft:{engine.model_id}"
        self._flight: tuple[list[int], Any] | None = None   # (tokens drafted for, its request)
        self._leaving: Any = None  # a cancelled draft request: the session is free once it ends
        self.failures = 0          # draft requests the draft engine refused
        self.not_ready = 0         # drafts asked for while none had tokens past the target's (plain steps)
        self.stale = 0             # drafts the target left (it emitted another token than the draft's)

    def draft(self, history: list[int], last: int, pos: int, n_max: int) -> list[int]:
        context = history + [last]
        rest = self._rest(context)
        tokens = (rest or [])[:n_max]
        spent = self._flight is None or (self._flight[1].finished.is_set() and len(rest or []) <= n_max)
        if spent and (self._leaving is None or self._leaving.finished.is_set()):
            self._submit(context + tokens, n_max)
        if not tokens:
            self.not_ready += 1
        return tokens

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
        req = self._flight[1]
        self._flight = None
        if not req.finished.is_set():
            self.engine.cancel(req)
            self._leaving = req

    def _submit(self, prompt: list[int], n_max: int) -> None:
        opts = RequestOptions(response_tokens=min(MAX_FLIGHT, FLIGHT_DRAFTS * n_max), cache=False,
                              session_id=self.session, cache_scope=DRAFT_SCOPE,
                              logprobs=0 if self.opts.p_min > 0 else None)
        self._flight = None
        try:
            self._flight = (prompt, self.engine.submit(prompt, opts))
        except WorkbenchError:
            self.failures += 1    # the draft model is busy, full or gone: no draft this time

    def accepted(self, n: int) -> None:
        pass

    def close(self) -> None:
        for req in (self._flight[1] if self._flight else None, self._leaving):
            if req is not None:
                self.engine.cancel(req)
                req.finished.wait(CLOSE_WAIT_S)
        try:
            self.engine.end_session(self.session, DRAFT_SCOPE)
        except (WorkbenchError, TimeoutError):
            pass    # no session yet, or the draft model is gone: nothing to free

    def summary(self) -> dict[str, Any]:
        return {"draft_not_ready": self.not_ready, "draft_stale": self.stale, "draft_failures": self.failures}
