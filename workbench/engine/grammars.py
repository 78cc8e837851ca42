"""The compiled-grammar cache: an identical grammar is parsed once per model.

Agentic clients resend the same tool grammar every turn and parsing a large GBNF costs
more than the rest of admission. Entries are keyed by the grammar text itself (a dict
lookup compares the full string, so identity is confirmed byte for byte, not by hash) and
hold a native prototype that each request clones. JSON schemas are converted to GBNF by
llama.cpp common's converter, and the conversion is cached the same way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .. import _native
from ..errors import InvalidOption, SamplingFailed, WorkbenchError
from ..options import RequestOptions
from .schema_patterns import unsatisfiable_pattern


class GrammarCache:
    def __init__(self, model: Any, capacity: int = 32) -> None:
        self._model = model
        self._capacity = capacity
        self._lock = threading.Lock()
        self._grammars: OrderedDict[tuple[str, str], Any] = OrderedDict()  # (text, root)
        self._schemas: OrderedDict[str, str] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def for_request(self, grammar: str | None, json_schema: str | None, root: str = "root") -> Any:
        """The native Grammar prototype for a request's options, or None. ``root``: the
        grammar's start rule (grammar_root; a JSON schema's grammar starts at 'root')."""
        if grammar is not None and json_schema is not None:
            raise InvalidOption("json_schema", "...", "not both grammar and json_schema")
        if root != "root" and grammar is None:
            raise InvalidOption("grammar_root", root, "'root' unless grammar is given (it names a rule of grammar)")
        if json_schema is not None:
            grammar = self._schema_grammar(json_schema)
            key = "json_schema"
        else:
            key = "grammar"
        if grammar is None:
            return None
        with self._lock:
            proto = self._grammars.get((grammar, root))
            if proto is not None:
                self._grammars.move_to_end((grammar, root))
                self.hits += 1
                return proto
        try:
            proto = _native.Grammar(self._model, grammar, root)
        except ValueError as e:
            raise self._refused(key, grammar if key == "grammar" else json_schema, root, e) from None
        with self._lock:
            self.misses += 1
            self._grammars[(grammar, root)] = proto
            while len(self._grammars) > self._capacity:
                self._grammars.popitem(last=False)
        return proto

    @staticmethod
    def _refused(key: str, value: str | None, root: str, err: ValueError) -> InvalidOption:
        """llama.cpp refused the grammar: a missing start rule names grammar_root."""
        if root != "root" and f"'{root}'" in str(err):
            return InvalidOption("grammar_root", root, f"a rule the grammar defines: {err}")
        return InvalidOption(key, value, f"a grammar llama.cpp accepts: {err}")

    def _schema_grammar(self, schema_json: str) -> str:
        with self._lock:
            hit = self._schemas.get(schema_json)
        if hit is not None:
            return hit
        nothing = unsatisfiable_pattern(schema_json)
        if nothing is not None:
            pattern, cls = nothing
            raise InvalidOption("json_schema", schema_json, f"a satisfiable schema (the pattern {pattern!r} can match "
                                f"no string: no character is in its class {cls!r})")
        try:
            gbnf = _native.json_schema_to_grammar(schema_json)
        except ValueError as e:
            raise InvalidOption("json_schema", schema_json, f"a JSON schema llama.cpp can convert: {e}") from None
        with self._lock:
            self._schemas[schema_json] = gbnf
            while len(self._schemas) > self._capacity:
                self._schemas.popitem(last=False)
        return gbnf

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._grammars)}


def sampling_failed(grammar: str | None, json_schema: str | None, err: Exception) -> WorkbenchError:
    """The error a request ends with when llama.cpp's sampler chain throws (e.g. its grammar
    matcher cannot accept the token it let through: negated token references): a grammar or
    schema is named as the cause, otherwise SamplingFailed."""
    if json_schema is not None:
        return InvalidOption("json_schema", json_schema, f"a schema llama.cpp's grammar matcher can run: {err}")
    if grammar is not None:
        return InvalidOption("grammar", grammar, f"a grammar llama.cpp's grammar matcher can run: {err}")
    return SamplingFailed(f"llama.cpp's sampler failed: {err}")


def sampler_refused(opts: RequestOptions, err: ValueError) -> WorkbenchError:
    """The error a request ends with when its native sampler refuses it: when it is made
    (a parameter) or mid-way (no token can continue: csrc/sampler.cpp finds which part
    ruled the last ones out). The native message starts with that part ("logit_bias: ...",
    "grammar: ..."); the error names it only as an option the caller gave (a grammar as
    json_schema when one came from a schema), else SamplingFailed: never an option the
    request does not have."""
    part, _, why = str(err).partition(": ")
    if part == "grammar" and opts.json_schema is not None:
        return InvalidOption("json_schema", opts.json_schema, f"a schema some continuation can satisfy ({why})")
    if part == "grammar" and opts.grammar is not None:
        return InvalidOption("grammar", opts.grammar, f"a grammar some continuation can satisfy ({why})")
    if part == "logit_bias" and opts.logit_bias:
        constrained = opts.grammar is not None or opts.json_schema is not None
        shown = opts.logit_bias if len(opts.logit_bias) <= 8 else f"{len(opts.logit_bias)} entries"
        return InvalidOption("logit_bias", shown, "a bias that leaves " + (
            "the grammar some token it allows" if constrained else "some token possible") + f" ({why})")
    value = getattr(opts, part, None) if part in RequestOptions.__dataclass_fields__ else None
    if value is not None:
        return InvalidOption(part, value, f"a value llama.cpp's sampler accepts ({why})")
    return SamplingFailed(f"llama.cpp's sampler refused the request: {err}")
