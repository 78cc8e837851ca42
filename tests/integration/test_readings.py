"""The readings a researcher relies on are true: each request's hit kind and cache_delta
(in tokens) follow from what its KV came from, and the engine's hit counters agree with the
prefix cache's own, kind by kind, over a mixed workload."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.cache import HitKind

pytestmark = pytest.mark.model

SYSTEM = "<|im_start|>system\nYou are a careful assistant who answers in one short sentence.<|im_end|>\n"


def ask(question: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def read_is_reused(r: wb.CompletionResult) -> int:
    s = r.stats
    assert s.cache_delta["read"] == s.prompt_tokens - s.prefilled_tokens, s
    return s.cache_delta["read"]


def stored_context(r: wb.CompletionResult, deterministic: bool) -> int:
    """Tokens of the longest row a request stores. Deterministic: its finish row, the prompt
    and the reply as far as they are in the KV (a reply cut by response_tokens leaves its last
    token undecoded). Default mode: its prompt row (n - 1): the rest came from one-row
    decodes, which no row holds (docs/architecture.md, "Warm equals cold")."""
    s = r.stats
    if not deterministic:
        return s.prompt_tokens - 1
    return s.prompt_tokens + s.generated_tokens - (r.finish_reason == "length")


@pytest.mark.parametrize("deterministic", [
    pytest.param(False, marks=pytest.mark.load(n_seq_max=2)),
    pytest.param(True, marks=pytest.mark.load(n_seq_max=2, deterministic=True))])
def test_cache_delta_counts_tokens_on_every_kind_of_turn(fresh_model, deterministic):
    m, scope = fresh_model, "readings-delta"
    q = ask("Which planet is known as the red planet? Explain why it looks red.")
    cold = wb.complete(m, q, response_tokens=6, ignore_eos=True, cache_scope=scope)
    assert cold.stats.cache_hit_kind == "cold" and read_is_reused(cold) == 0
    # a cold request stores its prompt row (n - 1) and, deterministic, its finish row: the longest
    assert cold.stats.cache_delta["created"] == stored_context(cold, deterministic)
    assert wb.wait_for_saves()

    exact = wb.complete(m, q, response_tokens=6, ignore_eos=True, cache_scope=scope)
    assert exact.stats.cache_hit_kind == "exact" and read_is_reused(exact) == exact.stats.prompt_tokens - 1
    # the same prompt, the same greedy reply: its rows exist already, nothing is added
    assert exact.tokens == cold.tokens and exact.stats.cache_delta["created"] == 0

    longer = q + cold.reply + "<|im_end|>\n<|im_start|>user\nAnd Venus?<|im_end|>\n<|im_start|>assistant\n"
    partial = wb.complete(m, longer, response_tokens=4, ignore_eos=True, cache_scope=scope)
    read = read_is_reused(partial)
    assert partial.stats.cache_hit_kind == "partial" and 0 < read < partial.stats.prompt_tokens - 1
    assert read == (stored_context(cold, True) if deterministic else q_tokens(m, q) - 1)
    assert partial.stats.cache_delta["created"] == stored_context(partial, deterministic) - read

    t1 = wb.complete(m, q, response_tokens=4, ignore_eos=True, session_id="s", cache_scope=scope)
    turn2 = q + t1.reply + "<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    sticky = wb.complete(m, turn2, response_tokens=4, ignore_eos=True, session_id="s", cache_scope=scope)
    read = read_is_reused(sticky)
    assert sticky.stats.cache_hit_kind == "sticky" and read >= t1.stats.prompt_tokens
    # the session's turn stores all it holds (in the default mode as the session's own row)
    assert sticky.stats.cache_delta["created"] == stored_context(sticky, True) - read

    tail = wb.tokenize(m, "<|im_end|>\n<|im_start|>user\nShorter?<|im_end|>\n<|im_start|>assistant\n",
                       add_special=False)
    cont = wb.continue_session(m, "s", tail, response_tokens=4, ignore_eos=True, cache_scope=scope)
    assert cont.stats.cache_hit_kind == "continuation" and cont.stats.prefilled_tokens == len(tail)
    assert read_is_reused(cont) == cont.stats.prompt_tokens - len(tail)
    wb.end_session(m, "s", cache_scope=scope)


def q_tokens(m: str, text: str) -> int:
    return len(wb.tokenize(m, text))


def test_engine_and_cache_count_the_same_hit_kinds(fresh_model):
    m, scope = fresh_model, "readings-agree"
    questions = [ask(f"Tell me one fact about the number {i} and why it matters.") for i in range(3)]
    before = wb.counters()
    seen: list[str] = []
    for q in questions:                           # cold, then the same prompt: exact
        for _ in range(2):
            r = wb.complete(m, q, response_tokens=3, cache_scope=scope)
            assert wb.wait_for_saves()
            seen.append(r.stats.cache_hit_kind)
    longer = questions[-1] + "Sure."                # a longer prompt over the stored rows: partial
    p = wb.complete(m, longer, response_tokens=3, cache_scope=scope)
    seen.append(p.stats.cache_hit_kind)
    # a resume from that request's finish key (the row named by parent_key), a few tokens
    # short of the prompt: exact, and counted so by the cache too
    more = list(p.context_tokens) + wb.tokenize(m, " And one more.", add_special=False)
    resumed = wb.complete(m, more, response_tokens=2, parent_key=p.finish_key, cache_scope=scope)
    assert read_is_reused(resumed) == stored_context(p, deterministic=False) < len(more) - 1
    seen.append(resumed.stats.cache_hit_kind)
    after = wb.counters()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # whole rows: each new question is cold; chunk storage finds the questions' shared opening
    # (system prompt and "Tell me one fact about the number"), stored once in whole chunks:
    # partial (docs/cache.md, "Chunk storage in the engine")
    chunks = wb.cache_info().get("storage") == "chunks"
    firsts = ["cold"] + ["partial" if chunks else "cold"] * 2
    assert seen == [kind for first in firsts for kind in (first, "exact")] + ["partial", "exact"]
    engine = {kind: delta[kind.counter] for kind in (HitKind.COLD, HitKind.PARTIAL, HitKind.EXACT)}
    cache = {HitKind.COLD: delta["cache_misses_cold"], HitKind.PARTIAL: delta["cache_hits_partial"],
             HitKind.EXACT: delta["cache_hits_exact"]}
    assert engine == cache == {HitKind.COLD: firsts.count("cold"), HitKind.PARTIAL: firsts.count("partial") + 1,
                               HitKind.EXACT: 4}
