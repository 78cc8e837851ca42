"""Typed events a request yields, and the results built from them.

``stream()`` yields these; ``complete()`` collects them into a :class:`CompletionResult`.
They mirror erllama 0.10's ``{erllama, Ref, Event}`` envelope: ``{token, Bin}``,
``{token_id, Id}``, ``{done, Stats}``, ``{error, Reason}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

FinishReason = Literal["stop", "length", "cancelled"]
# where a request is (request_info, requests) and what a model's loop is doing (phase())
RequestPhase = Literal["queued", "prefilling", "generating", "done"]
ModelPhase = Literal["idle", "prefilling", "generating"]
REQUEST_PHASES: tuple[RequestPhase, ...] = get_args(RequestPhase)


@dataclass(slots=True, frozen=True)
class Stats:
    """Numbers of one finished request; times in seconds, rates in tokens/s.

    ``cache_hit_kind``: a ``workbench.cache.HitKind`` value: cold (nothing reused), sticky
    (a session's live KV), continuation (``continue_session``), partial (a cached row
    covering part of the prompt), exact (a row covering the prompt but at most its last
    token, or the ``parent_key`` row). ``cache_delta``, in tokens: ``read`` = prompt tokens
    whose KV was reused (restored or live: prompt_tokens - prefilled_tokens), ``created`` =
    tokens this request added to the cache beyond those (its longest newly stored row).
    ``cache_saved_by``: for a partial or exact hit, the id of the model whose save wrote the
    restored row (models loaded from the same file with the same KV settings share rows, so it
    may be another id, or the same id in an earlier process); "" when the row does not
    record it; None when nothing was restored from the cache.
    """

    prompt_tokens: int
    generated_tokens: int
    prefilled_tokens: int
    ttft_s: float | None
    prefill_s: float
    prefill_tps: float | None
    decode_s: float
    decode_tps: float | None
    total_s: float
    queued_s: float
    seed: int | None
    cache_hit_kind: str = "cold"
    cache_delta: dict[str, int] = field(default_factory=lambda: {"read": 0, "created": 0})
    cache_saved_by: str | None = None
    # speculative=: drafted, accepted, ..., and the adaptive policy's decisions (docs/speculative.md)
    speculative: dict[str, Any] | None = None


@dataclass(slots=True, frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position (``logprobs=N``)."""

    id: int
    text: str
    logprob: float


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the ``logprobs`` most likely tokens at its
    position, most likely first (docs/api.md, "Log-probabilities", says from which logits)."""

    id: int
    text: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(slots=True, frozen=True)
class Token:
    """A piece of reply text (whole UTF-8 characters; stop strings never leak).

    ``logprob`` (with ``logprobs=``): the summed log-probability of the tokens generated
    since the previous Token event, whose text this piece releases; None without."""

    text: str
    logprob: float | None = None

    def __repr__(self) -> str:  # without logprobs, events read as before: Token(text='Hi')
        lp = "" if self.logprob is None else f", logprob={self.logprob:.4f}"
        return f"Token(text={self.text!r}{lp})"


@dataclass(slots=True, frozen=True)
class TokenId:
    """The id of each generated token, in order (emitted before its text). ``draft``: the
    token was a speculative draft token the target accepted (False for a token the target
    sampled itself, and always False without ``speculative=``). ``logprob``, ``top_logprobs``
    (with ``logprobs=``): its log-probability and the most likely tokens at its position."""

    id: int
    draft: bool = False
    logprob: float | None = None
    top_logprobs: tuple[TopLogprob, ...] = ()

    def __repr__(self) -> str:  # plain decoding's events read as before: TokenId(id=504)
        extra = ", draft=True" if self.draft else ""
        if self.logprob is not None:
            extra += f", logprob={self.logprob:.4f}"
        return f"TokenId(id={self.id}{extra})"


@dataclass(slots=True, frozen=True)
class _Finished:
    """What a finished request made, the same in its Done event and in the CompletionResult
    built from it (their first fields, in this order)."""

    reply: str
    tokens: tuple[int, ...]
    context_tokens: tuple[int, ...]
    finish_reason: FinishReason
    stop_sequence: str | None
    stats: Stats


@dataclass(slots=True, frozen=True)
class Done(_Finished):
    """The request ended; ``finish_reason`` says why."""

    finish_key: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token of ``tokens`` (logprobs=)


@dataclass(slots=True, frozen=True)
class Error:
    """The request failed; ``reason`` is the exception (from workbench.errors)."""

    reason: BaseException


@dataclass(slots=True, frozen=True)
class Thinking:
    """A piece of a reasoning block's text (chat_stream with thinking='enabled')."""

    text: str


@dataclass(slots=True, frozen=True)
class ThinkingEnd:
    """The reasoning block closed (its end marker, the budget, or the end of the reply).

    ``signature``: HMAC-SHA256 hex of the block's UTF-8 text under the model's
    ``thinking_signing_key``; '' when no key is set.
    """

    signature: str


Event = Token | TokenId | Thinking | ThinkingEnd | Done | Error


@dataclass(slots=True, frozen=True)
class CompletionResult(_Finished):
    """What ``complete()`` returns: its Done's fields, with the model and the request's ref."""

    model: str
    ref: int
    finish_key: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token of ``tokens`` (logprobs=)

    @property
    def committed_tokens(self) -> int:
        """len(context_tokens): the prompt and the reply together (erllama's committed_tokens)."""
        return len(self.context_tokens)

    @classmethod
    def from_done(cls, done: Done, model: str, ref: int) -> CompletionResult:
        return cls(done.reply, done.tokens, done.context_tokens, done.finish_reason,
                   done.stop_sequence, done.stats, model, ref, done.finish_key, done.logprobs)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        s = self.stats
        ttft = f"{s.ttft_s * 1000:.0f} ms" if s.ttft_s is not None else "-"
        p.text(f"{self.reply}\n[{self.finish_reason}; {s.prompt_tokens} prompt + {s.generated_tokens} "
               f"generated tokens; ttft {ttft}; cache {s.cache_hit_kind}]")
