"""workbench/samples.py without a model: counts, seeds, the best_of ranking and the merged
stream of sample events."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from workbench import samples
from workbench.engine.events import Done, Token
from workbench.errors import InvalidOption


@dataclass
class Lp:
    logprob: float


@dataclass
class Res:
    logprobs: tuple[Lp, ...] | None


@dataclass
class FakeHandle:
    """A sample's stream: its events come one per poll."""

    ref: int
    events: list[Any]
    cancelled: bool = False
    closed: bool = False
    seen: list[Any] = field(default_factory=list)

    def poll(self, timeout: float | None = 0.0) -> Any:
        if not self.events:
            return None
        ev = self.events.pop(0)
        self.seen.append(ev)
        return ev

    def result(self) -> Any:
        return self.ref

    def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        self.closed = True

    def wait(self, timeout: float | None = None) -> bool:
        return not self.events


def test_counts_and_their_errors():
    assert samples.counts(3) == (3, 3)
    assert samples.counts(2, 5) == (2, 5)
    for n, best_of, key in ((0, None, "n"), (17, None, "n"), (True, None, "n"), (2.0, None, "n"),
                            (3, 2, "best_of"), (1, 17, "best_of"), (1, "4", "best_of")):
        with pytest.raises(InvalidOption) as e:
            samples.counts(n, best_of)
        assert e.value.key == key


def test_sample_seeds():
    assert [samples.sample_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert samples.sample_seed(2**32 - 2, 1) == 0                      # wraps into llama.cpp's range
    assert samples.sample_seed(None, 3) is None and samples.sample_seed("x", 1) == "x"   # checked later
    assert samples.sample_opts({"seed": 5, "temperature": 1.0}, 2) == {"seed": 7, "temperature": 1.0}
    assert samples.sample_opts({"temperature": 1.0}, 2) == {"temperature": 1.0}


def test_best_ranks_by_mean_logprob_per_token():
    a, b, c = Res((Lp(-1.0), Lp(-1.0))), Res((Lp(-0.2),)), Res((Lp(-0.5), Lp(-0.1), Lp(-0.3)))
    assert samples.score(a) == -1.0 and math.isclose(samples.score(c), -0.3)
    assert samples.best([a, b, c], 2) == [b, c]
    assert samples.score(Res(None)) == -math.inf and samples.score(Res(())) == -math.inf
    assert samples.best([0, 1, 2], 1, key=lambda i: [a, b, c][i]) == [1]
    assert samples.scored_opts({}, 3) == {"logprobs": 0} and samples.scored_opts({"logprobs": 2}, 3) == {"logprobs": 2}
    assert samples.scored_opts({}, None) == {}


def test_a_sample_stream_merges_and_tags_events():
    h0 = FakeHandle(10, [Token("a"), Done("a", (1,), (1,), "length", None, None)])   # type: ignore[arg-type]
    h1 = FakeHandle(11, [Token("b"), Token("c"), Done("bc", (1, 2), (1, 2), "length", None, None)])  # type: ignore[arg-type]
    s = samples.SampleStream([h0, h1])
    got = [(x.index, type(x.event).__name__) for x in s]
    assert sorted(got) == sorted([(0, "Token"), (0, "Done"), (1, "Token"), (1, "Token"), (1, "Done")])
    assert [i for i, kind in got if kind == "Token"].count(1) == 2 and s.ended
    assert s.result() == [10, 11] and s.refs == [10, 11]
    s.cancel()
    assert h0.cancelled and h1.cancelled


def test_a_refused_sample_closes_those_started():
    started: list[FakeHandle] = []

    def begin(**opts: Any) -> FakeHandle:
        if len(started) == 2:
            raise InvalidOption("seed", opts.get("seed"), "an int")
        started.append(FakeHandle(len(started), []))
        return started[-1]

    with pytest.raises(InvalidOption):
        samples.start(begin, 3, {"seed": 1})
    assert [h.closed for h in started] == [True, True]
