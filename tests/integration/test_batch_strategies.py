"""batch_strategy=: the built-ins and a user's object, on the real model.

A small batch (n_batch 64, chunks of 32) makes the strategies plan different batches for
the same mixed workload (a long prompt prefilling while short ones decode). Greedy replies
must not depend on the strategy; a user's strategy runs end to end, and a bad plan or a
raising strategy fails the requests with InvalidBatchPlan while the model keeps serving.
"""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.engine.scheduler import BatchPlan, DecodeFirst, Take
from workbench.errors import InvalidBatchPlan, InvalidOption

pytestmark = pytest.mark.model

SMALL_BATCH = {"n_batch": 64, "n_ubatch": 64, "prefill_chunk_size": 32, "n_seq_max": 4, "cache": False}
LONG = "Write a detailed history of the city of Lyon. " * 30
JOBS = [{"prompt": "The capital of France is", "response_tokens": 24},
        {"prompt": LONG, "response_tokens": 8},
        {"prompt": "1, 2, 3, 4,", "response_tokens": 20},
        {"prompt": "Once upon a time", "response_tokens": 16}]


def run_workload(model: str) -> list[wb.CompletionResult]:
    streams = [wb.stream(model, ignore_eos=True, **job) for job in JOBS]
    return [s.result() for s in streams]


def load(model_path, **opts) -> str:
    return wb.load_model(model_path=str(model_path), **SMALL_BATCH, **opts)


@pytest.fixture(scope="module")
def default_replies(model_path):
    mid = load(model_path)
    try:
        solo = wb.complete(mid, ignore_eos=True, **JOBS[0])
        yield run_workload(mid), solo
    finally:
        wb.unload(mid)


@pytest.mark.parametrize("strategy", ["prefill_first", "round_robin"])
def test_each_built_in_gives_the_default_greedy_replies(model_path, default_replies, strategy):
    expected, solo = default_replies
    mid = load(model_path, batch_strategy=strategy)
    try:
        assert wb.model_info(mid)["batch_strategy"] == strategy
        got = run_workload(mid)
    finally:
        wb.unload(mid)
    for job, r, e in zip(JOBS, got, expected):
        assert r.finish_reason == "length" and len(r.tokens) == job["response_tokens"]
        assert r.stats.prompt_tokens == e.stats.prompt_tokens
        assert r.tokens == e.tokens, (strategy, job["prompt"][:30], r.reply, e.reply)
    assert got[0].tokens == solo.tokens    # and batched equals alone


class Recording:
    """A user's strategy: decode_first's plan, with a note of every plan it made."""

    def __init__(self) -> None:
        self.plans: list[BatchPlan] = []
        self.mode = "ok"

    def plan(self, active, budget):
        if self.mode == "raise":
            raise ZeroDivisionError("my strategy's bug")
        if self.mode == "too_many_rows":
            return BatchPlan([Take(active[0].ref, budget.n_batch + 1)])   # the prompt has more
        if self.mode == "stranger":
            return BatchPlan([Take(10**9, 1)])
        plan = DecodeFirst().plan(active, budget)
        self.plans.append(plan)
        return plan


def test_a_users_strategy_runs_end_to_end(model_path, default_replies):
    expected, _ = default_replies
    mine = Recording()
    mid = load(model_path, batch_strategy=mine)
    try:
        got = run_workload(mid)
    finally:
        wb.unload(mid)
    assert [r.tokens for r in got] == [e.tokens for e in expected]
    # every token of every prompt and reply went through the user's plans (the last token
    # of each reply is sampled, never decoded)
    decoded = sum(t.n for p in mine.plans for t in p.takes)
    assert decoded == sum(r.stats.prompt_tokens + len(r.tokens) - 1 for r in got)


@pytest.mark.parametrize(("mode", "says"), [("raise", "ZeroDivisionError: my strategy's bug"),
                                            ("too_many_rows", "more rows than n_batch (64)"),
                                            ("stranger", "request 1000000000 is not running")])
def test_a_bad_plan_fails_the_requests_and_the_model_keeps_serving(model_path, mode, says):
    mine = Recording()
    mid = load(model_path, batch_strategy=mine)
    try:
        mine.mode = mode
        with pytest.raises(InvalidBatchPlan, match="Recording") as err:
            wb.complete(mid, prompt=LONG, response_tokens=4)
        assert says in str(err.value)
        mine.mode = "ok"
        r = wb.complete(mid, prompt="Hello there", response_tokens=4, ignore_eos=True)
        assert len(r.tokens) == 4
        assert wb.counters()["bad_batch_plans"] >= 1
    finally:
        wb.unload(mid)


@pytest.mark.parametrize("bad", ["fastest", 3, object(), type("NoPlan", (), {"plan": 1})()])
def test_a_strategy_without_plan_is_refused_at_load(model_path, bad):
    with pytest.raises(InvalidOption, match="batch_strategy"):
        wb.load_model(model_path=str(model_path), batch_strategy=bad)
