"""The model's loop thread and its tick.

Each tick runs queued commands (commands.py), finishes cancelled requests (queued ones
too), applies a waiting adapter change once nothing runs, admits, checks time limits, then
three steps: plan the batch (the strategy; a user strategy's plan checked), run the native
decode (GIL released, within ``decode_budget_ms``), apply the results (sampling, events,
save points; verify rows to speculation). Other threads talk to the loop only through the admission
queue, the command queue, a request's cancel flag (:meth:`Loop.cancelled` wakes it), and
plain attributes they read without waiting on it.

State: ``phase`` and ``last_active`` (written here, read anywhere), ``in_decode`` (refs in
the running decode, under the lock: what a cancel or an interrupting command may abort),
``_cancels`` (a cancel came since the last look for cancelled requests),
``stopping`` / ``stopped_why`` (under the lock), the thread and the command queue.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import EngineStopped, InvalidBatchPlan
from .adapter_ops import AdapterSet
from .admission import Admission
from .batch import DecodeBatch, build_batch, view_of
from .commands import COMMAND_TIMEOUT_S, CommandQueue
from .events import ModelPhase
from .kernel_rows import KernelRows
from .naming import describe
from .recovery import KV_FULL, Recovery
from .request import Request
from .request_table import RequestTable
from .results import BatchResults
from .scheduler import BatchPlan, BatchStrategy, Budget, plan_problem, strategy_name
from .seq_pool import SeqPool
from .scoring import Scoring
from .speculation import Speculation
from .timeouts import Timeouts


@dataclass(frozen=True, slots=True)
class LoopParts:
    """The engine's parts a tick drives (built once in Engine._compose)."""

    pool: SeqPool
    table: RequestTable
    adapters: AdapterSet
    admission: Admission
    results: BatchResults
    speculation: Speculation
    scoring: Scoring
    recovery: Recovery
    timeouts: Timeouts


class Loop:
    def __init__(self, model_id: str, parts: LoopParts, strategy: BatchStrategy, budget: Budget,
                 decode_budget_ms: int, counters: collections.Counter[str], lock: threading.Condition,
                 kernels: KernelRows, check_plans: bool = True) -> None:
        self._model_id = model_id
        self._p = parts
        self._strategy = strategy
        self._check_plans = check_plans   # False: a built-in strategy, whose plans are not checked
        self._budget = budget
        self._kernels = kernels
        self._decode_budget_ms = float(decode_budget_ms)
        self._counters = counters
        self._lock = lock
        self.commands = CommandQueue(model_id, lock)
        self.phase: ModelPhase = "idle"
        self.last_active = time.monotonic()
        self.in_decode: set[int] = set()
        self.stopping = False
        self.stopped_why = "is being unloaded"   # or why the loop died
        self._cancels = False    # a request was cancelled since the last look (_finish_cancelled)
        self._thread = threading.Thread(target=self._run, name=f"workbench-loop-{model_id}", daemon=True)

    # --- any thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def refuse_if_stopped(self) -> None:
        """EngineStopped when the loop is stopping or dead (the caller holds the lock)."""
        if self.stopping:
            raise EngineStopped(f"model {self._model_id!r} {self.stopped_why}")

    def cancelled(self, req: Request) -> None:
        """``req`` was flagged cancelled: abort the decode it is prefilling in, wake the loop."""
        with self._lock:
            self._cancels = True
            if req.ref in self.in_decode and req.phase == "prefilling":
                self._p.pool.ctx.request_abort()
            self._lock.notify()

    def call(self, fn: Callable[[], Any], interrupt: bool = False, timeout: float = COMMAND_TIMEOUT_S) -> Any:
        """Run fn on the loop thread between ticks; bounded wait (the loop may be wedged).
        ``interrupt``: abort a running decode so the command runs soon."""
        with self._lock:
            self.refuse_if_stopped()
            fut = self.commands.put(fn)
            if interrupt and self.in_decode:
                self._p.pool.ctx.request_abort()
            self._lock.notify()
        return self.commands.answer(fut, timeout)

    def stop(self) -> None:
        """Stop the loop and wait for it; what was queued or running has failed after."""
        with self._lock:
            self.stopping = True
            self._p.pool.ctx.request_abort()
            self._lock.notify()
        self._thread.join()

    # --- the loop thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._tick()
        except BaseException as e:  # never let the loop die silently: fail everyone, refuse the rest
            with self._lock:
                self.stopping = True
                self.stopped_why = f"stopped: its loop failed ({type(e).__name__}: {e}); unload and load it again"
            self._fail_all(EngineStopped(f"model {self._model_id!r} {self.stopped_why}"))
            raise
        self._fail_all(EngineStopped(f"model {self._model_id!r} was unloaded"))

    def _wait_for_work(self) -> bool:
        """Idle until there is something to do; False when the loop should end. With work
        at hand (most ticks) no lock is taken: a stop is seen at the next tick."""
        table = self._p.table
        if table.active or table.pending or self.commands:
            return not self.stopping
        with self._lock:
            while not (self.stopping or table.pending or table.active or self.commands):
                self.phase = "idle"
                self._lock.wait()
            return not self.stopping

    def _fail_all(self, reason: BaseException) -> None:
        table = self._p.table
        for req in table.take_all():
            table.fail(req, reason)
        self.commands.fail_all(lambda: EngineStopped(f"model {self._model_id!r} was unloaded"))
        self.phase = "idle"

    def _tick(self) -> None:
        p = self._p
        self.last_active = time.monotonic()
        self.commands.run_all()
        self._finish_cancelled()
        self._admit()
        self._finish_cancelled()    # cancelled while it was being admitted
        p.timeouts.check()
        batch = self._plan()
        if batch is None:
            return
        rc = self._decode(batch)
        if rc != 0:
            p.recovery.decode_failed(rc, batch)
            return
        p.results.apply(batch)
        if batch.verifies:
            p.speculation.apply(batch)
            p.scoring.apply(batch)

    def _finish_cancelled(self) -> None:
        """Every cancelled request, queued (anywhere in the queue) or running, finishes
        through BatchResults.finish: one Done and one finished_cancelled count each. Looked
        for only after a cancel (``cancelled`` sets ``_cancels``; cleared before the look, so
        a cancel during it is looked for again)."""
        if not self._cancels:
            return
        self._cancels = False
        for req in self._p.table.take_cancelled():
            self._p.results.finish(req, "cancelled")

    def _admit(self) -> None:
        p = self._p
        if p.adapters.change_waiting:
            if p.table.active:
                return  # hold admissions until the requests admitted under the old set end
            p.adapters.apply()
        p.admission.admit()

    # --- step 1: plan ----------------------------------------------------------------------
    def _plan(self) -> DecodeBatch | None:
        """The strategy's plan for the running requests, checked, as native rows. A plan
        that cannot run fails the running requests (the loop goes on)."""
        active = self._p.table.active
        if not active:
            return None
        self._p.speculation.attach_drafts(active)
        views = [view_of(r) for r in active]
        try:
            plan = self._strategy.plan(views, self._budget)
            problem = None
            if self._check_plans:   # a user's strategy (the built-in ones keep the rules by construction)
                if isinstance(plan, BatchPlan) and isinstance(plan.takes, (list, tuple)):
                    plan = BatchPlan(list(plan.takes))  # a snapshot: what is checked is what runs
                problem = plan_problem(plan, views, self._budget)
        except Exception as e:  # noqa: BLE001 - a user's strategy: its error fails the requests, not the loop
            problem = f"plan() raised {describe(e)}"
        if problem is not None:
            self._bad_plan(problem)
            return None
        batch = build_batch(plan, {r.ref: r for r in active}, self._kernels)
        self.phase = "prefilling" if any(r.phase == "prefilling" for r in active) else "generating"
        return batch

    def _bad_plan(self, problem: str) -> None:
        self._counters["bad_batch_plans"] += 1
        err = InvalidBatchPlan(strategy_name(self._strategy), problem)
        for req in list(self._p.table.active):
            self._p.table.fail(req, err)

    # --- step 2: decode ----------------------------------------------------------------------
    def _decode(self, batch: DecodeBatch) -> int:
        """The tick's native decodes (GIL released, each within decode_budget_ms): its prompt
        rows, then the rest; llama_decode's code (the first that is not 0)."""
        now = time.perf_counter()
        for s in batch.slices:
            if s.request.phase == "prefilling":
                s.request.prefill_starts(now)
        ctx = self._p.pool.ctx
        with self._lock:
            self.in_decode = {s.request.ref for s in batch.slices}
            ctx.clear_abort()
        rc = calls = 0
        for rows, reference, pad in batch.parts():   # prompt rows first (kernel_rows.py)
            calls += 1
            if ctx.reference_kernels != reference:
                ctx.set_reference_kernels(reference)
            rc = ctx.decode(*rows, self._decode_budget_ms)
            if pad is not None:
                ctx.seq_rm(pad.seq, pad.start, -1)
                self._counters["pad_rows"] += pad.n
                if rc == KV_FULL:   # no cells for the pad: the rows alone may fit (the row kernel then)
                    self._counters["pad_refused"] += 1
                    batch.untile()
                    for sl in batch.slices:
                        assert sl.request.seq is not None
                        self._p.pool.trim(sl.request.seq, sl.request.n_past)
                    rc = ctx.decode(*batch.prompt.native(), self._decode_budget_ms)
            if rc != 0:
                break
        batch.decode_s = time.perf_counter() - now
        with self._lock:
            self.in_decode = set()
        self._counters["decode_calls"] += calls
        if rc == 0:
            self._counters["decoded_tokens"] += len(batch)
        return rc
