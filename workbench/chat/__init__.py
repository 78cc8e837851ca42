"""Chat turns over llama.cpp common's chat machinery: render, generate, parse.

    messages (+ tools)  --validate-->  OpenAI-shaped JSON
                        --ChatTemplates.apply (native, the model's jinja template)-->
                        prompt, tool grammar, stops, thinking tags, parser
    prompt tokens       --stream() (the ordinary request path)-->  events
    events              --ThinkingStream (optional)-->  + Thinking / ThinkingEnd
    reply               --ChatParser.parse (native, common_chat_parse)-->  message

Nothing here renders a template or parses a tool call by hand. Inputs are validated in
Python first so every mistake is an InvalidOption naming the message, key and value;
anything common still refuses comes back as an InvalidOption too.

Tool grammars are set up as llama.cpp's server sets up its sampler, through the ordinary
``grammar`` option and the engine's grammar cache: a required call's grammar is advanced
past the generation prompt (its root starts with it); tool_choice='auto' makes it lazy on
the template's triggers (e.g. ``<tool_call>``).

Modules: messages (validation), render (per-model template cache, rendering), turn (plan,
stream, results, parsing), thinking (the block splitter), raw_thinking (thinking=True on a
raw stream). The chat options are split from the request options in workbench/options
(``split_chat``).
"""

from .messages import ROLES, normalize_messages, normalize_tools
from .render import RenderedChat, TemplateCache, render, templates_for
from .turn import ChatDone, ChatPlan, ChatResult, ChatStream, parse_reply, plan

__all__ = [
    "ROLES", "ChatDone", "ChatPlan", "ChatResult", "ChatStream", "RenderedChat", "TemplateCache", "normalize_messages",
    "normalize_tools", "parse_reply", "plan", "render", "templates_for",
]
