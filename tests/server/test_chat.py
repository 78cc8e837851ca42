"""POST /v1/chat/completions through the official SDK: the greedy reply equals wb.chat's,
streamed (role first, content deltas, finish reason, a usage chunk) or not; tool calls
(plain and streamed) and response_format's JSON, each as a user's code would read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import workbench as wb

from .conftest import extra

pytestmark = pytest.mark.model

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
N = 8

# The default model's own template has no tool-call format; Qwen2.5's (ChatML like the
# model's, tools in the system prompt, <tool_call> JSON replies) has one.
TOOL_TEMPLATE = Path(__file__).resolve().parents[2] / "vendor/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_template() -> str:
    if not TOOL_TEMPLATE.is_file():
        pytest.skip("vendor/llama.cpp/models/templates is not there")
    return TOOL_TEMPLATE.read_text()


def test_greedy_chat_equals_wb_chat(model, client):
    want = wb.chat(model, FRANCE, response_tokens=N, temperature=0)
    r = client.chat.completions.create(model=model, messages=FRANCE, max_tokens=N, temperature=0)
    [choice] = r.choices
    assert choice.message.role == "assistant" and choice.message.content == want.content
    assert choice.finish_reason == want.finish_reason and choice.message.tool_calls is None
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == want.stats.prompt_tokens
    assert r.usage.completion_tokens == want.stats.generated_tokens
    [facts] = extra(r)["requests"]
    assert facts["cached_tokens"] + facts["prefilled_tokens"] == r.usage.prompt_tokens


def test_streamed_chat_role_first_then_content_then_finish_then_usage(model, client):
    want = wb.chat(model, FRANCE, response_tokens=N, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=FRANCE, max_tokens=N, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    *with_choice, usage_chunk = chunks
    assert with_choice[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in with_choice[1:])
    assert "".join(c.choices[0].delta.content or "" for c in with_choice) == want.content
    assert [c.choices[0].finish_reason for c in with_choice] == [None] * (len(with_choice) - 1) + [want.finish_reason]
    assert all(c.object == "chat.completion.chunk" for c in chunks) and len({c.id for c in chunks}) == 1
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == want.stats.generated_tokens
    assert usage_chunk.usage.prompt_tokens == want.stats.prompt_tokens


def assert_weather_call(calls):
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert isinstance(args, dict) and isinstance(args["city"], str)


def test_a_required_tool_call(model, client, tool_template):
    r = client.chat.completions.create(
        model=model, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", max_tokens=40, temperature=0,
        stop=["</tool_call>"], extra_body={"workbench": {"chat_template": tool_template}})
    [choice] = r.choices
    assert choice.finish_reason == "tool_calls"
    assert_weather_call(choice.message.tool_calls)
    assert not choice.message.content                     # the call's text is never shown as content


def test_a_named_tool_call_streamed(model, client, tool_template):
    chunks = list(client.chat.completions.create(
        model=model, messages=ASK_WEATHER, tools=[WEATHER], max_tokens=40, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stop=["</tool_call>"],
        extra_body={"workbench": {"chat_template": tool_template}}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    # the SDK's streamed tool calls: pieces by index, the name once, the arguments in parts
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert calls and all(call["id"] for call in calls.values())
    assert {call["name"] for call in calls.values()} == {"get_weather"}
    assert all(isinstance(json.loads(call["arguments"])["city"], str) for call in calls.values())
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_response_format_json_schema(model, client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give me a number"}], max_tokens=24, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "number", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    value = json.loads(r.choices[0].message.content)
    assert isinstance(value, dict) and isinstance(value["n"], int) and not isinstance(value["n"], bool)


def test_response_format_json_object(model, client):
    # without the format the model answers in prose ("The capital of France is Paris.")
    msgs = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": '{"color": "red"}'},
            {"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.load(thinking_markers={"start": "The", "end": "<|im_start|>"})
def test_reasoning_content_comes_apart_from_the_content(fresh_model):
    """workbench={'thinking': 'enabled'}: the reasoning block is the message's
    reasoning_content (streamed as reasoning_content deltas), as wb.chat splits it; here the
    block's markers are set at load so the 135M model's reply has one."""
    from .conftest import sdk

    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    opts = {"thinking": "enabled", "thinking_budget_tokens": 2}
    ref = wb.chat(fresh_model, messages, response_tokens=8, temperature=0, **opts)
    assert ref.reasoning_content == "capital of"
    with wb.serve(fresh_model) as srv:
        client = sdk(srv.url)
        r = client.chat.completions.create(model=fresh_model, messages=messages, max_tokens=8, temperature=0,
                                           extra_body={"workbench": opts})
        chunks = list(client.chat.completions.create(model=fresh_model, messages=messages, max_tokens=8,
                                                     temperature=0, stream=True, extra_body={"workbench": opts}))
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"] == ref.reasoning_content and msg.content == ref.content
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    said = "".join(d.content or "" for d in deltas)
    assert thought == ref.reasoning_content and said == ref.content
