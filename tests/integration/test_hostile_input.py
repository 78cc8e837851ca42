"""Input that killed or hung the process (issue 10) must come back as a specific error.

Each case runs in a child process, so a regression shows up as a failed test with the
child's exit status (134 = SIGABRT from llama.cpp's GGML_ABORT) or a timeout (a grammar
parser allocating without end) instead of ending the whole test run. Before the guards:
a grammar no token can satisfy aborted in llama-grammar.cpp ("fatal error"), a repetition
whose maximum is below its minimum looped while memory grew by hundreds of MB/s, and a
lone surrogate raised pybind's TypeError.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.model

CHILD = textwrap.dedent(r'''
    import json, sys
    import workbench as wb

    m = wb.load_model(model_path=sys.argv[1], n_seq_max=1, n_ctx=512)
    out = {}

    def attempt(name, fn):
        try:
            r = fn()
            out[name] = ["ok", getattr(r, "finish_reason", None)]
        except Exception as e:  # the point: an exception, not a dead process
            out[name] = [type(e).__name__, getattr(e, "key", None), str(e)[-300:]]

    def grammar(g, **kw):
        return lambda: wb.complete(m, "Say:", grammar=g, response_tokens=8, **kw)

    def schema(s):
        return lambda: wb.complete(m, "Say:", json_schema=s, response_tokens=8)

    # no token can begin these (llama.cpp never matches a piece holding NUL or an unused code point)
    attempt("nul_literal", grammar('root ::= "\\x00"'))
    attempt("empty_class", grammar('root ::= [^\\x00-\\U0010FFFF]'))
    attempt("unused_code_point", grammar('root ::= "\\U00073465"'))
    # these begin, then leave no token mid-way: the request ends with an Error event
    attempt("nul_pattern", schema({"type": "string", "pattern": "^\\x00$"}))
    attempt("nul_after_a", grammar('root ::= "a" "\\x00"'))
    # patterns no string matches (a class no character is in): llama.cpp's converter made the
    # first "any string" (it does not take \s in a class) and the second a dead end after '"'
    attempt("nothing_class_pattern", schema({"type": "string", "pattern": "^[^\\s\\S]$"}))
    attempt("empty_class_pattern", schema({"type": "string", "pattern": "^[]$"}))
    attempt("nested_nothing_pattern", schema({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^(?:[^\\d\\D]{2}|[])$"}}}))
    attempt("optional_nothing_pattern", schema({"type": "string", "pattern": "^a[^\\w\\W]?$"}))
    # a finished grammar under ignore_eos: the request stops, as when the model stops
    attempt("done_ignore_eos", grammar('root ::= "a"', ignore_eos=True))
    # min > max
    attempt("gbnf_min_above_max", grammar('root ::= "a"{3,2}'))
    attempt("gbnf_min_above_max_spaced", grammar('root ::= [a-z]{ 7 , 1 }'))
    attempt("string_min_above_max", schema({"type": "string", "minLength": 5, "maxLength": 2}))
    attempt("items_min_above_max", schema({"type": "array", "minItems": 5, "maxItems": 2}))
    attempt("nested_min_above_max", schema({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer", "minimum": 9, "maximum": 1}}}}))
    attempt("pattern_min_above_max", schema({"type": "string", "pattern": "^a{5,2}$"}))
    # braces inside literals, classes and comments are text, not repetitions
    attempt("braces_in_text", grammar('root ::= "{3,2}" [{}] # {9,1}\n'))
    attempt("data_not_schema", schema({"type": "string", "maxLength": 3, "default": {"minLength": 5, "maxLength": 2}}))
    # large counts: llama.cpp's own caps refuse or bound them
    attempt("huge_min_length", schema({"type": "string", "minLength": 10**9}))
    attempt("huge_max_repeat", grammar('root ::= "a"{0,100000000}'))
    # nested repetitions: llama.cpp's match stacks grow with the product of the counts
    import time
    for name, fn in [("nested_gbnf_100", grammar('root ::= sub{0,100}\nsub ::= "a"{0,100}\n')),
                     ("nested_gbnf_200", grammar('root ::= sub{0,200}\nsub ::= "a"{0,200}\n')),
                     ("nested_after_prefix", grammar('root ::= "xyz" sub{0,100}\nsub ::= "a"{0,100}\n')),
                     ("nested_three_levels", grammar('root ::= b{0,20}\nb ::= c{0,20}\nc ::= "a"{0,20}\n')),
                     ("doubling_rules", grammar("root ::= r30\nr0 ::= \"a\"?\n" + "".join(
                         f"r{i} ::= r{i - 1} r{i - 1}\n" for i in range(1, 31)))),
                     ("nested_pattern", schema({"type": "string", "pattern": "^(a{0,1000}){0,1000}$"})),
                     ("small_nested_pattern", schema({"type": "string", "pattern": "^(a{0,10}){0,10}$"}))]:
        started = time.perf_counter()
        attempt(name, fn)
        out[name].append(time.perf_counter() - started)
    # a negated token reference llama.cpp's matcher then fails to accept (fuzz finding N5):
    # its sampler threw NativeError inside the model loop, the loop died and later requests hung
    negated = 'r1 ::= !<[2]> "\u00dfpZrls"{1,5}\nroot ::= [^x"]{0,1} .{4} .{1} r1+\n'
    attempt("negated_token_ref", lambda: wb.complete(m, "Answer:", grammar=negated, temperature=0.8, seed=1,
                                                     response_tokens=16))
    # lone surrogates, wherever a string crosses into native code
    attempt("surrogate_prompt", lambda: wb.complete(m, "ab\ud800", response_tokens=1))
    attempt("surrogate_tokenize", lambda: wb.tokenize(m, "\udfff"))
    attempt("surrogate_grammar", grammar('root ::= "\ud800"'))
    out["after"] = wb.complete(m, "The capital of France is", response_tokens=3).finish_reason
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def outcome(model_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(model_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["nul_literal", "empty_class", "unused_code_point"])
def test_a_grammar_no_token_can_begin_is_refused_at_admission(outcome, case):
    kind, key, message = outcome[case]
    assert (kind, key) == ("InvalidOption", "grammar")
    assert "no token of the model's vocabulary can begin" in message


@pytest.mark.parametrize("case,key", [("nul_pattern", "json_schema"), ("nul_after_a", "grammar")])
def test_a_grammar_that_leaves_no_token_ends_the_request(outcome, case, key):
    kind, got_key, message = outcome[case]
    assert (kind, got_key) == ("InvalidOption", key)
    assert "no token can continue" in message


@pytest.mark.parametrize("case,cls", [("nothing_class_pattern", r"'[^\\s\\S]'"), ("empty_class_pattern", "'[]'"),
                                      ("nested_nothing_pattern", r"'[^\\d\\D]'")])
def test_a_pattern_no_string_matches_is_refused(outcome, case, cls):
    """Issue 24: ^[^\\s\\S]$ was accepted and the reply broke the pattern."""
    kind, key, message = outcome[case]
    assert (kind, key) == ("InvalidOption", "json_schema")
    assert "can match no string" in message and f"class {cls}" in message


def test_a_pattern_whose_empty_class_may_be_absent_passes(outcome):
    assert outcome["optional_nothing_pattern"][0] == "ok"


def test_a_grammar_llama_cpp_fails_to_match_ends_only_its_request(outcome):
    kind, key, message = outcome["negated_token_ref"]
    assert (kind, key) == ("InvalidOption", "grammar") and "grammar matcher" in message
    assert outcome["after"] == "length"     # the loop lived: the next request was served


def test_a_finished_grammar_under_ignore_eos_stops(outcome):
    assert outcome["done_ignore_eos"] == ["ok", "stop"]


@pytest.mark.parametrize("case,key,bound", [
    ("gbnf_min_above_max", "grammar", "'{3,2}'"),
    ("gbnf_min_above_max_spaced", "grammar", "minimum 7 above its maximum 1"),
    ("string_min_above_max", "json_schema", "minLength 5 is above maxLength 2"),
    ("items_min_above_max", "json_schema", "minItems 5 is above maxItems 2"),
    ("nested_min_above_max", "json_schema", "minimum 9 is above maximum 1"),
    ("pattern_min_above_max", "json_schema", "'{5,2}'"),
])
def test_a_repetition_with_min_above_max_is_refused(outcome, case, key, bound):
    kind, got_key, message = outcome[case]
    assert (kind, got_key) == ("InvalidOption", key)
    assert bound in message


@pytest.mark.parametrize("case", ["braces_in_text", "data_not_schema", "huge_max_repeat"])
def test_braces_that_are_not_bad_repetitions_pass(outcome, case):
    assert outcome[case][0] == "ok"


@pytest.mark.parametrize("case,key", [("nested_gbnf_100", "grammar"), ("nested_gbnf_200", "grammar"),
                                      ("nested_after_prefix", "grammar"), ("nested_three_levels", "grammar"),
                                      ("doubling_rules", "grammar"), ("nested_pattern", "json_schema")])
def test_nested_repetitions_are_refused_at_once(outcome, case, key):
    """These took 1.7 s (n=100), 36 s (n=200) and over 30 s (the pattern) in llama.cpp's matcher."""
    kind, got_key, message, seconds = outcome[case]
    assert (kind, got_key) == ("InvalidOption", key)
    assert "match stacks" in message and "at most 256" in message
    assert seconds < 10.0  # refused before matching (~0.05 s quiet); a loaded CI machine is slower


def test_a_small_nested_repetition_still_generates(outcome):
    kind, _finish, seconds = outcome["small_nested_pattern"]
    assert kind == "ok" and seconds < 60.0  # 8 tokens under the grammar; 12 s seen on a loaded machine


def test_a_huge_repetition_is_refused_by_llama_cpp_cleanly(outcome):
    kind, key, message = outcome["huge_min_length"]
    assert (kind, key) == ("InvalidOption", "json_schema") and "could not parse the grammar" in message


@pytest.mark.parametrize("case", ["surrogate_prompt", "surrogate_tokenize", "surrogate_grammar"])
def test_a_lone_surrogate_is_an_invalid_option(outcome, case):
    kind, _key, message = outcome[case]
    assert kind == "InvalidOption"
    assert "lone surrogate" in message and ("U+D800" in message or "U+DFFF" in message)


def test_the_model_still_answers_afterwards(outcome):
    assert outcome["after"] == "length"


def test_a_prompt_that_cannot_fit_is_refused_before_tokenising(model):
    """64,000 special tokens took 5 s to tokenise (llama.cpp's split is quadratic in them)."""
    import time

    import workbench as wb
    from workbench.errors import ContextOverflow

    text = "<|im_start|>" * 64_000
    for call in (lambda: wb.complete(model, text, response_tokens=1), lambda: wb.tokenize(model, text)):
        started = time.perf_counter()
        with pytest.raises(ContextOverflow, match="refused before tokenising"):
            call()
        assert time.perf_counter() - started < 0.5
    # what fits is tokenised as before
    assert wb.tokenize(model, "<|im_start|>" * 100, add_special=False) == wb.tokenize(model, "<|im_start|>")[-1:] * 100


@pytest.mark.load(n_seq_max=2)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the loop's traceback
@pytest.mark.timeout(60)  # before the fix the second call waited for ever
def test_a_loop_that_dies_fails_its_requests_and_refuses_new_ones(fresh_model, monkeypatch):
    """Whatever escapes a tick ends the loop: its requests end with EngineStopped naming the
    cause, and later calls raise it at once instead of queueing for a loop that is gone."""
    import workbench as wb
    from workbench import registry
    from workbench.errors import EngineStopped

    eng = registry.get(fresh_model)

    def broken(batch):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(eng.results, "apply", broken)
    events = list(wb.stream(fresh_model, "Hello there", response_tokens=4))
    assert isinstance(events[-1], wb.Error) and isinstance(events[-1].reason, EngineStopped)
    assert "injected failure" in str(events[-1].reason)
    with pytest.raises(EngineStopped, match="loop failed"):
        wb.complete(fresh_model, "Hello again", response_tokens=2)
    wb.unload(fresh_model)
