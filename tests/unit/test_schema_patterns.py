"""Schema patterns no string can match (issue 24): llama.cpp's converter turned
``^[^\\s\\S]$`` into "any string" (it does not take \\s in a class), so the reply broke the
pattern; such patterns are found before conversion. Model-free."""

import json

import pytest

from workbench.engine.schema_patterns import pattern_matches_nothing, unsatisfiable_pattern


@pytest.mark.parametrize("pattern, cls", [
    (r"^[^\s\S]$", r"[^\s\S]"),
    (r"^[^\d\D]$", r"[^\d\D]"),
    (r"^[^\w\W]+$", r"[^\w\W]"),
    (r"^[^\S\s-]$", r"[^\S\s-]"),
    (r"^[]$", "[]"),
    (r"^a[]b$", "[]"),
    (r"^[z-a]$", "[z-a]"),                       # a reversed range names nothing
    (r"^((([])))$", "[]"),
    (r"^(a|[^\s\S])[]$", "[]"),                  # every alternative needs the last class
    (r"^(?:[^\d\D])$", r"[^\d\D]"),
    (r"^[^\s\S]{1,3}$", r"[^\s\S]"),
    (r"^[^\s\S]+?$", r"[^\s\S]"),                # lazy, still at least once
    # \s is ECMA's whitespace: with every other character named, the class is empty
    ("^[^\\t-\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff\\S]$", None),
])
def test_a_class_no_character_matches_is_found(pattern, cls):
    assert pattern_matches_nothing(pattern) == (cls or pattern[1:-1])


@pytest.mark.parametrize("pattern", [
    r"^[^]$", r"^[\s\S]$", r"^[^a-z]$", r"^[a-z]+$", r"^\d{3}-\d{4}$", r"^[\]]$", r"^[^\]]$", r"^[-]$",
    r"^a[^\s\S]?b$", r"^[^\s\S]*$", r"^[^\s\S]{0,3}$",   # the class may occur zero times
    r"^(a|[^\s\S])$", r"^(?:[^\d\D]|x)$",                # another alternative matches
    r"^(?![^\s\S])a$",                                   # a lookaround is not read
    r"^[^\p{L}\P{L}]$", r"^[^\x00-\uFFFF]$",             # \p not understood; astral code points left
    r"^[", r"^(a", r"^a)",                               # not regexes: left to llama.cpp's converter
    "^" + "(" * 5000 + ")" * 5000 + "$",                 # deep nesting is read without recursion
])
def test_a_pattern_some_string_may_match_passes(pattern):
    assert pattern_matches_nothing(pattern) is None


def test_the_schema_walk_finds_string_patterns_only():
    bad = {"type": "string", "pattern": r"^[^\s\S]$"}
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": bad}}}
    assert unsatisfiable_pattern(json.dumps(nested)) == (r"^[^\s\S]$", r"[^\s\S]")
    assert unsatisfiable_pattern(json.dumps({"anyOf": [{"type": "integer"}, bad]})) is not None
    assert unsatisfiable_pattern(json.dumps({"type": ["string", "null"], "pattern": "^[]$"})) == ("^[]$", "[]")
    # data and patterns llama.cpp's converter does not use
    assert unsatisfiable_pattern(json.dumps({"type": "string", "default": bad, "examples": [bad]})) is None
    assert unsatisfiable_pattern(json.dumps({"type": "integer", "pattern": "^[]$"})) is None
    assert unsatisfiable_pattern(json.dumps({"type": "string", "pattern": "^[a-z]+$"})) is None
