"""The `pattern`s of a JSON schema that no string can match.

llama.cpp's schema converter turns a pattern into GBNF only as far as it supports the
regex: an escape it does not take inside a character class (``\\s``, ``\\d``, ``\\w``) makes
it accept any string instead (a warning on stderr). So ``^[^\\s\\S]$``, whose class no
character matches, became "any string" and the reply broke the pattern; ``^[]$`` became a
grammar that dies after the opening quote. Such schemas are refused before conversion.

A pattern is read as JSON Schema's regex dialect (ECMA-262), without recursion: a
disjunction can match when one of its alternatives can; an alternative when each of its
terms can or may occur zero times (``?``, ``*``, ``{0,n}``); a character class when the code
points it names are not none (a negated class: not all of U+0000..U+10FFFF), with ``\\d``,
``\\w``, ``\\s`` and their negations as sets of ranges. What is not understood (lookarounds,
backreferences, ``\\p{..}``) is taken as able to match: only a pattern that surely matches
nothing is refused.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from typing import Any

MAX_CODE_POINT = 0x10FFFF
Ranges = list[tuple[int, int]]

_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),  # ECMA's \s
                  (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
_CONTROL = {"b": 0x08, "t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}
_HEX = {"x": 2, "u": 4}
_REPEAT = re.compile(r"\{(\d+)(,\d*)?\}")
_NOT_DATA = ("enum", "const", "default", "examples")  # values given as data, not subschemas


def _merged(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in _merged(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = max(at, hi + 1)
    if at <= MAX_CODE_POINT:
        out.append((at, MAX_CODE_POINT))
    return out


_SETS = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_SETS.update({k.upper(): _complement(v) for k, v in list(_SETS.items())})


def _class_atom(p: str, j: int) -> tuple[int | Ranges | str | None, int]:
    """One member of a character class at p[j]: a code point, a set of ranges, "-" for a
    bare dash (a range's), or None for one not understood; and the index past it."""
    if p[j] != "\\":
        return ("-" if p[j] == "-" else ord(p[j])), j + 1
    if j + 1 >= len(p):
        return None, j + 1
    e = p[j + 1]
    if e in _SETS:
        return _SETS[e], j + 2
    if e in _CONTROL and not (e == "0" and p[j + 2:j + 3].isdigit()):
        return _CONTROL[e], j + 2
    digits = p[j + 2:j + 2 + _HEX.get(e, 0)]
    if e in _HEX and len(digits) == _HEX[e] and all(ch in string.hexdigits for ch in digits):
        return int(digits, 16), j + 2 + _HEX[e]
    if e == "c" and p[j + 2:j + 3].isascii() and p[j + 2:j + 3].isalpha():
        return ord(p[j + 2]) % 32, j + 3
    if e.isalnum():  # \p{..}, \u{..}, octal or a backreference: not understood
        return None, j + 2
    return ord(e), j + 2  # an escaped punctuation mark is itself


def _char_class(p: str, i: int) -> tuple[int, bool] | None:
    """The class at p[i] == '[': the index past its ']' and whether some character matches
    it; None when it is not closed."""
    j = i + 1
    negated = p[j:j + 1] == "^"
    j += negated
    members: list[int | Ranges | str | None] = []
    while j < len(p) and p[j] != "]":
        member, j = _class_atom(p, j)
        members.append(member)
    if j >= len(p):
        return None
    if None in members:
        return j + 1, True
    ranges: Ranges = []
    k = 0
    while k < len(members):
        m = members[k]
        lo, hi = m, members[k + 2] if k + 2 < len(members) else None
        if isinstance(lo, int) and members[k + 1:k + 2] == ["-"] and isinstance(hi, int):
            ranges.append((lo, hi))
            k += 3
            continue
        if isinstance(m, list):
            ranges.extend(m)
        else:
            c = ord("-") if m == "-" else m
            assert isinstance(c, int)
            ranges.append((c, c))
        k += 1
    named = [r for r in ranges if r[0] <= r[1]]
    return j + 1, bool(_complement(named) if negated else named)


@dataclass(slots=True)
class _Disjunction:
    """A group (or the whole pattern) being read: can one of its alternatives match?"""

    lookaround: bool = False
    some_alternative: bool = False   # a finished alternative can match
    this_alternative: bool = True    # the alternative being read can, so far
    last: bool | None = None         # the last term can match (its quantifier may follow)
    last_why: str | None = None
    why: str | None = None           # the first class that matches nothing, for the message

    def term(self, can: bool, why: str | None = None) -> None:
        self._commit()
        self.last, self.last_why = can, why

    def may_be_absent(self) -> None:
        if self.last is not None:
            self.last = True

    def alternative(self) -> None:
        self._commit()
        self.some_alternative |= self.this_alternative
        self.this_alternative = True

    def close(self) -> bool:
        self.alternative()
        return self.some_alternative or self.lookaround

    def _commit(self) -> None:
        if self.last is False:
            self.this_alternative = False
            self.why = self.why or self.last_why
        self.last = None


def pattern_matches_nothing(pattern: str) -> str | None:
    """The character class that makes ``pattern`` match no string (one no character
    matches, in a term every alternative needs), or None when some string may match or
    the pattern is not understood."""
    groups = [_Disjunction()]
    i, quantified = 0, False
    while i < len(pattern):
        c, g = pattern[i], groups[-1]
        step, was_quantified, quantified = 1, quantified, False
        if c == "\\":
            g.term(True)
            step = 2
        elif c == "[":
            read = _char_class(pattern, i)
            if read is None:
                return None
            end, can = read
            g.term(can, None if can else pattern[i:end])
            step = end - i
        elif c == "(":
            prefix = re.match(r"\(\?(?:[:=!]|<[=!]|<[A-Za-z_$][\w$]*>)?", pattern[i:])
            look = pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i)
            groups.append(_Disjunction(lookaround=look))
            step = len(prefix.group()) if prefix else 1
        elif c == ")":
            if len(groups) == 1:
                return None
            inner = groups.pop()
            groups[-1].term(inner.close(), inner.why)
        elif c == "|":
            g.alternative()
        elif c == "?" and was_quantified:
            pass  # lazy
        elif c in "*?+":
            if c != "+":
                g.may_be_absent()
            quantified = True
        elif c == "{" and (rep := _REPEAT.match(pattern, i)):
            if int(rep.group(1)) == 0:
                g.may_be_absent()
            quantified, step = True, len(rep.group())
        else:
            g.term(True)  # a literal, '.', an anchor
        i += step
    if len(groups) != 1:
        return None
    top = groups[0]
    return None if top.close() else top.why


def unsatisfiable_pattern(schema_json: str) -> tuple[str, str] | None:
    """(pattern, class) for the first string pattern of a schema (given as JSON text) that
    no string can match, else None."""
    try:
        todo: list[Any] = [json.loads(schema_json)]
    except (ValueError, RecursionError):
        return None
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        kind, pattern = node.get("type"), node.get("pattern")
        for_strings = kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)
        if isinstance(pattern, str) and for_strings:
            why = pattern_matches_nothing(pattern)
            if why is not None:
                return pattern, why
        todo.extend(v for k, v in node.items() if k not in _NOT_DATA)
    return None
