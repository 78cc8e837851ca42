"""Drafts from another loaded model (``speculative={'draft': id}``), without blocking the
target's loop.

:class:`ModelDrafter` asks the draft model's own engine for its greedy reply to the
target's tokens so far, as a request on a session of that engine (scope
``speculative-draft``, one session per target request, ended with it): each draft
prefills only what is new since the last, and the draft model's sequences are batched
there with its other work. The target never waits for it: a draft in flight is looked at
when the target asks for the next one, and until it is back the target decodes plainly.

A draft made for tokens X came back as g; the target has since reached C. When C is X
followed by the first m tokens of g (the target emitted what the draft model predicted,
by plain steps meanwhile), the rest of g is the draft for C; otherwise the draft is
stale and dropped. Right after a draft is handed out, the next one is asked for as if
all of it will be accepted (X + draft): when it is, the next draft is under way already.
A draft in flight for tokens the target has since left is cancelled. Each request asks
for the tokens wanted plus the ones the target emitted while the last draft was out.

``p_min``: the draft ends before the first token whose probability under the draft model
(the softmax of its logits as sampled, through the draft request's ``logprobs``) is
below ``p_min``, as llama.cpp's draft-simple does.

State: one target request's flight (at most one draft request at a time), the draft in
hand, and counts; used from the target's loop thread only.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _native
from ..errors import InvalidOption, WorkbenchError
from ..options import RequestOptions, SpeculativeOptions

DRAFT_SCOPE = "speculative-draft"
MAX_LAG = 32               # extra tokens a draft request asks for, for the target's progress meanwhile
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
    """What of a draft ``tokens`` made for ``made_for`` still follows ``context``: None
    when the context has left made_for + tokens."""
    if not extends(context, made_for):
        return None
    m = len(context) - len(made_for)
    return tokens[m:] if context[len(made_for):] == tokens[:m] else None


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

    def __init__(self, engine: Any, opts: SpeculativeOptions, name: str) -> None:
        self.engine, self.opts, self.session = engine, opts, name
        self.kind = f"draft:{engine.model_id}"
        self._flight: tuple[list[int], Any] | None = None       # (tokens drafted for, its request)
        self._hand: tuple[list[int], list[int]] | None = None   # (tokens drafted for, the draft)
        self.lag = 0              # tokens the target emitted while the last used draft was out
        self.failures = 0         # draft requests the draft engine refused or failed
        self.not_ready = 0        # drafts asked for while none was back yet (plain steps)
        self.stale = 0            # drafts that came back for tokens the target had left

    def draft(self, history: list[int], last: int, pos: int, n_max: int) -> list[int]:
        context = history + [last]
        self._collect()
        tokens = self._from_hand(context)[:n_max]
        if self._flight is not None and not extends(context, self._flight[0]):
            self.engine.cancel(self._flight[1])      # drafting for tokens the target has left
        if self._flight is None:
            self._submit(context + tokens, n_max)
        if not tokens:
            self.not_ready += 1
        return tokens

    def _from_hand(self, context: list[int]) -> list[int]:
        if self._hand is None:
            return []
        made_for, draft = self._hand
        self.lag = min(MAX_LAG, len(context) - len(made_for))
        rest = continuation(context, made_for, draft)
        if rest is None:
            self._hand, self.stale = None, self.stale + 1
            return []
        return rest

    def _collect(self) -> None:
        """A draft request that is back becomes the draft in hand."""
        if self._flight is None or not self._flight[1].finished.is_set():
            return
        made_for, req = self._flight
        self._flight = None
        if req.cancel_requested:
            return
        tokens = list(req.generated)
        logprobs = [lp.logprob for lp in req.logprobs]
        self._hand = (made_for, confident(tokens, logprobs, self.opts.p_min))

    def _submit(self, prompt: list[int], n_max: int) -> None:
        opts = RequestOptions(response_tokens=n_max + self.lag, cache=False, session_id=self.session,
                              cache_scope=DRAFT_SCOPE, logprobs=0 if self.opts.p_min > 0 else None)
        try:
            self._flight = (prompt, self.engine.submit(prompt, opts))
        except WorkbenchError:
            self.failures += 1    # the draft model is busy, full or gone: no draft this time

    def accepted(self, n: int) -> None:
        pass

    def close(self) -> None:
        if self._flight is not None:
            req = self._flight[1]
            self.engine.cancel(req)
            req.finished.wait(CLOSE_WAIT_S)
        try:
            self.engine.end_session(self.session, DRAFT_SCOPE)
        except (WorkbenchError, TimeoutError):
            pass    # no session yet, or the draft model is gone: nothing to free

    def summary(self) -> dict[str, Any]:
        return {"draft_not_ready": self.not_ready, "draft_stale": self.stale, "draft_failures": self.failures}
