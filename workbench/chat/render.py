"""Rendering with a model's chat template (llama.cpp common, parsed once per model)."""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from ..engine.tokens import tokenize_within
from ..errors import ContextOverflow, InvalidOption, NoChatTemplate
from ..options import ChatOptions
from ..options.load import CHAT_TEMPLATE_CACHE
from .messages import normalize_messages, normalize_tools
from .probe import check_template

class TemplateCache:
    """A model's parsed ChatTemplates by source (None: the GGUF's own), the ``size`` most
    recently used kept (the load option ``chat_template_cache``); owned by the model's
    engine (`Engine.attachment`)."""

    def __init__(self, size: int = CHAT_TEMPLATE_CACHE) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.by_source: collections.OrderedDict[str | None, Any] = collections.OrderedDict()

    def get(self, source: str | None) -> Any:
        with self.lock:
            hit = self.by_source.get(source)
            if hit is not None:
                self.by_source.move_to_end(source)
            return hit

    def put(self, source: str | None, tmpls: Any) -> None:
        with self.lock:
            self.by_source[source] = tmpls
            while len(self.by_source) > self.size:
                self.by_source.popitem(last=False)

    def close(self) -> None:
        with self.lock:
            self.by_source.clear()


def templates_for(engine: Any, override: str | None = None) -> Any:
    """The model's parsed ChatTemplates (built once per model and template source)."""
    cache = engine.attachment("chat_templates", lambda: TemplateCache(engine.cfg.chat_template_cache))
    hit = cache.get(override)
    if hit is not None:
        return hit
    check_template(engine.model, str(engine.path), override)  # in a child process, once per template
    try:
        tmpls = _native.ChatTemplates(engine.model, override or "")
    except ValueError as e:
        raise InvalidOption("chat_template", override if override else "<the model's template>",
                            f"a jinja template llama.cpp can parse ({e})") from None
    if not tmpls.has_template:
        raise NoChatTemplate(engine.model_id)
    cache.put(override, tmpls)
    return tmpls


# --- rendering ---------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class RenderedChat:
    """A conversation rendered by the model's template, and what generation needs from it."""

    prompt: str
    tokens: list[int]
    grammar: str | None
    grammar_lazy: bool
    grammar_triggers: tuple[dict[str, Any], ...]
    preserved_tokens: tuple[str, ...]
    stop_sequences: tuple[str, ...]
    generation_prompt: str
    format: str
    supports_thinking: bool
    thinking_start: str | None
    thinking_end: str | None
    parser: Any = field(default=None, repr=False, compare=False)
    tool_call_prefill: str = ""     # the call marker the reply was opened with ('' = none)


def render(native_model: Any, templates: Any, messages: Any, tools: Any = None,
           opts: ChatOptions | None = None, add_special: bool = True, parse_special: bool = True,
           n_ctx: int | None = None) -> RenderedChat:
    """Validate and render; the prompt is tokenised as llama.cpp's server does (specials parsed).
    A prompt whose tokens cannot fit ``n_ctx`` (default: the model's trained context, if the
    file states one) is refused with ContextOverflow before it is tokenised."""
    limit = n_ctx or native_model.n_ctx_train or sys.maxsize
    try:
        return _render(native_model, templates, messages, tools, opts, add_special, parse_special, limit)
    except RecursionError:
        raise InvalidOption("messages", "...", "messages and tools nested less deeply "
                                               "(Python's JSON recursion limit)") from None


def _render(native_model: Any, templates: Any, messages: Any, tools: Any, opts: ChatOptions | None,
            add_special: bool, parse_special: bool, limit: int) -> RenderedChat:
    opts = opts or ChatOptions()
    msgs = normalize_messages(messages)
    tool_list = normalize_tools(tools)
    choice = opts.tool_choice or "auto"
    if isinstance(choice, dict):  # one named function: offer only it, and require a call
        name = choice["function"]["name"]
        tool_list = [t for t in tool_list if t["function"]["name"] == name]
        if not tool_list:
            raise InvalidOption("tool_choice", opts.tool_choice, "the name of one of the tools given")
        choice = "required"
    if choice == "required" and not tool_list:
        raise InvalidOption("tool_choice", opts.tool_choice, "tools to choose from (none were given)")
    if opts.continue_final_message and (msgs[-1]["role"] != "assistant" or msgs[-1].get("tool_calls")):
        raise InvalidOption("continue_final_message", True, "an assistant message without tool calls last")
    if opts.thinking_budget_tokens is not None and opts.thinking != "enabled":
        raise InvalidOption("thinking_budget_tokens", opts.thinking_budget_tokens, "thinking='enabled'")
    kwargs = json.dumps(opts.chat_template_kwargs) if opts.chat_template_kwargs else ""
    tools_json = json.dumps(tool_list) if tool_list else ""
    thinking = opts.thinking == "enabled"

    def apply(msgs: list[dict[str, Any]], choice: str, continue_final: bool) -> dict[str, Any]:
        try:
            return templates.apply(json.dumps(msgs), tools_json, choice, opts.parallel_tool_calls,
                                   opts.add_generation_prompt, thinking, kwargs, "", continue_final)
        except ValueError as e:  # the template itself refused (e.g. roles must alternate)
            raise InvalidOption("messages", messages, f"a conversation the chat template accepts ({e})") from None

    prefill = ""
    if (choice == "required" and opts.tool_call_prefill and opts.add_generation_prompt and not thinking
            and not opts.continue_final_message):
        prefill = _call_marker(apply(msgs, "auto", False))
    if prefill:
        # llama.cpp's grammar for a required call lets text come first, and small models
        # write the call as bare JSON there; open the reply with the template's own call
        # marker instead (an assistant prefill, as continue_final_message does)
        r = apply([*msgs, {"role": "assistant", "content": prefill}], "required", True)
    else:
        r = apply(msgs, choice, opts.continue_final_message)
    if choice == "required" and not r["grammar"]:
        raise InvalidOption("tool_choice", opts.tool_choice,
                            f"'auto' or 'none': this chat template has no tool-call format ({r['format']})")
    tokens = tokenize_within(native_model, r["prompt"], add_special, parse_special, limit,
                             "n_ctx (the rendered chat prompt)")
    end_tags = r["thinking_end_tags"]
    return RenderedChat(
        prompt=r["prompt"], tokens=tokens, grammar=r["grammar"], grammar_lazy=r["grammar_lazy"],
        grammar_triggers=tuple(r["grammar_triggers"]), preserved_tokens=tuple(r["preserved_tokens"]),
        stop_sequences=tuple(r["additional_stops"]), generation_prompt=r["generation_prompt"],
        format=r["format"], supports_thinking=r["supports_thinking"],
        thinking_start=r["thinking_start_tag"] or None, thinking_end=end_tags[0] if end_tags else None,
        parser=r["parser"], tool_call_prefill=prefill)


def _call_marker(auto: dict[str, Any]) -> str:
    """The text that opens a tool call in this template's format: the word that triggers its
    lazy grammar under tool_choice 'auto' (e.g. '<tool_call>\\n'); '' if it has none."""
    for t in auto["grammar_triggers"]:
        if t["type"] == "word" and t["value"].strip():
            return t["value"]
    return ""


def system_prefix_len(native_model: Any, templates: Any, messages: Any, tools: Any, opts: ChatOptions | None,
                      add_special: bool, parse_special: bool, tokens: list[int]) -> int | None:
    """How many of a rendered chat's ``tokens`` its leading system message (with the tools)
    renders to, when they are a prefix of them: where the prefix every conversation under
    that system prompt shares ends (chunk storage cuts a chunk there). None when the chat
    does not open with a system message, or its rendering is no prefix of the prompt's."""
    msgs = normalize_messages(messages)
    if not msgs or msgs[0]["role"] != "system" or len(msgs) < 2:
        return None
    system_opts = dataclasses.replace(opts or ChatOptions(), add_generation_prompt=False, continue_final_message=False,
                                      tool_choice=None, tool_call_prefill=False)
    try:
        head = _render(native_model, templates, msgs[:1], tools, system_opts, add_special, parse_special, len(tokens))
    except (InvalidOption, ContextOverflow):
        return None
    n = len(head.tokens)
    return n if 0 < n < len(tokens) and tokens[:n] == head.tokens else None
