"""erllama's result facts on the real default model: a result's ``committed_tokens`` and
``last_cache_hit(model)['prefix_len']``, the prompt tokens the admission reused."""

from __future__ import annotations

import pytest

import workbench as wb

pytestmark = pytest.mark.model

PROMPT = "A long prompt about the history of the river towns, their bridges and their markets. " * 3


def test_committed_tokens_is_the_whole_context(model):
    r = wb.complete(model, "The capital of France is", response_tokens=6)
    assert r.committed_tokens == len(r.context_tokens) == r.stats.prompt_tokens + len(r.tokens)
    chat = wb.chat(model, [{"role": "user", "content": "Hi"}], response_tokens=4)
    assert chat.committed_tokens == len(chat.context_tokens)


def test_last_cache_hit_reports_the_reused_prefix_in_tokens(model):
    cold = wb.complete(model, PROMPT, response_tokens=2, cache_scope="facts-prefix")
    hit = wb.last_cache_hit(model)
    assert hit["ref"] == cold.ref and hit["kind"] == "cold" and hit["prefix_len"] == 0
    wb.wait_for_saves()
    warm = wb.complete(model, PROMPT, response_tokens=2, cache_scope="facts-prefix")
    hit = wb.last_cache_hit(model)
    assert hit["ref"] == warm.ref and hit["kind"] in ("exact", "partial")
    assert hit["prefix_len"] == warm.stats.cache_delta["read"] == warm.stats.prompt_tokens - warm.stats.prefilled_tokens
    assert 0 < hit["prefix_len"] < warm.stats.prompt_tokens
