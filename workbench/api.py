"""The public calls, over a registry of loaded models (model id -> Engine).

Thin by design: validate, look the engine up, delegate. Every per-model call raises
NotLoaded for an id that is not loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .engine.engine import Engine, model_id_for
from .engine.events import CompletionResult
from .engine.stream import Stream
from .errors import AlreadyLoaded, EmptyPrompt, InvalidOption, NotLoaded, UnknownRequest
from .models import fetch_default_model
from .options import LoadConfig, RequestOptions, build

_lock = threading.Lock()
_engines: dict[str, Engine] = {}


def _engine(model: Any) -> Engine:
    if isinstance(model, Engine):
        model = model.model_id
    with _lock:
        eng = _engines.get(model) if isinstance(model, str) else None
    if eng is None:
        raise NotLoaded(model)
    return eng


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
    with _lock:
        if cfg.model_id is not None and cfg.model_id in _engines:
            raise AlreadyLoaded(cfg.model_id)
        model_id = cfg.model_id or model_id_for(path, set(_engines))
        _engines[model_id] = None  # type: ignore[assignment]  # reserve the id while loading
    try:
        engine = Engine.load(model_id, path, cfg)
    except BaseException:
        with _lock:
            _engines.pop(model_id, None)
        raise
    with _lock:
        _engines[model_id] = engine
    return model_id


def unload(model: str) -> None:
    """Stop the model's loop (queued and running requests end with an Error) and free it."""
    eng = _engine(model)
    with _lock:
        _engines.pop(eng.model_id, None)
    eng.stop()


def list_models() -> list[dict[str, Any]]:
    with _lock:
        engines = [e for e in _engines.values() if e is not None]
    return [e.info() for e in engines]


def model_info(model: str) -> dict[str, Any]:
    return _engine(model).info()


# --- tokens ------------------------------------------------------------------------------

def tokenize(model: str, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    """Tokens of ``text`` as llama.cpp's own tools make them (BOS per vocab, specials parsed)."""
    if not isinstance(text, str):
        raise InvalidOption("text", text, "a string")
    return _engine(model).model.tokenize(text, add_special, parse_special)


def detokenize(model: str, tokens: Sequence[int], remove_special: bool = False,
               unparse_special: bool = False) -> str:
    eng = _engine(model)
    ids = _token_list(eng, tokens, "tokens")
    return eng.model.detokenize(ids, remove_special, unparse_special).decode("utf-8", "replace")


def _token_list(eng: Engine, tokens: Any, key: str) -> list[int]:
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise InvalidOption(key, tokens, "a list of token ids")
    n_vocab = eng.model.n_vocab
    out = list(tokens)
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise InvalidOption(key, t, f"token ids in [0, {n_vocab})")
    return out


def _prompt_tokens(eng: Engine, prompt: Any, opts: RequestOptions) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise EmptyPrompt()
        tokens = eng.model.tokenize(prompt, opts.add_special, opts.parse_special)
    elif isinstance(prompt, Sequence) and not isinstance(prompt, bytes):
        tokens = _token_list(eng, prompt, "prompt")
    else:
        raise InvalidOption("prompt", prompt, "a string or a list of token ids")
    if not tokens:
        raise EmptyPrompt()
    return tokens


# --- generation --------------------------------------------------------------------------

def stream(model: str, prompt: str | Sequence[int], **opts: Any) -> Stream:
    """Start a request; iterate the returned Stream (or ``async for``) for typed events."""
    eng = _engine(model)
    ropts = build(RequestOptions, opts)
    tokens = _prompt_tokens(eng, prompt, ropts)
    return Stream(eng, eng.submit(tokens, ropts))


def complete(model: str, prompt: str | Sequence[int], **opts: Any) -> CompletionResult:
    """Generate a reply and return it with its tokens, finish reason and stats.

    Ctrl-C (a notebook's Interrupt) cancels the request before re-raising.
    """
    return _collect(stream(model, prompt, **opts))


def _collect(s: Stream) -> CompletionResult:
    try:
        # wait for the end without waking per token (each wake-up costs the loop thread
        # GIL hand-offs on the decode path); the events are all queued by then
        while not s.wait(0.25):
            pass
    except KeyboardInterrupt:
        s.cancel()
        raise
    return s.result()


def continue_session(model: str, session_id: str | int, tokens: Sequence[int], *,
                     expect_committed: Sequence[int] | None = None, stream: bool = False,
                     **opts: Any) -> CompletionResult | Stream:
    """Append caller-asserted ``tokens`` to a session's stored tokens and generate.

    Only the new tokens are prefilled on the session's live KV cells. With
    ``expect_committed`` (the caller's view of the stored tokens) a mismatch raises
    TranscriptMismatch and leaves the session intact.
    """
    eng = _engine(model)
    if isinstance(session_id, bool) or not isinstance(session_id, (str, int)):
        raise InvalidOption("session_id", session_id, "a string or an int")
    ropts = build(RequestOptions, opts, session_id=session_id)
    new = _token_list(eng, tokens, "tokens")
    if not new:
        raise EmptyPrompt()
    committed = None if expect_committed is None else _token_list(eng, expect_committed, "expect_committed")
    s = Stream(eng, eng.submit(new, ropts, continue_session=True, expect_committed=committed))
    return s if stream else _collect(s)


def end_session(model: str, session_id: str | int) -> None:
    """Release a session's sequence. NoSession if unknown, SessionBusy while a request runs."""
    _engine(model).end_session(session_id)


def reset_session(model: str, session_id: str | int) -> str:
    """Forcibly drop a session; its in-flight request ends with Error(SessionReset).

    Returns 'recovered' or 'not_found'; reachable while the loop is busy (a running decode
    is interrupted), TimeoutError if the loop does not answer within 5 s.
    """
    return _engine(model).reset_session(session_id)


def sessions(model: str) -> list[dict[str, Any]]:
    return _engine(model).session_info()


def cancel(ref: Stream | int) -> None:
    """Cancel a request by its Stream or ref. Idempotent; a finished request is left as is."""
    if isinstance(ref, Stream):
        ref.cancel()
        return
    if isinstance(ref, bool) or not isinstance(ref, int):
        raise InvalidOption("ref", ref, "a Stream or an int request ref")
    with _lock:
        engines = [e for e in _engines.values() if e is not None]
    for eng in engines:
        req = eng.requests.get(ref)
        if req is not None:
            eng.cancel(req)
            return


# --- observability (never waits on a loop) ------------------------------------------------

def phase(model: str) -> str:
    return _engine(model).phase


def queue_depth(model: str | None = None) -> int:
    """Requests running on a sequence now (one model, or all)."""
    if model is not None:
        return _engine(model).queue_depth()
    with _lock:
        return sum(e.queue_depth() for e in _engines.values() if e is not None)


def pending_len(model: str) -> int:
    """Requests waiting for a sequence of this model."""
    return _engine(model).pending_len()


def last_cache_hit(model: str) -> dict[str, Any] | None:
    """How the most recent admission was served: kind, reused tokens, ref, session."""
    return _engine(model).last_hit


def requests() -> list[dict[str, Any]]:
    with _lock:
        engines = [e for e in _engines.values() if e is not None]
    return [r.info() for e in engines for r in list(e.requests.values())]


def request_info(ref: int) -> dict[str, Any]:
    with _lock:
        engines = [e for e in _engines.values() if e is not None]
    for eng in engines:
        req = eng.requests.get(ref)
        if req is not None:
            return req.info()
    raise UnknownRequest(f"no running or queued request with ref {ref!r}")


def counters() -> dict[str, int]:
    with _lock:
        engines = [e for e in _engines.values() if e is not None]
    total: dict[str, int] = {}
    for e in engines:
        for k, v in e.counters.items():
            total[k] = total.get(k, 0) + v
        g = e.grammars.stats()
        total["grammar_cache_hits"] = total.get("grammar_cache_hits", 0) + g["hits"]
        total["grammar_cache_misses"] = total.get("grammar_cache_misses", 0) + g["misses"]
    return total
