"""A request's native settings from its options: which special tokens it shows, the token
form of its reasoning budget and of its logit_bias, its sampler chain's parameters. Pure functions of the model's
vocabulary and the options; the engine calls them when a request is submitted or admitted.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidOption
from ..options import RequestOptions
from .request import Request
from .tokens import at_least


def special_ids(model: Any, render: bool | tuple[str, ...]) -> bool | frozenset[int]:
    """render_special as the loop uses it: a bool, or the ids whose text is shown."""
    if isinstance(render, bool):
        return render
    ids = set()
    for s in render:
        t = model.tokenize(s, False, True)
        if len(t) != 1 or model.token_to_piece(t[0], False) == model.token_to_piece(t[0], True):
            raise InvalidOption("render_special", list(render), f"special tokens of this model ({s!r} is not one)")
        ids.add(t[0])
    return frozenset(ids)


def reasoning_budget(model: Any, opts: RequestOptions, prompt: list[int]) -> dict[str, Any] | None:
    """The budget sampler's token sequences. A prompt that ends with the start marker
    (the template opened the block) starts the count at the first generated token, as
    the thinking splitter does."""
    rb = opts.reasoning_budget
    if rb is None:
        return None

    def tok(s: str) -> list[int]:
        return model.tokenize(s, False, True) if s else []

    end = tok(rb["end"])
    if not end:
        raise InvalidOption("reasoning_budget", rb, "an end marker that tokenizes to at least one token")
    tail = model.detokenize(prompt[-16:], False, True).decode("utf-8", "replace").rstrip()
    return {"budget": rb["tokens"], "start": tok(rb["start"]), "end": end, "forced": tok(rb["message"]) + end,
            "inside": not rb["start"] or tail.endswith(rb["start"])}


def logit_bias_ids(model: Any, opts: RequestOptions) -> list[tuple[int, float]]:
    """logit_bias as (token id, bias) pairs: an id must be in the vocabulary, a text must be
    exactly one token (special tokens by their text, e.g. '<|im_end|>'), each token once."""
    if not opts.logit_bias:
        return []
    if len(opts.logit_bias) > model.n_vocab:  # some token would be named twice: refused before tokenising
        raise InvalidOption("logit_bias", f"{len(opts.logit_bias)} entries",
                            f"at most {model.n_vocab} entries (the vocabulary)")
    out: dict[int, float] = {}
    for key, bias in opts.logit_bias.items():
        if isinstance(key, int):
            if key >= model.n_vocab:
                raise InvalidOption("logit_bias key", key, f"a token id of this model (0 to {model.n_vocab - 1})")
            tid = key
        else:
            ids = model.tokenize(key, False, True) if at_least(model, key) <= 1 else []
            if len(ids) != 1:
                raise InvalidOption("logit_bias key", key, "a text that is exactly one token of this model "
                                    f"(it is {len(ids) or 'more than one'}; give token ids instead)")
            tid = ids[0]
        if tid in out:
            raise InvalidOption("logit_bias key", key, f"each token once (token {tid} is named twice)")
        out[tid] = bias
    return list(out.items())


def sampler_params(req: Request) -> dict[str, Any]:
    o = req.opts
    return {
        "temperature": o.temperature,
        "top_k": o.top_k,
        "top_p": o.top_p,
        "min_p": o.min_p,
        "repetition_penalty": o.repetition_penalty,
        "repeat_last_n": o.repeat_last_n,
        "seed": req.seed,
        "grammar_proto": req.grammar,
        "reasoning_budget": req.reasoning_budget,
        "ignore_eos": o.ignore_eos,
        "min_tokens": o.min_tokens,
        "frequency_penalty": o.frequency_penalty,
        "presence_penalty": o.presence_penalty,
        "logit_bias": req.logit_bias,
        "logprobs": o.logprobs,
    }
