"""Parallel sampling: ``n`` continuations of one prompt, or the best ``n`` of ``best_of``.

Each sample is a request of its own, all submitted together. The engine computes their common
prompt once: the first sample prefills it, the others wait for that prefill and copy its KV
(live prefix sharing, engine/live_share.py: their hit kind is ``shared``), then the samples
decode side by side in one batch. With ``seed`` s, sample i samples with seed s + i
(:func:`sample_seed`, also the endpoint's rule for its choices); without one, each draws its
own.

``best_of`` = k >= n: k samples, and the n with the highest mean log-probability per
generated token are returned, best first (OpenAI's rule for ``best_of``; :func:`score`). The
chosen tokens' logprobs are asked for (``logprobs=0``) when the caller asked for none.

Results come as a list in sample order (best first with ``best_of``). A :class:`SampleStream`
hands out every sample's events as ``Sample(index, event)``, in the order they come.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .engine.events import Done, Error, Event
from .engine.stream import EventEnds
from .errors import InvalidOption

MAX_SAMPLES = 16   # samples of one call (n, best_of): each holds a sequence while it runs
SEED_MODULUS = 2**32 - 1
_POLL_S = 0.005    # how long a SampleStream waits on one sample when none had an event


class Handle(Protocol):
    """What a sample's stream offers (Stream, ThinkingResultStream, ChatStream)."""

    ref: int

    def poll(self, timeout: float | None = 0.0) -> Event | None: ...
    def result(self) -> Any: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample's event: ``index`` (0 .. n-1, submission order) and the ``event``."""

    index: int
    event: Event


def sample_seed(seed: Any, i: int) -> Any:
    """Sample ``i``'s seed: ``seed + i`` (wrapped into llama.cpp's range) when ``seed`` is an
    int, else ``seed`` unchanged (None: each sample draws its own; anything else is checked,
    and refused, with the request's options)."""
    if i and isinstance(seed, int) and not isinstance(seed, bool):
        return (seed + i) % SEED_MODULUS
    return seed


def sample_opts(opts: dict[str, Any], i: int) -> dict[str, Any]:
    """Sample ``i``'s options: the caller's, its seed per :func:`sample_seed`."""
    if "seed" not in opts:
        return opts
    return {**opts, "seed": sample_seed(opts["seed"], i)}


def counts(n: Any, best_of: Any = None) -> tuple[int, int]:
    """(samples returned, samples generated) of ``n`` / ``best_of``, checked."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        raise InvalidOption("n", n, f"an integer from 1 to {MAX_SAMPLES}")
    if best_of is None:
        return n, n
    if isinstance(best_of, bool) or not isinstance(best_of, int) or not n <= best_of <= MAX_SAMPLES:
        raise InvalidOption("best_of", best_of, f"None or an integer from n ({n}) to {MAX_SAMPLES}")
    return n, best_of


def score(result: Any) -> float:
    """Mean log-probability per generated token of a result (or a Done): -inf without
    tokens or logprobs."""
    lps = result.logprobs or ()
    return sum(lp.logprob for lp in lps) / len(lps) if lps else -math.inf


def best(items: Sequence[T], n: int, key: Callable[[T], Any] = lambda r: r) -> list[T]:
    """The ``n`` items whose result (``key(item)``) has the highest :func:`score`, best
    first (ties: sample order)."""
    return sorted(items, key=lambda it: score(key(it)), reverse=True)[:n]


def start(begin: Callable[..., Handle], k: int, opts: dict[str, Any]) -> SampleStream:
    """``k`` samples, each ``begin(**its options)``; a refusal closes those already started."""
    handles: list[Handle] = []
    try:
        for i in range(k):
            handles.append(begin(**sample_opts(opts, i)))
    except BaseException:
        for h in handles:
            h.close()
        raise
    return SampleStream(handles)


def scored_opts(opts: dict[str, Any], best_of: int | None) -> dict[str, Any]:
    """With ``best_of``, the chosen tokens' logprobs are needed for the ranking."""
    if best_of is not None and opts.get("logprobs") is None:
        return {**opts, "logprobs": 0}
    return opts


def keep(results: list[Any], n: int, best_of: int | None) -> list[Any]:
    """What a call returns of its samples' results: all, or the best n with ``best_of``."""
    return best(results, n) if best_of is not None else results


class SampleStream(EventEnds):
    """The events of n samples as one stream of :class:`Sample`; ``result()`` the list.
    (An EventEnds: the middleware chain closes one it made and did not return.)"""

    def __init__(self, handles: Sequence[Handle]) -> None:
        self.done = None
        self._ended = False
        self.samples = list(handles)
        self.refs = [h.ref for h in self.samples]
        self._open = list(range(len(self.samples)))

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return self

    def __next__(self) -> Sample:
        while self._open:
            ready = self._ready()
            if ready is not None:
                return ready
            i = self._open[0]
            try:
                ev = self.samples[i].poll(_POLL_S)
            except KeyboardInterrupt:
                self.cancel()
                raise
            if ev is not None:
                return self._sample(i, ev)
        raise StopIteration

    def _ready(self) -> Sample | None:
        """An event some open sample already has, in sample order; None when none has."""
        for i in list(self._open):
            ev = self.samples[i].poll(0.0)
            if ev is not None:
                return self._sample(i, ev)
        return None

    def _sample(self, i: int, ev: Event) -> Sample:
        if isinstance(ev, (Done, Error)):
            self._open.remove(i)
        return Sample(i, ev)

    def poll(self, timeout: float | None = 0.0) -> Sample | None:
        """The next event of any sample within ``timeout`` seconds, else None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._open:
            ready = self._ready()
            if ready is not None:
                return ready
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)
        return None

    @property
    def ended(self) -> bool:
        return not self._open or self._ended

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every sample has ended; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for h in self.samples:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not h.wait(left):
                return False
        return True

    def result(self) -> list[Any]:
        """Every sample's result, in sample order (raises the first sample's error)."""
        return [h.result() for h in self.samples]

    def cancel(self) -> None:
        for h in self.samples:
            h.cancel()

    def close(self) -> None:
        for h in self.samples:
            h.close()
        self._open = []
        self._ended = True

    def __enter__(self) -> SampleStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SampleStream refs={self.refs} open={len(self._open)}>"
