"""Batch strategies and the plan check, on stand-in requests (no model).

decode_first: decode rows first, prefill chunks capped, n_batch respected, chunks end at
save points. prefill_first and round_robin: the same rules, another order. The plan check
refuses what the native decode must never see. The rows built from a plan are checked
against the requests' own feeds and positions.
"""

from dataclasses import dataclass, field

import pytest

from workbench.engine.batch import build_batch
from workbench.engine.scheduler import (
    BatchPlan,
    Budget,
    DecodeFirst,
    PrefillFirst,
    RoundRobin,
    SeqView,
    Take,
    plan_problem,
    strategy_for,
)


def view(ref: int, phase: str, feed: int, n_past: int = 0, boundary: int | None = None) -> SeqView:
    return SeqView(ref=ref, phase=phase, feed=feed, n_past=n_past, boundary=boundary, prompt_tokens=n_past + feed,
                   generated=0)


def takes(plan: BatchPlan) -> list[tuple[int, int]]:
    return [(t.ref, t.n) for t in plan.takes]


LONG, D1, D2 = view(0, "prefilling", 1000), view(1, "generating", 1, 50), view(2, "generating", 1, 20)


def test_decode_first_puts_decoders_first_and_chunks_the_prefill():
    plan = DecodeFirst().plan([LONG, D1, D2], Budget(n_batch=512, chunk=128))
    assert takes(plan) == [(1, 1), (2, 1), (0, 128)]
    assert plan_problem(plan, [LONG, D1, D2], Budget(512, 128)) is None


def test_prefill_first_puts_the_prompt_first_and_decoders_in_what_is_left():
    assert takes(PrefillFirst().plan([D1, LONG, D2], Budget(512, 128))) == [(0, 128), (1, 1), (2, 1)]
    # a full batch: the decoders wait (decode_first would have them run)
    assert takes(PrefillFirst().plan([D1, LONG, D2], Budget(128, None))) == [(0, 128)]
    assert takes(DecodeFirst().plan([D1, LONG, D2], Budget(128, None))) == [(1, 1), (2, 1), (0, 126)]


def test_round_robin_starts_one_request_later_each_tick():
    a, b, c = (view(i, "prefilling", 300) for i in range(3))
    rr, budget = RoundRobin(), Budget(n_batch=200, chunk=128)
    firsts = [takes(rr.plan([a, b, c], budget)) for _ in range(4)]
    assert firsts == [[(0, 128), (1, 72)], [(1, 128), (2, 72)], [(2, 128), (0, 72)], [(0, 128), (1, 72)]]


def test_round_robin_gives_decoders_their_turn_among_prefills():
    rr, budget = RoundRobin(), Budget(n_batch=64, chunk=64)
    active = [view(0, "prefilling", 500), D1]
    assert takes(rr.plan(active, budget)) == [(0, 64)]             # the prompt's turn: the batch is full
    assert takes(rr.plan(active, budget)) == [(1, 1), (0, 63)]     # the decoder's turn


@pytest.mark.parametrize("strategy", [DecodeFirst(), PrefillFirst(), RoundRobin()])
def test_every_built_in_ends_a_chunk_at_the_save_point_and_respects_n_batch(strategy):
    a = view(0, "prefilling", 300, n_past=10, boundary=50)
    b = view(1, "prefilling", 300)
    plan = strategy.plan([a, b], Budget(n_batch=100, chunk=None))
    assert dict(takes(plan)) == {0: 40, 1: 60}
    assert plan.rows == 100 and plan_problem(plan, [a, b], Budget(100, None)) is None


def test_empty_feeds_are_skipped_and_nothing_to_do_is_not_a_problem():
    idle = view(0, "generating", 0)
    for s in (DecodeFirst(), PrefillFirst(), RoundRobin()):
        plan = s.plan([idle], Budget(8, 4))
        assert plan.takes == [] and plan_problem(plan, [idle], Budget(8, 4)) is None


@pytest.mark.parametrize(("plan", "says"), [
    (BatchPlan([Take(1, 1), Take(0, 200)]), "more rows than n_batch (128)"),
    (BatchPlan([Take(9, 1)]), "request 9 is not running"),
    (BatchPlan([Take(1, 0)]), "a take of 0 tokens"),
    (BatchPlan([Take(0, 1001)]), "a take of 1001 tokens (it has 1000"),
    (BatchPlan([Take(1, 1), Take(1, 1)]), "request 1 appears twice"),
    (BatchPlan([Take(3, 60)]), "crosses its save point at 50"),
    (BatchPlan([]), "an empty plan while requests wait"),
    (BatchPlan([(1, 1)]), "is not a Take"),                        # type: ignore[list-item]
    (BatchPlan([Take(True, 1)]), "is not a Take"),
    ([Take(1, 1)], "returned list, not a BatchPlan"),
    (None, "returned NoneType, not a BatchPlan"),
])
def test_a_bad_plan_is_named(plan, says):
    active = [LONG, D1, view(3, "prefilling", 100, n_past=10, boundary=50)]
    problem = plan_problem(plan, active, Budget(n_batch=128, chunk=64))
    assert problem is not None and says in problem


def test_strategy_for_builds_a_fresh_built_in_per_model_and_keeps_a_users_object():
    assert type(strategy_for("round_robin")) is RoundRobin
    assert strategy_for("round_robin") is not strategy_for("round_robin")
    mine = DecodeFirst()
    assert strategy_for(mine) is mine


# --- the native rows built from a plan -------------------------------------------------------

@dataclass
class Req:
    ref: int
    seq: int
    feed: list[int] = field(default_factory=list)
    n_past: int = 0
    out_from: int | None = None


def test_rows_follow_the_plan_and_only_a_finished_feed_asks_for_logits():
    prompt, d1, d2 = Req(0, 0, list(range(1000))), Req(1, 1, [7], 50), Req(2, 2, [8], 20)
    plan = BatchPlan([Take(1, 1), Take(2, 1), Take(0, 128)])
    batch = build_batch(plan, {r.ref: r for r in (prompt, d1, d2)})  # type: ignore[misc]
    assert batch.tokens[:2] == [7, 8] and batch.seq[:2] == [1, 2]
    assert batch.pos[:2] == [50, 20] and batch.logits[:2] == [1, 1]
    assert len(batch) == 2 + 128
    assert batch.seq[2:] == [0] * 128 and batch.pos[2:] == list(range(128))
    assert sum(batch.logits[2:]) == 0          # prompt not finished: nothing sampled
    assert [s.logits_row for s in batch.slices] == [0, 1, None]


def test_the_last_chunk_of_a_prompt_asks_for_logits_on_its_last_row():
    r = Req(0, 0, [1, 2, 3], n_past=10)
    batch = build_batch(BatchPlan([Take(0, 3)]), {0: r})  # type: ignore[dict-item]
    assert batch.pos == [10, 11, 12] and batch.logits == [0, 0, 1]
    assert batch.slices[0].logits_row == 2


# --- speculative drafts: a generating feed of 1 + draft ---------------------------------------

def test_draft_rows_come_after_every_decoders_own_row_and_are_cut_to_fit():
    spec, plain = view(1, "generating", 1 + 8, 50), view(2, "generating", 1, 20)
    assert takes(DecodeFirst().plan([spec, plain], Budget(n_batch=6, chunk=None))) == [(1, 5), (2, 1)]
    assert takes(DecodeFirst().plan([spec, plain], Budget(n_batch=64, chunk=None))) == [(1, 9), (2, 1)]
    assert takes(PrefillFirst().plan([LONG, spec, plain], Budget(n_batch=130, chunk=128))) == [
        (0, 128), (1, 1), (2, 1)]
    assert takes(RoundRobin().plan([spec, plain], Budget(n_batch=4, chunk=None))) == [(1, 4)]
    assert plan_problem(BatchPlan([Take(1, 3)]), [spec], Budget(8, None)) is None   # fewer draft rows: fine


def test_verify_rows_all_ask_for_logits_from_out_from_on():
    spec = Req(0, 0, [5, 6, 7, 8], n_past=40, out_from=40)        # last token + a draft of 3
    verify = Req(1, 1, [1, 2, 3, 4, 5, 6], n_past=0, out_from=3)   # a verify() prefix of 4 + 2 candidates
    batch = build_batch(BatchPlan([Take(0, 3), Take(1, 6)]), {0: spec, 1: verify})  # type: ignore[dict-item]
    assert batch.logits == [1, 1, 1] + [0, 0, 0, 1, 1, 1]
    assert [s.rows for s in batch.slices] == [range(0, 3), range(6, 9)] and batch.verifies
    assert [s.logits_row for s in batch.slices] == [None, None]
