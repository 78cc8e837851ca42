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


class GrammarCache:
    def __init__(self, model: Any, capacity: int = 32) -> None:
        self._model = model
        self._capacity = capacity
        self._lock = threading.Lock()
        self._grammars: OrderedDict[str, Any] = OrderedDict()
        self._schemas: OrderedDict[str, str] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def for_request(self, grammar: str | None, json_schema: str | None) -> Any:
        """The native Grammar prototype for a request's options, or None."""
        if grammar is not None and json_schema is not None:
            raise InvalidOption("json_schema", "...", "not both grammar and json_schema")
        if json_schema is not None:
            grammar = self._schema_grammar(json_schema)
            key = "json_schema"
        else:
            key = "grammar"
        if grammar is None:
            return None
        with self._lock:
            proto = self._grammars.get(grammar)
            if proto is not None:
                self._grammars.move_to_end(grammar)
                self.hits += 1
                return proto
        try:
            proto = _native.Grammar(self._model, grammar)
        except ValueError as e:
            raise InvalidOption(key, grammar if key == "grammar" else json_schema,
                                f"a grammar llama.cpp accepts: {e}") from None
        with self._lock:
            self.misses += 1
            self._grammars[grammar] = proto
            while len(self._grammars) > self._capacity:
                self._grammars.popitem(last=False)
        return proto

    def _schema_grammar(self, schema_json: str) -> str:
        with self._lock:
            hit = self._schemas.get(schema_json)
        if hit is not None:
            return hit
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


def grammar_dead_end(grammar: str | None, json_schema: str | None, err: Exception) -> InvalidOption:
    """The error a request ends with when its grammar leaves no token to sample mid-way (the
    native sampler refuses rather than let llama.cpp abort accepting a ruled-out token)."""
    if json_schema is not None:
        return InvalidOption("json_schema", json_schema, f"a schema some continuation can satisfy: {err}")
    return InvalidOption("grammar", grammar, f"a grammar some continuation can satisfy: {err}")
