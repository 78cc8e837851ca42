"""The generation calls of the facade: stream() and complete(), and the prompt rules they
share with the other calls that take a prompt (continue_session, prefill_only, ...).

The options are split and checked in workbench/options (``split_thinking``: thinking
options without ``thinking=True`` are refused there) and the RequestOptions built once. A
plain request goes straight to the engine; ``thinking=True`` (ThinkingOptions,
chat/raw_thinking.py, imported only then) wraps the request's Stream so the reply's
reasoning block comes as Thinking / ThinkingEnd events; the engine sees an ordinary request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from . import registry, samples
from .engine.engine import Engine
from .engine.events import CompletionResult
from .engine.stream import Stream
from .engine.tokens import tokenize_within
from .errors import EmptyPrompt, InvalidOption
from .options import RequestOptions, build, split_thinking
from .samples import SampleStream

if TYPE_CHECKING:
    from .chat.raw_thinking import ThinkingResultStream

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


def token_list(eng: Engine, tokens: Any, key: str) -> list[int]:
    """``tokens`` as a list of this model's token ids, else InvalidOption naming ``key``."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise InvalidOption(key, tokens, "a list of token ids")
    n_vocab = eng.model.n_vocab
    out = list(tokens)
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise InvalidOption(key, t, f"token ids in [0, {n_vocab})")
    return out


def prompt_tokens(eng: Engine, prompt: Any, opts: RequestOptions) -> list[int]:
    """A prompt (text, tokenised within n_ctx, or token ids) as a non-empty token list."""
    if isinstance(prompt, str):
        if not prompt:
            raise EmptyPrompt()
        tokens = tokenize_within(eng.model, prompt, opts.add_special, opts.parse_special, eng.ctx.n_ctx, "n_ctx")
    elif isinstance(prompt, Sequence) and not isinstance(prompt, bytes):
        tokens = token_list(eng, prompt, "prompt")
    else:
        raise InvalidOption("prompt", prompt, "a string or a list of token ids")
    if not tokens:
        raise EmptyPrompt()
    return tokens


def draft_engine(opts: RequestOptions) -> Engine | None:
    """The loaded model ``speculative={'draft': id}`` names (NotLoaded if it is not)."""
    spec = opts.speculative
    return registry.get(spec.draft) if spec is not None and spec.draft is not None else None


@overload
def stream(model: str, prompt: str | Sequence[int], *, n: None = None,
           **opts: Any) -> Stream | ThinkingResultStream: ...
@overload
def stream(model: str, prompt: str | Sequence[int], *, n: int, **opts: Any) -> SampleStream: ...
def stream(model: str, prompt: str | Sequence[int], *, n: int | None = None,
           **opts: Any) -> Stream | ThinkingResultStream | SampleStream:
    """Start a request; iterate the returned Stream (or ``async for``) for typed events.
    With ``thinking=True`` the reasoning block comes as Thinking / ThinkingEnd events.
    ``n``: that many samples of the prompt, one SampleStream of ``Sample(index, event)``
    (workbench/samples.py)."""
    if n is not None:
        return samples.start(lambda **o: stream(model, prompt, **o), samples.counts(n)[0], opts)
    eng = registry.get(model)
    topts, given = split_thinking(opts)
    ropts = build(RequestOptions, given)
    tokens = prompt_tokens(eng, prompt, ropts)
    if not topts.thinking:
        return start(eng, tokens, ropts)
    from .chat import raw_thinking  # thinking=True only: the template's markers, the splitter

    plan = raw_thinking.plan(eng, tokens, topts, ropts, given)
    return raw_thinking.ThinkingResultStream(start(eng, tokens, plan.request), plan)


def start(eng: Engine, tokens: list[int], ropts: RequestOptions) -> Stream:
    """Submit a request whose prompt and options are already checked; its Stream."""
    return Stream(eng, eng.submit(tokens, ropts, draft=draft_engine(ropts)))


@overload
def complete(model: str, prompt: str | Sequence[int], *, n: None = None, best_of: None = None,
             **opts: Any) -> CompletionResult: ...
@overload
def complete(model: str, prompt: str | Sequence[int], *, n: int, best_of: int | None = None,
             **opts: Any) -> list[CompletionResult]: ...
@overload
def complete(model: str, prompt: str | Sequence[int], *, n: int | None = None, best_of: int,
             **opts: Any) -> list[CompletionResult]: ...
def complete(model: str, prompt: str | Sequence[int], *, n: int | None = None, best_of: int | None = None,
             **opts: Any) -> CompletionResult | list[CompletionResult]:
    """Generate a reply and return it with its tokens, finish reason and stats (a
    ThinkingResult with ``thinking=True``).

    ``n`` (and ``best_of``): a list of ``n`` samples of the prompt, its prefill computed once;
    with ``best_of`` the ``n`` of highest mean logprob per token among ``best_of``, best
    first (workbench/samples.py).

    Ctrl-C (a notebook's Interrupt) cancels the request (every sample) before re-raising.
    """
    if n is not None or best_of is not None:
        n_out, k = samples.counts(1 if n is None else n, best_of)
        s = samples.start(lambda **o: stream(model, prompt, **o), k, samples.scored_opts(opts, best_of))
        return samples.keep(collect(s), n_out, best_of)
    return collect(stream(model, prompt, **opts))


class Ending(Protocol[R_co]):
    """What ``collect`` waits on: a Stream, a ThinkingResultStream, a ChatStream, a SampleStream."""

    def wait(self, timeout: float | None = None) -> bool: ...
    def cancel(self) -> None: ...
    def result(self) -> R_co: ...


def collect(s: Ending[R]) -> R:
    """Wait for a stream's end and return its result (raises the request's error)."""
    try:
        # wait for the end without waking per token (each wake-up costs the loop thread
        # GIL hand-offs on the decode path); the events are all queued by then
        while not s.wait(0.25):
            pass
    except KeyboardInterrupt:
        s.cancel()
        raise
    return s.result()
