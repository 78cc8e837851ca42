"""The adaptive speculation policy on synthetic observations: what it decides, and what its
decisions would cost against plain decoding under the cost they were given."""

from __future__ import annotations

import random
from collections.abc import Callable

from workbench.engine.spec_policy import FIRST_BACKOFF, REFRESH, WARMUP, SpecPolicy, expected_accepted

PLAIN = 0.010   # a plain step: 10 ms


def run(policy: SpecPolicy, steps: int, accept: Callable[[int, int], int], row: float, cap: int = 16,
        draft_tok: float = 0.0, step: float = 0.0) -> tuple[list[int], float, int]:
    """``steps`` steps where a plain step costs PLAIN and a draft of k costs step + k * (row
    + draft_tok) more, ``accept(step, k)`` tokens accepted; (lengths, time, tokens emitted)."""
    lengths, time_s, tokens = [], 0.0, 0
    for i in range(steps):
        k = policy.next_length(cap)
        lengths.append(k)
        if k == 0:
            policy.observe(0, 0, 0, 0.0, PLAIN)
            time_s, tokens = time_s + PLAIN, tokens + 1
            continue
        a = accept(i, k)
        verify = PLAIN + step + k * row
        policy.observe(k, k, a, k * draft_tok, verify)
        time_s, tokens = time_s + verify + k * draft_tok, tokens + a + 1
    return lengths, time_s, tokens


def slowdown(time_s: float, tokens: int) -> float:
    """Time per token over plain decoding's."""
    return (time_s / tokens) / PLAIN


def test_the_first_steps_are_plain_and_measure_the_plain_step():
    p = SpecPolicy()
    lengths, _, _ = run(p, WARMUP + 1, lambda i, k: k, row=0.1 * PLAIN)
    assert lengths[:WARMUP] == [0] * WARMUP and lengths[WARMUP] > 0
    assert p.plain_s == PLAIN and p.summary()["plain_steps"] == WARMUP


def test_high_acceptance_grows_the_draft_to_the_cap_and_stays_on():
    p = SpecPolicy()
    lengths, time_s, tokens = run(p, 60, lambda i, k: k, row=0.1 * PLAIN)
    spec = [k for k in lengths[WARMUP:] if k]
    assert spec[0] < spec[-1] == 16 and spec == sorted(spec)
    s = p.summary()
    assert s["decisions"] == {"off": 0, "on": 0, "probes": 0} and s["off_steps"] == 0
    assert slowdown(time_s, tokens) < 0.3       # 60 steps, most of them 17 tokens for 2.6 steps' time


def test_the_draft_length_follows_the_acceptance_down():
    p = SpecPolicy()
    run(p, 20, lambda i, k: k, row=0.1 * PLAIN)
    long = p.next_length(16)
    p.observe(long, long, long, 0.0, PLAIN + long * 0.1 * PLAIN)
    lengths, _, _ = run(p, 40, lambda i, k: min(k, 2), row=0.1 * PLAIN)
    assert long == 16 and 0 < lengths[-1] <= 6


def test_zero_acceptance_switches_off_after_a_few_steps_and_costs_under_3_percent():
    p = SpecPolicy()
    lengths, time_s, tokens = run(p, 300, lambda i, k: 0, row=0.5 * PLAIN)
    assert all(k == 0 for k in lengths[WARMUP + 3:WARMUP + 3 + FIRST_BACKOFF - 3])
    s = p.summary()
    assert s["decisions"]["off"] == 1 and s["decisions"]["on"] == 0
    assert s["off_steps"] > 280 and 1 <= s["decisions"]["probes"] <= 6
    assert slowdown(time_s, tokens) <= 1.03


def test_a_short_reply_with_poor_drafts_stays_within_3_percent():
    for row in (0.2, 0.5):          # a verify row at 1.0 plain step costs 3.1% over 128 steps (the prior)
        p = SpecPolicy()
        _, time_s, tokens = run(p, 128, lambda i, k: 0, row=row * PLAIN)
        assert slowdown(time_s, tokens) <= 1.03, row


def test_probes_switch_speculation_back_on_when_drafts_start_to_pay():
    p = SpecPolicy()
    lengths, _, _ = run(p, 200, lambda i, k: 0 if i < 40 else k, row=0.1 * PLAIN)
    s = p.summary()
    assert s["decisions"]["off"] >= 1 and s["decisions"]["on"] == s["decisions"]["off"]
    assert s["decisions"]["probes"] >= 1 and lengths[30:40].count(0) >= 8   # off while nothing is accepted
    assert lengths[-1] == 16 and lengths[-30:].count(16) >= 28               # on again, at the cap


def test_verify_rows_that_cost_too_much_make_a_mediocre_acceptance_not_pay():
    rng = random.Random(1)

    def half(i: int, k: int) -> int:   # each draft token accepted with probability 0.5
        n = 0
        while n < k and rng.random() < 0.5:
            n += 1
        return n

    cheap, dear = SpecPolicy(), SpecPolicy()
    cheap_lengths, cheap_t, cheap_n = run(cheap, 200, half, row=0.05 * PLAIN)
    dear_lengths, dear_t, dear_n = run(dear, 200, half, row=0.9 * PLAIN)
    assert cheap.summary()["off_steps"] < 20 and slowdown(cheap_t, cheap_n) < 0.8
    assert dear.summary()["off_steps"] > 150 and slowdown(dear_t, dear_n) <= 1.03


def test_an_expensive_drafter_is_counted_as_part_of_a_verify_row():
    p = SpecPolicy()
    run(p, 100, lambda i, k: k, row=0.05 * PLAIN, draft_tok=1.2 * PLAIN)   # a drafter as slow as the target
    assert p.summary()["off_steps"] > 60 and p.draft_tok_s is not None and p.draft_tok_s > PLAIN


def test_plain_steps_are_remeasured_while_speculating():
    p = SpecPolicy()
    lengths, _, _ = run(p, WARMUP + 3 * REFRESH + 3, lambda i, k: k, row=0.1 * PLAIN)
    assert lengths[WARMUP:].count(0) == 3 and p.summary()["off_steps"] == 0


def test_a_step_whose_time_is_shared_does_not_measure():
    p = SpecPolicy()
    for _ in range(5):
        assert p.next_length(16) == 0
        p.observe(0, 0, 0, 0.0, None)      # its decode also carried another prefill
    assert p.plain_s is None and p.summary()["plain_steps"] == 5
    p.observe(0, 0, 0, 0.0, PLAIN)
    p.observe(0, 0, 0, 0.0, PLAIN)
    assert p.next_length(16) > 0


def test_fixed_length_is_always_the_cap_and_n_min_bounds_the_choice():
    fixed = SpecPolicy(adaptive=False)
    assert [fixed.next_length(c) for c in (16, 3, 1)] == [16, 3, 1]
    assert fixed.summary()["estimated_acceptance"] is None
    p = SpecPolicy(n_min=4)
    lengths, _, _ = run(p, 30, lambda i, k: k, row=0.1 * PLAIN)
    assert all(k == 0 or k >= 4 for k in lengths)
    assert p.next_length(3) == 0


def geometric(q: float, seed: int) -> Callable[[int, int], int]:
    """Each draft token accepted with probability q once the ones before it were."""
    rng = random.Random(seed)

    def accept(i: int, k: int) -> int:
        n = 0
        while n < k and rng.random() < q:
            n += 1
        return n
    return accept


# a CPU verify step: its first draft row costs more than a plain step, later rows little
FIRST_ROW, LATER_ROW = 1.5 * PLAIN, 0.2 * PLAIN


def test_a_copying_reply_ends_on_with_long_drafts_where_only_later_rows_are_cheap():
    # what fixed speculation accepted on the copying prompt: long drafts, one in four cut halfway
    p = SpecPolicy()
    lengths, time_s, tokens = run(p, 80, lambda i, k: k if i % 4 else k // 2, row=LATER_ROW, step=FIRST_ROW)
    s = p.summary()
    assert s["decisions"]["off"] == 0 and s["explored"] >= 1, lengths
    assert min(k for k in lengths[-10:] if k) >= 8, lengths
    assert abs(s["verify_step_s"] - FIRST_ROW) < 1e-9 and abs(s["verify_row_s"] - LATER_ROW) < 1e-9
    assert slowdown(time_s, tokens) < 0.6


def test_a_copying_reply_with_random_rejections_mostly_ends_on():
    # each draft token accepted with probability 0.93; a first draft rejected at once can
    # leave a short reply off (the allowance is spent), but most runs find the long drafts
    on, total = 0, 0.0
    for seed in range(20):
        p = SpecPolicy()
        lengths, time_s, tokens = run(p, 80, geometric(0.93, seed), row=LATER_ROW, step=FIRST_ROW)
        on += p.summary()["decisions"]["off"] == 0 and min(k for k in lengths[-10:] if k) >= 6
        total += slowdown(time_s, tokens)
    assert on >= 12 and total / 20 < 0.8, (on, total / 20)   # measured: 14 of 20, mean 0.73


def test_short_drafts_alone_would_not_pay_there():
    # the same costs seen at one short length look like 0.95 plain steps per row: exploring
    # is what finds the long drafts (a policy that does not explore turns off here)
    p = SpecPolicy()
    for _ in range(WARMUP):
        p.observe(0, 0, 0, 0.0, PLAIN)
    first = p.next_length(16)
    p.observe(first, first, first, 0.0, PLAIN + FIRST_ROW + first * LATER_ROW)
    assert first == 2 and p.best_length(16) == 0 and p.next_length(16) == 16


def test_exploring_on_poor_drafts_stays_within_3_percent_whatever_the_verify_step_costs():
    for step in (0.0, 0.5, 1.5):
        for row in (0.1, 0.2, 0.5):
            p = SpecPolicy()
            lengths, time_s, tokens = run(p, 128, lambda i, k: 0, row=row * PLAIN, step=step * PLAIN)
            assert slowdown(time_s, tokens) <= 1.03, (step, row, lengths)
            assert p.summary()["explored"] >= 1 and p.summary()["decisions"]["off"] == 1


def test_the_slack_bounds_what_exploring_may_lose():
    p = SpecPolicy()
    for _ in range(WARMUP):
        p.observe(0, 0, 0, 0.0, PLAIN)
    first = p.next_length(16)
    assert 1 < first < 16 and p.best_length(16) < first     # a first draft the allowance covers
    p.observe(first, first, 0, 0.0, PLAIN + first * 0.5 * PLAIN)   # all rejected, at half a plain step a row
    assert p.summary()["explored"] == 1
    assert p.summary()["slack_steps"] < 0.1 and p.explore_length(16) == 0


def test_expected_accepted():
    assert expected_accepted(1.0, 5) == 5
    assert expected_accepted(0.0, 5) == 0
    assert abs(expected_accepted(0.5, 2) - 0.75) < 1e-12
