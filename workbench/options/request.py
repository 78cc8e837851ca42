"""Per-request and per-chat-call options: `RequestOptions` (complete / stream), its
`speculative=` record `SpeculativeOptions`, and `ChatOptions`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidOption
from .rules import (INT32_MAX, as_bool, as_float, as_int, as_json_object, as_json_schema, as_marker_pair, as_scope,
                    as_session_id, as_str, as_str_list, build, check_number, one_of, opt)

LOGIT_BIAS_MAX = 100.0  # OpenAI's and vLLM's bound; -inf (a ban) is allowed beyond it
MAX_LOGPROBS = 20       # alternatives per token, as OpenAI's top_logprobs and vLLM's default cap

def _tool_choice(key: str, v: Any, where: str) -> Any:
    """'auto' | 'none' | 'required' | {'type': 'function', 'function': {'name': str}}."""
    if v is None or v in ("auto", "none", "required"):
        return v
    if isinstance(v, Mapping) and v.get("type") == "function" and isinstance(v.get("function"), Mapping):
        name = v["function"].get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise InvalidOption(key, v, "'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
                        where)


def _reasoning_budget(key: str, v: Any, where: str) -> Any:
    """{'tokens': int >= 0, 'end': non-empty str, 'start': str = '', 'message': str = ''}."""
    if v is None:
        return None
    expected = ("None or {'tokens': int >= 0, 'end': non-empty str, 'start': str, 'message': str} "
                "(start '' = the reply opens inside the block)")
    if not isinstance(v, Mapping) or set(v) - {"tokens", "start", "end", "message"}:
        raise InvalidOption(key, v, expected, where)
    tokens, end = v.get("tokens"), v.get("end")
    start, message = v.get("start", ""), v.get("message", "")
    if (isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= INT32_MAX
            or not isinstance(end, str) or not end or not isinstance(start, str) or not isinstance(message, str)):
        raise InvalidOption(key, v, expected, where)
    return {"tokens": tokens, "start": start, "end": end, "message": message}


def _render_special(key: str, v: Any, where: str) -> Any:
    """False | True | a list of special-token strings."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(s, str) and s for s in v):
        return tuple(v)
    raise InvalidOption(key, v, "True, False or a list of special-token strings (e.g. ['<think>', '</think>'])",
                        where)


def _seconds(key: str, v: Any, where: str) -> Any:
    """None (no limit) or a finite number of seconds > 0."""
    if v is None:
        return None
    expected = "a number of seconds > 0, or None"
    if check_number(key, v, where=where, what=expected) <= 0:
        raise InvalidOption(key, v, expected, where)
    return float(v)


MAX_POSITIONS = 4096  # cache_boundaries: a prompt has few shared prefixes; each costs a chunk cut


def _positions(key: str, v: Any, where: str) -> Any:
    """A sequence of at most MAX_POSITIONS token positions >= 1 (ints), kept sorted and distinct."""
    if isinstance(v, (list, tuple)) and len(v) <= MAX_POSITIONS and all(
            isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= INT32_MAX for p in v):
        return tuple(sorted(set(v)))
    raise InvalidOption(key, v, f"a list of at most {MAX_POSITIONS} token positions (ints >= 1)", where)


def _logit_bias(key: str, v: Any, where: str) -> Any:
    """None or {token id (int) or token text (str): bias in [-100, 100] or -inf}. Text keys
    are resolved to one token per model when the request is submitted (request_setup)."""
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise InvalidOption(key, v, "None or a dict {token id or token text: bias}", where)
    out: dict[int | str, float] = {}
    for k, b in v.items():
        if (k == "" or not isinstance(k, (str, int)) or isinstance(k, bool)
                or (isinstance(k, int) and not 0 <= k <= INT32_MAX)):
            raise InvalidOption(f"{key} key", k, "a token id (int >= 0) or a token's text (non-empty str)", where)
        if isinstance(b, (int, float)) and not isinstance(b, bool) and b == -math.inf:
            out[k] = -math.inf
        else:
            out[k] = check_number(f"{key}[{k!r}]", b, -LOGIT_BIAS_MAX, LOGIT_BIAS_MAX, where=where,
                                  what="a bias (float('-inf') bans the token)")
    return out


REPETITION_PENALTY_RANGE = (0.01, 100.0)


def _repetition_penalty(key: str, v: Any, where: str) -> Any:
    """A number in [0.01, 100]. llama.cpp divides a seen token's positive logit by it and
    multiplies a negative one: 0 divides by zero (an infinite logit), and a bound far from 0
    keeps float32 logits finite; past either bound the effect is already total."""
    lo, hi = REPETITION_PENALTY_RANGE
    return check_number(key, v, lo, hi, where=where, what="a penalty (1.0 = off)")


_RULE_NAME = re.compile(r"[A-Za-z0-9-]+")


def _grammar_root(key: str, v: Any, where: str) -> Any:
    """A GBNF rule name (letters, digits, '-'), as llama.cpp's grammar parser reads them."""
    if not isinstance(v, str) or not _RULE_NAME.fullmatch(v):
        raise InvalidOption(key, v, "a GBNF rule name (letters, digits and '-'), e.g. 'root'", where)
    return v


NGRAM_KINDS = {"simple": "ngram-simple", "map_k": "ngram-map-k", "map_k4v": "ngram-map-k4v", "cache": "ngram-cache"}


@dataclass(slots=True, frozen=True)
class SpeculativeOptions:
    """The ``speculative=`` request option: drafts from llama.cpp's n-gram drafters or from
    a loaded draft model (its greedy reply), verified by the target in the scheduler's batch."""

    ngram: str | None = opt(None, one_of(*NGRAM_KINDS), "self-speculation from the prompt and reply so far")
    draft: str | None = opt(None, as_str(), "a loaded draft model's id")
    n_max: int = opt(16, as_int(1, 256), "most draft tokens per step")
    adaptive: bool = opt(True, as_bool, "draft length from measured acceptance and costs, off when it does not "
                                         "pay (engine/spec_policy.py); False = always n_max")
    n_min: int = opt(0, as_int(0, 256), "a shorter draft is not verified")
    size_n: int = opt(12, as_int(1, 1024), "n-gram drafters: tokens of the key looked up (llama.cpp's default)")
    size_m: int = opt(48, as_int(1, 1024), "n-gram drafters: tokens of the m-gram drafted (llama.cpp's default)")
    min_hits: int = opt(1, as_int(1, 1024), "map_k / map_k4v: times a key must have been seen")
    p_min: float = opt(0.0, as_float(0.0, 1.0), "draft model: a draft ends before a token the draft model "
                                                "gives less than this probability (llama.cpp's draft-simple)")


def _speculative(key: str, v: Any, where: str) -> Any:
    """None or a dict of SpeculativeOptions with exactly one of 'ngram' and 'draft'."""
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise InvalidOption(key, v, "None or a dict such as {'ngram': 'simple'} or {'draft': '<model id>'}", where)
    spec = build(SpeculativeOptions, v, "speculative option")
    if (spec.ngram is None) == (spec.draft is None):
        raise InvalidOption(key, dict(v), "exactly one of 'ngram' (simple, map_k, map_k4v, cache) and 'draft'", where)
    if spec.p_min > 0.0 and spec.draft is None:
        raise InvalidOption("p_min", spec.p_min, "0 with 'ngram' (n-gram drafts have no probabilities)",
                            "speculative option")
    if spec.n_min > spec.n_max:
        raise InvalidOption("n_min", spec.n_min, f"at most n_max ({spec.n_max})", "speculative option")
    return spec


@dataclass(slots=True, frozen=True)
class RequestOptions:
    """Per-request options of complete / stream."""

    response_tokens: int = opt(64, as_int(0), "most tokens to generate")
    temperature: float = opt(0.0, as_float(0.0), "0 = greedy")
    top_k: int = opt(40, as_int(0), "0 = off")
    top_p: float = opt(1.0, as_float(0.0, 1.0))
    min_p: float = opt(0.0, as_float(0.0, 1.0))
    repetition_penalty: float = opt(1.0, _repetition_penalty, "1.0 = off; > 1 discourages repeats, < 1 favours them")
    repeat_last_n: int = opt(64, as_int(-1))
    seed: int | None = opt(None, as_int(0, 2**32 - 2, none_ok=True), "None = a fresh random seed")
    stop_sequences: tuple[str, ...] = opt((), as_str_list)
    grammar: str | None = opt(None, as_str())
    grammar_root: str = opt("root", _grammar_root, "the grammar's start rule (only with grammar)")
    json_schema: str | None = opt(None, as_json_schema, "constrain output to a JSON schema (dict or text)")
    ignore_eos: bool = opt(False, as_bool, "never sample end-of-generation tokens (benchmarks)")
    min_tokens: int = opt(0, as_int(0), "no end-of-generation token before this many tokens (vLLM's)")
    frequency_penalty: float = opt(0.0, as_float(-2.0, 2.0), "minus this times a token's count so far")
    presence_penalty: float = opt(0.0, as_float(-2.0, 2.0), "minus this once a token has appeared")
    logit_bias: dict[int | str, float] | None = opt(None, _logit_bias,
                                                     "{token id or text: bias}, added to its logit; -inf bans")
    logprobs: int | None = opt(None, as_int(0, MAX_LOGPROBS, none_ok=True),
                               "each token's logprob and the N most likely tokens (None = off)")
    render_special: bool | tuple[str, ...] = opt(False, _render_special,
                                                 "show special tokens' text in the reply: True = all, or these")
    reasoning_budget: dict[str, Any] | None = opt(None, _reasoning_budget,
                                                  "after 'tokens' tokens inside start..end, force "
                                                  "message + end into the reply (llama.cpp's budget sampler)")
    session_id: str | int | None = opt(None, as_session_id, "pin a sequence to this conversation")
    on_full: str = opt("block", one_of("block", "error"), "no free sequence: queue, or raise SeqCapacity")
    cache: bool = opt(True, as_bool, "look up and save KV prefix cache rows for this request")
    cache_scope: str = opt("default", as_scope, "tenant: rows are never shared across scopes")
    parent_key: str | None = opt(None, as_str(), "resume from this row (a previous finish_key)")
    prefix_checkpoint_len: int | None = opt(None, as_int(1, none_ok=True),
                                            "save a pinned agent_prefix row at exactly this many tokens")
    cache_boundaries: tuple[int, ...] = opt((), _positions,
                                            "where shared prefixes end (chat: the system prompt's; set by wb.chat): "
                                            "chunk storage ends a chunk there, so they are stored once")
    add_special: bool = opt(True, as_bool, "text prompts: add BOS as the vocab says")
    parse_special: bool = opt(True, as_bool, "text prompts: parse special tokens in the text")
    speculative: SpeculativeOptions | None = opt(None, _speculative, "speculative decoding (docs/speculative.md)")
    timeout_s: float | None = opt(None, _seconds, "cancel with RequestTimeout past this long from submission "
                                                  "(queue wait included); None = no limit")
    token_timeout_s: float | None = opt(None, _seconds, "cancel with RequestTimeout when the next token takes longer "
                                                        "(the first: from admission, prefill included)")


def _thinking_switch(key: str, v: Any, where: str) -> Any:
    """True / False, or chat's spelling 'enabled' / 'disabled'."""
    if isinstance(v, bool):
        return v
    if v in ("enabled", "disabled"):
        return v == "enabled"
    raise InvalidOption(key, v, "True or False (or 'enabled' / 'disabled')", where)


@dataclass(slots=True, frozen=True)
class ThinkingOptions:
    """Thinking on a raw stream() / complete() (chat has its own, in ChatOptions): the
    facade splits the reply's reasoning block into Thinking / ThinkingEnd events."""

    thinking: bool = opt(False, _thinking_switch, "split the reasoning block out as Thinking / ThinkingEnd")
    thinking_budget_tokens: int | None = opt(None, as_int(0, none_ok=True),
                                             "close the block after this many tokens (sets reasoning_budget)")
    thinking_markers: dict[str, str] | None = opt(None, as_marker_pair,
                                                  "{'start', 'end'}; None = the load option's, else the template's")


@dataclass(slots=True, frozen=True)
class ChatOptions:
    """Per-call options of chat / chat_stream / render_chat_template (beside RequestOptions)."""

    tool_choice: str | dict[str, Any] | None = opt(None, _tool_choice,
                                                    "'auto' (None), 'none', 'required' or one named function")
    parallel_tool_calls: bool = opt(False, as_bool, "let the template's grammar allow several calls")
    tool_call_prefill: bool = opt(True, as_bool, "tool_choice 'required' or named: open the reply with the "
                                               "template's call marker, so it is a call, not text first")
    add_generation_prompt: bool = opt(True, as_bool, "end the prompt with the assistant turn's header")
    continue_final_message: bool = opt(False, as_bool,
                                       "the last (assistant) message is a prefix the reply continues")
    chat_template_kwargs: dict[str, Any] | None = opt(None, as_json_object, "extra variables for the template")
    chat_template: str | None = opt(None, as_str(), "a jinja template to use instead of the model's")
    thinking: str = opt("disabled", one_of("enabled", "disabled"),
                        "enabled: ask the template to think and stream Thinking events")
    thinking_budget_tokens: int | None = opt(None, as_int(0, none_ok=True),
                                             "close the thinking block after this many tokens")
