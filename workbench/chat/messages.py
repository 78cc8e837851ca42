"""Chat inputs checked before anything native runs: OpenAI-shaped dicts in, JSON-ready
dicts out, every mistake an InvalidOption whose key names the message, field and value."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _native
from ..errors import InvalidOption

ROLES = ("system", "user", "assistant", "tool")
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check ``messages`` and return them in the shape llama.cpp's parser takes."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidOption("messages", messages, "a non-empty list of message dicts")
    return [_message(i, m) for i, m in enumerate(messages)]


def _message(i: int, m: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, Mapping):
        raise InvalidOption(where, m, "a dict with 'role' and 'content'")
    for k in m:
        if k not in _MESSAGE_KEYS:
            raise InvalidOption(f"{where}.{k}", m[k], "no such key; a message has " + ", ".join(_MESSAGE_KEYS))
    role = m.get("role")
    if role not in ROLES:
        raise InvalidOption(f"{where}.role", role, "one of " + ", ".join(repr(r) for r in ROLES))
    out: dict[str, Any] = {"role": role, "content": _content(where, m.get("content"))}
    for k in ("name", "tool_call_id"):
        if m.get(k) is not None:
            if not isinstance(m[k], str):
                raise InvalidOption(f"{where}.{k}", m[k], "a string")
            out[k] = m[k]
    if m.get("reasoning_content") is not None:
        if not isinstance(m["reasoning_content"], str):
            raise InvalidOption(f"{where}.reasoning_content", m["reasoning_content"], "a string or None")
        out["reasoning_content"] = m["reasoning_content"]
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise InvalidOption(f"{where}.tool_calls", calls, "tool calls only on assistant messages")
        if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
            raise InvalidOption(f"{where}.tool_calls", calls, "a list of tool calls")
        if calls:
            out["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls)]
    if out["content"] is None and role == "tool":
        raise InvalidOption(f"{where}.content", None, "the tool's result (a string)")
    return out


def _content(where: str, c: Any) -> Any:
    if c is None or isinstance(c, str):
        return c
    if isinstance(c, Sequence) and not isinstance(c, bytes):
        parts = []
        for j, part in enumerate(c):
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise InvalidOption(f"{where}.content[{j}]", part, "a text part {'type': 'text', 'text': str}")
            parts.append({"type": "text", "text": part["text"]})
        return parts
    raise InvalidOption(f"{where}.content", c, "a string, a list of text parts or None")


def _tool_call(where: str, c: Any) -> dict[str, Any]:
    """OpenAI's {'id', 'type': 'function', 'function': {'name', 'arguments'}} or this
    module's flat {'id', 'name', 'arguments'} (what chat() returns)."""
    if not isinstance(c, Mapping):
        raise InvalidOption(where, c, "a tool call dict")
    fn = c.get("function", c)
    if not isinstance(fn, Mapping):
        raise InvalidOption(f"{where}.function", fn, "a dict with 'name' and 'arguments'")
    name, args = fn.get("name"), fn.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"{where}.name", name, "the called function's name")
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            raise InvalidOption(f"{where}.arguments", args, "a dict or JSON text") from None
    elif isinstance(args, Mapping):
        args = json.dumps(dict(args))
    else:
        raise InvalidOption(f"{where}.arguments", args, "a dict or JSON text")
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if c.get("id") is not None:
        if not isinstance(c["id"], str):
            raise InvalidOption(f"{where}.id", c["id"], "a string")
        out["id"] = c["id"]
    return out


def normalize_tools(tools: Any) -> list[dict[str, Any]]:
    """Check ``tools`` (OpenAI function tools); each schema must convert to a grammar."""
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidOption("tools", tools, "a list of {'type': 'function', 'function': {...}} dicts")
    out, names = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, Mapping) or t.get("type") != "function":
            raise InvalidOption(where, t, "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidOption(f"{where}.function", fn, "a dict with 'name' and 'parameters'")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidOption(f"{where}.function.name", name, "a non-empty string")
        if name in names:
            raise InvalidOption(f"{where}.function.name", name, "a name no other tool uses")
        names.add(name)
        desc = fn.get("description", "")
        if not isinstance(desc, str):
            raise InvalidOption(f"{where}.function.description", desc, "a string")
        params = fn.get("parameters", {})
        if not isinstance(params, Mapping):
            raise InvalidOption(f"{where}.function.parameters", params, "a JSON schema dict")
        try:
            _native.json_schema_to_grammar(json.dumps(dict(params)) if params else '{"type": "object"}')
        except (ValueError, TypeError) as e:
            raise InvalidOption(f"{where}.function.parameters", params,
                                f"a JSON schema llama.cpp can convert ({e})") from None
        out.append({"type": "function", "function": {"name": name, "description": desc, "parameters": dict(params)}})
    return out

