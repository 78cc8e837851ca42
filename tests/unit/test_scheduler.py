"""One batch per tick: decode rows first, prefill chunks capped, n_batch respected."""

from dataclasses import dataclass, field

from workbench.engine.scheduler import plan_batch


@dataclass
class Req:
    seq: int
    phase: str
    feed: list[int] = field(default_factory=list)
    n_past: int = 0


def test_decoders_go_first_and_prefill_is_chunked():
    long = Req(0, "prefilling", list(range(1000)))
    d1 = Req(1, "generating", [7], n_past=50)
    d2 = Req(2, "generating", [8], n_past=20)
    plan = plan_batch([long, d1, d2], n_batch=512, chunk=128)
    assert plan.tokens[:2] == [7, 8] and plan.seq[:2] == [1, 2]
    assert plan.pos[:2] == [50, 20] and plan.logits[:2] == [1, 1]
    assert len(plan) == 2 + 128
    assert plan.seq[2:] == [0] * 128 and plan.pos[2:] == list(range(128))
    assert sum(plan.logits[2:]) == 0          # prompt not finished: nothing sampled
    assert [s.logits_row for s in plan.slices] == [0, 1, None]


def test_last_chunk_of_a_prompt_asks_for_logits_on_its_last_row():
    r = Req(0, "prefilling", [1, 2, 3], n_past=10)
    plan = plan_batch([r], n_batch=64, chunk=None)
    assert plan.pos == [10, 11, 12] and plan.logits == [0, 0, 1]
    assert plan.slices[0].logits_row == 2


def test_n_batch_bounds_all_prefills_together():
    a = Req(0, "prefilling", list(range(300)))
    b = Req(1, "prefilling", list(range(300)))
    plan = plan_batch([a, b], n_batch=400, chunk=None)
    assert len(plan) == 400
    assert [s.take for s in plan.slices] == [300, 100]


def test_queued_and_empty_requests_are_skipped():
    plan = plan_batch([Req(0, "queued", [1]), Req(1, "generating", [])], n_batch=8, chunk=4)
    assert len(plan) == 0 and plan.slices == []
