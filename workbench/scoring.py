"""Scoring a text with the model: ``score`` (every token's logprob given the tokens before
it), ``loglikelihood`` (lm-evaluation-harness's contract) and ``perplexity`` (llama.cpp's
perplexity tool's method and number).

Each is one or more scoring requests (engine/scoring.py): prompts decoded with logits on
the rows that are scored, batched with the model's other work by the scheduler, nothing
generated. Logprobs are the raw logits' log-softmax (no temperature, penalties or bias).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import registry
from .generation import collect, token_list
from .engine.logprobs import piece_text
from .engine.scoring import ScoreState
from .engine.stream import Stream
from .engine.tokens import tokenize_within
from .errors import ContextOverflow, InvalidOption
from .options import RequestOptions, build, check_bool, check_int, check_scope

MAX_TOKENS = 1 << 22             # the longest text scored (windows past the context)
MAX_TOP = 100                    # alternatives per token


@dataclass
class ScoreResult:
    """A scored token sequence. ``logprobs[i]`` is the log-probability (natural log) of
    ``tokens[i]`` given ``tokens[:i]``, NaN where nothing was scored (the first token);
    ``ranks[i]`` its rank among the vocabulary (1 = the model's argmax, 0 = not scored);
    ``top[i]`` the ``top`` most likely tokens there as (id, logprob), when asked."""

    model: str
    tokens: list[int]
    pieces: list[str]
    logprobs: Any
    ranks: Any
    top: list[list[tuple[int, float]]] | None
    windows: int = 1

    @property
    def n_scored(self) -> int:
        return int(np.count_nonzero(self.ranks))

    @property
    def sum_logprob(self) -> float:
        return float(np.nansum(self.logprobs))

    @property
    def perplexity(self) -> float:
        """exp of the mean negative logprob over the scored tokens."""
        return math.exp(-self.sum_logprob / self.n_scored) if self.n_scored else math.nan

    def to_frame(self) -> Any:
        """One row per token: position, token, piece, logprob, surprise (bits), rank, top."""
        import pandas as pd

        df = pd.DataFrame({"token": self.tokens, "piece": self.pieces, "logprob": self.logprobs,
                           "surprise_bits": -np.asarray(self.logprobs) / math.log(2), "rank": self.ranks})
        df["rank"] = df["rank"].astype("Int64").mask(df["rank"] == 0)
        if self.top is not None:
            df["top"] = self.top
        df.index.name = "position"
        return df

    def plot(self, **kw: Any) -> Any:
        """Each token's surprise in bits along the text (workbench.notebook.score_plots)."""
        from workbench.notebook.score_plots import surprise

        return surprise(self, **kw)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"<ScoreResult {self.model}: {len(self.tokens)} tokens, {self.n_scored} scored, "
               f"sum logprob {self.sum_logprob:.4f}, perplexity {self.perplexity:.4f}>")


def score(model: str, text: str | Sequence[int], *, top: int = 0, window: int | None = None,
          overlap: int | None = None, cache: bool | None = None, cache_scope: str = "default") -> ScoreResult:
    """The logprob of every token of ``text`` (a string, tokenized with the model's BOS, or
    token ids) given the tokens before it, with its rank and ``top`` alternatives.

    A text longer than ``window`` tokens (default: the context less one) is scored in
    windows of ``window`` tokens, each after the first starting ``overlap`` tokens
    (default: window // 2) before the first token it scores: every token is scored once,
    with at least ``overlap`` tokens before it. ``cache``: a window's context the cache
    holds is restored rather than decoded (scores are read only from rows decoded here);
    None: only on a deterministic model (see ``use_cache``)."""
    eng = registry.get(model)
    tokens = _tokens(eng, text, "text")
    top = check_int("top", top, 0, MAX_TOP)
    window, overlap = _window(eng, window, overlap)
    if len(tokens) < 2:
        raise InvalidOption("text", text, "at least two tokens (the first is only context)")
    opts = _options(use_cache(eng, cache), cache_scope)
    wins = _windows(len(tokens), window, overlap)
    states = run_scoring(eng, [(tokens[a:b], start, top) for a, b, start in wins], opts)
    return _assemble(eng, model, tokens, top, [a for a, _, _ in wins], states)


def _window(eng: Any, window: Any, overlap: Any) -> tuple[int, int]:
    most = eng.ctx.n_ctx - 1
    window = check_int("window", most if window is None else window, 2, most)
    overlap = check_int("overlap", window // 2 if overlap is None else overlap, 1, window - 1)
    return window, overlap


def _windows(n: int, window: int, overlap: int) -> list[tuple[int, int, int]]:
    """(first token, end, first position with logits within the window) of each window:
    the first from token 0 (position 0's logits score token 1), each later one starting
    ``overlap`` tokens before the first token it scores."""
    out = [(0, min(n, window), 0)]
    while out[-1][1] < n:
        a = out[-1][1] - overlap
        out.append((a, min(n, a + window), overlap - 1))
    return out


def _assemble(eng: Any, model: str, tokens: list[int], top: int, offsets: list[int],
              states: list[ScoreState]) -> ScoreResult:
    n = len(tokens)
    logprobs, ranks = np.full(n, np.nan), np.zeros(n, np.int32)
    alts: list[list[tuple[int, float]]] | None = [[] for _ in range(n)] if top else None
    for offset, state in zip(offsets, states):
        positions, lp, rank, ids, lps = state.arrays()
        at = offset + positions + 1          # the token each row scored, in the whole text
        logprobs[at], ranks[at] = lp, rank
        if alts is not None:
            for i, a in enumerate(at):
                alts[a] = list(zip(ids[i].tolist(), lps[i].astype(float).tolist()))
    pieces = [piece_text(eng.model, t) for t in tokens]
    return ScoreResult(model, tokens, pieces, logprobs, ranks, alts, len(offsets))


# --- running scoring requests ------------------------------------------------------------------

def use_cache(eng: Any, cache: Any) -> Any:
    """``cache`` as given, or for None whether the model runs deterministic: only there does
    KV restored from the cache give the numbers computing it gives (in the default mode a
    restored context moved a continuation's logprob by up to ~0.9 nats, bench_eval.py)."""
    return bool(eng.cfg.deterministic) if cache is None else cache


def _options(cache: Any, cache_scope: Any) -> RequestOptions:
    check_bool("cache", cache)
    check_scope("cache_scope", cache_scope)
    return build(RequestOptions, None, response_tokens=0, cache=cache, cache_scope=cache_scope)


def run_scoring(eng: Any, jobs: Sequence[tuple[list[int], int, int]], opts: RequestOptions,
                in_flight: int | None = None) -> list[ScoreState]:
    """Each job (tokens, first position with logits, top) as a scoring request; their
    states in job order (see run_requests)."""
    states = [ScoreState(start, top) for _, start, top in jobs]
    run_requests(eng, [functools.partial(eng.submit, tokens, opts, score=state)
                       for (tokens, _, _), state in zip(jobs, states)], in_flight)
    return states


def run_requests(eng: Any, submits: Sequence[Callable[[], Any]], in_flight: int | None = None) -> None:
    """Submit each request, ``in_flight`` at a time (default: twice the model's sequences,
    so the scheduler batches them), and wait for all. An error (a cancel, a timeout,
    Ctrl-C) cancels the rest and is raised."""
    in_flight = in_flight or max(1, eng.ctx.n_seq_max) * 2
    streams: list[Stream] = []
    try:
        for i, submit in enumerate(submits):
            if i >= in_flight:
                collect(streams[i - in_flight])
            streams.append(Stream(eng, submit()))
        for s in streams[-in_flight:]:
            collect(s)
    except BaseException:
        for s in streams:
            s.cancel()
        raise


# --- lm-evaluation-harness's loglikelihood -----------------------------------------------------

def loglikelihood(model: str, pairs: Sequence[tuple[str, str]], *, cache: bool | None = None,
                  cache_scope: str = "default") -> list[tuple[float, bool]]:
    """For each (context, continuation): the sum of the continuation's token logprobs given
    the context, and whether each of its tokens is the model's argmax there (greedy), as
    lm-evaluation-harness's ``loglikelihood`` returns them. Tokenised as lm-eval's
    HuggingFace model does: the context's trailing spaces move to the continuation, the
    continuation is what the whole text's tokens add to the context's, an empty context is
    the BOS (or EOS) token. With ``cache``, a context shared by several pairs (a question's
    choices) is prefilled once and stored in the prefix cache, and each pair restores it.
    ``cache=None`` (the default): only on a model loaded with ``deterministic=True``, where a
    restored context gives the cold numbers; in the default mode the reused KV moves a
    continuation's logprob (up to ~0.9 nats measured here), so each pair is computed whole."""
    eng = registry.get(model)
    encoded = [_encode_pair(eng, i, pair) for i, pair in enumerate(_pairs(pairs))]
    cache = use_cache(eng, cache)
    opts = _options(cache, cache_scope)
    if cache and eng.kvcache is not None:
        _prefill_shared(eng, [ctx for ctx, _ in encoded], cache_scope)
    states = run_scoring(eng, [(ctx + cont, len(ctx) - 1, 0) for ctx, cont in encoded], opts)
    out = []
    for state in states:
        _, lp, rank, _, _ = state.arrays()
        out.append((float(lp.sum()), bool((rank == 1).all())))
    return out


def loglikelihood_rolling(model: str, texts: Sequence[str], *, window: int | None = None,
                          overlap: int | None = None, cache: bool | None = None,
                          cache_scope: str = "default") -> list[float]:
    """lm-evaluation-harness's ``loglikelihood_rolling``: for each text, the sum of the
    logprobs of all its tokens given the ones before them, the first given the prefix token
    (BOS, or EOS without one); a text past the context is scored in windows (``score``)."""
    eng = registry.get(model)
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise InvalidOption("texts", texts, "a list of strings")
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise InvalidOption(f"texts[{i}]", text, "a non-empty string")
        tokens = [prefix_token(eng), *text_tokens(eng, text, False, f"texts[{i}]")]
        out.append(score(model, tokens, window=window, overlap=overlap, cache=cache,
                         cache_scope=cache_scope).sum_logprob)
    return out


def prefix_token(eng: Any) -> int:
    """What stands before a text scored from its first token: BOS, or EOS (lm-eval's rule)."""
    return int(eng.model.bos if eng.model.bos >= 0 else eng.model.eos)


def _pairs(pairs: Any) -> list[tuple[Any, Any]]:
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise InvalidOption("pairs", pairs, "a list of (context, continuation) pairs of strings")
    for i, pair in enumerate(pairs):
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(x, str) for x in pair)):
            raise InvalidOption(f"pairs[{i}]", pair, "a (context, continuation) pair of strings")
        if not pair[1]:
            raise InvalidOption(f"pairs[{i}]", pair, "a non-empty continuation")
    return [tuple(p) for p in pairs]


def _encode_pair(eng: Any, i: int, pair: tuple[str, str]) -> tuple[list[int], list[int]]:
    context, continuation = pair
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    where = f"pairs[{i}]"
    if not context:
        ctx = [prefix_token(eng)]
        return ctx, text_tokens(eng, continuation, False, where)
    whole = text_tokens(eng, context + continuation, True, where)
    ctx = text_tokens(eng, context, True, where)
    cont = whole[len(ctx):]
    if not cont:   # the continuation merged into the context's last token
        cont = text_tokens(eng, continuation, False, where)
    return ctx, cont


def _prefill_shared(eng: Any, contexts: list[list[int]], cache_scope: str) -> None:
    """Prefill each context used by more than one pair once, its row stored before the
    pairs are scored (prefill_only's synchronous saves)."""
    seen: dict[tuple[int, ...], int] = {}
    for ctx in contexts:
        seen[tuple(ctx)] = seen.get(tuple(ctx), 0) + 1
    shared = [list(ctx) for ctx, n in seen.items() if n > 1 and len(ctx) > 1]
    opts = build(RequestOptions, None, response_tokens=0, cache=True, cache_scope=cache_scope)
    run_requests(eng, [functools.partial(eng.submit, ctx, opts, sync_saves=True) for ctx in shared])


def _tokens(eng: Any, text: Any, key: str) -> list[int]:
    """A string's tokens (BOS per vocab, specials not parsed: text is text) or token ids."""
    return text_tokens(eng, text, True) if isinstance(text, str) else _within(token_list(eng, text, key))


def text_tokens(eng: Any, text: str, add_special: bool, where: str = "") -> list[int]:
    """The tokens of a text to score, at most MAX_TOKENS (refused before tokenising when the
    text is surely longer, else after)."""
    return _within(tokenize_within(eng.model, text, add_special, False, MAX_TOKENS, _limit(where)), where)


def _within(tokens: list[int], where: str = "") -> list[int]:
    if len(tokens) > MAX_TOKENS:
        raise ContextOverflow(len(tokens), MAX_TOKENS, _limit(where))
    return tokens


def _limit(where: str) -> str:
    return (f"{where}: " if where else "") + f"at most {MAX_TOKENS} tokens are scored"
