"""How long a speculative request's next draft is, from what its steps measured.

:class:`SpecPolicy` is one request's adaptive draft length. Each step the engine asks
``next_length(cap)`` (0 = decode this step plainly, no draft) and then reports what the
step was with ``observe``: the draft length verified, how many of it were accepted, the
time in the drafter, and the time of the step (the decode that carried its rows plus its
sampling). A step without a draft is a plain step: its time is the measured cost of a
plain decode step for this request, never a constant. Times on a shared machine have
positive noise (a step that waited for the CPU), so each step cost is the least of its
last few observations (engine/spec_costs.py).

The model, all from those measurements:

- acceptance: each draft token is accepted with probability ``a`` given the ones before it
  were (decayed counts of accepted and rejecting positions, from a prior of one each that
  decays with them), so a draft of k yields 1 + a(1 - a^k)/(1 - a) tokens;
- cost: plain step P, plus a verify step's own C and R per verified draft row, plus per
  drafted token D (the drafter's time per token asked for, all of it: a draft model's
  engine's time for the request included, which arrives in lumps, so D is the time over
  the last steps that asked for drafts divided by the tokens they asked for). C and R are a line through
  the least extra time seen at each verified length. On a CPU a 2-row decode costs much
  more than a 1-row one and later rows little, so C can be larger than P: one length
  cannot tell C from R, and until two lengths far enough apart are measured the line
  is the pessimistic one (C = 0, all of it per row).

The next length is the longer of two:

- exploit: the k in [n_min, cap] with the most expected tokens per second under the line;
- explore: while the line is not known, a draft longer than any measured, when it would
  pay were its further rows free, as long as its expected loss (under the pessimistic
  line) fits the request's slack. The slack starts at ``INITIAL_SLACK`` plain steps,
  earns ``BUDGET`` of a plain step per plain step and is charged (or credited) every
  speculated step's time over (under) what plain decoding would have taken for its
  tokens. So on a reply whose first long draft is accepted the line is measured at once,
  and on a poor one exploring costs at most that allowance.

When neither is above 0 (no k is ``MIN_GAIN`` times plain decoding's 1/P), speculation is
off for the request: it decodes plainly for ``backoff`` steps (where the slack does not
cover a probe yet, at least so many that a probe costs at most ``PROBE_BUDGET`` of their
time), then probes with a draft as long as would pay best at PROBE_HOPE acceptance, whose
result weighs as much as all that was known before; a probe that does not pay doubles the
backoff. While off, a cheap drafter (n-grams) is also asked on plain steps for a shadow
draft of ``SHADOW`` tokens, never verified: how much of it the reply then matched counts
in the acceptance (``observe_shadow``), and when that makes a draft pay the request is on
again at once. The first ``WARMUP`` steps are plain (they measure P), and every ``REFRESH``
speculated steps one is plain again so P follows the machine's load.

A drafter that must first catch up (a draft model's engine prefilling the target's tokens
its session does not hold) says what that would cost (``next_length``'s ``setup_s``):
a draft that needs it is asked for only once the slack covers it, and until then the
step is plain (``deferred_steps``); so is a probe.

State: one request's estimates, slack and decision counts; no clock of its own (tests
feed it synthetic observations).
"""

from __future__ import annotations

import math
from typing import Any

from .spec_costs import Cost, LumpyCost, expected_accepted, fit_line

WARMUP = 2            # plain steps first: they measure the plain step cost
REFRESH = 32          # speculated steps between plain re-measurements
MIN_GAIN = 1.03       # expected speed over plain decoding needed to speculate
PROBE_HOPE = 0.9      # a probe while off is as long as would pay best at this acceptance
FIRST_BACKOFF = 16    # plain steps before the first probe; doubles up to MAX_BACKOFF
MAX_BACKOFF = 128
PROBE_BUDGET = 0.01   # and at least so many that a probe costs at most this share of their time
PROBE_FORGET = 0.5    # a probe's result weighs as much as this share of what was known before
DECAY = 0.9           # weight of the past in the acceptance counts, per verified step
PRIOR_ROW = 0.5       # a verify row's cost, in plain steps, before any is measured (a first draft of 2)
PRIOR_COUNT = 1.0     # accepted and rejecting positions counted before any is seen
INITIAL_SLACK = 1.0   # plain steps' time exploring may lose before it has earned any
BUDGET = 0.015        # of a plain step's time, earned per plain step (under MIN_GAIN - 1)
MAX_SLACK = 16.0      # plain steps: what good steps bank for exploring is bounded
SHADOW = 2            # while off, a cheap drafter's draft of this many is checked against the reply
SPAN = 2              # the line is known once two lengths, one SPAN times the other, are measured


class SpecPolicy:
    """One request's draft lengths (adaptive) or always the cap (``adaptive=False``)."""

    def __init__(self, n_min: int = 1, adaptive: bool = True) -> None:
        self.n_min = max(1, n_min)
        self.adaptive = adaptive
        self._plain = Cost()                   # a plain step
        self._rows: dict[int, Cost] = {}       # a verify step's time, by draft length verified
        self._draft_tok = LumpyCost()          # the drafter, per token asked for
        self._setup = 0.0                      # what the drafter must do before a draft, in plain steps
        self.deferred_steps = 0                # steps a draft would pay on but its setup is not covered yet
        self._hits = PRIOR_COUNT               # decayed accepted positions (a prior, decaying too)
        self._misses = PRIOR_COUNT             # decayed rejecting positions
        self._prior_weight = 1.0               # what is left of the prior in those counts
        self._plain_n = 0
        self._since_plain = 0
        self.on = True
        self._off_left = 0
        self._backoff = FIRST_BACKOFF
        self._probing = False                  # a probe was asked for, not yet verified
        self._probed = False                   # a probe was verified, not yet decided on
        self.slack = INITIAL_SLACK             # in plain steps
        self.switched = {"off": 0, "on": 0}
        self.off_steps = 0
        self.plain_steps = 0
        self.probes = 0
        self.explored = 0                      # verified drafts whose length was exploring
        self._exploring = False
        self._cap = 1                          # the last cap asked with: what a probe may be
        self.shadows = 0                       # unverified drafts checked against the reply
        self._shadowed = False                 # one was, while off, since the last decision

    # --- the decision ------------------------------------------------------------------------
    def next_length(self, cap: int, setup_s: float = 0.0) -> int:
        """Draft length for the next step, at most ``cap``; 0 = a plain step. ``setup_s``:
        the drafter's time before it can draft (a draft engine's catch-up prefill)."""
        if not self.adaptive:
            return cap
        self._cap = cap
        if self._plain_n < WARMUP:
            return 0
        self._setup = setup_s / max(self.plain_s or 0.0, 1e-9)
        if not self.on:
            return self._while_off(cap)
        if self._since_plain >= REFRESH:
            return 0
        k = self.choose(cap)
        if k == 0:
            self._switch_off()
        elif self._setup > self.slack:
            self.deferred_steps += 1
            return 0
        return k

    def choose(self, cap: int) -> int:
        """The longer of the best length under the line and an affordable exploring one."""
        best, explore = self.best_length(cap), self.explore_length(cap)
        self._exploring = explore > best
        return max(best, explore)

    def _while_off(self, cap: int) -> int:
        if self._shadowed:
            self._shadowed = False
            if k := self._shadow_switch(cap):
                return k
        if self._off_left > 0 or (not self._probed and self.slack < self._probe_loss()):
            self._off_left = max(0, self._off_left - 1)
            self.off_steps += 1
            return 0
        if not self._probed:
            self._probing = True
            return self.probe_length(cap)
        self._probed = False
        k = self.choose(cap)
        if k > 0:
            self.on, self._backoff = True, FIRST_BACKOFF
            self.switched["on"] += 1
            return k
        self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        self._go_off()
        return 0

    def _shadow_switch(self, cap: int) -> int:
        """Back on at once when the drafts checked against the reply say a draft pays, and
        its expected loss at the acceptance they showed fits the slack; else 0."""
        k = self.best_length(cap)
        if k == 0 or self.slack < self._setup + self._loss(k) - expected_accepted(self._evidence(), k):
            return 0
        self.on, self._backoff, self._off_left = True, FIRST_BACKOFF, 0
        self._probing = self._probed = False
        self.switched["on"] += 1
        return k

    def shadow_length(self, cap: int) -> int:
        """How long a draft this plain step should ask a cheap drafter for anyway, to check
        against the tokens the target emits (``observe_shadow``): SHADOW while off, else 0."""
        return min(cap, SHADOW) if self.adaptive and not self.on else 0

    def _switch_off(self) -> None:
        self.on = False
        self.switched["off"] += 1
        self._go_off()

    def _go_off(self) -> None:
        """Plain steps until the next probe: the backoff, or more where a probe is dear and
        the slack does not cover it yet (savings banked by good drafts pay for it)."""
        probe, wait = self._probe_loss(), self._backoff
        if self.slack < probe:
            wait = max(wait, min(MAX_BACKOFF, math.ceil(probe / PROBE_BUDGET)))
        self._off_left = wait - 1
        self.off_steps += 1

    def probe_length(self, cap: int) -> int:
        """The draft length that would pay best were PROBE_HOPE of it accepted: one row
        where rows cost alike, longer where a verify step's first row is the dear one."""
        return max(self.n_min, min(cap, self._fastest(PROBE_HOPE, cap)[0]))

    def _probe_loss(self) -> float:
        """A probe's cost over a plain step, its drafter's setup included, in plain steps:
        it waits until the slack has it."""
        return self._setup + self._loss(self.probe_length(self._cap))

    def _loss(self, k: int) -> float:
        """What a draft of k costs over a plain step were it all rejected, in plain steps."""
        plain = max(self.plain_s or 0.0, 1e-9)
        step, row = self.verify_cost(plain)
        return (step + k * (row + (self.draft_tok_s or 0.0))) / plain

    def _least_extra(self, plain: float) -> dict[int, float]:
        """The least time over a plain step seen at each verified length."""
        return {k: max(0.0, (c.value or 0.0) - plain) for k, c in self._rows.items()}

    def line_known(self) -> bool:
        """Whether two measured lengths, one at least SPAN times the other, pin C and R."""
        return bool(self._rows) and max(self._rows) >= SPAN * min(self._rows)

    def verify_cost(self, plain: float) -> tuple[float, float]:
        """(C, R): a verify step of k rows costs P + C + k R beyond its drafting. A line
        through the least extra time seen at each length once it is known; before, all of
        it per row (C = 0) at the longest length measured, PRIOR_ROW * P before any."""
        least = self._least_extra(plain)
        if not least:
            return 0.0, PRIOR_ROW * plain
        if not self.line_known():
            k = max(least)
            return 0.0, least[k] / k
        return fit_line(least)

    @property
    def plain_s(self) -> float | None:
        return self._plain.value

    @property
    def row_s(self) -> float | None:
        return None if self.plain_s is None else self.verify_cost(self.plain_s)[1]

    @property
    def verify_step_s(self) -> float | None:
        return None if self.plain_s is None else self.verify_cost(self.plain_s)[0]

    @property
    def draft_tok_s(self) -> float | None:
        return self._draft_tok.value

    def acceptance(self) -> float:
        return (self._hits + 1e-3) / (self._hits + self._misses + 2e-3)

    def _rate(self, a: float, k: int, step: float, per_row: float, plain: float) -> float:
        return (1.0 + expected_accepted(a, k)) / (plain + step + k * per_row)

    def best_length(self, cap: int) -> int:
        """The k in [n_min, cap] with the most expected tokens per second, or 0 when none
        is MIN_GAIN times faster than a plain step."""
        if self.plain_s is None or cap < self.n_min:
            return 0
        k, rate = self._fastest(self.acceptance(), cap)
        return k if rate > MIN_GAIN / max(self.plain_s, 1e-9) else 0

    def _fastest(self, a: float, cap: int) -> tuple[int, float]:
        """The k in [n_min, cap] with the most expected tokens per second at acceptance a."""
        plain = max(self.plain_s or 0.0, 1e-9)
        step, row = self.verify_cost(plain)
        per_row = row + (self.draft_tok_s or 0.0)
        return max(((k, self._rate(a, k, step, per_row, plain)) for k in range(self.n_min, cap + 1)),
                   key=lambda kr: kr[1], default=(0, 0.0))

    def explore_length(self, cap: int) -> int:
        """While the line is not known: the longest draft past every measured length whose
        expected loss under the pessimistic line fits the slack, when a draft of ``cap``
        would pay were the rows past the longest measured free; else 0."""
        if self.plain_s is None or self.line_known():
            return 0
        plain = max(self.plain_s, 1e-9)
        longest = max(self._rows, default=0)
        lo = max(self.n_min, longest + 1)
        if cap < lo:
            return 0
        step, row = self.verify_cost(plain)
        draft, a = self.draft_tok_s or 0.0, self.acceptance()
        if longest and self._rate(a, cap, longest * row, draft, plain) < MIN_GAIN / plain:
            return 0      # not even free rows would make a longer draft pay
        for k in range(cap, lo - 1, -1):
            loss = step + k * (row + draft) - expected_accepted(self._evidence(), k) * plain
            if loss <= self.slack * plain:
                return k
        return 0

    def _evidence(self) -> float:
        """The acceptance seen, without the prior (0 before any draft was verified)."""
        prior = self._prior_weight * PRIOR_COUNT
        hits, misses = self._hits - prior, self._misses - prior
        return hits / (hits + misses) if hits + misses > 1e-9 else 0.0

    # --- what a step measured ----------------------------------------------------------------
    def observe(self, asked: int, drafted: int, accepted: int, draft_s: float, step_s: float | None) -> None:
        """A step: ``asked`` draft tokens were asked for, ``drafted`` verified, ``accepted``
        of them accepted; ``step_s`` None when the step's time is not its own (its decode
        also carried another request's prefill)."""
        if asked:
            self._draft_tok.add(draft_s, asked)
        if drafted == 0:
            self._plain_step(step_s, draft_s)
            self._exploring = False
            return
        self._since_plain += 1
        if step_s is not None:
            self._rows.setdefault(drafted, Cost()).add(step_s)
        self._charge(drafted, accepted, draft_s, step_s)
        self.explored += self._exploring
        self._exploring = False
        if self._probing:
            self._probing, self._probed = False, True
            self._scale_counts(PROBE_FORGET)
            self.probes += 1
        self._count(drafted, accepted)

    def observe_shadow(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` asked for on a plain step and not verified: ``accepted`` of
        it matched what the target then emitted. Acceptance evidence at no verify cost;
        while off, the next step decides on it."""
        if not self.adaptive or drafted == 0:
            return
        self._count(drafted, accepted)
        self.shadows += 1
        self._shadowed = not self.on

    def _count(self, drafted: int, accepted: int) -> None:
        self._scale_counts(DECAY)
        self._hits += accepted
        self._misses += 1.0 if accepted < drafted else 0.0

    def _scale_counts(self, f: float) -> None:
        self._hits, self._misses, self._prior_weight = f * self._hits, f * self._misses, f * self._prior_weight

    def _charge(self, drafted: int, accepted: int, draft_s: float, step_s: float | None) -> None:
        """The slack gains what the step saved over plain decoding's time for its tokens
        (plain steps as they were lately, their noise included, as this step's is)."""
        if self.plain_s is None:
            return
        plain, typical = max(self.plain_s, 1e-9), max(self._plain.mean or 0.0, 1e-9)
        if step_s is None:
            step, row = self.verify_cost(plain)
            step_s = typical + step + drafted * row
        saved = ((1.0 + BUDGET) * (1 + accepted) * typical - step_s - draft_s) / plain
        self.slack = min(MAX_SLACK, self.slack + saved)

    def _plain_step(self, step_s: float | None, draft_s: float) -> None:
        self.plain_steps += 1
        if step_s is not None:
            self._plain.add(step_s)
            self._plain_n += 1
            self._since_plain = 0
        if self.plain_s is not None:
            self.slack = min(MAX_SLACK, self.slack + BUDGET - draft_s / max(self.plain_s, 1e-9))

    def summary(self) -> dict[str, Any]:
        return {
            "adaptive": self.adaptive,
            "decisions": {"off": self.switched["off"], "on": self.switched["on"], "probes": self.probes},
            "explored": self.explored,
            "shadows": self.shadows,
            "deferred_steps": self.deferred_steps,
            "off_steps": self.off_steps,
            "plain_steps": self.plain_steps,
            "plain_step_s": self.plain_s,
            "verify_row_s": self.row_s,
            "verify_step_s": self.verify_step_s,
            "draft_token_s": self.draft_tok_s,
            "estimated_acceptance": self.acceptance() if self.adaptive else None,
            "slack_steps": self.slack if self.adaptive else None,
        }
