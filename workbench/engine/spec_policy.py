"""How long a speculative request's next draft is, from what its steps measured.

:class:`SpecPolicy` is one request's adaptive draft length. Each step the engine asks
``next_length(cap)`` (0 = decode this step plainly, no draft) and then reports what the
step was with ``observe``: the draft length verified, how many of it were accepted, the
time in the drafter, and the time of the step (the decode that carried its rows plus its
sampling). A step without a draft is a plain step: its time is the measured cost of a
plain decode step for this request, never a constant. Times on a shared machine have
positive noise (a step that waited for the CPU), so each cost is the least of its last
``WINDOW`` observations.

The model, all from those measurements:

- acceptance: each draft token is accepted with probability ``a`` given the ones before it
  were (decayed counts of accepted and rejecting positions, from a prior of one each that
  decays with them), so a draft
  of k yields 1 + a(1 - a^k)/(1 - a) tokens;
- cost: plain step P, plus a verify step's own C and R per verified draft row (a line
  through the least extra time seen at each draft length; on a CPU a 2-row decode costs
  much more than a 1-row one, later rows less), plus per drafted token D (the drafter's
  time per token asked for).

The next length is the k in [n_min, cap] with the most tokens per second; when even that
is not ``MIN_GAIN`` times plain decoding's 1/P, speculation is off for the request: it
decodes plainly for ``backoff`` steps (at least so many that a probe costs at most
``PROBE_BUDGET`` of their time), then probes with a one-token draft, whose result weighs
as much as all that was known before; a probe that does not pay doubles the backoff. The first
``WARMUP`` steps are plain (they measure P), and every ``REFRESH`` speculated steps one is
plain again so P follows the machine's load.

State: one request's estimates and decision counts; no clock of its own (tests feed it
synthetic observations).
"""

from __future__ import annotations

import collections
import math
from typing import Any

WARMUP = 2            # plain steps first: they measure the plain step cost
REFRESH = 32          # speculated steps between plain re-measurements
MIN_GAIN = 1.03       # expected speed over plain decoding needed to speculate
PROBE_LEN = 1         # draft length of a probe while off: one row risked
FIRST_BACKOFF = 16    # plain steps before the first probe; doubles up to MAX_BACKOFF
MAX_BACKOFF = 128
PROBE_BUDGET = 0.01   # and at least so many that a probe costs at most this share of their time
PROBE_FORGET = 0.5    # a probe's result weighs as much as this share of what was known before
DECAY = 0.9           # weight of the past in the acceptance counts, per verified step
WINDOW = 8            # time observations kept per cost
PRIOR_ROW = 0.25      # a verify row's cost, in plain steps, where its average starts
PRIOR_COUNT = 1.0     # accepted and rejecting positions counted before any is seen


class Cost:
    """The least of the last WINDOW observations of one cost (None before the first)."""

    def __init__(self) -> None:
        self.seen: collections.deque[float] = collections.deque(maxlen=WINDOW)

    def add(self, value: float) -> None:
        self.seen.append(value)

    @property
    def value(self) -> float | None:
        return min(self.seen) if self.seen else None


def expected_accepted(a: float, k: int) -> float:
    """Expected accepted tokens of a k-token draft at per-token acceptance ``a``."""
    return float(k) if a >= 1.0 else a * (1.0 - a ** k) / (1.0 - a)


class SpecPolicy:
    """One request's draft lengths (adaptive) or always the cap (``adaptive=False``)."""

    def __init__(self, n_min: int = 1, adaptive: bool = True) -> None:
        self.n_min = max(1, n_min)
        self.adaptive = adaptive
        self._plain = Cost()                   # a plain step
        self._row: collections.deque[tuple[int, float]] = collections.deque(maxlen=WINDOW)  # (rows, step_s)
        self._draft_tok = Cost()               # the drafter, per token asked for
        self._hits = PRIOR_COUNT               # decayed accepted positions (a prior, decaying too)
        self._misses = PRIOR_COUNT             # decayed rejecting positions
        self._plain_n = 0
        self._since_plain = 0
        self.on = True
        self._off_left = 0
        self._backoff = FIRST_BACKOFF
        self._probing = False                  # a probe was asked for, not yet verified
        self._probed = False                   # a probe was verified, not yet decided on
        self.switched = {"off": 0, "on": 0}
        self.off_steps = 0
        self.plain_steps = 0
        self.probes = 0

    # --- the decision ------------------------------------------------------------------------
    def next_length(self, cap: int) -> int:
        """Draft length for the next step, at most ``cap``; 0 = a plain step."""
        if not self.adaptive:
            return cap
        if self._plain_n < WARMUP:
            return 0
        if not self.on:
            return self._while_off(cap)
        if self._since_plain >= REFRESH:
            return 0
        k = self.best_length(cap)
        if k == 0:
            self._switch_off()
        return k

    def _while_off(self, cap: int) -> int:
        if self._off_left > 0:
            self._off_left -= 1
            self.off_steps += 1
            return 0
        if not self._probed:
            self._probing = True
            return max(self.n_min, min(cap, PROBE_LEN))
        self._probed = False
        k = self.best_length(cap)
        if k > 0:
            self.on, self._backoff = True, FIRST_BACKOFF
            self.switched["on"] += 1
            return k
        self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        self._go_off()
        return 0

    def _switch_off(self) -> None:
        self.on = False
        self.switched["off"] += 1
        self._go_off()

    def _go_off(self) -> None:
        """Plain steps until the next probe: the backoff, or more where a probe is dear."""
        plain = max(self.plain_s or 0.0, 1e-9)
        probe_s = PROBE_LEN * self._per_row(plain)
        self._off_left = max(self._backoff, min(MAX_BACKOFF, math.ceil(probe_s / (PROBE_BUDGET * plain)))) - 1
        self.off_steps += 1

    def _per_row(self, plain: float) -> float:
        """A draft token's cost: its verify row and its share of the drafter."""
        return self.verify_cost(plain)[1] + (self.draft_tok_s or 0.0)

    def verify_cost(self, plain: float) -> tuple[float, float]:
        """(C, R): a verify step of k rows costs P + C + k R beyond its drafting. From the
        least extra time seen at each length: a line through them when there are two
        lengths or more, else all of it per row (C = 0); PRIOR_ROW * P per row counts as
        one length-1 observation until WINDOW // 2 are seen."""
        least: dict[int, float] = {}
        for k, t in self._row:
            least[k] = min(least.get(k, math.inf), max(0.0, t - plain))
        if len(self._row) < WINDOW // 2:
            least[1] = min(least.get(1, math.inf), PRIOR_ROW * plain)
        if len(least) == 1:
            (k, x), = least.items()
            return 0.0, x / k
        n = len(least)
        mk, mx = sum(least) / n, sum(least.values()) / n
        slope = sum((k - mk) * (x - mx) for k, x in least.items()) / sum((k - mk) ** 2 for k in least)
        slope = max(slope, 0.0)
        return max(0.0, mx - slope * mk), slope

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

    def best_length(self, cap: int) -> int:
        """The k in [n_min, cap] with the most expected tokens per second, or 0 when none
        is MIN_GAIN times faster than a plain step."""
        if self.plain_s is None or cap < self.n_min:
            return 0
        plain = max(self.plain_s, 1e-9)
        step, row = self.verify_cost(plain)
        per_row = row + (self.draft_tok_s or 0.0)
        a = self.acceptance()
        best_k, best_rate = 0, MIN_GAIN / plain
        for k in range(self.n_min, cap + 1):
            rate = (1.0 + expected_accepted(a, k)) / (plain + step + k * per_row)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    # --- what a step measured ----------------------------------------------------------------
    def observe(self, asked: int, drafted: int, accepted: int, draft_s: float, step_s: float | None) -> None:
        """A step: ``asked`` draft tokens were asked for, ``drafted`` verified, ``accepted``
        of them accepted; ``step_s`` None when the step's time is not its own (its decode
        also carried another request's prefill)."""
        if asked:
            self._draft_tok.add(draft_s / asked)
        if drafted == 0:
            self._plain_step(step_s)
            return
        self._since_plain += 1
        if step_s is not None:
            self._row.append((drafted, step_s))
        if self._probing:
            self._probing, self._probed = False, True
            self._hits, self._misses = PROBE_FORGET * self._hits, PROBE_FORGET * self._misses
            self.probes += 1
        self._hits = DECAY * self._hits + accepted
        self._misses = DECAY * self._misses + (1.0 if accepted < drafted else 0.0)

    def _plain_step(self, step_s: float | None) -> None:
        self.plain_steps += 1
        if step_s is not None:
            self._plain.add(step_s)
            self._plain_n += 1
            self._since_plain = 0

    def summary(self) -> dict[str, Any]:
        return {
            "adaptive": self.adaptive,
            "decisions": {"off": self.switched["off"], "on": self.switched["on"], "probes": self.probes},
            "off_steps": self.off_steps,
            "plain_steps": self.plain_steps,
            "plain_step_s": self.plain_s,
            "verify_row_s": self.row_s,
            "verify_step_s": self.verify_step_s,
            "draft_token_s": self.draft_tok_s,
            "estimated_acceptance": self.acceptance() if self.adaptive else None,
        }
