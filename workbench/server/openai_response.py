"""Workbench results in OpenAI's response shapes: completions, chat completions, their
stream chunks, usage and logprobs.

Usage is counted from the engine's own Stats: prompt_tokens, completion_tokens (generated),
and prompt_tokens_details.cached_tokens = the prompt tokens whose KV was reused (restored
from the prefix cache or live in a session), i.e. prompt_tokens - prefilled_tokens. With n > 1
or several prompts, the choices' requests are summed (each was prefilled and generated on
its own; docs/serving.md). Each response also carries a ``workbench`` field: per choice, the
request's ref, hit kind, cached / prefilled tokens and TTFT.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..engine.events import Done, Stats, TokenId, TokenLogprob, TopLogprob


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def finish_reason(done: Done, tool_calls: bool = False) -> str:
    """OpenAI's reason; 'cancelled' (the request was cancelled in the notebook or by a
    timeout) is the workbench's own."""
    if tool_calls:
        return "tool_calls"
    return done.finish_reason


def usage(stats: Sequence[Stats]) -> dict[str, Any]:
    prompt = sum(s.prompt_tokens for s in stats)
    completion = sum(s.generated_tokens for s in stats)
    cached = sum(s.cache_delta["read"] for s in stats)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def request_facts(ref: int, done: Done) -> dict[str, Any]:
    """The workbench's own reading of one choice's request."""
    s = done.stats
    return {"ref": ref, "cache_hit_kind": s.cache_hit_kind, "cache_saved_by": s.cache_saved_by,
            "cached_tokens": s.cache_delta["read"],
            "prefilled_tokens": s.prefilled_tokens, "ttft_s": s.ttft_s, "total_s": s.total_s,
            "queued_s": s.queued_s, "finish_key": done.finish_key, "seed": s.seed, "speculative": s.speculative}


# --- logprobs ------------------------------------------------------------------------------------

def completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.text)
        lps.append(e.logprob)
        tops.append({t.text: t.logprob for t in e.top})
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs(tokens: Sequence[int], scored: Any, text_of: Any, top: int) -> dict[str, Any]:
    """An echoed prompt's logprobs in the legacy shape, from a wb.score result (None: a
    one-token prompt): the first token's logprob and alternatives are null, as OpenAI's."""
    texts = [text_of(t) for t in tokens]
    lps: list[float | None] = [None]
    tops: list[dict[str, float] | None] = [None]
    for i in range(1, len(tokens)):
        lps.append(float(scored.logprobs[i]))
        tops.append({text_of(t): lp for t, lp in scored.top[i]} if top else {})
    offsets = [0, *itertools.accumulate(len(x) for x in texts)][: len(texts)]
    return {"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def joined_logprobs(prompt: dict[str, Any] | None, reply: dict[str, Any] | None) -> dict[str, Any] | None:
    """The echoed prompt's logprobs, then the reply's (either may be absent)."""
    if prompt is None or reply is None:
        return prompt or reply
    return {k: prompt[k] + reply[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    def one(t: TokenLogprob | TopLogprob) -> dict[str, Any]:
        return {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode("utf-8"))}

    return {"content": [{**one(e), "top_logprobs": [one(t) for t in e.top]} for e in entries]}


def entries_of(ids: Sequence[TokenId], text_of: Any) -> list[TokenLogprob]:
    """TokenId events (with logprobs) as TokenLogprob entries; ``text_of(id)`` names a token."""
    return [TokenLogprob(t.id, text_of(t.id), t.logprob if t.logprob is not None else 0.0, t.top_logprobs)
            for t in ids]


# --- completions ---------------------------------------------------------------------------------

def completion(rid: str, model: str, choices: list[dict[str, Any]], stats: Sequence[Stats],
               facts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": now(), "model": model, "choices": choices,
            "usage": usage(stats), "workbench": {"requests": facts}}


def completion_choice(index: int, text: str, done: Done | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": None if done is None else finish_reason(done)}


def completion_chunk(rid: str, model: str, created: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices}


# --- chat ----------------------------------------------------------------------------------------

def tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(message.get("tool_calls") or []):
        args = c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"])
        out.append({"index": i, "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": args}})
    return out


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = tool_calls(message)
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or (None if calls else "")}
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    if calls:
        out["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    return out


def chat_completion(rid: str, model: str, choices: list[dict[str, Any]], stats: Sequence[Stats],
                    facts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": now(), "model": model, "choices": choices,
            "usage": usage(stats), "workbench": {"requests": facts}}


def chat_choice(index: int, message: dict[str, Any], done: Done, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    msg = chat_message(message)
    return {"index": index, "message": msg, "logprobs": logprobs,
            "finish_reason": finish_reason(done, bool(msg.get("tool_calls")))}


def chat_chunk(rid: str, model: str, created: int, choices: list[dict[str, Any]],
               usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def chat_delta(index: int, delta: dict[str, Any], finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


# --- embeddings and models -----------------------------------------------------------------------

def embeddings(model: str, vectors: Sequence[Any], n_tokens: int) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def model_entry(info: dict[str, Any]) -> dict[str, Any]:
    """GET /v1/models: OpenAI's fields, and the workbench's facts under ``workbench``."""
    keep = ("desc", "n_ctx", "n_ctx_train", "n_seq_max", "n_vocab", "quant_tag", "has_chat_template")
    return {"id": info["model_id"], "object": "model", "created": int(info.get("loaded_at") or 0),
            "owned_by": "llama-workbench", "workbench": {k: info.get(k) for k in keep}}
