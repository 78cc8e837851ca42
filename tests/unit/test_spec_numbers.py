"""A speculative request's numbers (engine/speculation.py's ``SpecNumbers``): the summary's
acceptance is exactly accepted / drafted over the verified drafts, per position accepted /
tried; recorded steps are the reference, not another formula."""

from __future__ import annotations

from workbench.engine.speculation import SpecNumbers

# (draft length, accepted) per verified step
STEPS = [(4, 4), (4, 1), (2, 0), (6, 3), (1, 1), (3, 2)]


def recorded(steps: list[tuple[int, int]]) -> SpecNumbers:
    numbers = SpecNumbers("ngram-simple")
    for n_draft, n_accepted in steps:
        numbers.record(n_draft, n_accepted)
    return numbers


def test_acceptance_is_accepted_over_drafted_exactly():
    s = recorded(STEPS).summary()
    assert (s["steps"], s["drafted"], s["accepted"]) == (6, 20, 11)
    assert s["acceptance"] == 11 / 20         # not over drafted + steps, nor per step
    assert recorded([(5, 5)] * 3).summary()["acceptance"] == 1.0
    assert recorded([(3, 0), (2, 0)]).summary()["acceptance"] == 0.0


def test_acceptance_by_position_is_accepted_over_tried_at_each_position():
    s = recorded(STEPS).summary()
    # tried: positions 0..5 verified by 6, 5, 4, 3, 1, 1 drafts; accepted there 5, 3, 2, 1, 0, 0
    assert s["accepted_by_position"] == [5, 3, 2, 1, 0, 0]
    assert s["acceptance_by_position"] == [5 / 6, 3 / 5, 2 / 4, 1 / 3, 0.0, 0.0]
    assert s["draft_lengths"] == {1: 1, 2: 1, 3: 1, 4: 2, 6: 1}
    assert sum(s["accepted_by_position"]) == s["accepted"]


def test_no_draft_verified_has_no_acceptance():
    s = SpecNumbers("ngram-simple").summary()
    assert (s["steps"], s["drafted"], s["acceptance"], s["acceptance_by_position"]) == (0, 0, None, [])
