"""Reading a request's JSON body so that no body can crash or hang the kernel.

A body over the server's ``max_body_bytes`` is refused while it arrives (413); the rest is
JSON as RFC 8259 says (UTF-8, no NaN / Infinity), nested at most MAX_DEPTH deep, with strings
that are valid Unicode (no lone surrogates from ``\\ud800`` escapes), or a 400 that says which.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from .http_errors import ApiError

MAX_DEPTH = 64


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > max_bytes:
        raise _too_large(max_bytes)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return parse(b"".join(chunks))


def parse(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise ApiError(400, "the request body is empty: send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 ({e.reason} at byte {e.start})", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, f"the body is nested too deeply (at most {MAX_DEPTH} levels)",
                       code="invalid_json") from None
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the body must be a JSON object, got a JSON {type(value).__name__}",
                       code="invalid_json")
    check_tree(value)
    return value


def check_tree(value: Any) -> None:
    """Depth at most MAX_DEPTH and every string (keys too) encodable as UTF-8; iterative, so
    a deep body cannot exhaust the stack here."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, str):
            _check_text(v)
        elif isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise ApiError(400, f"the body is nested too deeply (at most {MAX_DEPTH} levels)",
                               code="invalid_json")
            items = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
            for k, x in items:
                if k is not None:
                    _check_text(k)
                todo.append((x, depth + 1))


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "a string in the body is not valid Unicode (a lone surrogate escape such as "
                       "\\ud800)", code="invalid_json") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is larger than the server's max_body_bytes={max_bytes}",
                    code="body_too_large")
