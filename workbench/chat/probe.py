"""A chat template is tried in a child process before this process parses it.

llama.cpp's jinja engine recurses without a bound (a macro that calls itself forever, an
expression nested thousands deep) and loops as long as a template says, so a template
that does either kills or hangs the process that renders it: the user's notebook kernel.
Templates come from GGUF files and from the ``chat_template`` option, so each new one is
first parsed and rendered, on a few ordinary conversations, in a child process that loads
only the model's vocabulary. A child killed by a signal or running past the timeout means
the template is refused with InvalidOption; anything else (including the template's own
errors, which this process reports cleanly) lets it through. Verdicts, refusals as well as
acceptances, are remembered in memory and under ``$WORKBENCH_HOME/template-probes`` (keyed
by llama.cpp's commit and the template texts), so a template is probed once per machine.

This covers what a template does on any input. Input the caller supplies is bounded
separately (JSON nesting, see csrc/native.h), so that a template's legitimate recursion
over nested tool schemas stays shallow.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import subprocess
import sys
from typing import Any

from .. import _native
from ..child_probe import clear, cleared, refuse, refused, signal_name
from ..errors import InvalidOption

log = logging.getLogger(__name__)

TIMEOUT_S = 20.0

_CHILD = r"""
import json, sys
from workbench import _native
path, override = sys.argv[1], sys.stdin.read()
model = _native.Model(path, 0, True, True)
tmpls = _native.ChatTemplates(model, override)
if tmpls.has_template:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    user = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
    conversations = [
        ([user], None),
        ([{"role": "system", "content": "Be brief."}, user, {"role": "assistant", "content": "Sunny."},
          {"role": "user", "content": "Thanks."}], None),
        ([user], [tool]),
        ([user, call, {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], [tool]),
    ]
    for messages, tools in conversations:
        for thinking in (False, True):
            try:
                tmpls.apply(json.dumps(messages), json.dumps(tools) if tools else "", "auto", False, True,
                            thinking, "", "", False)
            except ValueError:
                pass  # refusing a conversation is the template's right; dying is not
print("ok")
"""

FOLDER = "template-probes"


def _key(native_model: Any, override: str | None) -> str:
    h = hashlib.sha256()
    h.update(_native.llama_commit.encode())
    for part in (native_model.meta("tokenizer.chat_template"), native_model.meta("tokenizer.chat_template.tool_use"),
                 override):
        h.update(b"\x00" if part is None else b"\x01" + part.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def check_template(native_model: Any, model_path: str, override: str | None) -> None:
    """Raise InvalidOption if the template (``override``, else the model's) kills or hangs a
    process that parses and renders it."""
    key = _key(native_model, override)
    what = override if override else f"<the chat template of {model_path}>"
    if cleared(FOLDER, key):
        return
    why = refused(FOLDER, key)
    if why is not None:
        raise InvalidOption("chat_template", what, why)
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, model_path], input=override or "",
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        why = (f"a template that renders a short conversation within {TIMEOUT_S:g} s (a probe ran past "
               f"that: a huge or endless loop?)")
        refuse(FOLDER, key, why, persist=False)  # a busy machine is slow too: not on disk
        raise InvalidOption("chat_template", what, why) from None
    except OSError as e:  # no way to start a child here: render in-process, as llama.cpp would
        log.warning("could not probe the chat template in a child process (%s); rendering it unprobed", e)
        return
    if done.returncode < 0:
        why = (f"a template llama.cpp can render without dying (a probe process rendering it was killed "
               f"by {signal_name(done.returncode)}: unbounded recursion or nesting?)")
        refuse(FOLDER, key, why, persist=done.returncode != -signal.SIGKILL)  # SIGKILL: the OOM killer?
        raise InvalidOption("chat_template", what, why)
    # rc > 0: the template's own error (parse or render), which this process reports cleanly
    clear(FOLDER, key, persist=done.returncode == 0)
