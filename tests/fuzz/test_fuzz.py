"""Fuzzing everything a user or a file supplies, with crash detection (tests/fuzz/harness.py).

Every case runs in one long-lived worker child that loads the default model once; a case
that kills it (a signal), hangs it (no answer in time) or makes it grow without bound fails
its example with the input and the child's last words, and the next case gets a fresh
worker. What each example asserts is the standard: the process lives, the call returns or
raises a ``WorkbenchError`` (never a bare TypeError / ValueError / RuntimeError), no
sequence is left busy, and the baseline greedy reply is unchanged afterwards. Some families
assert more: stop sequences trim the reply exactly; a damaged cache row file is rejected
with a counted reason and never served.

Every input family is drawn, issue 10's (items 1-11) included; one whose crash is found and
not yet fixed goes into strategies.KEPT_OUT until its fix lands (WORKBENCH_FUZZ_KNOWN=all
draws it anyway; see strategies.known).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from . import strategies as S

pytestmark = [pytest.mark.fuzz, pytest.mark.model]

TOTAL = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "1200"))
WEIGHTS = {  # share of TOTAL per family (cheap families get more)
    "request_options": 0.14, "load_options": 0.025, "chat_options": 0.06, "prompts": 0.08, "tokens": 0.08,
    "gbnf": 0.12, "gbnf_nearly": 0.06, "json_schema": 0.10, "json_schema_nearly": 0.05, "stop_sequences": 0.06,
    "chat_messages": 0.09, "row_files": 0.05, "api_calls": 0.06, "embed": 0.025,
}
_SEED = os.environ.get("WORKBENCH_FUZZ_SEED")
_PHASES = [Phase.explicit, Phase.generate, Phase.target] + (
    [Phase.shrink] if os.environ.get("WORKBENCH_FUZZ_SHRINK", "1") == "1" else [])
_checks = {"n": 0}


def fuzz(family: str):
    """hypothesis settings for one family: its share of the examples, reproducible draws."""
    n = max(8, round(TOTAL * WEIGHTS[family]))
    s = settings(max_examples=n, derandomize=_SEED is None, deadline=None, database=None, phases=_PHASES,
                 suppress_health_check=list(HealthCheck), print_blob=False)

    def wrap(fn):
        fn = s(fn)
        return seed(int(_SEED))(fn) if _SEED is not None else fn
    return wrap


def run(worker, family: str, case: dict, timeout: float = 30.0):
    _checks["n"] += 1
    case.setdefault("check_reply", _checks["n"] % 40 == 0)
    v = worker.run(family, case, timeout)
    v.assert_survived()
    return v


prompt_text = st.sampled_from(["Hi", "The capital of France is", "<|im_start|>user\nhello<|im_end|>", "1 2 3"])


@fuzz("request_options")
@given(prompt=st.one_of(prompt_text, S.text), opts=S.request_opts)
def test_request_options(fuzz_worker, prompt, opts):
    run(fuzz_worker, "request_options", {"kind": "complete", "prompt": prompt, "opts": opts})


@fuzz("load_options")
@given(kwargs=S.load_kwargs, as_config=st.booleans(), generate=st.booleans())
def test_load_options(fuzz_worker, kwargs, as_config, generate):
    kwargs.setdefault("model_path", fuzz_worker.info.get("model_path") or _default_path())
    case = {"kind": "load", "generate": generate}
    if as_config:
        case["config"] = kwargs
    else:
        case["kwargs"] = kwargs
    run(fuzz_worker, "load_options", case, timeout=120)


def _default_path() -> str:
    from workbench.models import default_model_path

    return str(default_model_path())


@fuzz("chat_options")
@given(opts=S.chat_and_request_opts, render=st.booleans())
def test_chat_options(fuzz_worker, opts, render):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    run(fuzz_worker, "chat_options", {"kind": "chat", "messages": msgs, "opts": opts,
                                      "mode": "render" if render else "chat"})


@fuzz("prompts")
@given(prompt=S.prompts, add_special=st.one_of(st.booleans(), S.weird), parse_special=st.booleans())
def test_prompts(fuzz_worker, prompt, add_special, parse_special):
    run(fuzz_worker, "prompts", {"kind": "complete", "prompt": prompt,
                                 "opts": {"add_special": add_special, "parse_special": parse_special}})


@fuzz("tokens")
@given(which=st.integers(0, 2), text=S.text, tokens=S.token_lists,
       flags=st.lists(st.one_of(st.booleans(), S.weird) if S.known("N1") else st.booleans(), max_size=2))
def test_tokenize_detokenize(fuzz_worker, which, text, tokens, flags):
    if which == 0:
        case = {"kind": "tokenize", "text": text, "args": tuple(flags), "roundtrip": True}
    elif which == 1:
        case = {"kind": "detokenize", "tokens": tokens, "args": tuple(flags)}
    else:
        case = {"kind": "complete", "prompt": tokens, "opts": {"response_tokens": 2}}
    run(fuzz_worker, "tokens", case)


@fuzz("gbnf")
@given(grammar=S.gbnf(tokens=True), temperature=st.sampled_from([0.0, 0.8]))
def test_gbnf(fuzz_worker, grammar, temperature):
    v = run(fuzz_worker, "gbnf", {"kind": "complete", "prompt": "Answer:",
                                  "opts": {"grammar": grammar, "temperature": temperature, "seed": 1}})
    # a syntactically valid grammar is refused only by llama.cpp's own limits or its token refs
    if v.kind == "workbench":
        assert v.error_type == "InvalidOption", v.explain()


@fuzz("gbnf_nearly")
@given(grammar=S.nearly_gbnf())
def test_gbnf_nearly_valid(fuzz_worker, grammar):
    v = run(fuzz_worker, "gbnf_nearly", {"kind": "complete", "prompt": "Answer:", "opts": {"grammar": grammar}})
    if v.kind == "workbench":
        assert v.error_type == "InvalidOption", v.explain()


@fuzz("json_schema")
@given(schema=S.json_schema, as_text=st.booleans())
def test_json_schema(fuzz_worker, schema, as_text):
    import json

    value = json.dumps(schema) if as_text else schema
    run(fuzz_worker, "json_schema", {"kind": "complete", "prompt": "JSON:", "opts": {"json_schema": value}})


@fuzz("json_schema_nearly")
@given(schema=S.nearly_json_schema())
def test_json_schema_nearly_valid(fuzz_worker, schema):
    run(fuzz_worker, "json_schema_nearly", {"kind": "complete", "prompt": "JSON:", "opts": {"json_schema": schema}})


STOP_PROMPTS = ("The capital of France is", "Once upon a time,", "def fibonacci(n):", "1, 2, 3, 4,")
stop_item = st.one_of(
    st.tuples(st.just("reply"), st.integers(0, 200), st.integers(1, 12)),  # a piece of the reply
    S.text, st.sampled_from(["\n", " ", ".", "<|im_end|>", "é"]),
)


def _cut_at_first_stop(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """The reply a user sees: the text grows a token at a time; the first token after which
    some stop sequence appears ends it, cut where the earliest-starting one that has
    appeared starts (a longer stop that started earlier but completes later does not
    count: ' Paris.\\n\\n' loses to '\\n' in ' Paris.\\n')."""
    text = ""
    for piece in pieces:
        text += piece
        starts = [text.find(s) for s in stops if s and s in text]
        if starts:
            return text[:min(starts)], True
    return text, False


@fuzz("stop_sequences")
@given(prompt=st.sampled_from(STOP_PROMPTS), stops=st.lists(stop_item, max_size=4), cache=st.booleans())
def test_stop_sequences(fuzz_worker, prompt, stops, cache):
    v = run(fuzz_worker, "stop_sequences", {"kind": "stop", "prompt": prompt, "stops": stops, "cache": cache})
    if v.kind != "ok":
        assert v.error_type == "InvalidOption", v.explain()
        return
    f = v.facts
    reply, used = f["reply"], f["stops"]
    expected, hit = _cut_at_first_stop(f["pieces"], used)
    # the reply is the greedy one, ended by the first stop sequence to appear as the tokens
    # come (cut where it starts); none leaks into it
    assert reply == expected, f"stops {used!r}: reply {reply!r}, expected {expected!r} (from {f['pieces']!r})"
    assert not any(s and s in reply for s in used), f"a stop sequence leaked: {used!r} in {reply!r}"
    if hit:
        assert f["finish_reason"] == "stop" and f["stop_sequence"] in used, f


@fuzz("chat_messages")
@given(conv=S.conversation, tool_choice=st.one_of(st.none(), S.CHAT_VALID["tool_choice"], S.weird),
       mode=st.sampled_from(["render", "render", "chat"]))
def test_chat_messages(fuzz_worker, conv, tool_choice, mode):
    messages, tools = conv
    opts = {"tool_choice": tool_choice} if mode == "render" else {}
    case = {"kind": "chat", "messages": messages, "tools": tools, "mode": mode, "opts": opts}
    if mode == "chat":
        case["tool_choice"] = tool_choice
    run(fuzz_worker, "chat_messages", case)


@fuzz("row_files")
@given(mutation=S.row_mutation)
def test_row_files(fuzz_worker, mutation):
    v = run(fuzz_worker, "row_files", {"kind": "row", "mutation": mutation}, timeout=60)
    assert v.kind == "ok", v.explain()
    f = v.facts
    op = mutation[0]
    if op == "payload_resealed":
        # a changed llama.cpp state under valid checksums: integrity checks cannot tell it from
        # a saved one (the trust model in docs/reliability.md). The state is checked against the
        # context before llama.cpp restores it: refused, the row is counted and the request is
        # cold (the cold reply); accepted, it was valid in shape and its KV is served as is.
        # Either way the worker lives and no sequence stays busy (checked by run).
        if f["hit"] == "cold" and f["rows_read"]:
            assert f["reply_ok"] and f["rejected"].get("total", 0) >= 1, f"a refused restore was not counted: {f}"
        return
    # never a wrong reply: an adopted row must compute what the cold run did (warm == cold)
    assert f["reply_ok"], f"the reply changed with a damaged row {mutation!r}: {f}"
    if f["identical"]:
        assert f["adopted"] >= 1 and f["hit"] == "exact", f"a pristine row was not served: {f}"
    elif op == "field":
        pass  # a re-sealed header may describe the same chunk (reserved, created_at, fingerprint): either outcome
    elif op in ("symlink", "directory", "fifo"):
        assert f["hit"] == "cold", f"a row that is not a regular file was served: {mutation!r} {f}"
    else:
        assert f["hit"] == "cold" and f["rows_read"] == 0, f"a damaged row was served: {mutation!r} {f}"
        assert f["rejected"].get("total", 0) >= 1, f"a damaged row was not rejected and counted: {mutation!r} {f}"


def _api_call():
    sid = st.one_of(st.sampled_from(["s1", 0, 1, -1, None, True, 2.5]), S.text)
    scope = st.one_of(st.sampled_from(["default", "t1"]), S.weird.filter(lambda x: x is not None or S.known(11)))
    calls = [
        st.tuples(st.sampled_from(["cached_prefix_len", "cached_prefix"]), st.tuples(st.just("<model>"), S.prompts),
                  st.fixed_dictionaries({}, optional={"cache_scope": scope})),
        st.tuples(st.just("pin_row"), st.tuples(st.one_of(S.text, S.weird)), st.just({})),
        st.tuples(st.just("evict_bytes"), st.tuples(S.weird), st.fixed_dictionaries({}, optional={"tier": S.weird})),
        st.tuples(st.just("request_info"), st.tuples(S.weird if S.known("N3") else S.hashable), st.just({})),
        st.tuples(st.just("cancel"), st.tuples(S.weird), st.just({})),
        st.tuples(st.sampled_from(["end_session", "reset_session"]), st.tuples(st.just("<model>"), sid), st.just({})),
        st.tuples(st.just("continue_session"), st.tuples(st.just("<model>"), sid, S.token_lists),
                  st.fixed_dictionaries({"response_tokens": st.just(2)},
                                        optional={"expect_committed": st.one_of(S.weird, S.ints)})),
        st.tuples(st.sampled_from(["model_info", "phase", "queue_depth", "pending_len", "sessions",
                                   "last_cache_hit", "unload"]), st.tuples(S.weird), st.just({})),
        st.tuples(st.just("prefill_only"), st.tuples(st.just("<model>"), S.prompts),
                  S.option_map(("cache_scope", "prefix_checkpoint_len", "session_id", "cache"), S.REQUEST_VALID,
                               max_size=2)),
        st.tuples(st.just("wait_for_saves"),
                  st.tuples(st.one_of(st.sampled_from([0, 0.0, 1, -1, None, True, "1", float("inf")]),
                                      st.just(float("nan")).filter(lambda _: S.known(11)))), st.just({})),
        st.tuples(st.just("load_adapter"), st.tuples(st.just("<model>"), st.sampled_from(
            ["", "/dev/null", "README.md", "missing.gguf", "vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf"]
            + ([3, None] if S.known("N2") else []))),
            st.fixed_dictionaries({}, optional={"scale": S.floats})),
        st.tuples(st.sampled_from(["unload_adapter", "set_adapter_scale"]),
                  st.tuples(st.just("<model>"), S.weird if S.known("N4") else S.hashable), st.just({})),
        # scoring (docs/scoring.md): texts, token lists and junk; sizes at their bounds
        st.tuples(st.just("score"), st.tuples(st.just("<model>"), S.prompts),
                  st.fixed_dictionaries({}, optional={"top": st.one_of(S.ints, S.weird),
                                                      "window": st.one_of(S.ints, S.weird),
                                                      "overlap": st.one_of(S.ints, S.weird), "cache_scope": scope})),
        st.tuples(st.sampled_from(["loglikelihood", "loglikelihood_rolling"]),
                  st.tuples(st.just("<model>"), st.one_of(st.lists(st.tuples(S.text, S.text), max_size=3),
                                                          st.lists(S.text, max_size=3), S.weird)), st.just({})),
        st.tuples(st.just("perplexity"), st.tuples(st.just("<model>"), st.one_of(S.text, S.weird)),
                  st.fixed_dictionaries({}, optional={"n_ctx": st.one_of(S.ints, S.weird),
                                                      "n_chunks": st.one_of(S.ints, S.weird)})),
    ]
    if S.known(11):
        calls.append(st.tuples(st.just("unpin_row"), st.tuples(st.one_of(S.text, S.weird)), st.just({})))
    return st.one_of(*calls)


@fuzz("api_calls")
@given(call=_api_call())
def test_api_calls(fuzz_worker, call):
    name, args, kwargs = call
    if name == "set_adapter_scale":
        args = args + (1.0,)
    if name in ("unload",) and args[0] == "<model>":
        return  # unloading the worker's own model is not an input error
    run(fuzz_worker, "api_calls", {"kind": "api", "call": name, "args": args, "kwargs": kwargs}, timeout=60)


@fuzz("embed")
@given(inputs=st.one_of(S.text, S.token_lists, S.weird), batch=st.booleans(),
       args=st.tuples(st.sampled_from(["mean", "cls", "last", "none", "max", 1]), st.one_of(st.booleans(), S.weird)))
def test_embed(fuzz_worker, inputs, batch, args):
    if batch:
        inputs = [inputs, "a sentence"]
    run(fuzz_worker, "embed", {"kind": "embed", "inputs": inputs, "batch": batch, "args": args}, timeout=60)
