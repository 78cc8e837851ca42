"""The adaptive policy on replies that copy their input in runs (a summary, a code edit),
with and without shadow drafts, on synthetic costs.

An n-gram draft is right inside a copied run until the run ends, and wrong or absent
between runs. Before shadow drafts, one wrong draft between runs could switch
speculation off for the rest of a short reply (the summary class in docs/benchmarks.md:
adaptive 1.10x plain against fixed drafts' 1.21-1.30x). While off, a shadow draft is a
cheap drafter's draft asked for on a plain step, never verified, and checked against the
tokens the target then emits: acceptance evidence at no verify cost, so the policy turns
back on where the next copied run starts.
"""

from __future__ import annotations

import random
import statistics

from workbench.engine.spec_policy import SHADOW, SpecPolicy
from workbench.engine.speculation import shadow_match

PLAIN = 0.010   # a plain step: 10 ms
Reply = list[int | None]   # per token: how many draft tokens from here match (0: a wrong draft; None: no draft)


def copying_reply(seed: int, n: int = 128) -> Reply:
    """Copied runs of 6-30 tokens, each followed by 1-4 tokens of the model's own, where the
    drafter offers a wrong draft half the time and nothing otherwise."""
    rng = random.Random(seed)
    left: Reply = []
    while len(left) < n:
        left += list(range(rng.randint(6, 30), 0, -1))
        left += [0 if rng.random() < 0.5 else None for _ in range(rng.randint(1, 4))]
    return left[:n]


class NoShadows(SpecPolicy):
    """The policy as it decides for a drafter that is not cheap (a draft model)."""

    def shadow_length(self, cap: int) -> int:
        return 0


def decode(policy: SpecPolicy, left: Reply, row: float, step: float, cap: int = 8,
           draft_tok: float = 0.0) -> tuple[float, list[int]]:
    """The reply decoded as engine/speculation.py does it: a draft of k costs step + k * (row
    + draft_tok) over a plain step PLAIN; a shadow draft is told to the policy once the reply
    leaves it or passes its end, or as far as it got when a real draft is asked for.
    (speed-up over plain decoding, draft length per step)."""
    t, time_s, lengths = 0, 0.0, []
    shadow: tuple[int, int, int] | None = None      # (first token it drafts, length, how many match)
    while t < len(left):
        cap_now = min(cap, len(left) - t - 1)
        if shadow and (t - shadow[0] > shadow[2] or t - shadow[0] >= shadow[1]):
            policy.observe_shadow(shadow[1], shadow[2])
            shadow = None
        k = policy.next_length(cap_now) if cap_now >= 1 else 0
        if k and shadow:
            policy.observe_shadow(t - shadow[0], t - shadow[0])
            shadow = None
        offered = left[t]
        if k == 0 or offered is None:
            n = policy.shadow_length(cap_now) if k == 0 and shadow is None and cap_now >= 1 else 0
            if n and offered is not None:
                shadow = (t + 1, n, min(n, offered))
            policy.observe(k, 0, 0, (k or n) * draft_tok, PLAIN)
            time_s, t = time_s + PLAIN + (k or n) * draft_tok, t + 1
            lengths.append(0)
            continue
        accepted, verify = min(k, offered), PLAIN + step + k * row
        policy.observe(k, k, accepted, k * draft_tok, verify)
        time_s, t = time_s + verify + k * draft_tok, t + accepted + 1
        lengths.append(k)
    return len(left) * PLAIN / time_s, lengths


def speedups(make: type[SpecPolicy], row: float, step: float, adaptive: bool = True) -> list[float]:
    return [decode(make(adaptive=adaptive), copying_reply(seed), row * PLAIN, step * PLAIN)[0] for seed in range(20)]


def test_shadow_drafts_turn_speculation_back_on_where_a_copied_run_starts():
    # a CPU verify step: its first row dear (1.5 plain steps), later rows cheap (0.2)
    with_shadows, without = speedups(SpecPolicy, 0.2, 1.5), speedups(NoShadows, 0.2, 1.5)
    fixed = speedups(SpecPolicy, 0.2, 1.5, adaptive=False)
    # measured: mean 1.44 / 1.37 / fixed 1.49; without shadows 3 of 20 replies stay off, under plain
    assert statistics.mean(with_shadows) > statistics.mean(without) + 0.05, (with_shadows, without)
    assert statistics.mean(with_shadows) > 0.95 * statistics.mean(fixed)
    assert min(with_shadows) > 1.1 and min(without) < 1.0


def test_where_every_verify_row_is_dear_shadows_reach_fixed_drafts_gain():
    # rows at half a plain step each and a verify step's own half step: fixed drafts gain 1.14x
    with_shadows, without = speedups(SpecPolicy, 0.5, 0.5), speedups(NoShadows, 0.5, 0.5)
    fixed = speedups(SpecPolicy, 0.5, 0.5, adaptive=False)
    # measured: mean 1.13 / 1.08 / fixed 1.14; replies under plain 1 / 9 / 2 of 20
    assert statistics.mean(with_shadows) > 0.98 * statistics.mean(fixed)
    assert statistics.mean(with_shadows) > statistics.mean(without) + 0.03
    assert sum(s < 1.0 for s in with_shadows) < sum(s < 1.0 for s in without)


def test_shadow_drafts_that_never_match_keep_speculation_off_within_3_percent():
    # free generation where the drafter offers a draft at every token and none matches,
    # the drafter costing 1% of a plain step per token (its shadows are paid from the slack too)
    for steps in (128, 300):
        for step, row in ((0.0, 0.5), (1.5, 0.2)):
            p = SpecPolicy()
            speedup, lengths = decode(p, [0] * steps, row * PLAIN, step * PLAIN, draft_tok=0.01 * PLAIN)
            s = p.summary()
            assert 1 / speedup <= 1.03, (steps, step, row, lengths)
            assert s["shadows"] > 10 and s["decisions"]["on"] == 0, s


def test_a_shadow_counts_as_a_draft_of_what_the_reply_reached():
    p = SpecPolicy()
    for _ in range(2):
        p.observe(0, 0, 0, 0.0, PLAIN)
    before = p.acceptance()
    p.observe_shadow(2, 2)                     # matched as far as it went: no rejection
    matched = p.acceptance()
    assert matched > before and p.summary()["shadows"] == 1
    p.observe_shadow(2, 0)                     # its first token was not what the target emitted
    assert p.acceptance() < matched
    p.observe_shadow(0, 0)                     # the reply reached none of it: nothing to count
    assert p.summary()["shadows"] == 2


def test_shadows_are_asked_for_only_while_off_and_never_with_fixed_lengths():
    p = SpecPolicy()
    assert p.on and p.shadow_length(8) == 0
    p.on = False
    assert p.shadow_length(8) == SHADOW and p.shadow_length(1) == 1
    assert SpecPolicy(adaptive=False).shadow_length(8) == 0


def test_shadow_match_counts_the_run_the_reply_matched_so_far():
    emitted = [1, 2, 3, 4, 5]
    assert shadow_match(emitted, 3, [4, 5, 6]) == (2, 2)      # matched so far, the reply not past it
    assert shadow_match(emitted, 3, [4, 9]) == (2, 1)         # left it at the second token
    assert shadow_match(emitted, 5, [6, 7]) == (0, 0)         # not reached yet
    assert shadow_match(emitted, 1, [2, 3]) == (2, 2)         # passed its end
