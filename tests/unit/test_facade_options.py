"""The facade's shape (issue 26): each public call resolves in one hop from workbench/__init__,
the options of stream / complete and chat are split in workbench/options, and a plain
request never enters workbench/chat/ (no model: the engine is a stand-in)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

import workbench as wb
from workbench import generation, registry
from workbench.chat import raw_thinking
from workbench.errors import InvalidOption, UnknownOption
from workbench.options import (ChatOptions, RequestOptions, ThinkingOptions, amend, build, option_names, split_chat,
                               split_thinking)
from workbench.options.kinds import option_names as call_option_names

INIT = Path(wb.__file__)


def _exported_from() -> dict[str, str]:
    """Name -> the module workbench/__init__.py imports it from (``from .x import name``)."""
    out: dict[str, str] = {}
    for node in ast.parse(INIT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = f"workbench.{node.module}"
    return out


def test_each_facade_call_is_one_wrapper_over_the_function_where_it_is_defined():
    sources = _exported_from()
    calls = [n for n in wb.__all__ if inspect.isfunction(getattr(wb, n))]
    assert "complete" in calls and "stream" in calls
    for name in calls:
        facade = getattr(wb, name)
        impl = facade.__wrapped__
        assert not hasattr(impl, "__wrapped__"), name
        assert impl.__module__ == sources[name], (name, impl.__module__, sources[name])
        assert getattr(importlib.import_module(sources[name]), name) is impl
    assert wb.complete.__wrapped__ is generation.complete and wb.stream.__wrapped__ is generation.stream


def test_split_thinking_refuses_unknown_keys_naming_every_request_key():
    with pytest.raises(UnknownOption) as e:
        split_thinking({"thinking": True, "respone_tokens": 3})
    assert e.value.key == "respone_tokens"
    assert e.value.allowed == option_names(RequestOptions) + option_names(ThinkingOptions)
    assert e.value.allowed == call_option_names("request")


@pytest.mark.parametrize("key,value", [("thinking_budget_tokens", 4),
                                       ("thinking_markers", {"start": "<t>", "end": "</t>"})])
def test_split_thinking_refuses_thinking_options_without_thinking(key, value):
    for off in ({}, {"thinking": False}, {"thinking": "disabled"}):
        with pytest.raises(InvalidOption) as e:
            split_thinking({**off, key: value, "response_tokens": 2})
        assert str(e.value) == (f"option {key!r}: got {value!r} ({type(value).__name__}), "
                                "expected None unless thinking=True")


def test_split_thinking_keeps_the_request_options_as_given():
    given = {"response_tokens": 2, "reasoning_budget": {"tokens": 1, "end": "x"}}
    topts, rest = split_thinking({**given, "thinking": True, "thinking_budget_tokens": 3})
    assert topts == ThinkingOptions(thinking=True, thinking_budget_tokens=3)
    assert rest == given


def test_split_chat_refuses_unknown_keys_naming_every_chat_key():
    copts, rest = split_chat({"tool_choice": "auto", "temperature": 0.5})
    assert copts == build(ChatOptions, {"tool_choice": "auto"}) and rest == {"temperature": 0.5}
    with pytest.raises(UnknownOption) as e:
        split_chat({"thinking_markers": None})   # a raw-stream option, not chat's
    assert e.value.allowed == option_names(ChatOptions) + option_names(RequestOptions) == call_option_names("chat")


def test_amend_checks_the_values_as_build_does():
    ropts = build(RequestOptions, {"response_tokens": 5})
    assert amend(ropts, {}) is ropts
    out = amend(ropts, {"reasoning_budget": {"tokens": 2, "end": "</t>"}, "render_special": ["<t>"]})
    assert out == build(RequestOptions, {"response_tokens": 5, "reasoning_budget": {"tokens": 2, "end": "</t>"},
                                         "render_special": ["<t>"]})
    with pytest.raises(InvalidOption) as e:
        amend(ropts, {"cache_boundaries": (0,)})
    assert str(e.value) == str(pytest.raises(InvalidOption, build, RequestOptions, {"cache_boundaries": (0,)}).value)
    with pytest.raises(UnknownOption):
        amend(ropts, {"nope": 1})


def test_a_plain_stream_builds_its_options_once_and_never_enters_chat(monkeypatch):
    eng = SimpleNamespace(model=SimpleNamespace(n_vocab=100), ctx=SimpleNamespace(n_ctx=64))
    monkeypatch.setattr(registry, "get", lambda model: eng)
    started: list[tuple[object, ...]] = []
    monkeypatch.setattr(generation, "start", lambda e, tokens, ropts: started.append((e, tokens, ropts)) or "s")

    def no_chat(*args: object, **kwargs: object) -> None:
        raise AssertionError("a plain request entered chat/raw_thinking")

    monkeypatch.setattr(raw_thinking, "plan", no_chat)
    monkeypatch.setattr(raw_thinking, "ThinkingResultStream", no_chat)
    built: list[type] = []
    real_build = generation.build
    monkeypatch.setattr(generation, "build", lambda cls, *a, **k: built.append(cls) or real_build(cls, *a, **k))

    assert generation.stream("m", [1, 2, 3], response_tokens=4, thinking=False) == "s"
    assert built == [RequestOptions]
    assert started == [(eng, [1, 2, 3], build(RequestOptions, {"response_tokens": 4}))]
