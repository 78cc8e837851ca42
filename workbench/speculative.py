"""erllama's speculative primitives over the scheduler: ``draft_tokens`` and ``verify``.

Both run as ordinary requests on their own sequence while the model serves others, with
the prefix cache off (no row is looked up or stored) and their sequence freed at the end:
they leave no KV behind. Speculative *generation* is the ``speculative=`` request option
(engine/speculation.py, docs/speculative.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import registry
from .generation import collect, token_list
from .engine.stream import Stream
from .errors import InvalidOption, UnknownOption
from .options import RequestOptions, build, check_int

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "repeat_last_n", "seed",
                    "grammar", "grammar_root", "json_schema", "ignore_eos", "min_tokens", "frequency_penalty",
                    "presence_penalty", "logit_bias")


def draft_tokens(model: str, prefix_tokens: Sequence[int], max: int = 8, **sampling: Any) -> list[int]:  # noqa: A002
    """Up to ``max`` tokens the model generates after ``prefix_tokens`` (greedy unless
    ``sampling`` says otherwise); fewer when it ends the generation, possibly none."""
    for key in sampling:
        if key not in SAMPLING_OPTIONS:
            raise UnknownOption(key, SAMPLING_OPTIONS, "sampling option")
    check_int("max", max, 1)
    eng = registry.get(model)
    prefix = _prefix(eng, prefix_tokens)
    opts = build(RequestOptions, sampling, "sampling option", response_tokens=max, cache=False)
    return list(collect(Stream(eng, eng.submit(prefix, opts))).tokens)


def verify(model: str, prefix_tokens: Sequence[int], candidates: Sequence[int], k: int | None = None) -> dict[str, Any]:
    """One forward pass over ``prefix_tokens`` + the first ``k`` ``candidates`` (all when
    None), argmax at each position: ``accepted`` is the longest run of candidates equal to
    the model's argmax after the tokens before them; ``next`` is the argmax after that run
    (a token id, or ``'eos'`` for an end-of-generation token)."""
    eng = registry.get(model)
    prefix = _prefix(eng, prefix_tokens)
    cands = token_list(eng, candidates, "candidates")
    if not cands:
        raise InvalidOption("candidates", cands, "at least one token id")
    k = check_int("k", len(cands) if k is None else k, 1, len(cands))
    cands = cands[:k]
    opts = build(RequestOptions, None, response_tokens=1, cache=False)
    req = eng.submit(prefix + cands, opts, verify_from=len(prefix) - 1)
    collect(Stream(eng, req))
    argmax = req.argmax
    accepted = 0
    while accepted < k and argmax[accepted] == cands[accepted]:
        accepted += 1
    nxt = argmax[accepted]
    return {"accepted": accepted, "next": "eos" if eng.model.is_eog(nxt) else nxt}


def _prefix(eng: Any, tokens: Sequence[int]) -> list[int]:
    prefix = token_list(eng, tokens, "prefix_tokens")
    if not prefix:
        raise InvalidOption("prefix_tokens", prefix, "at least one token id")
    return prefix
