"""Validated option and config records.

Each record is a frozen dataclass built from a plain dict by :func:`build`, which tells an
unknown key (:class:`~workbench.errors.UnknownOption`) from a value of the wrong type or
range (:class:`~workbench.errors.InvalidOption`) and names both. Defaults follow erllama
0.10 where it has one (``response_tokens`` = 64).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from .errors import InvalidOption, UnknownOption

T = TypeVar("T")

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def default_threads() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# --- shared value rules: the one definition of each, for records and facade arguments ------

INT32_MAX = 2**31 - 1  # llama.cpp takes counts as int32 / uint32: nothing larger reaches it


@overload
def check_int(key: str, v: Any, lo: int | None = ..., hi: int | None = ..., *, none_ok: Literal[False] = ...,
              where: str = ...) -> int: ...
@overload
def check_int(key: str, v: Any, lo: int | None = ..., hi: int | None = ..., *, none_ok: bool,
              where: str = ...) -> int | None: ...
def check_int(key: str, v: Any, lo: int | None = None, hi: int | None = INT32_MAX, *, none_ok: bool = False,
              where: str = "argument") -> int | None:
    """An int (not a bool) in [lo, hi], or None when ``none_ok``; else InvalidOption."""
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise InvalidOption(key, v, _rng("an integer", lo, hi) + (" or None" if none_ok else ""), where)
    return v


@overload
def check_number(key: str, v: Any, lo: float | None = ..., hi: float | None = ..., *,
                 none_ok: Literal[False] = ..., where: str = ..., what: str = ...) -> float: ...
@overload
def check_number(key: str, v: Any, lo: float | None = ..., hi: float | None = ..., *, none_ok: bool,
                 where: str = ..., what: str = ...) -> float | None: ...
def check_number(key: str, v: Any, lo: float | None = None, hi: float | None = None, *, none_ok: bool = False,
                 where: str = "argument", what: str = "a finite number") -> float | None:
    """A finite int or float (not a bool, nan or inf) in [lo, hi], as a float; or None."""
    if v is None and none_ok:
        return None
    expected = _rng(what, lo, hi) + (" or None" if none_ok else "")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidOption(key, v, expected, where)
    try:
        f = float(v)
    except OverflowError:
        raise InvalidOption(key, v, expected, where) from None
    if not math.isfinite(f) or (lo is not None and f < lo) or (hi is not None and f > hi):
        raise InvalidOption(key, v, expected, where)
    return f


def check_bool(key: str, v: Any, where: str = "argument") -> bool:
    if not isinstance(v, bool):
        raise InvalidOption(key, v, "True or False", where)
    return v


def check_scope(key: str, v: Any, where: str = "argument") -> str:
    """A cache scope (tenant): a non-empty string."""
    if not isinstance(v, str) or not v:
        raise InvalidOption(key, v, "a non-empty string (a cache scope)", where)
    return v


def check_session_id(key: str, v: Any, where: str = "argument", none_ok: bool = False) -> Any:
    """A session id: a str or an int (not a bool); None too when ``none_ok``."""
    if (v is None and none_ok) or (isinstance(v, (str, int)) and not isinstance(v, bool)):
        return v
    raise InvalidOption(key, v, "a string or an int" + (" or None" if none_ok else ""), where)


# --- field checkers: each returns the normalised value or raises InvalidOption ------------

def _int(lo: int | None = None, hi: int | None = INT32_MAX, none_ok: bool = False) -> Callable[[str, Any, str], Any]:
    return lambda key, v, where: check_int(key, v, lo, hi, none_ok=none_ok, where=where)


def _float(lo: float | None = None, hi: float | None = None) -> Callable[[str, Any, str], Any]:
    return lambda key, v, where: check_number(key, v, lo, hi, where=where)


def _bool(key: str, v: Any, where: str) -> Any:
    return check_bool(key, v, where)


def _choice(*choices: str) -> Callable[[str, Any, str], Any]:
    def check(key: str, v: Any, where: str) -> Any:
        if not isinstance(v, str) or v not in choices:
            raise InvalidOption(key, v, "one of " + ", ".join(repr(c) for c in choices), where)
        return v
    return check


def _str(none_ok: bool = True) -> Callable[[str, Any, str], Any]:
    def check(key: str, v: Any, where: str) -> Any:
        if v is None and none_ok:
            return None
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise InvalidOption(key, v, "a string" + (" or None" if none_ok else ""), where)
        return v
    return check


def _session_id(key: str, v: Any, where: str) -> Any:
    return check_session_id(key, v, where, none_ok=True)


def _scope(key: str, v: Any, where: str) -> Any:
    return check_scope(key, v, where)


def _json_schema(key: str, v: Any, where: str) -> Any:
    """A JSON schema as a dict (or JSON text); kept as canonical JSON text."""
    import json

    if v is None:
        return None
    try:
        if isinstance(v, str):
            v = json.loads(v)
        if not isinstance(v, (dict, bool)):
            raise InvalidOption(key, v, "a JSON schema (dict or JSON text)", where)
        return json.dumps(v, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise InvalidOption(key, "...", "a schema nested less deeply (Python's JSON recursion limit)", where) from None
    except (ValueError, TypeError) as e:  # not JSON text; nan / inf, bytes, sets, non-string keys in a dict
        raise InvalidOption(key, v, f"valid JSON ({e})", where) from None


def _str_list(key: str, v: Any, where: str) -> Any:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) and s for s in v):
        raise InvalidOption(key, v, "a list of non-empty strings", where)
    return tuple(v)


def _thinking_markers(key: str, v: Any, where: str) -> Any:
    """{'start': str, 'end': str}; both non-empty. Kept as a plain dict copy."""
    if v is None:
        return None
    expected = "a dict {'start': str, 'end': str} of non-empty strings, or None"
    if not isinstance(v, Mapping) or set(v) != {"start", "end"}:
        raise InvalidOption(key, v, expected, where)
    if not all(isinstance(v[k], str) and v[k] for k in ("start", "end")):
        raise InvalidOption(key, v, expected, where)
    return {"start": v["start"], "end": v["end"]}


def _signing_key(key: str, v: Any, where: str) -> Any:
    if v is None:
        return None
    if isinstance(v, str):
        v = v.encode("utf-8")
    if not isinstance(v, (bytes, bytearray)) or not v:
        raise InvalidOption(key, "<hidden>", "non-empty bytes or str, or None", where)
    return bytes(v)


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


def _json_object(key: str, v: Any, where: str) -> Any:
    import json

    if v is None:
        return None
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise InvalidOption(key, v, "a dict with string keys", where)
    try:
        json.dumps(dict(v))
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidOption(key, v, f"JSON-serialisable values ({e})", where) from None
    return dict(v)


BATCH_STRATEGIES = ("decode_first", "prefill_first", "round_robin")


def _batch_strategy(key: str, v: Any, where: str) -> Any:
    """A built-in strategy's name, or an object with a callable ``plan(active, budget)``
    (workbench.engine.scheduler.BatchStrategy)."""
    if isinstance(v, str) and v in BATCH_STRATEGIES:
        return v
    try:
        plan = None if isinstance(v, str) else getattr(v, "plan", None)
    except Exception:  # a user's object whose attribute lookup raises
        plan = None
    if not callable(plan):
        raise InvalidOption(key, v, "one of " + ", ".join(repr(c) for c in BATCH_STRATEGIES)
                            + ", or an object with a plan(active, budget) method", where)
    return v


def _rng(what: str, lo: Any, hi: Any) -> str:
    if lo is not None and hi is not None:
        return f"{what} in [{lo}, {hi}]"
    if lo is not None:
        return f"{what} >= {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what


def opt(default: Any, check: Callable[[str, Any, str], Any], doc: str = "") -> Any:
    """A dataclass field carrying its checker in metadata."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"check": check, "doc": doc})
    return field(default=default, metadata={"check": check, "doc": doc})


def build(cls: type[T], values: Mapping[str, Any] | None, where: str = "option", **extra: Any) -> T:
    """Build record ``cls`` from ``values`` (+ keyword overrides), validating every key."""
    merged: dict[str, Any] = dict(values or {})
    merged.update(extra)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    for key, value in merged.items():
        if not isinstance(key, str) or key not in fields:
            raise UnknownOption(str(key), list(fields), where)
        out[key] = fields[key].metadata["check"](key, value, where)
    return cls(**out)


def option_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(slots=True, frozen=True)
class LoadConfig:
    """What ``load_model`` accepts. Context options change the KV layout and are fixed per load."""

    model_path: str | None = opt(None, _str(), "GGUF file; None loads the default model")
    model_id: str | None = opt(None, _str(), "id to register the model under; derived from the file name")
    n_ctx: int | None = opt(None, _int(16, none_ok=True), "context tokens; None = min(n_ctx_train, 8192)")
    n_batch: int = opt(2048, _int(1), "most tokens one decode may carry (all sequences together)")
    n_ubatch: int = opt(512, _int(1), "physical micro-batch")
    n_seq_max: int = opt(4, _int(1, 256), "concurrent sequences")
    n_threads: int | None = opt(None, _int(1, 512, none_ok=True),
                                "threads (ggml's limit: 512); None = cores this process may use")
    n_threads_batch: int | None = opt(None, _int(1, 512, none_ok=True), "prefill threads; None = n_threads")
    flash_attn: str = opt("auto", _choice("auto", "on", "off"))
    type_k: str = opt("f16", _choice(*KV_CACHE_TYPES), "K cache type")
    type_v: str = opt("f16", _choice(*KV_CACHE_TYPES), "V cache type (quantised needs flash_attn)")
    n_gpu_layers: int = opt(-1, _int(-1), "layers to offload on a GPU build (-1 = all); ignored on CPU")
    use_mmap: bool = opt(True, _bool)
    decode_budget_ms: int = opt(30000, _int(0), "wall-clock bound of one native step; 0 = off")
    max_queue: int = opt(64, _int(0), "requests waiting for a sequence before QueueFull")
    prefill_chunk_size: int | None = opt(-1, _int(-1, none_ok=True),
                                         "one prompt's share of a tick; -1 = max(64, n_batch/4), None = off")
    cache: bool = opt(True, _bool, "use the shared KV prefix cache (restore at admission, save rows)")
    cache_min_tokens: int = opt(16, _int(1), "shortest prefix worth a row")
    cold_checkpoint_interval: int | None = opt(2048, _int(64, none_ok=True),
                                               "checkpoint a long cold prefill every N tokens; None = off")
    cold_min_tokens: int = opt(0, _int(0), "no cold checkpoint before this position")
    cold_max_tokens: int | None = opt(None, _int(1, none_ok=True),
                                      "no cold checkpoint past this position; None = no bound")
    evict_save_timeout_ms: int = opt(30000, _int(0), "bound on evict()/shutdown() saves")
    batch_strategy: Any = field(default="decode_first", compare=False, metadata={
        "check": _batch_strategy, "doc": "which rows each decode carries: 'decode_first', 'prefill_first', "
                                        "'round_robin', or an object with plan(active, budget)"})

    thinking_markers: dict[str, str] | None = opt(None, _thinking_markers,
                                                  "{'start', 'end'} of reasoning blocks; None = the template's")
    thinking_signing_key: bytes | None = field(default=None, repr=False, metadata={
        "check": _signing_key, "doc": "HMAC-SHA256 key signing thinking blocks; None = unsigned ('')"})
    embed_n_ctx: int | None = opt(None, _int(8, none_ok=True),
                                  "tokens one embedding decode holds; None = min(n_ctx_train, 2048)")
    embed_n_seq_max: int = opt(16, _int(1, 256), "sequences packed into one embedding decode")

    def __post_init__(self) -> None:
        if self.cold_max_tokens is not None and self.cold_max_tokens < self.cold_min_tokens:
            raise InvalidOption("cold_max_tokens", self.cold_max_tokens,
                                f"None or >= cold_min_tokens ({self.cold_min_tokens})", "config")
        _check_batch(self.n_ctx, self.n_batch, self.n_seq_max)
        if self.embed_n_ctx is not None:
            _check_embed(self.embed_n_ctx, self.embed_n_seq_max)

    def context_params(self, n_ctx_train: int) -> dict[str, Any]:
        """The generation context's parameters for a model trained on ``n_ctx_train`` tokens,
        relations checked with the resolved n_ctx (InvalidOption)."""
        params = context_params(self, n_ctx_train)
        _check_batch(params["n_ctx"], self.n_batch, self.n_seq_max, "" if self.n_ctx else "the model's default")
        return params

    def embed_params(self, n_ctx_train: int) -> tuple[int, int]:
        """(n_ctx, n_seq_max) of an embedding context, relation checked (InvalidOption)."""
        n_ctx, n_seq = embed_params(self, n_ctx_train)
        _check_embed(n_ctx, n_seq)
        return n_ctx, n_seq


DEFAULT_N_CTX = 8192
DEFAULT_EMBED_N_CTX = 2048


def context_params(cfg: Any, n_ctx_train: int) -> dict[str, Any]:
    """What ``_native.Context`` gets for ``cfg`` (a LoadConfig, or an object with its context
    fields: the model probe's child passes them unchecked), defaults resolved."""
    n_threads = cfg.n_threads or default_threads()
    return {"n_ctx": cfg.n_ctx or min(n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX), "n_batch": cfg.n_batch,
            "n_ubatch": min(cfg.n_ubatch, cfg.n_batch), "n_seq_max": cfg.n_seq_max, "n_threads": n_threads,
            "n_threads_batch": cfg.n_threads_batch or n_threads, "flash_attn": cfg.flash_attn,
            "type_k": cfg.type_k, "type_v": cfg.type_v}


def embed_params(cfg: Any, n_ctx_train: int) -> tuple[int, int]:
    """(n_ctx, n_seq_max) of ``cfg``'s embedding contexts, defaults resolved."""
    return cfg.embed_n_ctx or min(n_ctx_train or DEFAULT_EMBED_N_CTX, DEFAULT_EMBED_N_CTX), cfg.embed_n_seq_max


def _check_batch(n_ctx: int | None, n_batch: int, n_seq_max: int, n_ctx_is: str = "") -> None:
    """llama.cpp reserves one output row per sequence in a batch of min(n_ctx, n_batch) rows
    (llama_context: n_batch = min(n_ctx, n_batch) for causal models, n_outputs_max = n_batch,
    then output_reserve(n_seq_max) asserts n_seq_max <= n_outputs_max: the process aborts)."""
    if n_seq_max > n_batch:
        raise InvalidOption("n_batch", n_batch, f"at least n_seq_max ({n_seq_max}): llama.cpp needs a batch row "
                            "per sequence", "config")
    if n_ctx is not None and n_seq_max > n_ctx:
        raise InvalidOption("n_ctx", n_ctx, f"at least n_seq_max ({n_seq_max}): llama.cpp needs a batch row "
                            "per sequence, and a batch holds at most n_ctx rows"
                            + (f" ({n_ctx_is})" if n_ctx_is else ""), "config")


def _check_embed(n_ctx: int, n_seq_max: int) -> None:
    """An embedding context is one micro-batch of n_ctx tokens over n_seq_max sequences;
    llama.cpp's graph reserve rounds the micro-batch up to a multiple of n_seq_max while the
    output rows stay n_ctx, and mean pooling then fails ggml_can_mul_mat (an abort)."""
    if n_ctx % n_seq_max:
        up = -(-n_ctx // n_seq_max) * n_seq_max
        raise InvalidOption("embed_n_ctx", n_ctx, f"a multiple of embed_n_seq_max ({n_seq_max}), e.g. {up}: "
                            "llama.cpp splits the embedding batch evenly across its sequences", "config")

NGRAM_KINDS = {"simple": "ngram-simple", "map_k": "ngram-map-k", "map_k4v": "ngram-map-k4v", "cache": "ngram-cache"}


@dataclass(slots=True, frozen=True)
class SpeculativeOptions:
    """The ``speculative=`` request option: drafts from llama.cpp's n-gram drafters or from
    a loaded draft model (its greedy reply), verified by the target in the scheduler's batch."""

    ngram: str | None = opt(None, _choice(*NGRAM_KINDS), "self-speculation from the prompt and reply so far")
    draft: str | None = opt(None, _str(), "a loaded draft model's id")
    n_max: int = opt(16, _int(1, 256), "most draft tokens per step")
    n_min: int = opt(0, _int(0, 256), "a shorter draft is not verified")
    size_n: int = opt(12, _int(1, 1024), "n-gram drafters: tokens of the key looked up (llama.cpp's default)")
    size_m: int = opt(48, _int(1, 1024), "n-gram drafters: tokens of the m-gram drafted (llama.cpp's default)")
    min_hits: int = opt(1, _int(1, 1024), "map_k / map_k4v: times a key must have been seen")


def _speculative(key: str, v: Any, where: str) -> Any:
    """None or a dict of SpeculativeOptions with exactly one of 'ngram' and 'draft'."""
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise InvalidOption(key, v, "None or a dict such as {'ngram': 'simple'} or {'draft': '<model id>'}", where)
    spec = build(SpeculativeOptions, v, "speculative option")
    if (spec.ngram is None) == (spec.draft is None):
        raise InvalidOption(key, dict(v), "exactly one of 'ngram' (simple, map_k, map_k4v, cache) and 'draft'", where)
    if spec.n_min > spec.n_max:
        raise InvalidOption("n_min", spec.n_min, f"at most n_max ({spec.n_max})", "speculative option")
    return spec


@dataclass(slots=True, frozen=True)
class RequestOptions:
    """Per-request options of complete / stream."""

    response_tokens: int = opt(64, _int(0), "most tokens to generate")
    temperature: float = opt(0.0, _float(0.0), "0 = greedy")
    top_k: int = opt(40, _int(0), "0 = off")
    top_p: float = opt(1.0, _float(0.0, 1.0))
    min_p: float = opt(0.0, _float(0.0, 1.0))
    repetition_penalty: float = opt(1.0, _float(0.0))
    repeat_last_n: int = opt(64, _int(-1))
    seed: int | None = opt(None, _int(0, 2**32 - 2, none_ok=True), "None = a fresh random seed")
    stop_sequences: tuple[str, ...] = opt((), _str_list)
    grammar: str | None = opt(None, _str())
    json_schema: str | None = opt(None, _json_schema, "constrain output to a JSON schema (dict or text)")
    ignore_eos: bool = opt(False, _bool, "never sample end-of-generation tokens (benchmarks)")
    render_special: bool | tuple[str, ...] = opt(False, _render_special,
                                                 "show special tokens' text in the reply: True = all, or these")
    reasoning_budget: dict[str, Any] | None = opt(None, _reasoning_budget,
                                                  "after 'tokens' tokens inside start..end, force "
                                                  "message + end into the reply (llama.cpp's budget sampler)")
    session_id: str | int | None = opt(None, _session_id, "pin a sequence to this conversation")
    on_full: str = opt("block", _choice("block", "error"), "no free sequence: queue, or raise SeqCapacity")
    cache: bool = opt(True, _bool, "look up and save KV prefix cache rows for this request")
    cache_scope: str = opt("default", _scope, "tenant: rows are never shared across scopes")
    parent_key: str | None = opt(None, _str(), "resume from this row (a previous finish_key)")
    prefix_checkpoint_len: int | None = opt(None, _int(1, none_ok=True),
                                            "save a pinned agent_prefix row at exactly this many tokens")
    add_special: bool = opt(True, _bool, "text prompts: add BOS as the vocab says")
    parse_special: bool = opt(True, _bool, "text prompts: parse special tokens in the text")
    speculative: SpeculativeOptions | None = opt(None, _speculative, "speculative decoding (docs/speculative.md)")


@dataclass(slots=True, frozen=True)
class ChatOptions:
    """Per-call options of chat / chat_stream / render_chat_template (beside RequestOptions)."""

    tool_choice: str | dict[str, Any] | None = opt(None, _tool_choice,
                                                    "'auto' (None), 'none', 'required' or one named function")
    parallel_tool_calls: bool = opt(False, _bool, "let the template's grammar allow several calls")
    tool_call_prefill: bool = opt(True, _bool, "tool_choice 'required' or named: open the reply with the "
                                               "template's call marker, so it is a call, not text first")
    add_generation_prompt: bool = opt(True, _bool, "end the prompt with the assistant turn's header")
    continue_final_message: bool = opt(False, _bool,
                                       "the last (assistant) message is a prefix the reply continues")
    chat_template_kwargs: dict[str, Any] | None = opt(None, _json_object, "extra variables for the template")
    chat_template: str | None = opt(None, _str(), "a jinja template to use instead of the model's")
    thinking: str = opt("disabled", _choice("enabled", "disabled"),
                        "enabled: ask the template to think and stream Thinking events")
    thinking_budget_tokens: int | None = opt(None, _int(0, none_ok=True),
                                             "close the thinking block after this many tokens")
