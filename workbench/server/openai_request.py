"""OpenAI request bodies as workbench calls.

Each route's body becomes a `Call`: the model, the prompts (completions) or messages (chat),
n, streaming, and the keyword options of ``wb.stream`` / ``wb.chat_stream``, with ``names``
mapping each workbench option back to the field the client sent, so every 400 names the
client's own field. The values themselves are checked once, by the workbench's option
records (workbench/options); this module checks only what is OpenAI's alone (types of n,
stream, echo, prompt, messages) and says which fields it does not serve.

Defaults are OpenAI's where OpenAI has one (temperature 1, top_p 1, top_k off, max_tokens 16
for completions and "until the end of generation or the context" for chat); workbench options
go in the ``workbench`` field (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..samples import MAX_SAMPLES
from .http_errors import PROMPT, ApiError, bad_field

MAX_N = MAX_SAMPLES     # choices per request (each is a request of its own on the engine)
MAX_BATCH_PROMPTS = 64  # prompts in one /v1/completions body
MAX_EMBEDDING_INPUTS = 2048  # inputs in one /v1/embeddings body (OpenAI's cap)

# OpenAI's field -> the workbench option it sets (both routes)
SAMPLING = {
    "max_tokens": "response_tokens", "temperature": "temperature", "top_p": "top_p", "seed": "seed",
    "stop": "stop_sequences", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    # beyond OpenAI, under the names vLLM and llama-server use
    "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
    "ignore_eos": "ignore_eos", "grammar": "grammar", "repeat_last_n": "repeat_last_n",
}
IGNORED = ("user", "metadata", "store", "service_tier")  # accepted, no effect here
COMMON = ("model", "n", "stream", "stream_options", "workbench") + IGNORED
COMPLETION_FIELDS = COMMON + tuple(SAMPLING) + ("prompt", "logprobs", "echo", "best_of", "suffix")
CHAT_FIELDS = COMMON + tuple(SAMPLING) + (
    "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "logprobs", "top_logprobs",
    "max_completion_tokens", "chat_template_kwargs")
EMBEDDING_FIELDS = ("model", "input", "encoding_format", "dimensions", "user", "workbench")
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


@dataclass
class Call:
    """One OpenAI request, ready for the engine."""

    model: str
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    prompts: list[Any] = field(default_factory=list)      # completions: text or token ids, each
    messages: list[Any] = field(default_factory=list)     # chat
    tools: list[Any] | None = None
    tool_choice: Any = None
    opts: dict[str, Any] = field(default_factory=dict)    # keyword options of wb.stream / wb.chat_stream
    names: dict[str, str] = field(default_factory=dict)   # workbench option -> the client's field
    logprobs: int | None = None                           # alternatives asked for (None: no logprobs)
    best_of: int | None = None                            # completions: samples per prompt, the best n returned

    @property
    def samples(self) -> int:
        """Requests per prompt: best_of, else n."""
        return self.best_of or self.n


def completion_call(body: Mapping[str, Any], scope: str | None) -> Call:
    _known(body, COMPLETION_FIELDS)
    call = _common(body, scope)
    call.prompts = _prompts(body.get("prompt"))
    call.names.update({PROMPT: "prompt", "tokens": "prompt"})  # "tokens": detokenising an echo
    call.echo = _bool(body, "echo", False)
    if body.get("suffix") not in (None, ""):
        raise ApiError(400, "'suffix' (insertion) is not served: the default models have no fill-in-the-middle "
                       "template", param="suffix", code="unsupported")
    best_of = body.get("best_of")
    if best_of is not None:
        if isinstance(best_of, bool) or not isinstance(best_of, int) or not call.n <= best_of <= MAX_N:
            raise bad_field("best_of", best_of, f"absent or an integer from n ({call.n}) to {MAX_N}")
        if call.stream and best_of != call.n:
            raise bad_field("best_of", best_of, f"absent or equal to n ({call.n}) with stream: the best "
                            "choices are known only at the end")
        call.best_of = best_of if best_of > call.n else None
    lp = body.get("logprobs")
    if lp is not None:
        _set(call, "logprobs", lp, "logprobs")
        call.logprobs = lp if isinstance(lp, int) and not isinstance(lp, bool) else None
    call.opts.setdefault("response_tokens", 16)
    return call


def chat_call(body: Mapping[str, Any], scope: str | None, n_ctx: int) -> Call:
    _known(body, CHAT_FIELDS)
    call = _common(body, scope)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", messages, "a non-empty list of messages")
    call.messages = messages
    call.names[PROMPT] = "messages"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_field("tools", tools, "a list of tools")
    call.tools, call.tool_choice = tools or None, body.get("tool_choice")
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise bad_field("max_tokens", body["max_tokens"], "absent when max_completion_tokens is given")
        _set(call, "response_tokens", body["max_completion_tokens"], "max_completion_tokens")
    call.opts.setdefault("response_tokens", n_ctx)  # until end of generation or the context is full
    for key in ("parallel_tool_calls", "chat_template_kwargs"):
        if body.get(key) is not None:
            _set(call, key, body[key], key)
    _response_format(call, body.get("response_format"))
    _chat_logprobs(call, body)
    return call


def embedding_call(body: Mapping[str, Any]) -> tuple[str, list[Any], str, int | None]:
    """(model, inputs, encoding_format, dimensions)."""
    _known(body, EMBEDDING_FIELDS)
    model = _model(body)
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(_is_token(t) for t in raw)):
        inputs: list[Any] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) or _token_list(x) for x in raw):
        inputs = list(raw)
    else:
        raise bad_field("input", raw, "a string, a list of strings, a list of token ids or a list of those")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise bad_field("input", f"<{len(inputs)} inputs>", f"at most {MAX_EMBEDDING_INPUTS} inputs (OpenAI's limit)")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad_field("encoding_format", fmt, "'float' or 'base64'")
    if body.get("workbench") not in (None, {}):
        raise bad_field("workbench", body["workbench"], "absent: embeddings take no workbench options")
    dims = body.get("dimensions")
    if dims is not None and (not _is_token(dims) or dims < 1):
        raise bad_field("dimensions", dims, "a positive integer (the model's embedding size)")
    return model, inputs, fmt, dims


# --- the pieces --------------------------------------------------------------------------------

def _known(body: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"unknown field {key!r} for this route; known: {', '.join(sorted(allowed))}",
                           param=key, code="unknown_field")


def _common(body: Mapping[str, Any], scope: str | None) -> Call:
    call = Call(model=_model(body))
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise bad_field("n", n, f"an integer from 1 to {MAX_N}")
    call.n = n
    call.stream = _bool(body, "stream", False)
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict) or set(so) - {"include_usage", "continuous_usage_stats"}:
            raise bad_field("stream_options", so, "{'include_usage': bool}")
        call.include_usage = _bool(so, "include_usage", False, "stream_options.include_usage")
    call.opts.update(OPENAI_DEFAULTS)
    for key, option in SAMPLING.items():
        if body.get(key) is not None:
            _set(call, option, _logit_bias(body[key]) if key == "logit_bias" else body[key], key)
    _workbench(call, body.get("workbench"), scope)
    return call


def _set(call: Call, option: str, value: Any, name: str) -> None:
    if option in call.names and call.names[option] != name:
        raise bad_field(name, value, f"absent: {call.names[option]!r} already sets it")
    call.opts[option] = value
    call.names[option] = name


def _workbench(call: Call, extra: Any, scope: str | None) -> None:
    """The ``workbench`` field: any request (or chat) option by its workbench name. With a
    tenant header configured the scope comes from the header alone."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise bad_field("workbench", extra, "an object of workbench options (docs/serving.md)")
    if scope is not None:
        if "cache_scope" in extra and extra["cache_scope"] != scope:
            raise bad_field("workbench.cache_scope", extra["cache_scope"],
                            "absent: this server takes the cache scope from its tenant header")
        extra = {**extra, "cache_scope": scope}
    for key, value in extra.items():
        _set(call, key, value, f"workbench.{key}")


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_field("model", model, "a loaded model's id (GET /v1/models lists them)")
    return model


def _bool(body: Mapping[str, Any], key: str, default: bool, name: str | None = None) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_field(name or key, v, "true or false")
    return v


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _token_list(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(_is_token(t) for t in x)


def _prompts(raw: Any) -> list[Any]:
    """OpenAI's four prompt shapes: text, token ids, a list of texts, a list of token lists."""
    if isinstance(raw, str) or _token_list(raw):
        return [raw]
    if isinstance(raw, list) and raw and len(raw) <= MAX_BATCH_PROMPTS and all(
            isinstance(p, str) or _token_list(p) for p in raw):
        return list(raw)
    raise bad_field("prompt", raw, "a string, a list of token ids, or a list of up to "
                                   f"{MAX_BATCH_PROMPTS} of either")


def _logit_bias(raw: Any) -> Any:
    """OpenAI's keys are token ids written as strings; other text keys are token texts (ours)."""
    if not isinstance(raw, dict):
        return raw  # the option's own check names it
    return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in raw.items()}


def _response_format(call: Call, rf: Any) -> None:
    if rf is None:
        return
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        _set(call, "json_schema", {"type": "object"}, "response_format")
        return
    spec = rf.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or "schema" not in spec:
        raise bad_field("response_format", rf, "{'type': 'text'}, {'type': 'json_object'} or "
                                               "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}")
    _set(call, "json_schema", spec["schema"], "response_format")


def _chat_logprobs(call: Call, body: Mapping[str, Any]) -> None:
    want = _bool(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None and not want:
        raise bad_field("top_logprobs", top, "absent unless logprobs is true")
    if want:
        _set(call, "logprobs", 0 if top is None else top, "top_logprobs" if top is not None else "logprobs")
        call.logprobs = top if _is_token(top) else 0
