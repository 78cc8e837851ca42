"""Input nested deeply enough to overflow llama.cpp's recursive parsers must come back as a
clear error, never kill the process (a crash takes the user's Jupyter kernel with it).

The cases run in a child process so that a regression shows up as a failed test with the
child's exit status (139 = SIGSEGV) instead of ending the whole test run. Before the
guards, 20,000 nested GBNF groups, a 200,000-rule chain and 5,000 levels of JSON in a reply
each killed the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.model

CHILD = textwrap.dedent(r'''
    import json, sys
    import workbench as wb
    from workbench import _native
    from workbench.chat import parse_reply, render
    from workbench.options import ChatOptions

    m = wb.load_model(model_path=sys.argv[1], n_seq_max=1)
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except Exception as e:  # the point: an exception, not a dead process
            out[name] = f"{type(e).__name__}: ...{str(e)[-300:]}"  # the value echoed may be huge

    deep_groups = "root ::= " + "(" * 20000 + '"a"' + ")" * 20000
    chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(200000)) + 'r200000 ::= "a"\n'
    attempt("grammar_groups", lambda: wb.complete(m, "Hi", grammar=deep_groups, response_tokens=1))
    attempt("grammar_chain", lambda: wb.complete(m, "Hi", grammar=chain, response_tokens=1))
    schema = {"type": "string"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    attempt("json_schema", lambda: wb.complete(m, "Hi", json_schema=schema, response_tokens=1))
    attempt("json_schema_text", lambda: wb.complete(m, "Hi", json_schema='{"a":' * 100000 + "1" + "}" * 100000,
                                                    response_tokens=1))
    args = {"x": 1}
    for _ in range(5000):
        args = {"x": args}
    call = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f", "arguments": args}]}]
    attempt("messages", lambda: wb.render_chat_template(m, call))
    attempt("messages_text", lambda: wb.render_chat_template(m, [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "name": "f", "arguments": '{"x":' * 3000 + "1" + "}" * 3000}]}]))
    # a reply nested 5,000 deep through a tool-call template's parser
    qwen = open("vendor/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja").read()
    vocab = _native.Model("vendor/llama.cpp/models/ggml-vocab-qwen2.gguf", 0, True, True)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}}
    r = render(vocab, _native.ChatTemplates(vocab, qwen), [{"role": "user", "content": "hi"}], [tool], ChatOptions())
    reply = '<tool_call>\n{"name": "f", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}\n</tool_call>"
    message, error = parse_reply(r.parser, reply)
    out["reply"] = f"parse_error: {error}" if error else "parsed"
    out["reply_content_kept"] = message["content"] == reply
    # brackets inside strings are text, not nesting
    out["brackets_in_text"] = "[" * 5000 in wb.render_chat_template(m, [{"role": "user", "content": "[" * 5000}]).prompt
    # still usable afterwards
    out["after"] = wb.complete(m, "The capital of France is", response_tokens=3).reply
    print(json.dumps(out))
''')


def test_deeply_nested_input_is_refused_not_fatal(model_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(model_path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["grammar_groups"].startswith("InvalidOption") and "nested 20000 deep" in out["grammar_groups"]
    assert out["grammar_chain"].startswith("InvalidOption") and "200002 rules; at most 20000" in out["grammar_chain"]
    for key in ("json_schema", "json_schema_text", "messages"):
        assert out[key].startswith("InvalidOption") and "deeply" in out[key], out[key]
    assert out["messages_text"].startswith("InvalidOption"), out["messages_text"]
    assert out["reply"].startswith("parse_error") and "512 deep" in out["reply"]
    assert out["reply_content_kept"] is True and out["brackets_in_text"] is True
    assert out["after"].strip()


TEMPLATE_CHILD = textwrap.dedent(r'''
    import importlib, json, sys, time
    import workbench as wb
    probe = importlib.import_module("workbench.chat.probe")
    probe.TIMEOUT_S = 3.0
    m = wb.load_model(model_path=sys.argv[1], n_seq_max=1)
    msgs = [{"role": "user", "content": "hi"}]
    out = {}
    for name, t in [("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                    ("nesting", "{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}"),
                    ("loop", "{% for i in range(1000000000) %}x{% endfor %}"),
                    ("fine", "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")]:
        try:
            out[name] = "ok: " + wb.render_chat_template(m, msgs, chat_template=t).prompt
        except Exception as e:
            out[name] = f"{type(e).__name__}: ...{str(e)[-300:]}"
    for name, t in [("recursion_again", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                    ("loop_again", "{% for i in range(1000000000) %}x{% endfor %}")]:
        started = time.perf_counter()
        try:
            wb.render_chat_template(m, msgs, chat_template=t)
            out[name] = ["ok", 0.0]
        except Exception as e:  # a refusal is remembered: no second probe
            out[name] = [type(e).__name__, time.perf_counter() - started]
    out["after"] = wb.chat(m, msgs, response_tokens=2).reply
    print(json.dumps(out))
''')


def test_templates_that_kill_or_hang_their_renderer_are_refused(model_path, tmp_path):
    """llama.cpp's jinja engine recurses and loops without bounds: each new template is
    tried in a child process first (before: the first two cases were SIGSEGV)."""
    env = dict(os.environ, WORKBENCH_HOME=str(tmp_path))   # no verdicts remembered from earlier runs
    done = subprocess.run([sys.executable, "-c", TEMPLATE_CHILD, str(model_path)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("recursion", "nesting"):
        assert out[name].startswith("InvalidOption") and "killed by SIGSEGV" in out[name], out[name]
    assert out["loop"].startswith("InvalidOption") and "within 3 s" in out["loop"], out["loop"]
    assert out["fine"] == "ok: <user>hi"
    assert out["after"]
    for name in ("recursion_again", "loop_again"):   # refused again at once, not re-probed
        assert out[name][0] == "InvalidOption" and out[name][1] < 0.5, out[name]
    verdicts = sorted(p.suffix for p in (tmp_path / "template-probes").iterdir())
    # the good ones and the two that killed the probe remembered on disk; a timeout only in memory
    assert verdicts == ["", "", ".refused", ".refused"], verdicts
