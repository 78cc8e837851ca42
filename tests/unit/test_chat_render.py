"""Chat template rendering and reply parsing through llama.cpp common, without generation.

Rendering is checked against an independent renderer: jinja2 set up as Hugging Face's
transformers sets it up (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, its tojson and
raise_exception), fed the template straight from the GGUF's ``tokenizer.chat_template``.
Models are loaded vocab-only (no weights, no context), so these tests are fast.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench import _native
from workbench.chat import TemplateCache, normalize_messages, parse_reply, render, templates_for
from workbench.errors import InvalidOption, NoChatTemplate
from workbench.options import ChatOptions

jinja2 = pytest.importorskip("jinja2")
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VOCABS = ROOT / "vendor" / "llama.cpp" / "models"
TEMPLATES = VOCABS / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hi"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "multi_turn": [{"role": "system", "content": "You answer in French."},
                   {"role": "user", "content": "Capital of Italy?"},
                   {"role": "assistant", "content": "Rome."},
                   {"role": "user", "content": "And of Spain?"}],
    "tools": [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}],
}


def hf_jinja(template: str, messages: list, tools: list | None, add_generation_prompt: bool,
             bos: str, eos: str) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, tools=tools, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=add_generation_prompt)


@pytest.fixture(scope="module")
def smollm(model_path):
    """The default model, vocab only: its tokenizer and its GGUF chat template."""
    m = _native.Model(str(model_path), 0, True, True)
    yield m
    m.close()


@pytest.fixture(scope="module")
def qwen2():
    """llama.cpp's Qwen2 vocab GGUF with the Qwen2.5-Instruct template (tools in the
    system prompt, <tool_call> JSON replies)."""
    path = VOCABS / "ggml-vocab-qwen2.gguf"
    if not path.is_file():
        pytest.skip("vendor/llama.cpp/models is not there")
    m = _native.Model(str(path), 0, True, True)
    yield m, (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    m.close()


# --- rendering against jinja2 -------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_default_model_template_matches_jinja2(smollm, name, add_generation_prompt):
    template = smollm.meta("tokenizer.chat_template")
    assert template and "<|im_start|>" in template
    tools = [WEATHER] if name == "tools" else None
    msgs = CONVERSATIONS[name]
    got = render(smollm, _native.ChatTemplates(smollm, ""), msgs, tools,
                 ChatOptions(add_generation_prompt=add_generation_prompt))
    want = hf_jinja(template, msgs, tools, add_generation_prompt, "<|im_start|>", "<|im_end|>")
    assert got.prompt == want
    assert got.tokens == smollm.tokenize(want, True, True)
    assert got.tokens.count(smollm.tokenize("<|im_start|>", False, True)[0]) >= len(msgs)  # specials parsed


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_tool_template_matches_jinja2(qwen2, name):
    model, template = qwen2
    tools = [WEATHER] if name in ("tools", "system") else None
    msgs = CONVERSATIONS[name]
    got = render(model, _native.ChatTemplates(model, template), msgs, tools, ChatOptions())
    want = hf_jinja(template, msgs, tools, True, "<|endoftext|>", "<|im_end|>")
    assert got.prompt == want
    if tools:
        assert '"name": "get_weather"' in got.prompt and "<tools>" in got.prompt


def test_tool_template_reports_grammar_and_markers(qwen2):
    model, template = qwen2
    tmpls = _native.ChatTemplates(model, template)
    msgs = CONVERSATIONS["user"]
    auto = render(model, tmpls, msgs, [WEATHER], ChatOptions())
    assert auto.grammar and auto.grammar_lazy and auto.grammar_triggers
    assert auto.preserved_tokens == ("<tool_call>", "</tool_call>")
    required = render(model, tmpls, msgs, [WEATHER], ChatOptions(tool_choice="required"))
    assert required.grammar and not required.grammar_lazy
    named = render(model, tmpls, msgs, [WEATHER, _tool("other")],
                   ChatOptions(tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert not named.grammar_lazy and '"name": "other"' not in named.prompt
    none = render(model, tmpls, msgs, [WEATHER], ChatOptions(tool_choice="none"))
    assert none.grammar is None


# --- parsing replies --------------------------------------------------------------------------

def test_tool_call_reply_is_parsed(qwen2):
    model, template = qwen2
    r = render(model, _native.ChatTemplates(model, template), CONVERSATIONS["user"], [WEATHER], ChatOptions())
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    message, error = parse_reply(r.parser, reply)
    assert error is None and message["content"] == ""
    [call] = message["tool_calls"]
    assert call["name"] == "get_weather" and call["arguments"] == {"city": "Paris"}
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call["id"])
    # the parsed message goes back into the conversation as it is
    again = normalize_messages(CONVERSATIONS["user"] + [message, {"role": "tool", "tool_call_id": call["id"],
                                                                  "content": "sunny"}])
    assert again[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_plain_reply_is_content(smollm):
    r = render(smollm, _native.ChatTemplates(smollm, ""), CONVERSATIONS["user"])
    assert parse_reply(r.parser, "Hello there.") == (
        {"role": "assistant", "content": "Hello there.", "reasoning_content": None, "tool_calls": []}, None)


def test_reasoning_template_extracts_thinking(qwen2):
    model, _ = qwen2
    tmpls = _native.ChatTemplates(model, (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    on = render(model, tmpls, CONVERSATIONS["user"], opts=ChatOptions(thinking="enabled"))
    assert on.supports_thinking and (on.thinking_start, on.thinking_end) == ("<think>", "</think>")
    message, _ = parse_reply(on.parser, "<think>\nThe user greets me.\n</think>\n\nHello!")
    assert message["reasoning_content"].strip() == "The user greets me." and message["content"] == "Hello!"
    off = render(model, tmpls, CONVERSATIONS["user"], opts=ChatOptions(thinking="disabled"))
    assert off.prompt.endswith("<think>\n\n</think>\n\n") and not on.prompt.endswith("</think>\n\n")


def test_template_that_opens_the_thinking_block(qwen2):
    model, _ = qwen2
    tmpls = _native.ChatTemplates(model, (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text())
    r = render(model, tmpls, CONVERSATIONS["user"], opts=ChatOptions(thinking="enabled"))
    assert r.prompt.rstrip().endswith("<think>")
    message, _ = parse_reply(r.parser, "hmm\n</think>\n\nHi.")
    assert message["reasoning_content"].strip() == "hmm" and message["content"].strip() == "Hi."


# --- validation -----------------------------------------------------------------------------

def _tool(name: str, params: object = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params or {"type": "object"}}}


BAD_MESSAGES = [
    ("messages", []),
    ("messages", "hello"),
    ("messages[0]", ["user", "hi"]),
    ("messages[0].role", [{"role": "robot", "content": "hi"}]),
    ("messages[0].role", [{"content": "hi"}]),
    ("messages[0].content", [{"role": "user", "content": 42}]),
    ("messages[0].content[1]", [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]),
    ("messages[0].contents", [{"role": "user", "contents": "hi"}]),
    ("messages[0].tool_calls", [{"role": "user", "content": "x", "tool_calls": [{"name": "f"}]}]),
    ("messages[1].tool_calls[0].arguments",
     [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{bad"}]}]),
    ("messages[0].content", [{"role": "tool", "content": None}]),
    ("messages[0].name", [{"role": "user", "content": "x", "name": 5}]),
]


@pytest.mark.parametrize("key,messages", BAD_MESSAGES)
def test_bad_messages_name_what_is_wrong(smollm, key, messages):
    with pytest.raises(InvalidOption) as e:
        render(smollm, _native.ChatTemplates(smollm, ""), messages)
    assert e.value.key == key


BAD_TOOLS = [
    ("tools", {"type": "function"}),
    ("tools[0]", [{"type": "retrieval"}]),
    ("tools[0].function", [{"type": "function"}]),
    ("tools[0].function.name", [{"type": "function", "function": {"parameters": {}}}]),
    ("tools[1].function.name", [_tool("f"), _tool("f")]),
    ("tools[0].function.parameters", [{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
    ("tools[0].function.parameters", [_tool("f", {"type": 5})]),
]


@pytest.mark.parametrize("key,tools", BAD_TOOLS)
def test_bad_tools_name_what_is_wrong(smollm, key, tools):
    with pytest.raises(InvalidOption) as e:
        render(smollm, _native.ChatTemplates(smollm, ""), CONVERSATIONS["user"], tools)
    assert e.value.key == key


def test_tool_choice_needs_tools(smollm):
    tmpls = _native.ChatTemplates(smollm, "")
    with pytest.raises(InvalidOption, match="tool_choice"):
        render(smollm, tmpls, CONVERSATIONS["user"], None, ChatOptions(tool_choice="required"))
    with pytest.raises(InvalidOption, match="tool_choice"):
        render(smollm, tmpls, CONVERSATIONS["user"], [_tool("f")],
               ChatOptions(tool_choice={"type": "function", "function": {"name": "g"}}))


def test_template_errors_become_invalid_option(smollm):
    strict = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}x"
    with pytest.raises(InvalidOption, match="first message must be system"):
        render(smollm, _native.ChatTemplates(smollm, strict), CONVERSATIONS["user"])
    with pytest.raises(ValueError, match="could not be parsed"):
        _native.ChatTemplates(smollm, "{% if %}")


def test_model_without_template_raises_no_chat_template():
    path = VOCABS / "ggml-vocab-gpt-2.gguf"
    if not path.is_file():
        pytest.skip("vendor/llama.cpp/models is not there")
    m = _native.Model(str(path), 0, True, True)
    try:
        cache = TemplateCache()  # what the model's Engine owns (Engine.attachment)
        engine = SimpleNamespace(model_id="gpt2-vocab", model=m, path=path, attachment=lambda name, make: cache)
        with pytest.raises(NoChatTemplate, match="gpt2-vocab"):
            templates_for(engine)
        assert templates_for(engine, "{{ messages[0]['content'] }}").has_template  # an explicit one works
        assert templates_for(engine, "{{ messages[0]['content'] }}") is cache.get("{{ messages[0]['content'] }}")
    finally:
        cache.close()
        m.close()


# --- the tool grammar set-up llama.cpp's server does --------------------------------------------

def test_required_grammar_is_prefilled_past_the_generation_prompt(qwen2):
    model, template = qwen2
    r = render(model, _native.ChatTemplates(model, template), CONVERSATIONS["user"], [WEATHER],
               ChatOptions(tool_choice="required"))
    root = next(line for line in r.grammar.splitlines() if line.startswith("root ::="))
    assert root.startswith('root ::= "<|im_start|>assistant\\n"')  # the grammar opens with the prompt's tail
    g = _native.Grammar(model, r.grammar)
    _native.grammar_prefill(g, r.generation_prompt)
    _native.grammar_prefill(g, r.generation_prompt)          # idempotent
    with pytest.raises(ValueError):
        _native.grammar_prefill(g, "something else")
    with pytest.raises(ValueError, match="does not accept"):
        _native.grammar_prefill(_native.Grammar(model, r.grammar), "<|im_start|>user\n")


def test_lazy_grammar_takes_the_template_triggers(qwen2):
    model, template = qwen2
    r = render(model, _native.ChatTemplates(model, template), CONVERSATIONS["user"], [WEATHER], ChatOptions())
    g = _native.Grammar(model, r.grammar)
    _native.grammar_make_lazy(g, list(r.grammar_triggers), list(r.preserved_tokens))
    with pytest.raises(ValueError, match="trigger"):
        _native.grammar_make_lazy(_native.Grammar(model, r.grammar), [], [])


def test_required_call_opens_the_reply_with_the_call_marker(qwen2):
    model, template = qwen2
    tmpls = _native.ChatTemplates(model, template)
    r = render(model, tmpls, CONVERSATIONS["user"], [WEATHER], ChatOptions(tool_choice="required"))
    assert r.tool_call_prefill == "<tool_call>\n" and r.prompt.endswith("<|im_start|>assistant\n<tool_call>\n")
    g = _native.Grammar(model, r.grammar)
    _native.grammar_prefill(g, r.generation_prompt)   # the grammar accepts the opened call
    message, error = parse_reply(r.parser, '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert error is None and message["tool_calls"][0]["arguments"] == {"city": "Oslo"}
    plain = render(model, tmpls, CONVERSATIONS["user"], [WEATHER],
                   ChatOptions(tool_choice="required", tool_call_prefill=False))
    assert plain.tool_call_prefill == "" and plain.prompt.endswith("<|im_start|>assistant\n")
    auto = render(model, tmpls, CONVERSATIONS["user"], [WEATHER], ChatOptions())
    assert auto.tool_call_prefill == "" and auto.prompt == plain.prompt


def test_required_needs_a_template_with_a_tool_format(smollm):
    tmpls = _native.ChatTemplates(smollm, "")
    with pytest.raises(InvalidOption, match="tool_choice.*no tool-call format"):
        render(smollm, tmpls, CONVERSATIONS["user"], [WEATHER], ChatOptions(tool_choice="required"))
    assert render(smollm, tmpls, CONVERSATIONS["user"], [WEATHER], ChatOptions()).grammar is None


def test_continue_final_message(qwen2):
    model, template = qwen2
    tmpls = _native.ChatTemplates(model, template)
    msgs = CONVERSATIONS["user"] + [{"role": "assistant", "content": "<tool_call>\n"}]
    r = render(model, tmpls, msgs, [WEATHER], ChatOptions(continue_final_message=True))
    assert r.prompt.endswith("<|im_start|>assistant\n<tool_call>\n")
    message, error = parse_reply(r.parser, '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    assert error is None and message["tool_calls"][0]["arguments"] == {"city": "Rome"}
    with pytest.raises(InvalidOption, match="continue_final_message"):
        render(model, tmpls, CONVERSATIONS["user"], None, ChatOptions(continue_final_message=True))
