"""replay(..., model=...): a short trace run for real beside the simulation."""

from __future__ import annotations

import pytest

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
