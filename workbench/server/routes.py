"""The OpenAI routes over the workbench's public calls.

Every route goes through the same calls a notebook makes (``wb.stream``, ``wb.chat_stream``,
``wb.embed_batch``, so the middleware chain, ``wb.requests()``, the views and the cache
tables see the server's traffic as the notebook's own). Nothing here decodes a token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import workbench as wb

from .. import registry, samples
from ..chat import ChatDone
from ..engine.events import Done, Error, Thinking, Token, TokenId
from ..engine.logprobs import piece_text
from . import openai_response as out
from .body import read_json
from .fanout import ClientGone, Fanout, unless_disconnected
from .http_errors import PROMPT, ApiError, bad_field, from_exception
from .metrics import prometheus_text
from .openai_request import Call, chat_call, completion_call, embedding_call


@dataclass(frozen=True)
class Settings:
    """What ``serve()`` was given (validated there)."""

    models: tuple[str, ...] | None   # None: every loaded model
    api_key: str | None
    scope_header: str | None         # the header naming a request's cache scope (tenant)
    max_body_bytes: int


def served_models(settings: Settings) -> list[str]:
    loaded = [m["model_id"] for m in wb.list_models()]
    return loaded if settings.models is None else [m for m in loaded if m in settings.models]


def check_model(settings: Settings, model: str) -> None:
    if model not in served_models(settings):
        raise ApiError(404, f"model {model!r} is not served here; GET /v1/models lists what is", param="model",
                       code="model_not_found")


def scope_of(settings: Settings, request: Request) -> str | None:
    if settings.scope_header is None:
        return None
    scope = request.headers.get(settings.scope_header)
    if not scope:
        raise ApiError(400, f"this server takes each request's cache scope from the {settings.scope_header!r} "
                       "header, and the request has none", param=settings.scope_header, code="missing_scope")
    return scope


# --- plain routes ------------------------------------------------------------------------------

async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok", "models": served_models(request.app.state.settings)})


async def models(request: Request) -> Response:
    settings = request.app.state.settings
    data = [out.model_entry(wb.model_info(m)) for m in served_models(settings)]
    return JSONResponse({"object": "list", "data": data})


async def metrics(request: Request) -> Response:
    text = await asyncio.to_thread(prometheus_text, served_models(request.app.state.settings), request.app.state.server)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


EMBED_BATCH = 64  # inputs per native call: a client that leaves stops the work within one


async def embeddings(request: Request) -> Response:
    settings = request.app.state.settings
    model, inputs, fmt, dims = embedding_call(await read_json(request, settings.max_body_bytes))
    check_model(settings, model)
    try:
        vectors, n_tokens = await unless_disconnected(request, _embed(model, inputs))
    except ClientGone:
        raise
    except Exception as e:
        raise from_exception(e, {"inputs": "input", PROMPT: "input"}) from None
    if dims is not None and dims != len(vectors[0]):
        raise bad_field("dimensions", dims, f"absent or {len(vectors[0])} (this model's embedding size: vectors are "
                                            "not shortened here)")
    if fmt == "base64":
        vectors = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii") for v in vectors]
    return JSONResponse(out.embeddings(model, vectors, n_tokens))


async def _embed(model: str, inputs: list[Any]) -> tuple[list[Any], int]:
    vectors: list[Any] = []
    for i in range(0, len(inputs), EMBED_BATCH):
        vectors += await asyncio.to_thread(wb.embed_batch, model, inputs[i:i + EMBED_BATCH])
    return vectors, await asyncio.to_thread(_count_tokens, model, inputs)


def _count_tokens(model: str, inputs: list[Any]) -> int:
    return sum(len(wb.tokenize(model, x)) if isinstance(x, str) else len(x) for x in inputs)


# --- completions ---------------------------------------------------------------------------------

async def completions(request: Request) -> Response:
    settings = request.app.state.settings
    call = completion_call(await read_json(request, settings.max_body_bytes), scope_of(settings, request))
    check_model(settings, call.model)
    try:
        start = [(p, _prompt_text(call.model, p) if call.echo else "") for p in call.prompts
                 for _ in range(call.samples)]
    except Exception as e:
        raise from_exception(e, call.names) from None
    prompt_lps = await unless_disconnected(request, _prompt_logprobs(call, [p for p, _ in start]))
    fan = await _start(request, call, [_completion_starter(call, p, i) for i, (p, _) in enumerate(start)])
    echoes = [text for _, text in start]
    if call.stream:
        return await _sse(request, fan, call, _completion_chunks(call, fan, echoes, prompt_lps))
    try:
        dones = await unless_disconnected(request, _collect(fan, call))
    finally:
        fan.close()
    kept = _best(call, dones)
    choices = [out.completion_choice(c, echoes[i] + dones[i].reply, dones[i],
                                     out.joined_logprobs(prompt_lps[i], _completion_lp(call, dones[i], len(echoes[i]))))
               for c, i in enumerate(kept)]
    facts = _facts(fan, dones)
    return JSONResponse(out.completion(out.new_id("cmpl"), call.model, choices, [d.stats for d in dones],
                                       [facts[i] for i in kept]))


def _best(call: Call, dones: list[Done]) -> list[int]:
    """The indices of the choices returned: all, or with best_of each prompt's n best
    (samples.best: highest mean logprob per token), best first."""
    if call.best_of is None:
        return list(range(len(dones)))
    k, kept = call.best_of, []
    for start in range(0, len(dones), k):
        group = list(range(start, start + k))
        kept += samples.best(group, call.n, key=lambda i: dones[i])
    return kept


def _completion_starter(call: Call, prompt: Any, i: int) -> Callable[[], Any]:
    opts = samples.scored_opts(_choice_opts(call, i % call.samples), call.best_of)
    return lambda: wb.stream(call.model, prompt, **opts)


async def _prompt_logprobs(call: Call, prompts: list[Any]) -> list[dict[str, Any] | None]:
    """With echo and logprobs: each prompt's own logprobs (wb.score over the tokens the
    request prefills; the first token has none), in the legacy shape; else Nones."""
    if not (call.echo and call.logprobs is not None):
        return [None] * len(prompts)
    loop = asyncio.get_running_loop()
    scope = call.opts.get("cache_scope", "default")
    text_of = _text_of(call.model)

    def one(prompt: Any) -> dict[str, Any]:
        tokens = wb.tokenize(call.model, prompt) if isinstance(prompt, str) else list(prompt)
        if len(tokens) < 2:
            return out.prompt_logprobs(tokens, None, text_of, call.logprobs or 0)
        return out.prompt_logprobs(tokens, wb.score(call.model, tokens, top=call.logprobs or 0,
                                                    cache_scope=scope), text_of, call.logprobs or 0)

    try:
        return [await loop.run_in_executor(None, one, p) for p in prompts]
    except Exception as e:
        raise from_exception(e, call.names) from None


def _completion_lp(call: Call, done: Done, offset: int) -> dict[str, Any] | None:
    if call.logprobs is None or done.logprobs is None:
        return None
    return out.completion_logprobs(done.logprobs, offset)


async def _completion_chunks(call: Call, fan: Fanout, echoes: list[str],
                             prompt_lps: list[dict[str, Any] | None]) -> AsyncIterator[dict[str, Any]]:
    rid, created = out.new_id("cmpl"), out.now()
    text_of = _text_of(call.model)
    ids: dict[int, list[TokenId]] = {i: [] for i in range(len(echoes))}
    for i, text in enumerate(echoes):
        if text:
            yield out.completion_chunk(rid, call.model, created, [out.completion_choice(i, text, None, prompt_lps[i])])
    dones: dict[int, Done] = {}
    async for i, ev in fan.events():
        if isinstance(ev, TokenId):
            ids[i].append(ev)
        elif isinstance(ev, Token):
            lp = None
            if call.logprobs is not None:
                lp = out.completion_logprobs(out.entries_of(ids[i], text_of), 0)
            ids[i] = []
            yield out.completion_chunk(rid, call.model, created, [out.completion_choice(i, ev.text, None, lp)])
        elif isinstance(ev, Done):
            dones[i] = ev
            yield out.completion_chunk(rid, call.model, created, [out.completion_choice(i, "", ev, None)])
        elif isinstance(ev, Error):
            raise ev.reason
    if call.include_usage:
        ordered = [dones[i] for i in sorted(dones)]
        yield {**out.completion_chunk(rid, call.model, created, []), "usage": out.usage([d.stats for d in ordered]),
               "workbench": {"requests": _facts(fan, ordered)}}


# --- chat completions ----------------------------------------------------------------------------

async def chat_completions(request: Request) -> Response:
    settings = request.app.state.settings
    body = await read_json(request, settings.max_body_bytes)
    model = body.get("model")
    n_ctx = wb.model_info(model)["n_ctx"] if isinstance(model, str) and model in served_models(settings) else 0
    call = chat_call(body, scope_of(settings, request), n_ctx)
    check_model(settings, call.model)
    fan = await _start(request, call, [_chat_starter(call, i) for i in range(call.n)])
    if call.stream:
        return await _sse(request, fan, call, _chat_chunks(call, fan))
    try:
        dones = await unless_disconnected(request, _collect(fan, call))
    finally:
        fan.close()
    choices = [out.chat_choice(i, d.message, d, _chat_lp(call, d)) for i, d in enumerate(dones)]
    return JSONResponse(out.chat_completion(out.new_id("chatcmpl"), call.model, choices,
                                            [d.stats for d in dones], _facts(fan, dones)))


def _chat_starter(call: Call, i: int) -> Callable[[], Any]:
    opts = _choice_opts(call, i)
    return lambda: wb.chat_stream(call.model, call.messages, call.tools, call.tool_choice, **opts)


def _chat_lp(call: Call, done: Done) -> dict[str, Any] | None:
    if call.logprobs is None or done.logprobs is None:
        return None
    return out.chat_logprobs(done.logprobs)


async def _chat_chunks(call: Call, fan: Fanout) -> AsyncIterator[dict[str, Any]]:
    """Content and reasoning stream as they come; with tools the reply is held until the
    parser has read it (a tool call's text is never shown as content)."""
    rid, created = out.new_id("chatcmpl"), out.now()
    text_of, hold = _text_of(call.model), call.tools is not None and call.tool_choice != "none"
    ids: dict[int, list[TokenId]] = {i: [] for i in range(call.n)}
    for i in range(call.n):
        yield out.chat_chunk(rid, call.model, created, [out.chat_delta(i, {"role": "assistant", "content": ""})])
    dones: dict[int, Done] = {}
    async for i, ev in fan.events():
        if isinstance(ev, TokenId):
            ids[i].append(ev)
        elif isinstance(ev, (Token, Thinking)) and not hold:
            lp = out.chat_logprobs(out.entries_of(ids[i], text_of)) if call.logprobs is not None else None
            ids[i] = []
            key = "content" if isinstance(ev, Token) else "reasoning_content"
            yield out.chat_chunk(rid, call.model, created, [out.chat_delta(i, {key: ev.text}, None, lp)])
        elif isinstance(ev, ChatDone):
            dones[i] = ev
            yield out.chat_chunk(rid, call.model, created, [_final_delta(i, ev, hold)])
        elif isinstance(ev, Error):
            raise ev.reason
    if call.include_usage:
        ordered = [dones[i] for i in sorted(dones)]
        yield {**out.chat_chunk(rid, call.model, created, [], out.usage([d.stats for d in ordered])),
               "workbench": {"requests": _facts(fan, ordered)}}


def _final_delta(i: int, done: ChatDone, held: bool) -> dict[str, Any]:
    msg = out.chat_message(done.message)
    delta: dict[str, Any] = {}
    if held:
        delta = {k: v for k, v in msg.items() if k != "role" and v is not None}
        if msg.get("tool_calls"):
            delta["tool_calls"] = out.tool_calls(done.message)
    return out.chat_delta(i, delta, out.finish_reason(done, bool(msg.get("tool_calls"))))


# --- shared by both generation routes -------------------------------------------------------------

def _choice_opts(call: Call, i: int) -> dict[str, Any]:
    """Choice i's options: with a seed and n > 1, choice i samples with seed + i (the
    choices differ; bit-for-bit reproducible on a model loaded with deterministic=True, as
    the choices share batches differently from run to run: docs/serving.md)."""
    return samples.sample_opts(dict(call.opts), i)


async def _start(request: Request, call: Call, starters: list[Callable[[], Any]]) -> Fanout:
    """Submit every choice's request (in the executor: tokenising a long prompt takes a
    while); a refusal (bad option, full queue) cancels those already submitted."""
    handles: list[Any] = []
    try:
        for s in starters:
            handles.append(await asyncio.to_thread(s))
    except Exception as e:
        for h in handles:
            h.close()
        raise from_exception(e, call.names) from None
    return Fanout(handles, request.app.state.server.open_fanouts)


async def _collect(fan: Fanout, call: Call) -> list[Any]:
    """Every request's Done, in choice order; the first Error fails the response."""
    dones: dict[int, Done] = {}
    async for i, ev in fan.events():
        if isinstance(ev, Done):
            dones[i] = ev
        elif isinstance(ev, Error):
            raise from_exception(ev.reason, call.names)
    return [dones[i] for i in range(len(dones))]


def _facts(fan: Fanout, dones: list[Done]) -> list[dict[str, Any]]:
    return [out.request_facts(h.ref, d) for h, d in zip(fan.handles, dones)]


async def _sse(request: Request, fan: Fanout, call: Call, chunks: AsyncIterator[dict[str, Any]]) -> Response:
    """A text/event-stream of the chunks, then ``data: [DONE]``. The first event is awaited
    before the headers go out, so a request refused or failed before its first token gets
    its HTTP status; a failure later is sent as an error event (the OpenAI SDK raises it)."""
    try:
        first = await unless_disconnected(request, fan.peek())
    except BaseException:
        fan.close()
        raise
    if isinstance(first, Error):
        fan.close()
        raise from_exception(first.reason, call.names)

    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield _event(chunk)
        except Exception as e:
            yield _event(from_exception(e, call.names).body())
        finally:
            fan.close()
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False)}\n\n"


def _prompt_text(model: str, prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else wb.detokenize(model, prompt)


def _text_of(model: str) -> Callable[[int], str]:
    native = registry.get(model).model
    return lambda token: piece_text(native, token)
