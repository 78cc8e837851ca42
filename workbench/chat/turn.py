"""One chat turn: the plan (request options, tool grammar, thinking markers), the stream
that ends with the parsed message, and the results."""

from __future__ import annotations

import dataclasses
import json
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _native
from ..engine.events import CompletionResult, Done, Error
from ..engine.stream import Stream
from .thinking import (ThinkingMarkers, ThinkingSplitter, ThinkingStream, budget_option, shown_specials,
                       special_markers)
from ..errors import InvalidOption
from ..options import ChatOptions, RequestOptions, amend, build, split_chat
from .render import RenderedChat, render, system_prefix_len, templates_for


# --- results and events -------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class ChatDone(Done):
    """The last event of chat_stream: a Done (same fields) plus the parsed assistant message.

    ``reply`` stays the raw generated text; ``message`` is what the template's parser made of
    it: {'role', 'content', 'reasoning_content', 'tool_calls': [{'id', 'name', 'arguments'}]}.
    """

    message: dict[str, Any] = field(default_factory=dict)
    thinking: str = ""
    thinking_signature: str | None = None
    parse_error: str | None = None


@dataclass(slots=True, frozen=True)
class ChatResult(CompletionResult):
    """What chat() returns: the CompletionResult fields plus the parsed message."""

    message: dict[str, Any] = field(default_factory=dict)
    thinking: str = ""
    thinking_signature: str | None = None
    parse_error: str | None = None

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def reasoning_content(self) -> str | None:
        return self.message.get("reasoning_content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls", [])

    @classmethod
    def from_chat_done(cls, done: ChatDone, model: str, ref: int) -> ChatResult:
        base = CompletionResult.from_done(done, model, ref)
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(CompletionResult)}
        return cls(**values, message=done.message, thinking=done.thinking,
                   thinking_signature=done.thinking_signature, parse_error=done.parse_error)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        if self.reasoning_content:
            p.text(f"[thinking] {self.reasoning_content}\n")
        p.text(self.content)
        for c in self.tool_calls:
            p.text(f"\n[tool call {c['id']}] {c['name']}({json.dumps(c['arguments'])})")
        p.text(f"\n[{self.finish_reason}; {self.stats.prompt_tokens} prompt + {self.stats.generated_tokens} "
               f"generated tokens]")


# --- a chat turn ------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class ChatPlan:
    """Everything a chat turn needs once rendered: the request options and how to parse."""

    rendered: RenderedChat
    request: RequestOptions        # built once, with what the turn sets (tool grammar, stops, ...)
    markers: ThinkingMarkers | None
    markers_from_template: bool    # the template's parser knows the block too
    inside_thinking: bool
    budget: int | None
    signing_key: bytes | None


def plan(engine: Any, messages: Any, tools: Any, tool_choice: Any, opts: Mapping[str, Any]) -> ChatPlan:
    """Validate and render a turn; say which request options generate it."""
    all_opts = dict(opts)
    if tool_choice is not None:
        all_opts["tool_choice"] = tool_choice
    copts, given = split_chat(all_opts)
    rq = build(RequestOptions, given)  # validates every request option before any work
    tmpls = templates_for(engine, copts.chat_template)
    rendered = render(engine.model, tmpls, messages, tools, copts, rq.add_special, rq.parse_special,
                      n_ctx=engine.ctx.n_ctx)
    changes: dict[str, Any] = {}
    if rendered.grammar is not None:
        for key in ("grammar", "json_schema"):
            if given.get(key) is not None:
                raise InvalidOption(key, given[key], "no grammar of your own with tools "
                                                     "(the template's tool grammar applies)")
        changes["grammar"] = _tool_grammar(engine, rendered)
    if rendered.stop_sequences:
        changes["stop_sequences"] = tuple(rq.stop_sequences) + rendered.stop_sequences
    system_len = system_prefix_len(engine.model, tmpls, messages, tools, copts, rq.add_special, rq.parse_special,
                                   rendered.tokens)
    if system_len is not None and rq.cache and "cache_boundaries" not in given:
        changes["cache_boundaries"] = (system_len,)
    cfg = engine.cfg
    markers, from_template, inside = _thinking_markers(cfg, rendered, copts)
    if markers is not None and copts.thinking_budget_tokens is not None:
        changes["reasoning_budget"] = budget_option(given.get("reasoning_budget"), markers,
                                                    copts.thinking_budget_tokens, inside)
    changes.update(shown_specials(rq.render_special, special_markers(
        engine.model, (*rendered.preserved_tokens, *((markers.start, markers.end) if markers else ())))))
    return ChatPlan(rendered=rendered, request=amend(rq, changes), markers=markers,
                    markers_from_template=from_template, inside_thinking=inside,
                    budget=copts.thinking_budget_tokens, signing_key=getattr(cfg, "thinking_signing_key", None))


def _tool_grammar(engine: Any, rendered: RenderedChat) -> str:
    """The template's tool grammar as a request's ``grammar`` text, its prototype in the
    engine's grammar cache set up as llama.cpp's server sets up its sampler:

    - eager (a call is required): advanced past the generation prompt, which the grammar's
      root starts with and generation does not repeat;
    - lazy (tool_choice 'auto'): constraining nothing until a trigger (e.g. ``<tool_call>``).

    A GBNF comment names the set-up, so each variant has its own cache entry.
    """
    if rendered.grammar_lazy:
        note = f"lazy on {json.dumps([t['value'] for t in rendered.grammar_triggers])}"
    else:
        note = f"prefilled with {json.dumps(rendered.generation_prompt)}"
    text = f"{rendered.grammar}\n# workbench: {note}\n"
    proto = engine.grammars.for_request(text, None)
    try:
        if rendered.grammar_lazy:
            _native.grammar_make_lazy(proto, list(rendered.grammar_triggers), list(rendered.preserved_tokens))
        else:
            _native.grammar_prefill(proto, rendered.generation_prompt)
    except ValueError as e:
        raise InvalidOption("tools", "...", f"tools whose grammar llama.cpp can set up ({e})") from None
    return text


def _thinking_markers(cfg: Any, rendered: RenderedChat,
                      copts: ChatOptions) -> tuple[ThinkingMarkers | None, bool, bool]:
    """(markers, whether the template's parser knows them, whether the prompt opens the block).

    The load option ``thinking_markers`` wins; otherwise the template's own thinking tags.
    """
    if copts.thinking != "enabled":
        return None, False, False
    configured = getattr(cfg, "thinking_markers", None)
    template = ThinkingMarkers(rendered.thinking_start or "", rendered.thinking_end or "")
    if configured:
        markers = ThinkingMarkers(configured["start"], configured["end"])
    elif rendered.supports_thinking and rendered.thinking_end:
        markers = template
    else:
        return None, False, False
    from_template = rendered.supports_thinking and markers == template
    inside = bool(markers.start) and rendered.prompt.rstrip().endswith(markers.start)
    return markers, from_template, inside


class ChatStream(ThinkingStream):
    """chat_stream's handle: the Stream's events (thinking split out when enabled), ending
    with a :class:`ChatDone` carrying the parsed message, or an Error."""

    def __init__(self, stream: Stream, chat_plan: ChatPlan) -> None:
        splitter = None
        if chat_plan.markers is not None:
            splitter = ThinkingSplitter(chat_plan.markers, inside=chat_plan.inside_thinking,
                                        budget=chat_plan.budget, key=chat_plan.signing_key)
        super().__init__(stream, splitter)
        self.plan = chat_plan
        self.rendered = chat_plan.rendered

    def _on_done(self, done: Done) -> Done:
        sp = self.splitter
        own_block = sp is not None and sp.signature is not None and not self.plan.markers_from_template
        if sp is not None and own_block:
            # markers the template's parser does not know: parse what is outside the block
            text = sp.text
        elif sp is not None and sp.cut_at is not None:
            text = sp.reply_for_parser(done.reply)
        else:
            text = done.reply
        message, error = parse_reply(self.rendered.parser, text)
        if sp is not None and own_block:
            message["reasoning_content"] = sp.thinking or None
        values = {f.name: getattr(done, f.name) for f in dataclasses.fields(Done)}
        return ChatDone(**values, message=message, thinking=sp.thinking if sp else "",
                        thinking_signature=sp.signature if sp else None, parse_error=error)

    def result(self) -> ChatResult:
        """Wait for the end and return the ChatResult (raises the request's error)."""
        for ev in self.drain():
            if isinstance(ev, Error):
                raise ev.reason
        if self.error is not None:  # its Error was already handed out
            raise self.error
        if not isinstance(self.done, ChatDone):
            raise RuntimeError("the chat stream was closed before it ended")
        return ChatResult.from_chat_done(self.done, self.model, self.ref)


def parse_reply(parser: Any, text: str) -> tuple[dict[str, Any], str | None]:
    """The assistant message the template's parser reads in ``text``, and the parse error
    if the reply did not match the format (then a best-effort partial parse, or the raw
    text as content)."""
    error = None
    try:
        raw = parser.parse(text, False)
    except ValueError as e:
        error = str(e)
        try:
            raw = parser.parse(text, True)
        except ValueError:
            raw = {"role": "assistant", "content": text, "reasoning_content": "", "tool_calls": []}
    calls = []
    for c in raw["tool_calls"]:
        try:
            args: Any = json.loads(c["arguments"]) if c["arguments"] else {}
        except (ValueError, RecursionError):
            args = c["arguments"]
        calls.append({"id": c["id"] or _call_id(), "name": c["name"], "arguments": args})
    message = {"role": "assistant", "content": raw["content"],
               "reasoning_content": raw["reasoning_content"] or None, "tool_calls": calls}
    return message, error


_ID_CHARS = string.ascii_letters + string.digits


def _call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))
