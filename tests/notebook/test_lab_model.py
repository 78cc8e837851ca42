"""replay(..., model=...): a short trace run for real beside the simulation."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench import lab
from workbench.lab import traces

pytestmark = pytest.mark.model


def five_requests() -> traces.Trace:
    # two conversations, interleaved: turns 2 and 3 extend earlier prompts
    return traces.multi_turn_chats(5, seed=1, concurrency=2, turns=(3, 3), system_tokens=(40, 60),
                                   user_tokens=(5, 20), reply_tokens=(5, 20))


def test_replay_with_the_model_adds_measured_columns(model: str) -> None:
    trace = five_requests()
    df = lab.replay(trace, ["lru", "s3fifo"], ["64MiB", "1GiB"], model=model, response_tokens=2, workers=1)
    measured = df.attrs["measured"]
    assert len(measured) == 5 and measured.index.name == "request"
    assert (measured["prefill_tokens_saved"] == measured["prompt_tokens"] - measured["prefilled_tokens"]).all()
    assert list(measured["prompt_tokens"]) == [int(n) for n in trace.prompt_tokens]
    for col in ("measured_requests", "measured_hit_ratio", "measured_prefill_tokens_saved",
                "measured_prefill_saved_fraction", "measured_sticky", "measured_cold"):
        assert col in df.columns
    assert (df["measured_prefill_tokens_saved"] == measured["prefill_tokens_saved"].sum()).all()
    # a later turn of a conversation reuses the KV of the earlier one (sticky session or cache)
    later = [i for i in range(5) if trace[i].session in {trace[j].session for j in range(i)}]
    assert later and (measured.loc[later, "prefill_tokens_saved"] > 0).all()
    assert (measured.loc[later, "cache_hit_kind"] != "cold").all()
    per_request = df.attrs["requests"]
    assert len(per_request) == 5 * len(df)
    assert {"sim_hit_kind", "sim_prefill_tokens_saved", "measured_hit_kind"} <= set(per_request.columns)
    sim = per_request[(per_request["policy"] == "lru") & (per_request["size_bytes"] == 1 << 30)]
    # the simulation saves at least what the engine did: its finish rows hold the trace's
    # reply, which the next prompt repeats, while the model's own reply differs
    assert (sim["sim_prefill_tokens_saved"].to_numpy() >= measured["prefill_tokens_saved"].to_numpy()).all()


def test_without_sessions_only_the_prefix_cache_can_save(model: str) -> None:
    trace = five_requests()
    m = lab.measure(trace, model, response_tokens=2, sessions=False)
    assert "sticky" not in set(m["cache_hit_kind"].astype(str))
    later = [i for i in range(5) if trace[i].session in {trace[j].session for j in range(i)}]
    assert later and (m.loc[later, "prefill_tokens_saved"] > 0).all()


@pytest.mark.load(cold_checkpoint_interval=64)
def test_the_simulation_matches_the_real_engine_request_by_request(fresh_model: str) -> None:
    """Where the model's own replies cannot matter (no prompt repeats an earlier reply, no
    sessions, a budget nothing is evicted from), the lab's replay and the real engine agree
    exactly: the same hit kind and the same prefill saved for every request. This checks
    the lab's rules against the engine itself (HitKind, save points, the last prompt
    token decoded again), not against a second copy of those rules."""
    trace = traces.rag_queries(10, seed=11, documents=6, doc_tokens=(40, 120), system_tokens=60,
                               query_tokens=(5, 15), reply_tokens=(4, 8))
    # the lab's chunk model against the engine in chunk storage, both at their default chunk
    # size (the store alone is compared with the chunk model in tests/unit/test_lab_vs_store.py)
    wb.configure_cache([{"kind": "ram", "budget_bytes": 4 << 30}])
    try:
        df = lab.replay(trace, ["lru"], ["4GiB"], checkpoint_every=64, model=fresh_model, response_tokens=2,
                        sessions=False, workers=1)
    finally:
        wb.configure_cache([{"kind": "ram"}])
    per_request = df.attrs["requests"]
    assert len(per_request) == 10
    kinds = list(per_request["sim_hit_kind"])
    assert "partial" in kinds and "cold" in kinds          # the trace exercises both
    assert kinds == [str(k) for k in per_request["measured_hit_kind"]]
    assert list(per_request["sim_prefill_tokens_saved"]) == list(per_request["measured_prefill_tokens_saved"])
