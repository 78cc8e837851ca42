"""Recording a notebook's workload: the requests the engine served, as a lab trace.

    from workbench import lab
    with lab.record() as rec:                    # or rec = lab.record().start() ... rec.stop()
        wb.chat(m, messages, session_id="s1")    # anything that runs requests: complete,
        ...                                      # stream, chat, continue_session, ...
    rec.requests                                 # one row per request (a DataFrame)
    rec.save("my-workload.npz")                  # = rec.trace.save(...); traces.load(...) reads it
    lab.replay(rec.trace, ["lru", "s3fifo"], ["64MiB", "1GiB"])

A recorder listens to the engine's finished requests (`workbench.engine.finished`): every
request of the model (`record(model=...)`; None: every model) submitted while it records
and finished before it stops. Recorders are independent: nested or overlapping ones each
capture their own window.

`rec.trace` is a token-literal `Trace` (`Trace.from_prompts`), in arrival order: each
request's prompt as the token ids the engine ran, its reply as the token ids it generated,
arrivals in seconds from the first request, sessions ((cache scope, session id) pairs) as
0, 1, 2, ... in order of first use. The reply follows the lab's convention (it ends with
the token that was sampled but never decoded, so the lab's finish row is exactly the KV
the engine's request ended with): where the model ended the reply itself, its
end-of-generation token (the model's eos) is appended to the generated tokens.

What the trace leaves out, so that a replay sees the cache traffic the engine had (the
rows of `rec.requests` say `in_trace`): failed requests (an Error, no Done), requests run
with ``cache=False`` (draft-model requests, `draft_tokens`, `verify`), and the reply of
a cancelled request (it was served up to its cancel, but the engine stores no finish row
for it). A trace replays one model's cache: with requests of several models recorded,
`rec.to_trace(model)` picks one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from workbench.engine import finished
from workbench.engine.finished import FinishedRequest
from workbench.errors import InvalidOption
from workbench.lab.traces import Trace

__all__ = ["Recorder", "record"]

REQUEST_COLUMNS = ["ref", "model", "arrival_s", "prompt_tokens", "generated_tokens", "session", "session_id",
                   "cache_hit_kind", "prefilled_tokens", "prefill_tokens_saved", "finish_reason", "in_trace"]


def record(model: str | None = None) -> Recorder:
    """A recorder of the requests the engine serves (of ``model`` only, when given): use it
    as a context manager (``with lab.record() as rec:``) or call ``start()`` / ``stop()``."""
    if model is not None and not isinstance(model, str):
        raise InvalidOption("model", model, "a model id (str) or None", where="lab.record")
    return Recorder(model)


class Recorder:
    """Captures finished requests between ``start()`` and ``stop()`` (see the module doc)."""

    def __init__(self, model: str | None = None) -> None:
        self.model = model
        self._captured: list[FinishedRequest] = []
        self._since: float | None = None      # perf_counter of the latest start(); None: stopped
        self._eos: dict[str, int | None] = {}  # model id -> its end-of-generation token
        self._lock = threading.Lock()

    # --- recording --------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self._since is not None

    def start(self) -> Recorder:
        """Record from now on (requests submitted before this are not captured); returns
        the recorder. A stopped recorder may start again: it adds to what it captured."""
        with self._lock:
            if self._since is not None:
                raise RuntimeError("this recorder is already recording")
            self._since = time.perf_counter()
            finished.add_listener(self._on_finished)
        return self

    def stop(self) -> Recorder:
        """Stop recording (requests still running are not captured); returns the recorder.
        Stopping a stopped recorder does nothing."""
        with self._lock:
            if self._since is None:
                return self
            self._since = None
            finished.remove_listener(self._on_finished)
        return self

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _on_finished(self, req: FinishedRequest) -> None:
        """On an engine's loop thread: keep it to a few checks and an append."""
        since = self._since
        if since is None or req.submitted_at < since or (self.model is not None and req.model_id != self.model):
            return
        if req.model_id not in self._eos:
            self._eos[req.model_id] = _eos_of(req.model_id)
        self._captured.append(req)

    # --- what was captured ----------------------------------------------------------------------
    @property
    def captured(self) -> list[FinishedRequest]:
        """The captured requests (`workbench.engine.finished.FinishedRequest`), in arrival order."""
        return sorted(list(self._captured), key=lambda r: (r.submitted_at, r.ref))

    def __len__(self) -> int:
        return len(self._captured)

    @property
    def models(self) -> list[str]:
        """The models of the captured requests, in order of first arrival."""
        return list(dict.fromkeys(r.model_id for r in self.captured))

    @property
    def trace(self) -> Trace:
        """The captured requests as a `Trace` (see the module doc); `to_trace` names the
        model when several were recorded."""
        return self.to_trace()

    def to_trace(self, model: str | None = None, *, name: str = "recorded") -> Trace:
        """The captured requests of ``model`` (None: the one model recorded) as a trace."""
        reqs = self._trace_requests(model)
        t0 = reqs[0].submitted_at if reqs else 0.0
        sessions = _SessionNumbers()
        return Trace.from_prompts([r.prompt for r in reqs], replies=[self._reply(r) for r in reqs],
                                  arrivals=[r.submitted_at - t0 for r in reqs],
                                  sessions=[sessions.of(r) for r in reqs], name=name)

    def save(self, path: str | Path) -> Any:
        """Save the trace (`Trace.save`; `workbench.lab.traces.load` reads it back)."""
        return self.trace.save(path)

    @property
    def requests(self) -> Any:
        """One row per captured request, in arrival order (a pandas DataFrame): ref, model,
        arrival_s (from the first request), prompt_tokens, generated_tokens, session (the
        trace's number for it, per model), session_id, cache_hit_kind, prefilled_tokens,
        prefill_tokens_saved (prompt - prefilled, as the engine counts it), finish_reason
        ("stop", "length", "cancelled" or "error"), in_trace."""
        import pandas as pd

        reqs = self.captured
        t0 = reqs[0].submitted_at if reqs else 0.0
        numbers: dict[str, _SessionNumbers] = {}
        rows = []
        for r in reqs:
            sess = numbers.setdefault(r.model_id, _SessionNumbers()).of(r) if _in_trace(r) else None
            rows.append({"ref": r.ref, "model": r.model_id, "arrival_s": r.submitted_at - t0,
                         "prompt_tokens": r.prompt_tokens, "generated_tokens": len(r.generated),
                         "session": sess, "session_id": r.session_id, "cache_hit_kind": r.cache_hit_kind,
                         "prefilled_tokens": r.prefilled_tokens,
                         "prefill_tokens_saved": r.prompt_tokens - r.prefilled_tokens,
                         "finish_reason": r.finish_reason, "in_trace": _in_trace(r)})
        df = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
        return df.astype({"ref": "int64", "arrival_s": "float64", "prompt_tokens": "int64",
                          "generated_tokens": "int64", "session": "Int64", "prefilled_tokens": "int64",
                          "prefill_tokens_saved": "int64", "in_trace": "bool"})

    def __repr__(self) -> str:
        state = "recording" if self.recording else "stopped"
        which = "" if self.model is None else f" of {self.model!r}"
        return f"<Recorder{which} ({state}): {len(self)} requests>"

    # --- internals ------------------------------------------------------------------------------
    def _trace_requests(self, model: str | None) -> list[FinishedRequest]:
        reqs = [r for r in self.captured if _in_trace(r)]
        models = list(dict.fromkeys(r.model_id for r in reqs))
        if model is None and len(models) > 1:
            raise ValueError(f"requests of several models were recorded ({', '.join(map(repr, models))}): a trace "
                             "replays one model's cache; pick one with rec.to_trace(model) or record(model=...)")
        return [r for r in reqs if model is None or r.model_id == model]

    def _reply(self, r: FinishedRequest) -> list[int] | None:
        """The trace's reply: the generated tokens up to the one sampled but not decoded (a
        finish row of exactly the KV the request ended with); None for none."""
        if r.finish_reason == "cancelled" or not r.generated:
            return None     # no finish row (the engine stores none for a cancelled request)
        n = len(r.prompt)
        decoded = list(r.generated[: max(0, r.kv_tokens - n)])
        if len(decoded) < len(r.generated):
            return decoded + [r.generated[len(decoded)]]
        eos = self._eos.get(r.model_id)
        return decoded + [eos if eos is not None else r.generated[-1]]


def _in_trace(r: FinishedRequest) -> bool:
    return r.finish_reason != "error" and r.cache


class _SessionNumbers:
    """(cache scope, session id) -> 0, 1, 2, ... in order of first use."""

    def __init__(self) -> None:
        self._of: dict[tuple[str, Hashable], int] = {}

    def of(self, r: FinishedRequest) -> int | None:
        if r.session_id is None:
            return None
        return self._of.setdefault((r.cache_scope, r.session_id), len(self._of))


def _eos_of(model_id: str) -> int | None:
    """The model's end-of-generation token (its eos, else its eot), None if unknown."""
    try:
        from workbench import registry

        m = registry.get(model_id).model
        for tok in (m.eos, m.eot):
            if tok >= 0 and m.is_eog(tok):
                return int(tok)
    except Exception:  # noqa: BLE001 - unloading, or a model without one: the reply keeps its last token
        pass
    return None
