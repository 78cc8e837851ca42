"""Thinking on a raw ``stream()`` / ``complete()`` (no chat template rendering).

``thinking=True`` wraps the request's Stream in a :class:`ThinkingResultStream`, the same
splitter chat uses (thinking.py): ``Thinking(text)`` events for the block's text, one
``ThinkingEnd(signature)``, the rest unchanged; ``complete()`` returns a
:class:`ThinkingResult` (the raw ``reply`` plus ``thinking``, ``thinking_signature`` and
``content``, the text outside the block).

Markers, first found: the request option ``thinking_markers``, the load option
``thinking_markers``, the model's chat template's thinking tags (llama.cpp common's
reading of the template, as chat uses). The block opens at the head of the reply, or from
the first token when the prompt ends with the start marker. ``thinking_budget_tokens=N``
sets the request's ``reasoning_budget`` as chat does, so the model itself stops thinking.

The thinking options are split from the request options, and refused without
``thinking=True``, in workbench/options (``split_thinking``): a plain request never comes here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.events import CompletionResult, Error
from ..engine.stream import Stream
from ..errors import InvalidOption, NoChatTemplate
from ..options import ChatOptions, RequestOptions, ThinkingOptions, amend
from .render import render, templates_for
from .thinking import (ThinkingMarkers, ThinkingSplitter, ThinkingStream, budget_option, shown_specials,
                       special_markers)

_PROBE = [{"role": "user", "content": "Hi"}]   # a conversation to read the template's thinking tags from
_TAIL_TOKENS = 32                               # prompt tokens read back to see if it opens the block


@dataclass(slots=True, frozen=True)
class ThinkingPlan:
    markers: ThinkingMarkers
    inside: bool
    budget: int | None
    key: bytes | None
    request: RequestOptions    # the request's options with what thinking sets (reasoning_budget, render_special)


def plan(engine: Any, prompt_tokens: list[int], topts: ThinkingOptions, ropts: RequestOptions,
         given: Mapping[str, Any]) -> ThinkingPlan:
    """The thinking plan of a raw request with ``thinking=True`` (workbench/options'
    ``split_thinking`` has refused thinking options without it): its markers, and ``ropts``
    with the request options it needs (reasoning_budget, render_special for markers that are
    control tokens). ``given``: the request options as the caller passed them."""
    markers = _markers(engine, topts)
    tail = engine.model.detokenize(prompt_tokens[-_TAIL_TOKENS:], False, True).decode("utf-8", "replace")
    inside = bool(markers.start) and tail.rstrip().endswith(markers.start)
    changes: dict[str, Any] = {}
    if topts.thinking_budget_tokens is not None:
        changes["reasoning_budget"] = budget_option(given.get("reasoning_budget"), markers,
                                                    topts.thinking_budget_tokens, inside)
    changes.update(shown_specials(ropts.render_special, special_markers(engine.model, (markers.start, markers.end))))
    return ThinkingPlan(markers, inside, topts.thinking_budget_tokens, engine.cfg.thinking_signing_key,
                        amend(ropts, changes))


def _markers(engine: Any, topts: ThinkingOptions) -> ThinkingMarkers:
    given = topts.thinking_markers or engine.cfg.thinking_markers
    if given:
        return ThinkingMarkers(given["start"], given["end"])
    found = template_markers(engine)
    if found is None:
        raise InvalidOption("thinking_markers", None, "{'start': ..., 'end': ...}: this model's chat template "
                                                      "has no thinking markers (nor did load_model get any)")
    return found


def template_markers(engine: Any) -> ThinkingMarkers | None:
    """The thinking tags of the model's chat template, None when it has none (or no template)."""
    try:
        tmpls = templates_for(engine)
    except NoChatTemplate:
        return None
    r = render(engine.model, tmpls, _PROBE, None, ChatOptions(thinking="enabled"))
    if not (r.supports_thinking and r.thinking_end):
        return None
    return ThinkingMarkers(r.thinking_start or "", r.thinking_end)


@dataclass(slots=True, frozen=True)
class ThinkingResult(CompletionResult):
    """complete(thinking=True)'s result: the CompletionResult fields (``reply`` as generated)
    plus the block's text, its signature ('' unsigned; None when no block closed) and the
    text outside it."""

    thinking: str = ""
    thinking_signature: str | None = None
    content: str = ""


class ThinkingResultStream(ThinkingStream):
    """stream(thinking=True)'s handle: a ThinkingStream whose ``result()`` is a ThinkingResult."""

    def __init__(self, stream: Stream, p: ThinkingPlan) -> None:
        super().__init__(stream, ThinkingSplitter(p.markers, inside=p.inside, budget=p.budget, key=p.key))

    def result(self) -> ThinkingResult:
        """Wait for the end and return the result (raises the request's error)."""
        for ev in self.drain():
            if isinstance(ev, Error):
                raise ev.reason
        if self.error is not None:
            raise self.error
        if self.done is None:
            raise RuntimeError("the stream was closed before it ended")
        base = CompletionResult.from_done(self.done, self.model, self.ref)
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(CompletionResult)}
        sp = self.splitter
        assert sp is not None
        return ThinkingResult(**values, thinking=sp.thinking, thinking_signature=sp.signature, content=sp.text)
