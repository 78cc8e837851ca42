"""Errors as OpenAI's error object, with the HTTP status a client expects.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

`ApiError` is what the routes raise for what is wrong with the HTTP request itself (a body
too large, not JSON, a field of the wrong type); `from_exception` maps everything else, the
workbench's own errors first (docs/serving.md has the table). A 500 is only for a bug: an
exception the workbench did not raise on purpose.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from ..errors import (AlreadyLoaded, ContextOverflow, DecodeTimeout, EmptyPrompt, EngineStopped,
                      KvChunksRefused, NoChatTemplate, NoSession, NotLoaded, OptionError, QueueFull,
                      RequestTimeout, SeqCapacity, SessionBusy, SessionReset, TranscriptMismatch, UnknownOption,
                      WorkbenchError)

log = logging.getLogger("workbench.server")

RETRY_AFTER_S = 1  # QueueFull / SeqCapacity: a sequence frees within a reply's time


class ApiError(Exception):
    """An HTTP error in OpenAI's shape; ``param`` names the field of the request body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_field(param: str, value: Any, expected: str) -> ApiError:
    """A field of the request body with a value of the wrong kind (400)."""
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return ApiError(400, f"{param!r}: got {shown} ({type(value).__name__}), expected {expected}",
                    param=param, code="invalid_value")


# exception class -> (status, type, code); the first class that matches wins
_STATUS: tuple[tuple[type[BaseException], int, str, str], ...] = (
    (NotLoaded, 404, "invalid_request_error", "model_not_found"),
    (NoSession, 404, "invalid_request_error", "session_not_found"),
    (SessionBusy, 409, "invalid_request_error", "session_busy"),
    (QueueFull, 429, "server_overloaded", "queue_full"),
    (SeqCapacity, 429, "server_overloaded", "sequences_busy"),
    (RequestTimeout, 504, "timeout", "request_timeout"),
    (DecodeTimeout, 504, "timeout", "decode_timeout"),
    (EngineStopped, 503, "server_error", "engine_stopped"),
    (SessionReset, 409, "invalid_request_error", "session_reset"),
    (OptionError, 400, "invalid_request_error", "invalid_value"),
    (EmptyPrompt, 400, "invalid_request_error", "empty_prompt"),
    (ContextOverflow, 400, "invalid_request_error", "context_length_exceeded"),
    (TranscriptMismatch, 400, "invalid_request_error", "transcript_mismatch"),
    (NoChatTemplate, 400, "invalid_request_error", "no_chat_template"),
    (KvChunksRefused, 400, "invalid_request_error", "kv_chunks_refused"),
    (AlreadyLoaded, 400, "invalid_request_error", "invalid_value"),
)


def from_exception(exc: BaseException, names: Mapping[str, str] | None = None) -> ApiError:
    """The ApiError for ``exc``. ``names`` maps the workbench's option names back to the
    fields the client sent (``response_tokens`` -> ``max_tokens``), so a 400 names the
    client's own field."""
    if isinstance(exc, ApiError):
        return exc
    for cls, status, kind, code in _STATUS:
        if isinstance(exc, cls):
            return ApiError(status, _message(exc, names or {}), type=kind, param=_param(exc, names or {}),
                            code=code, headers=_headers(status))
    if isinstance(exc, WorkbenchError):
        log.warning("request failed: %r", exc)
        return ApiError(500, str(exc), type="server_error", code=type(exc).__name__)
    log.error("bug: unexpected %s while serving a request", type(exc).__name__, exc_info=exc)
    return ApiError(500, f"internal error ({type(exc).__name__}); this is a bug, see the server's log",
                    type="server_error", code="internal_error")


PROMPT = "<prompt>"  # in ``names``: the field that holds the prompt ('prompt' or 'messages')
_ROOT = re.compile(r"[A-Za-z0-9_.]+")


def _param(exc: BaseException, names: Mapping[str, str]) -> str | None:
    """The client's field: a workbench key's own name or its root's ('logit_bias key',
    'inputs[3]' -> the field that holds them)."""
    key = getattr(exc, "key", None)
    if isinstance(exc, OptionError) and isinstance(key, str):
        if key in names:
            return names[key]
        root = _ROOT.match(key)
        return names.get(root.group(), key) if root else key
    if isinstance(exc, NotLoaded):
        return "model"
    if isinstance(exc, (ContextOverflow, EmptyPrompt)):
        return names.get(PROMPT)
    return None


def _message(exc: BaseException, names: Mapping[str, str]) -> str:
    """The exception's message, with the workbench's option name replaced by the client's."""
    text = str(exc)
    key = getattr(exc, "key", None)
    if isinstance(exc, UnknownOption):
        return f"unknown field {names.get(exc.key, exc.key)!r}"
    param = _param(exc, names)
    if isinstance(exc, OptionError) and isinstance(key, str) and param is not None and param != key:
        root = _ROOT.match(key)
        rest = key[root.end():].strip() if root and key not in names else ""
        return text.replace(repr(key), repr(param) + (f" ({rest})" if rest else ""), 1)
    return text


def _headers(status: int) -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else {}
