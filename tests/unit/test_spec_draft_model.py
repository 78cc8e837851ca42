"""ModelDrafter's bookkeeping against a scripted draft engine: what it asks the draft
engine for, when it cancels, and what draft-engine time it hands to the policy. (The real
engines: tests/integration/test_speculative_draft*.py.)"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from workbench.engine.draft_model import FLIGHT_DRAFTS, PRIOR_PREFILL, ModelDrafter, common_prefix
from workbench.options import SpeculativeOptions


@dataclass
class FakeRequest:
    prompt: list[int]
    response_tokens: int
    generated: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finished: threading.Event = field(default_factory=threading.Event)
    prefilled: int = 0
    admitted_at: float | None = None
    prefill_started_at: float | None = None
    prefill_done_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    cancelled: bool = False

    def run(self, tokens: list[int], start: float, prefill_s: float, tok_s: float) -> None:
        """It prefilled its prompt from ``start`` on, then generated ``tokens``, and ended."""
        self.prefilled, self.admitted_at = len(self.prompt), start
        self.prefill_started_at, self.prefill_done_at = start, start + prefill_s
        self.generated = list(tokens)
        self.first_token_at = start + prefill_s
        self.last_token_at = start + prefill_s + tok_s * max(0, len(tokens) - 1)
        self.finished.set()


class FakeEngine:
    model_id = "fake-draft"

    def __init__(self) -> None:
        self.submitted: list[FakeRequest] = []

    def submit(self, prompt: list[int], opts) -> FakeRequest:
        req = FakeRequest(list(prompt), opts.response_tokens)
        self.submitted.append(req)
        return req

    def cancel(self, req: FakeRequest) -> None:
        req.cancelled = True
        req.finished.set()

    def end_session(self, session, scope) -> None:
        pass


def drafter(prefill_tok_s: float | None = None) -> tuple[ModelDrafter, FakeEngine]:
    eng = FakeEngine()
    return ModelDrafter(eng, SpeculativeOptions(draft="fake-draft", n_max=4), "t/1", prefill_tok_s), eng


PROMPT = list(range(100, 140))      # 40 tokens


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix([], [1]) == 0


def test_a_first_draft_costs_the_whole_context_until_the_draft_session_holds_it():
    d, eng = drafter(prefill_tok_s=0.002)
    assert d.setup_s(PROMPT, 7, plain_s=0.01) == pytest.approx(41 * 0.002)
    assert drafter()[0].setup_s(PROMPT, 7, plain_s=0.01) == pytest.approx(41 * PRIOR_PREFILL * 0.01)
    assert d.draft(PROMPT, 7, 40, 4) == [] and len(eng.submitted) == 1
    assert eng.submitted[0].response_tokens == FLIGHT_DRAFTS * 4
    assert d.setup_s(PROMPT, 7, plain_s=0.01) == 0.0          # under way
    eng.submitted[0].run([8, 9, 10, 11, 12, 13, 14, 15], start=1.0, prefill_s=0.2, tok_s=0.01)
    d.take_busy_s()                                              # the step after: it measured the prefill
    # the target went another way at its next token: only what follows the shared part is missing
    assert d.setup_s(PROMPT + [7], 99, plain_s=0.01) == pytest.approx(1 * 0.2 / 41)


def test_its_engine_time_is_handed_over_once_step_by_step():
    d, eng = drafter()
    d.draft(PROMPT, 7, 40, 4)
    assert d.take_busy_s() == 0.0                               # not started yet
    eng.submitted[0].run([8, 9, 10, 11], start=1.0, prefill_s=0.2, tok_s=0.01)
    assert d.take_busy_s() == pytest.approx(0.23)
    assert d.take_busy_s() == 0.0
    s = d.summary()
    assert s["draft_engine_s"] == pytest.approx(0.23) and s["draft_engine_tokens"] == 41 + 4
    assert s["draft_requests"] == 1


def test_pause_cancels_the_draft_request_in_flight_and_asks_for_nothing():
    d, eng = drafter()
    d.draft(PROMPT, 7, 40, 4)
    d.pause()
    assert eng.submitted[0].cancelled and d.summary()["draft_paused"] == 1
    d.pause()                                                    # nothing in flight: nothing to do
    assert len(eng.submitted) == 1 and d.summary()["draft_paused"] == 1


def test_a_probe_asks_for_its_one_draft_and_nothing_ahead():
    d, eng = drafter()
    assert d.draft(PROMPT, 7, 40, 4, ahead=False) == []
    probe = eng.submitted[0]
    assert probe.response_tokens == 4
    assert d.draft(PROMPT, 7, 40, 4, ahead=False) == [] and len(eng.submitted) == 1   # behind: waits
    probe.run([8, 9, 10, 11], start=1.0, prefill_s=0.1, tok_s=0.01)
    assert d.draft(PROMPT, 7, 40, 4, ahead=False) == [8, 9, 10, 11]
    assert len(eng.submitted) == 1                               # no next one asked for ahead
    # back on: the next draft request is for the target's tokens plus that draft
    assert d.draft(PROMPT + [7, 8, 9, 10, 11], 12, 45, 4) == []
    assert eng.submitted[1].prompt == PROMPT + [7, 8, 9, 10, 11, 12]
    assert eng.submitted[1].response_tokens == FLIGHT_DRAFTS * 4
