"""The public calls, over the registry of loaded models (workbench/registry.py).

Thin by design: validate, look the engine up, delegate. Every per-model call raises
NotLoaded for an id that is not loaded.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from . import registry, samples
from .cache.shared import shared_cache
from .engine.engine import Engine
from .engine.events import CompletionResult
from .engine.prefix_cache import CachedPrefix
from .engine.stream import Stream
from .engine.tokens import tokenize_within
from .generation import collect, draft_engine, prompt_tokens, start, token_list
from . import _native
from .errors import (EmptyPrompt, InvalidOption, ModelFileError, UnknownOption,
                     UnknownRequest)
from .models import check_model_file, fetch_default_model
from .cache import HitKind, SaveReason
from .options import (LoadConfig, RequestOptions, build, check_bool, check_int, check_number, check_scope,
                      check_session_id, option_names, split_chat)
from . import chat as _chat
from . import embed as _embed
from .chat import ChatResult, ChatStream, RenderedChat
from .chat.thinking import ThinkingStream
from .samples import SampleStream

# --- models ------------------------------------------------------------------------------

def load_model(config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> str:
    """Load a GGUF model and start its loop; returns the model id.

    ``config`` (or keyword arguments) are validated against :class:`LoadConfig`; without
    ``model_path`` the default model (SmolLM2-135M-Instruct) is fetched once and used.
    """
    if config is not None and not isinstance(config, Mapping):
        raise InvalidOption("config", config, "a dict of load options", "config")
    cfg = build(LoadConfig, config, "config", **kwargs)
    path = Path(cfg.model_path).expanduser() if cfg.model_path is not None else fetch_default_model()
    model_id = registry.reserve(cfg.model_id, path)
    try:
        engine = Engine.load(model_id, path, cfg)
    except BaseException:
        registry.release(model_id)
        raise
    registry.commit(model_id, engine)
    return model_id


def unload(model: str) -> None:
    """Stop the model's loop (queued and running requests end with an Error) and free it."""
    eng = registry.get(model)
    registry.release(eng.model_id)
    eng.stop()


def list_models() -> list[dict[str, Any]]:
    engines = registry.engines()
    return [e.info() for e in engines]


def model_info(model: str) -> dict[str, Any]:
    return registry.get(model).info()


# --- tokens ------------------------------------------------------------------------------

def tokenize(model: str, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    """Tokens of ``text`` as llama.cpp's own tools make them (BOS per vocab, specials parsed)."""
    if not isinstance(text, str):
        raise InvalidOption("text", text, "a string")
    check_bool("add_special", add_special)
    check_bool("parse_special", parse_special)
    eng = registry.get(model)
    limit = max(eng.ctx.n_ctx, eng.model.n_ctx_train)
    return tokenize_within(eng.model, text, add_special, parse_special, limit, "the model's trained context")


def detokenize(model: str, tokens: Sequence[int], remove_special: bool = False,
               unparse_special: bool = False) -> str:
    eng = registry.get(model)
    ids = token_list(eng, tokens, "tokens")
    check_bool("remove_special", remove_special)
    check_bool("unparse_special", unparse_special)
    return eng.model.detokenize(ids, remove_special, unparse_special).decode("utf-8", "replace")


# --- generation (stream and complete: generation.py, with collect and the prompt rules) -------

def continue_session(model: str, session_id: str | int, tokens: Sequence[int], *,
                     expect_committed: Sequence[int] | None = None, stream: bool = False,
                     **opts: Any) -> CompletionResult | Stream:
    """Append caller-asserted ``tokens`` to a session's stored tokens and generate.

    Only the new tokens are prefilled on the session's live KV cells. With
    ``expect_committed`` (the caller's view of the stored tokens) a mismatch raises
    TranscriptMismatch and leaves the session intact.
    """
    eng = registry.get(model)
    check_session_id("session_id", session_id)
    check_bool("stream", stream)
    ropts = build(RequestOptions, opts, session_id=session_id)
    new = token_list(eng, tokens, "tokens")
    if not new:
        raise EmptyPrompt()
    committed = None if expect_committed is None else token_list(eng, expect_committed, "expect_committed")
    s = Stream(eng, eng.submit(new, ropts, continue_session=True, expect_committed=committed,
                               draft=draft_engine(ropts)))
    return s if stream else collect(s)


def end_session(model: str, session_id: str | int, cache_scope: str = "default") -> None:
    """Release a session's sequence. NoSession if this scope holds no such session,
    SessionBusy while a request runs on it."""
    eng = registry.get(model)
    eng.end_session(*_session_key(session_id, cache_scope))


def reset_session(model: str, session_id: str | int, cache_scope: str = "default") -> str:
    """Forcibly drop a session; its in-flight request ends with Error(SessionReset).

    Returns 'recovered' or 'not_found' (also for a session of another scope); reachable
    while the loop is busy (a running decode is interrupted), TimeoutError if the loop does
    not answer within 5 s.
    """
    eng = registry.get(model)
    return eng.reset_session(*_session_key(session_id, cache_scope))


def sessions(model: str, cache_scope: str | None = None) -> list[dict[str, Any]]:
    """The model's sessions (every scope), or those of ``cache_scope``."""
    eng = registry.get(model)
    if cache_scope is not None:
        check_scope("cache_scope", cache_scope)
    return eng.session_info(cache_scope)


def _session_key(session_id: Any, cache_scope: Any) -> tuple[str | int, str]:
    """A session is named by its id and its cache scope together."""
    return check_session_id("session_id", session_id), check_scope("cache_scope", cache_scope)


def prefill_only(model: str, prompt: str | Sequence[int], **opts: Any) -> CompletionResult:
    """Prefill ``prompt`` and store its KV rows in the prefix cache, without sampling.

    Returns when the rows are stored; ``finish_key`` is the row of exactly the prompt
    (pass it as ``parent_key`` to resume from it).
    """
    if "response_tokens" in opts:
        raise UnknownOption("response_tokens", [n for n in option_names(RequestOptions) if n != "response_tokens"])
    eng = registry.get(model)
    ropts = build(RequestOptions, opts, response_tokens=0)
    req = eng.submit(prompt_tokens(eng, prompt, ropts), ropts, sync_saves=True)
    return collect(Stream(eng, req))


def cached_prefix_len(model: str, prompt: str | Sequence[int], cache_scope: str = "default") -> int:
    """How many leading tokens of ``prompt`` the prefix cache holds for this model (all
    tiers, nothing loaded, no counters moved)."""
    eng = registry.get(model)
    opts = build(RequestOptions, {"cache_scope": cache_scope}, "argument")
    if eng.kvcache is None:
        return 0
    tokens = prompt_tokens(eng, prompt, opts)
    return eng.kvcache.cached_prefix_len(tokens, cache_scope)


def cached_prefix(model: str, prompt: str | Sequence[int], cache_scope: str = "default") -> CachedPrefix:
    """What the prefix cache holds of ``prompt`` for this model: the tokens a restore would
    load (as ``cached_prefix_len``), the KV bytes they take in the model's context, the tier
    the restore reads from, the hit kind a request would get and the row's key (None for a
    chain of chunks no row names). A probe: nothing loaded, no counters moved."""
    eng = registry.get(model)
    opts = build(RequestOptions, {"cache_scope": cache_scope}, "argument")
    if eng.kvcache is None:
        return CachedPrefix(0, 0, None, HitKind.COLD.value, None)
    return eng.kvcache.cached_prefix(prompt_tokens(eng, prompt, opts), cache_scope, eng.ctx)


def evict(model: str) -> int:
    """Save every idle session's live KV to the prefix cache and free its sequence.

    Returns the rows saved. Used under memory pressure: the sessions' next turns restore
    from the cache instead of starting cold.
    """
    return registry.get(model).evict(SaveReason.EVICT)


def shutdown(model: str) -> int:
    """As :func:`evict`, with save reason ``shutdown`` (call before the process stops)."""
    return registry.get(model).evict(SaveReason.SHUTDOWN)


_adapter_handles = itertools.count(1)


def load_adapter(model: str, path: str, scale: float = 1.0) -> int:
    """Load a LoRA adapter (GGUF) and attach it; returns its handle.

    The adapter's sha256 and scale fold into the model's cache namespace, so rows made
    under one adapter set never serve another. The change applies from the next admitted
    request (requests already running finish under the set they started with).
    """
    from .engine.adapter_ops import AdapterSlot
    from .models import fingerprint
    from .models.probe import probe

    eng = registry.get(model)
    scale = _scale(scale)
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidOption("path", path, "a path (str or PathLike) to a GGUF LoRA adapter")
    p = check_model_file(path)
    probe(eng.path, eng.fingerprint, eng.cfg, adapter_path=p, adapter_sha256=fingerprint(p))
    try:
        native = _native.Adapter(eng.model, str(p))
    except _native.NativeError as e:
        raise ModelFileError(str(path), f"not a LoRA adapter for this model: {e}") from None
    slot = AdapterSlot(next(_adapter_handles), native, str(p), fingerprint(p), scale)
    eng.request_adapters(lambda cur: cur + [slot])
    return slot.handle


def unload_adapter(model: str, adapter: int) -> None:
    """Detach an adapter (idempotent)."""
    check_int("adapter", adapter, 0, None)
    registry.get(model).request_adapters(lambda cur: [a for a in cur if a.handle != adapter])


def set_adapter_scale(model: str, adapter: int, scale: float) -> None:
    """Change an attached adapter's scale (0 = the base model's output); splits the cache namespace."""
    import dataclasses

    eng = registry.get(model)
    scale = _scale(scale)
    check_int("adapter", adapter, 0, None)
    if adapter not in {a.handle for a in eng.adapter_list()}:
        raise InvalidOption("adapter", adapter, "the handle of an attached adapter")
    eng.request_adapters(lambda cur: [dataclasses.replace(a, scale=scale) if a.handle == adapter else a
                                      for a in cur])


def list_adapters(model: str) -> list[dict[str, Any]]:
    """Attached adapters: {'adapter': handle, 'scale', 'path', 'sha256'}."""
    return [a.info() for a in registry.get(model).adapter_list()]


def _scale(scale: Any) -> float:
    return check_number("scale", scale)


def cancel(ref: Stream | ThinkingStream | int) -> None:
    """Cancel a request by its Stream (a chat or thinking one too) or ref. Idempotent; a
    finished request is left as is."""
    if isinstance(ref, (Stream, ThinkingStream)):
        ref.cancel()
        return
    if isinstance(ref, bool) or not isinstance(ref, int):
        raise InvalidOption("ref", ref, "a Stream or an int request ref")
    engines = registry.engines()
    for eng in engines:
        req = eng.requests.get(ref)
        if req is not None:
            eng.cancel(req)
            return


# --- observability (never waits on a loop) ------------------------------------------------

def phase(model: str) -> str:
    return registry.get(model).phase


def queue_depth(model: str | None = None) -> int:
    """Requests running on a sequence now (one model, or all)."""
    if model is not None:
        return registry.get(model).queue_depth()
    return sum(e.queue_depth() for e in registry.engines())


def pending_len(model: str) -> int:
    """Requests waiting for a sequence of this model."""
    return registry.get(model).pending_len()


def last_cache_hit(model: str) -> dict[str, Any] | None:
    """How the most recent admission was served: kind, reused tokens, ref, session."""
    return registry.get(model).last_hit


def requests() -> list[dict[str, Any]]:
    engines = registry.engines()
    return [r.info() for e in engines for r in list(e.requests.values())]


def request_info(ref: int) -> dict[str, Any]:
    """A running or queued request's info; UnknownRequest once it has finished."""
    check_int("ref", ref, None, None)
    engines = registry.engines()
    for eng in engines:
        req = eng.requests.get(ref)
        if req is not None:
            return req.info()
    raise UnknownRequest(f"no running or queued request with ref {ref!r}")


def history(model: str | None = None) -> list[dict[str, Any]]:
    """The finished requests each engine keeps (its newest ``history_size``, a load option),
    of one model or all, oldest first: times on the engine's clock (``arrival``:
    time.perf_counter() at submission; queued_s, ttft_s, e2e_s after it; tpot_s, and itl_s
    the gaps between tokens as a float32 array), tokens (prompt, cached, prefilled,
    generated), hit kind, finish reason, error, speculative drafted / accepted
    (engine/history.py)."""
    engines = [registry.get(model)] if model is not None else registry.engines()
    records = sorted((r for e in engines for r in e.history.records()), key=lambda r: r.arrival)
    return [r.row() for r in records]


def counters() -> dict[str, int]:
    engines = registry.engines()
    total: dict[str, int] = {}
    for e in engines:
        for k, v in e.counters.items():
            total[k] = total.get(k, 0) + v
        g = e.grammars.stats()
        total["grammar_cache_hits"] = total.get("grammar_cache_hits", 0) + g["hits"]
        total["grammar_cache_misses"] = total.get("grammar_cache_misses", 0) + g["misses"]
    for k, v in shared_cache().counters().items():
        total[f"cache_{k}"] = v
    return total


# --- chat ---------------------------------------------------------------------------------

def render_chat_template(model: str, messages: Sequence[Mapping[str, Any]],
                         tools: Sequence[Mapping[str, Any]] | None = None, **opts: Any) -> RenderedChat:
    """Render OpenAI-shaped ``messages`` (+ ``tools``) with the model's chat template.

    Returns the prompt, its tokens (specials parsed, as llama.cpp's server does) and what a
    chat turn takes from the template: tool grammar, extra stop strings, thinking tags.
    Options: see ChatOptions (tool_choice, add_generation_prompt, thinking, ...).
    """
    eng = registry.get(model)
    copts, ropts = split_chat(opts)
    rq = build(RequestOptions, ropts)
    tmpls = _chat.templates_for(eng, copts.chat_template)
    return _chat.render(eng.model, tmpls, messages, tools, copts, rq.add_special, rq.parse_special)


@overload
def chat_stream(model: str, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None, *, n: None = None,
                **opts: Any) -> ChatStream: ...
@overload
def chat_stream(model: str, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None, *, n: int,
                **opts: Any) -> SampleStream: ...
def chat_stream(model: str, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None, *, n: int | None = None,
                **opts: Any) -> ChatStream | SampleStream:
    """One chat turn as a stream: the events of stream() (Thinking / ThinkingEnd split out
    when thinking='enabled'), ending with a ChatDone (a Done) carrying the parsed message.
    ``n``: that many samples of the turn, one SampleStream (workbench/samples.py)."""
    if n is not None:
        return samples.start(lambda **o: chat_stream(model, messages, tools, tool_choice, **o),
                             samples.counts(n)[0], opts)
    eng = registry.get(model)
    p = _chat.plan(eng, messages, tools, tool_choice, opts)
    return ChatStream(start(eng, prompt_tokens(eng, p.rendered.tokens, p.request), p.request), p)


@overload
def chat(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
         tool_choice: Any = None, *, n: None = None, best_of: None = None, **opts: Any) -> ChatResult: ...
@overload
def chat(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
         tool_choice: Any = None, *, n: int, best_of: int | None = None, **opts: Any) -> list[ChatResult]: ...
@overload
def chat(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
         tool_choice: Any = None, *, n: int | None = None, best_of: int, **opts: Any) -> list[ChatResult]: ...
def chat(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
         tool_choice: Any = None, *, n: int | None = None, best_of: int | None = None,
         **opts: Any) -> ChatResult | list[ChatResult]:
    """One chat turn: render, generate, parse. Returns the assistant message
    (content, reasoning_content, tool_calls [{id, name, arguments}]) with the completion's
    tokens, finish reason and stats. Ctrl-C cancels the request before re-raising.
    ``n`` / ``best_of``: a list of samples of the turn, as complete()'s (workbench/samples.py)."""
    if n is not None or best_of is not None:
        n_out, k = samples.counts(1 if n is None else n, best_of)
        s = samples.start(lambda **o: chat_stream(model, messages, tools, tool_choice, **o), k,
                          samples.scored_opts(opts, best_of))
        return samples.keep(collect(s), n_out, best_of)
    return chat_stream(model, messages, tools, tool_choice, **opts).result()


# --- embeddings -----------------------------------------------------------------------------

def embed(model: str, text_or_tokens: str | Sequence[int], pooling: str = "mean",
          normalize: bool = True) -> list[float] | list[list[float]]:
    """The embedding of one text (or token list): n_embd floats, L2-normalised by default.

    pooling: 'mean', 'cls', 'last', or 'none' (then one vector per token).
    """
    return _embed.embed_inputs(registry.get(model), [text_or_tokens], pooling, normalize)[0]


def embed_batch(model: str, inputs: Sequence[str | Sequence[int]], pooling: str = "mean",
                normalize: bool = True) -> list[Any]:
    """Embeddings of several inputs in one native call (several sequences per decode)."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise InvalidOption("inputs", inputs, "a list of strings or token lists")
    return _embed.embed_inputs(registry.get(model), list(inputs), pooling, normalize)


