"""The eviction lab's native replay (lab/native.py, csrc/lab_replay.cpp) reports exactly what
the Python chunk model (chunksim.py) reports, for every built-in policy, on every kind of
trace; other policies keep the Python path; a broken plan is an error, never a crash."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from workbench import _native
from workbench.cache.policies import FIFO, GDSF, LFU, LRU, Frecency, get_policy
from workbench.cache.s3fifo import S3FIFO
from workbench.cache.types import RowStats
from workbench.lab import traces
from workbench.lab.native import NativePlan, native_plan
from workbench.lab.plan import build_plan, run_plan
from workbench.lab.traces import Trace

BUILT_IN = ("lru", "lfu", "fifo", "gdsf", "frecency", "s3fifo")
BPT = 23_040


def _literal() -> Trace:
    """Chats as token ids with multi-token replies, as lab.record() makes them."""
    system = list(range(1000, 1040))
    prompts, replies, sessions = [], [], []
    for s in range(6):
        history = [*system, 50 + s]
        for turn in range(5):
            history = [*history, 2000 + 10 * s + turn, 7, 8]
            reply = [3000 + 100 * s + 10 * turn + k for k in range(4)]
            prompts.append(list(history))
            replies.append(reply)
            sessions.append(s)
            history = [*history, *reply]
    return Trace.from_prompts(prompts, replies=replies, sessions=sessions, name="literal")


TRACES = {
    "chats": lambda: traces.multi_turn_chats(160, seed=1),
    "agents": lambda: traces.agent_tasks(120, seed=2),   # pinned agent prefixes, chunk boundaries
    "rag": lambda: traces.rag_queries(160, seed=3),
    "mooncake": lambda: traces.mooncake("conversation").head(40),
    "literal": _literal,
}


def _both(plan: Any, policy: str | Any, size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    make = (lambda: get_policy(policy)) if isinstance(policy, str) else policy
    slow = run_plan(plan, make(), size, BPT, timeline_every=5, record=True, native=False)
    fast = run_plan(plan, make(), size, BPT, timeline_every=5, record=True)
    slow.pop("seconds")
    fast.pop("seconds")
    return slow, fast


@pytest.mark.parametrize("name", list(TRACES))
@pytest.mark.parametrize("chunk_size", [64, 16])
def test_native_replay_equals_the_python_chunk_model(name: str, chunk_size: int) -> None:
    trace = TRACES[name]()
    if name == "mooncake" and chunk_size == 16:
        trace = trace.head(15)   # 12,000-token prompts: 750 chunks each, slow in Python's s3fifo
    plan = build_plan(trace, chunk_size=chunk_size, checkpoint_every=256)
    footprint = plan.footprint_tokens * BPT
    for policy in BUILT_IN:
        evictions = 0
        for size in (footprint // 20, footprint // 6):
            slow, fast = _both(plan, policy, size)
            assert fast == slow, (policy, size)
            evictions += slow["evictions"]
        assert evictions > 0   # the budgets make the policies choose


def test_policy_parameters_reach_the_native_replay() -> None:
    plan = build_plan(traces.multi_turn_chats(160, seed=4), chunk_size=16)
    size = plan.footprint_tokens * BPT // 8
    for make in (lambda: Frecency(credit_s=30.0, half_life_s=5.0),
                 lambda: S3FIFO(small_ratio=0.3, ghost_ratio=0.5, move_to_main_threshold=1)):
        slow, fast = _both(plan, make, size)
        assert fast == slow
    default = run_plan(plan, Frecency(), size, BPT)
    other = run_plan(plan, Frecency(credit_s=30.0, half_life_s=5.0), size, BPT)
    assert (default["evicted_bytes"], default["prefill_tokens_saved"]) != \
        (other["evicted_bytes"], other["prefill_tokens_saved"])


class _Newest(LRU):
    """A user's subclass: its own priority, so never the native lru."""

    name = "newest"

    def priority(self, row: RowStats, now: float) -> float:
        return -row.last_used_at


def test_only_fresh_built_in_policies_replay_natively() -> None:
    for name in BUILT_IN:
        assert get_policy(name).native_spec() is not None
    assert _Newest().native_spec() is None
    row = RowStats("k", 100, 10, 0.0)
    for used in (GDSF(), FIFO(), S3FIFO(capacity_bytes=1000)):
        used.on_insert(row)
        assert used.native_spec() is None
    assert get_policy(lambda row, now: row.hits).__class__.__name__ == "FunctionPolicy"
    assert not hasattr(get_policy(lambda row, now: row.hits), "native_spec")
    plan = build_plan(traces.multi_turn_chats(80, seed=5), chunk_size=16)
    size = plan.footprint_tokens * BPT // 8
    newest = run_plan(plan, _Newest(), size, BPT)
    lru = run_plan(plan, LRU(), size, BPT)
    assert newest["evicted_bytes"] != lru["evicted_bytes"] or newest["prefill_tokens_saved"] != \
        lru["prefill_tokens_saved"]


def test_the_cache_computes_the_documented_formulas() -> None:
    """One definition (csrc/eviction.h) behind the cache's policies: what they rank by is the
    formula the policies' module documents."""
    row = RowStats("k", 4096, 300, 100.0, last_hit_at=500.0, hits=6)
    now = 9000.0
    bonus = 3600.0 * math.log2(1 + 6) * 0.5 ** ((now - 500.0) / (6 * 3600.0))
    assert Frecency().priority(row, now) == pytest.approx(500.0 + bonus, rel=1e-12)
    assert Frecency().priority(RowStats("k", 1, 1, 7.0), now) == 7.0
    g = GDSF()
    g.inflation = 2.5
    assert g.priority(row, now) == pytest.approx(2.5 + 7 * 300 / 4096, rel=1e-12)
    assert LRU().priority(row, now) == 500.0 and LFU().priority(row, now) == 6.0


def test_s3fifo_forgets_keys_it_no_longer_holds() -> None:
    s3 = S3FIFO(capacity_bytes=100)
    for i in range(20_000):
        s3.on_admit(RowStats(f"k{i}", 1, 1, 0.0))
        s3.on_insert(RowStats(f"k{i}", 1, 1, 0.0))
        if i >= 100:
            assert s3.victim() is not None
    assert len(s3._ids) <= 2 * 200 + 1024   # queued (100) + ghost (90), swept as it grows


def test_the_plan_is_built_once_and_shared() -> None:
    plan = build_plan(traces.multi_turn_chats(40, seed=6), chunk_size=16)
    assert native_plan(plan) is native_plan(plan)
    assert native_plan(plan).arrays.n_requests == 40
    with pytest.raises(ValueError, match="chunk-model plan"):
        NativePlan(build_plan(traces.multi_turn_chats(40, seed=6), chunk_size=None))


def _arrays(**change: Any) -> dict[str, Any]:
    """A valid two-request plan's arrays (two chunks: 0, then 1 after it), with changes."""
    a: dict[str, Any] = dict(
        chunk_size=4, parent=np.array([-1, 0], np.int32), tok_ptr=np.array([0, 4, 6], np.int64),
        toks=np.array([1, 2, 3, 4, 5, 6], np.int32), row_last=np.array([1], np.int32),
        row_tokens=np.array([6], np.int64), node_row=np.array([-1, 0], np.int32),
        plen=np.array([7, 7], np.int64), arrival=np.array([0.0, 1.0]),
        node_ptr=np.array([0, 1, 2], np.int64), nodes=np.array([1, 1], np.int32),
        prompt_last=np.array([1, 1], np.int32), save_ptr=np.array([0, 1, 1], np.int64),
        save_row=np.array([0], np.int32), save_kind=np.array([2], np.int32),
        finish_row=np.array([-1, -1], np.int32))
    a.update(change)
    return a


def test_a_broken_plan_is_a_value_error_not_a_crash() -> None:
    plan = _native.lab.Plan(**_arrays())
    out = _native.lab.replay(plan, "lru", {}, 10**9, np.array([100, 100], np.int64), np.array([50], np.int64),
                             1, 0, True)
    assert (out["misses"], out["exact_hits"], out["rows_saved"]) == (1, 1, 1)
    broken = {
        "parent": np.array([-1, 5], np.int32),
        "row_last": np.array([9], np.int32),
        "nodes": np.array([1, 7], np.int32),
        "save_row": np.array([3], np.int32),
        "save_kind": np.array([5], np.int32),
        "finish_row": np.array([-1], np.int32),
        "tok_ptr": np.array([0, 4, 9], np.int64),
        "node_ptr": np.array([0, 2, 1], np.int64),
    }
    for field, value in broken.items():
        with pytest.raises(ValueError, match="native lab plan"):
            _native.lab.Plan(**_arrays(**{field: value}))
    with pytest.raises(ValueError, match="no built-in policy named 'belady'"):
        _native.lab.replay(plan, "belady", {}, 10, np.array([1, 1], np.int64), np.array([1], np.int64), 1, 0, False)
    with pytest.raises(ValueError, match="sizes differ"):
        _native.lab.replay(plan, "lru", {}, 10, np.array([1], np.int64), np.array([1], np.int64), 1, 0, False)


def test_a_second_replay_of_the_same_trace_reuses_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench import lab
    from workbench.lab import experiment

    built: list[dict[str, Any]] = []
    real = experiment.build_plan

    def counting(trace: Trace, **settings: Any) -> Any:
        built.append(settings)
        return real(trace, **settings)

    monkeypatch.setattr(experiment, "build_plan", counting)
    trace = traces.multi_turn_chats(60, seed=8)
    first = lab.replay(trace, ["lru"], [10**8], workers=1)
    again = lab.replay(trace, ["gdsf", "lru"], [10**8, 10**9], workers=1)
    assert len(built) == 1
    cols = ["exact_hits", "partial_hits", "misses", "prefill_tokens_saved", "evictions", "bytes_end"]
    lru_again = again[(again["policy"] == "lru") & (again["size_bytes"] == 10**8)]
    assert first[cols].to_numpy().tolist() == lru_again[cols].to_numpy().tolist()
    lab.replay(trace, ["lru"], [10**8], workers=1, chunk_size=16)    # other settings: another plan
    lab.replay(traces.multi_turn_chats(60, seed=8), ["lru"], [10**8], workers=1)   # another trace object
    assert len(built) == 3
    kept = len(experiment._PLANS)
    del trace
    import gc

    gc.collect()
    assert len(experiment._PLANS) < kept   # a trace's plans go with it


def test_policy_parameters_that_would_break_the_arithmetic_are_value_errors() -> None:
    plan = _native.lab.Plan(**_arrays())
    sizes = (np.array([100, 100], np.int64), np.array([50], np.int64))
    for name, params in (("frecency", {"half_life_s": 0.0}), ("frecency", {"credit_s": float("nan")}),
                         ("s3fifo", {"small_ratio": float("nan")}), ("s3fifo", {"ghost_ratio": float("inf")}),
                         ("s3fifo", {"move_to_main_threshold": 0})):
        with pytest.raises(ValueError):
            _native.lab.replay(plan, name, params, 10**9, *sizes, 1, 0, False)
    with pytest.raises(ValueError, match="ghost_ratio"):
        S3FIFO(ghost_ratio=float("nan"))
