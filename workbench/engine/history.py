"""The last finished requests of an engine, for serving experiments (`wb.history()`,
`views.history()`, `views.latency()`).

Every request that ends (done, cancelled or failed) leaves one `Served` record in its
engine's `History`, a ring of the newest ``history_size`` (a load option; 0 keeps none).
Times are the engine's own clock, ``time.perf_counter()`` (the one ``Stats`` is computed
with): ``arrival`` is when the request was submitted, the others are seconds after it.
Inter-token gaps are kept as one float32 array per request (4 bytes a token).

Built on the loop thread as the request ends, before its caller sees the result: O(tokens)
for the gaps, nothing else.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .events import Stats

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Served:
    """One finished request as the engine served it."""

    ref: int
    model: str
    cache_scope: str
    session_id: Hashable | None
    arrival: float                   # time.perf_counter() at submission
    admitted_s: float | None         # after arrival: given a sequence
    first_token_s: float | None      # after arrival: its first token sampled (= TTFT)
    finished_s: float                # after arrival: ended (= end-to-end latency)
    gaps: np.ndarray                 # float32 seconds between consecutive delivered tokens
    prompt_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    cache_hit_kind: str
    cache_saved_by: str | None       # the model id that saved a restored row (Stats.cache_saved_by)
    finish_reason: str               # stop, length, cancelled, error
    error: str | None
    spec_drafted: int | None
    spec_accepted: int | None

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.prefilled_tokens

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than 2 tokens)."""
        return float(self.gaps.mean()) if len(self.gaps) else None

    def row(self) -> dict[str, Any]:
        return {"ref": self.ref, "model": self.model, "cache_scope": self.cache_scope, "session_id": self.session_id,
                "arrival": self.arrival, "queued_s": self.admitted_s, "ttft_s": self.first_token_s,
                "tpot_s": self.tpot_s, "e2e_s": self.finished_s, "itl_s": self.gaps,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "prefilled_tokens": self.prefilled_tokens, "generated_tokens": self.generated_tokens,
                "cache_hit_kind": self.cache_hit_kind, "cache_saved_by": self.cache_saved_by,
                "finish_reason": self.finish_reason, "error": self.error,
                "spec_drafted": self.spec_drafted, "spec_accepted": self.spec_accepted}


class History:
    """A bounded ring of `Served`, newest last; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ring: collections.deque[Served] = collections.deque(maxlen=max(size, 1))
        self._lock = threading.Lock()

    def add(self, req: Any, reason: str, stats: Stats, error: BaseException | None) -> None:
        """Record ``req`` (an engine Request) as it ends, with its final ``stats``."""
        if self.size == 0:
            return
        try:
            served = _served(req, reason, stats, error)
        except Exception:  # noqa: BLE001 - the record is a courtesy; the request's result is not
            log.exception("could not record request %s in the history", req.ref)
            return
        with self._lock:
            self._ring.append(served)

    def records(self) -> list[Served]:
        with self._lock:
            return list(self._ring)

    def clear(self) -> None:
        with self._lock:
            self._ring.clear()


def _served(req: Any, reason: str, stats: Stats, error: BaseException | None) -> Served:
    t0 = req.submitted_at
    times = np.asarray(req.token_times, dtype=np.float64)
    spec = stats.speculative or {}
    served = Served(
        ref=req.ref, model=req.model_id, cache_scope=req.opts.cache_scope, session_id=req.opts.session_id,
        arrival=t0, admitted_s=None if req.admitted_at is None else req.admitted_at - t0,
        first_token_s=stats.ttft_s, finished_s=stats.total_s, gaps=np.diff(times).astype(np.float32),
        prompt_tokens=stats.prompt_tokens, prefilled_tokens=stats.prefilled_tokens,
        generated_tokens=stats.generated_tokens, cache_hit_kind=stats.cache_hit_kind,
        cache_saved_by=stats.cache_saved_by, finish_reason=reason,
        error=None if error is None else f"{type(error).__name__}: {error}",
        spec_drafted=spec.get("drafted"), spec_accepted=spec.get("accepted"))
    return served
