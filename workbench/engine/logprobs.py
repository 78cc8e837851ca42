"""Log-probabilities of generated tokens (the ``logprobs=N`` request option).

The native sampler (csrc/sampler.cpp) takes the log-softmax of the logits after the
request's shaping (grammar, logit_bias, the end-of-generation ban of ignore_eos and
min_tokens, penalties, the reasoning budget) and before temperature and top-k / top-p /
min-p: the distribution the model gives under the request's constraints, the same for any
temperature. A token the request cannot produce has probability 0 and is never listed.

Each sample is queued on its request as it is drawn and taken off as its token enters the
reply, so speculative verify rows (several samples, then their tokens) stay in step.
"""

from __future__ import annotations

from typing import Any

from .events import TokenLogprob, TopLogprob
from .request import Request


def record_sample(req: Request) -> None:
    """Queue the request's last sample's logprobs (right after the sampler drew a token)."""
    if req.opts.logprobs is not None:
        req.queue_logprobs(req.sampler.last_logprobs())


def next_logprob(model: Any, req: Request, token: int) -> TokenLogprob | None:
    """The logprobs of ``token``, the request's next drawn token, off its queue; None
    without ``logprobs=``."""
    if req.opts.logprobs is None or not req.pending_logprobs:
        return None
    logprob, top = req.next_logprobs()
    return TokenLogprob(token, piece_text(model, token), float(logprob),
                        tuple(TopLogprob(t, piece_text(model, t), float(lp)) for t, lp in top))


def piece_text(model: Any, token: int) -> str:
    """A token's own text, special tokens shown (a piece that is part of a UTF-8 character
    reads as U+FFFD)."""
    return bytes(model.token_to_piece(token, True)).decode("utf-8", "replace")
