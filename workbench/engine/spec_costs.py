"""The cost estimates a speculative request's policy (engine/spec_policy.py) decides on.

- :class:`Cost`: the least of the last ``WINDOW`` observations of one cost. Times on a
  shared machine have positive noise (a step that waited for the CPU), so the least is
  the estimate of a step's own cost.
- :class:`LumpyCost`: a cost per unit that arrives in lumps (a draft model's engine
  prefills the target's tokens in one go, then hands out drafts it generated ahead for
  several steps at no further time): the time over the last ``LUMPY_WINDOW`` observations
  divided by their units, so a lump is spread over the steps it served.
- ``expected_accepted``: accepted tokens of a draft at a per-token acceptance;
  ``fit_line``: a verify step's fixed and per-row cost through the least times seen.

State: none across requests; each object belongs to one request's policy.
"""

from __future__ import annotations

import collections

WINDOW = 8            # time observations kept per cost (per verified length for the line)
LUMPY_WINDOW = 16     # (seconds, units) observations a lumpy cost is the ratio of


class Cost:
    """The least of the last WINDOW observations of one cost (None before the first)."""

    def __init__(self) -> None:
        self.seen: collections.deque[float] = collections.deque(maxlen=WINDOW)

    def add(self, value: float) -> None:
        self.seen.append(value)

    @property
    def value(self) -> float | None:
        return min(self.seen) if self.seen else None

    @property
    def mean(self) -> float | None:
        return sum(self.seen) / len(self.seen) if self.seen else None


class LumpyCost:
    """Seconds per unit over the last LUMPY_WINDOW observations (None before a unit)."""

    def __init__(self) -> None:
        self.seen: collections.deque[tuple[float, int]] = collections.deque(maxlen=LUMPY_WINDOW)

    def add(self, seconds: float, units: int) -> None:
        self.seen.append((seconds, units))

    @property
    def value(self) -> float | None:
        units = sum(u for _, u in self.seen)
        return sum(s for s, _ in self.seen) / units if units else None


def expected_accepted(a: float, k: int) -> float:
    """Expected accepted tokens of a k-token draft at per-token acceptance ``a``."""
    return float(k) if a >= 1.0 else a * (1.0 - a ** k) / (1.0 - a)


def fit_line(least: dict[int, float]) -> tuple[float, float]:
    """(C, R) of extra = C + k R through (k, extra) points, least squares, both >= 0."""
    n = len(least)
    mk, mx = sum(least) / n, sum(least.values()) / n
    slope = max(0.0, sum((k - mk) * (x - mx) for k, x in least.items()) / sum((k - mk) ** 2 for k in least))
    return max(0.0, mx - slope * mk), slope
