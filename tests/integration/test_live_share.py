"""Live prefix sharing (engine/live_share.py): requests of one cache scope start from the KV
another live sequence holds, copied, and requests whose prefix is being prefilled wait for it
rather than computing it again; the reply is the one a cold run gives."""

from __future__ import annotations

import pytest

import workbench as wb

pytestmark = pytest.mark.model

TOKENS = 12
SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: answer briefly and mention item {i * 7}." for i in range(45))   # ~600 tokens
QUESTIONS = [f" Question {i}: what is {i} plus {i * 3}?" for i in range(4)]


def counted(before: dict[str, int]) -> dict[str, int]:
    now = wb.counters()
    keys = ("hits_shared", "hits_cold", "hits_partial", "hits_exact", "shared_tokens", "share_waits",
            "share_waits_expired", "share_failed")
    return {k: now.get(k, 0) - before.get(k, 0) for k in keys}


def at_once(model: str, prompts: list[str], **opts) -> list:
    """Every prompt submitted before any is read: they run concurrently."""
    streams = [wb.stream(model, p, response_tokens=TOKENS, **opts) for p in prompts]
    return [s.result() for s in streams]


def cold_replies(model: str, prompts: list[str]) -> list[tuple[int, ...]]:
    return [wb.complete(model, p, response_tokens=TOKENS, cache=False).tokens for p in prompts]


@pytest.mark.load(n_seq_max=4)
def test_concurrent_requests_share_one_prefill_and_give_the_cold_replies(fresh_model):
    prompts = [SYSTEM + q for q in QUESTIONS]
    cold = cold_replies(fresh_model, prompts)
    before = wb.counters()
    res = at_once(fresh_model, prompts)
    kinds = [r.stats.cache_hit_kind for r in res]
    assert kinds == ["cold", "shared", "shared", "shared"]
    n_prompt = res[0].stats.prompt_tokens
    # the first prefilled the prefix once; the others computed only their own question
    assert res[0].stats.prefilled_tokens == n_prompt
    shared = [n_prompt - r.stats.prefilled_tokens for r in res[1:]]
    assert all(s > n_prompt - 20 for s in shared), shared
    assert [r.tokens for r in res] == cold
    c = counted(before)
    assert c["hits_shared"] == 3 and c["shared_tokens"] == sum(shared) and c["share_waits"] == 3
    assert c["share_waits_expired"] == 0 and c["share_failed"] == 0


@pytest.mark.load(n_seq_max=4, deterministic=True)
def test_deterministic_mode_copies_between_kv_streams_bit_for_bit(fresh_model):
    prompts = [SYSTEM + q for q in QUESTIONS[:3]]
    cold = [wb.complete(fresh_model, p, response_tokens=TOKENS, cache=False, logprobs=1) for p in prompts]
    res = at_once(fresh_model, prompts, logprobs=1)
    assert [r.stats.cache_hit_kind for r in res] == ["cold", "shared", "shared"]
    assert [r.tokens for r in res] == [c.tokens for c in cold]
    assert [[lp.logprob for lp in r.logprobs] for r in res] == [[lp.logprob for lp in c.logprobs] for c in cold]


@pytest.mark.load(n_seq_max=4)
def test_scopes_stay_sealed_and_a_cold_run_asked_for_stays_cold(fresh_model):
    a, b = SYSTEM + QUESTIONS[0], SYSTEM + QUESTIONS[1]
    s1 = wb.stream(fresh_model, a, response_tokens=TOKENS, cache_scope="tenant-a")
    s2 = wb.stream(fresh_model, b, response_tokens=TOKENS, cache_scope="tenant-b")
    s3 = wb.stream(fresh_model, b, response_tokens=TOKENS, cache=False)
    kinds = [s.result().stats.cache_hit_kind for s in (s1, s2, s3)]
    assert kinds == ["cold", "cold", "cold"]


@pytest.mark.load(n_seq_max=4, share_prefixes=False)
def test_sharing_off_prefills_or_restores(fresh_model):
    before = wb.counters()
    res = at_once(fresh_model, [SYSTEM + q for q in QUESTIONS[:3]])
    assert "shared" not in [r.stats.cache_hit_kind for r in res]
    assert counted(before)["shared_tokens"] == 0


@pytest.mark.load(n_seq_max=4, cache=False)
def test_an_idle_sessions_kv_is_shared_without_the_prefix_cache(fresh_model):
    """The persistent cache is off: the session's live KV is the only place the prefix is.
    (The cold reply is taken first, on an empty KV: in the default mode a prompt prefilled
    beside another sequence's cells can get other bits, engine/kernel_rows.py.)"""
    cold = cold_replies(fresh_model, [SYSTEM + QUESTIONS[1]])[0]
    first = wb.complete(fresh_model, SYSTEM + QUESTIONS[0], response_tokens=TOKENS, session_id="s1")
    assert first.stats.cache_hit_kind == "cold"
    later = wb.complete(fresh_model, SYSTEM + QUESTIONS[1], response_tokens=TOKENS)
    assert later.stats.cache_hit_kind == "shared"
    assert later.stats.prefilled_tokens < 20
    assert later.tokens == cold
    # the session keeps its KV (a copy was taken, nothing moved): its next turn is sticky
    turn2 = wb.complete(fresh_model, SYSTEM + QUESTIONS[0] + " And twice that?", response_tokens=TOKENS,
                        session_id="s1")
    assert turn2.stats.cache_hit_kind == "sticky"


@pytest.mark.load(n_seq_max=4, n_ctx=1536)
def test_a_shared_prefix_takes_its_cells_once(fresh_model):
    """Four copies of the ~600-token prefix need ~2,500 cells; the unified KV has 1,536: the
    requests fit because they share the prefix's cells."""
    res = at_once(fresh_model, [SYSTEM + q for q in QUESTIONS])
    assert [r.stats.cache_hit_kind for r in res] == ["cold", "shared", "shared", "shared"]
    assert all(r.finish_reason == "length" and len(r.tokens) == TOKENS for r in res)


@pytest.mark.load(n_seq_max=4, share_wait_ms=0)
def test_without_waiting_requests_admitted_together_each_compute_the_prefix(fresh_model):
    before = wb.counters()
    res = at_once(fresh_model, [SYSTEM + q for q in QUESTIONS[:3]])
    c = counted(before)
    assert c["share_waits"] == 0
    assert res[0].stats.cache_hit_kind == "cold"


@pytest.mark.load(n_seq_max=4)
def test_a_waiting_request_can_be_cancelled_and_the_prefill_goes_on(fresh_model):
    first = wb.stream(fresh_model, SYSTEM + QUESTIONS[0], response_tokens=TOKENS)
    waiting = wb.stream(fresh_model, SYSTEM + QUESTIONS[1], response_tokens=TOKENS)
    waiting.cancel()
    assert waiting.result().finish_reason == "cancelled"
    assert first.result().finish_reason == "length"
