"""One loaded model: the native model, the parts that run it, and the loop thread.

`Engine` composes (each part in its own module, with its own declared state):

- ``pool`` (seq_pool.SeqPool): the native context and its sequences, the only code that
  takes, frees, reclaims, trims or resets them;
- ``sessions`` (sessions.SessionTable) and ``session_commands`` (end / reset / evict);
- ``table`` (request_table.RequestTable): pending, active and live requests, and retiring;
- ``adapters`` (adapter_ops.AdapterSet), ``saves`` (cache_saves.SavePoints),
  ``admission`` (admission.Admission), ``results`` (results.BatchResults: sampling, events,
  finishing), ``recovery`` (recovery.Recovery), ``timeouts`` (timeouts.Timeouts);
- ``strategy`` (scheduler: the load option ``batch_strategy``).

Each tick runs queued commands, admits queued requests, finishes cancelled and timed-out ones, then
three steps: plan the batch (the strategy, its plan checked), run the native decode (GIL
released, within ``decode_budget_ms``), apply the results (sampling, events, save points).
Other threads talk to the loop only through the admission queue, the command queue, a
request's cancel flag, and plain attributes they read without waiting on the loop.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .. import _native
from ..cache import HitKind, SaveReason
from ..errors import (
    ContextOverflow,
    EngineStopped,
    InvalidBatchPlan,
    InvalidOption,
    LoadError,
    NoSession,
    QueueFull,
    SeqCapacity,
    SessionBusy,
    TranscriptMismatch,
)
from ..models import check_model_file, fingerprint
from ..models.probe import probe
from ..options import LoadConfig, RequestOptions, model_params
from .adapter_ops import AdapterSet, AdapterSlot
from .admission import Admission
from .batch import DecodeBatch, build_batch, view_of
from .events import ModelPhase
from .cache_saves import SavePoints
from .grammars import GrammarCache
from .naming import describe, model_facts, model_id_for  # noqa: F401 - registry takes model_id_for from here
from .prefix_cache import EngineCache
from .recovery import Recovery
from .request import Request, next_ref
from .request_setup import logit_bias_ids, reasoning_budget, special_ids
from .request_table import RequestTable
from .results import BatchResults
from .scheduler import BatchPlan, Budget, plan_problem, strategy_for, strategy_name
from .seq_pool import SeqPool
from .session_commands import COUNTER_NAMES as SESSION_COUNTERS, SessionCommands
from .speculation import COUNTER_NAMES as SPEC_COUNTERS, Speculation, check_speculative
from .sessions import SessionTable, common_prefix
from .timeouts import COUNTER_NAMES as TIMEOUT_COUNTERS, Timeouts

COMMAND_TIMEOUT_S = 5.0
COUNTER_NAMES = ("decode_calls", "decoded_tokens", "decode_aborted", "decode_timeouts", "finished_stop",
                 "finished_length", "finished_cancelled", *(kind.counter for kind in HitKind),
                 "sessions_reclaimed", "sessions_reset", "cache_restore_failed", "cache_seq_not_cleared",
                 "cache_saves_dropped", "cache_evicted_sessions", "adapter_changes", "bad_batch_plans",
                 *SPEC_COUNTERS, *TIMEOUT_COUNTERS, *SESSION_COUNTERS)


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)

class Engine:
    """A loaded model and its loop thread. Create with :meth:`load`."""

    def __init__(self, model_id: str, path: Path, cfg: LoadConfig, native_model: Any, ctx_params: dict[str, Any]):
        self.model_id = model_id
        self.path = path
        self.cfg = cfg
        self.model = native_model
        self.ctx_params = ctx_params
        self.fingerprint = fingerprint(path)
        self.loaded_at = time.time()
        self.last_active = time.monotonic()
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTER_NAMES, 0))
        self.grammars = GrammarCache(native_model)
        self._attachments: dict[str, Closable] = {}
        self._cv = threading.Condition()
        self._compose()
        n_batch = self.ctx.n_batch
        chunk = cfg.prefill_chunk_size
        self.chunk: int | None = max(64, n_batch // 4) if chunk == -1 else chunk
        self.budget = Budget(n_batch, self.chunk)
        self.strategy = strategy_for(cfg.batch_strategy)
        # written by the loop, read anywhere
        self.phase: ModelPhase = "idle"
        self._commands: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._stopping = False
        self._stopped_why = "is being unloaded"   # or why the loop died
        self._in_decode: set[int] = set()
        self._thread = threading.Thread(target=self._run, name=f"workbench-loop-{self.model_id}", daemon=True)
        self._thread.start()

    def _compose(self) -> None:
        cfg, counters, lock = self.cfg, self.counters, self._cv
        gpu_layers = cfg.n_gpu_layers if _native.cuda else 0
        self.kvcache = EngineCache(self.fingerprint, self.model.desc, dict(self.ctx_params, n_gpu_layers=gpu_layers),
                                   counters, self.model.n_layer * self.model.n_embd) if cfg.cache else None
        self.sessions = SessionTable()
        self.pool = SeqPool(self.model, self.ctx_params, self.sessions, counters, lock)
        self.table = RequestTable(self.pool, self.sessions, lock)
        self.adapters = AdapterSet(self.pool, self.kvcache, counters, lock)
        self.saves = SavePoints(cfg, self.kvcache, self.pool, counters)
        self.admission = Admission(self.model, self.pool, self.table, self.saves, self.kvcache, counters, lock)
        self.session_commands = SessionCommands(self.sessions, self.pool, self.table, self.saves, counters, lock)
        self.recovery = Recovery(self.pool, self.table, self.adapters, counters, cfg.decode_budget_ms)
        self.results = BatchResults(self.model, self.pool, self.table, self.saves, counters)
        self.speculation = Speculation(self.model, self.pool, self.results, counters)
        self.timeouts = Timeouts(self.table, counters, lock)

    # --- construction ------------------------------------------------------------------
    @classmethod
    def load(cls, model_id: str, path: Path, cfg: LoadConfig) -> Engine:
        path = check_model_file(path)  # first: a FIFO would block the reads below
        # settings whose defaults depend on the training context the file states (0: none),
        # checked before the probe, which could only say that llama.cpp aborted
        n_ctx_train = _native.gguf_context_length(str(path))
        cfg.context_params(n_ctx_train)
        cfg.embed_params(n_ctx_train)
        n_gpu = cfg.n_gpu_layers if _native.cuda else 0
        # in a child process first: llama.cpp aborts the process on many malformed files
        probe(path, fingerprint(path), cfg)
        try:
            native_model = _native.Model(str(path), n_gpu, cfg.use_mmap, False, model_params(cfg))
        except _native.NativeError as e:
            raise LoadError(str(e)) from None
        try:
            ctx_params = cfg.context_params(native_model.n_ctx_train)
        except BaseException:
            native_model.close()
            raise
        try:
            return cls(model_id, path, cfg, native_model, ctx_params)
        except _native.NativeError as e:
            native_model.close()
            raise LoadError(str(e)) from None

    # --- public, any thread --------------------------------------------------------------
    @property
    def ctx(self) -> Any:
        return self.pool.ctx

    @property
    def pending(self) -> collections.deque[Request]:
        return self.table.pending

    @property
    def active(self) -> list[Request]:
        return self.table.active

    @property
    def requests(self) -> dict[int, Request]:
        return self.table.by_ref

    @property
    def last_hit(self) -> dict[str, Any] | None:
        return self.admission.last_hit

    def submit(self, prompt: list[int], opts: RequestOptions, *, continue_session: bool = False,
               expect_committed: list[int] | None = None, sync_saves: bool = False,
               verify_from: int | None = None, draft: Engine | None = None) -> Request:
        """Queue a request; admission errors (capacity, sessions, grammar) raise here.
        ``verify_from``: a verify() request, the argmax of every row from there on;
        ``draft``: the Engine of ``speculative={'draft': id}``."""
        check_speculative(opts.speculative, self, draft)
        grammar = self.grammars.for_request(opts.grammar, opts.json_schema, opts.grammar_root)
        seed = opts.seed if opts.seed is not None else random.randrange(2**32 - 1)
        with self._cv:
            if self._stopping:
                raise EngineStopped(f"model {self.model_id!r} {self._stopped_why}")
            sid = opts.session_id
            sess = self.sessions.get(sid, opts.cache_scope) if sid is not None else None
            if sess is not None and sess.busy_ref is not None:
                raise SessionBusy(sid, sess.busy_ref)
            if continue_session:
                if sess is None:
                    raise NoSession(sid)
                if expect_committed is not None and list(expect_committed) != sess.tokens:
                    raise TranscriptMismatch(len(sess.tokens), len(expect_committed),
                                             common_prefix(sess.tokens, list(expect_committed)))
                prompt = sess.tokens + list(prompt)
            self._check_room(prompt, opts, needs_seq=sess is None or sess.seq is None)
            req = Request(ref=next_ref(), model_id=self.model_id, prompt=list(prompt), opts=opts, seed=seed)
            req.grammar = grammar
            req.continues = continue_session
            req.reasoning_budget = reasoning_budget(self.model, opts, req.prompt)
            req.special = special_ids(self.model, opts.render_special)
            req.logit_bias = logit_bias_ids(self.model, opts)
            req.sync_saves = sync_saves
            req.verify_from = req.out_from = verify_from
            req.draft_engine = draft
            if sid is not None:
                req.session = self.sessions.get_or_create(sid, opts.cache_scope)
                req.session.busy_ref = req.ref
            self.table.add(req)
            self._cv.notify()
        return req

    def _check_room(self, prompt: list[int], opts: RequestOptions, needs_seq: bool) -> None:
        """The prompt fits the context, and (without a pinned sequence) there is a sequence
        or a queue place for it."""
        if len(prompt) >= self.ctx.n_ctx:
            raise ContextOverflow(len(prompt), self.ctx.n_ctx, "leave room for at least one generated token")
        if opts.prefix_checkpoint_len is not None and opts.prefix_checkpoint_len > len(prompt):
            raise InvalidOption("prefix_checkpoint_len", opts.prefix_checkpoint_len,
                                f"at most the prompt length ({len(prompt)})")
        if needs_seq:
            placeable = self.pool.n_placeable() - len(self.table.pending)
            if opts.on_full == "error" and placeable <= 0:
                raise SeqCapacity(self.model_id, self.ctx.n_seq_max)
            if 1 - placeable > self.cfg.max_queue:
                raise QueueFull(self.model_id, self.cfg.max_queue)

    def cancel(self, req: Request) -> None:
        """Idempotent; observed at the next token boundary (a long prefill is interrupted)."""
        if req.phase == "done":
            return
        req.cancel_requested = True
        with self._cv:
            if req.ref in self._in_decode and req.phase == "prefilling":
                self.ctx.request_abort()
            self._cv.notify()

    def queue_depth(self) -> int:
        """Requests running on a sequence now."""
        return len(self.table.active)

    def pending_len(self) -> int:
        """Requests waiting for a sequence."""
        return len(self.table.pending)

    def info(self) -> dict[str, Any]:
        with self._cv:
            live = {"available_seqs": self.pool.n_free(), "pinned_idle_seqs": len(self.sessions.idle_pinned()),
                    "sessions": len(self.sessions)}
        return model_facts(self, live)

    # --- adapters and sessions (any thread; session commands run on the loop) ----------------
    def request_adapters(self, change: Callable[[list[AdapterSlot]], list[AdapterSlot]]) -> None:
        """Change the adapter set; it applies before the next admission."""
        self.adapters.request(change)

    def adapter_list(self) -> list[AdapterSlot]:
        return self.adapters.listed()

    def end_session(self, session_id: Hashable, scope: str) -> None:
        self._call(lambda: self.session_commands.end(session_id, scope))

    def reset_session(self, session_id: Hashable, scope: str) -> str:
        """Force-drop a session (its in-flight request ends with SessionReset)."""
        return self._call(lambda: self.session_commands.reset(session_id, scope), interrupt=True)

    def evict(self, reason: SaveReason = SaveReason.EVICT) -> int:
        """Save every idle session's live KV to the prefix cache and release its sequence;
        bounded by evict_save_timeout_ms; returns the rows saved."""
        budget_s = self.cfg.evict_save_timeout_ms / 1000
        return self._call(lambda: self.session_commands.evict(reason, budget_s), timeout=budget_s + COMMAND_TIMEOUT_S)

    def session_info(self, scope: str | None = None) -> list[dict[str, Any]]:
        """Every session, or those of one cache scope."""
        with self._cv:
            return [s.info() for s in self.sessions if scope is None or s.scope == scope]

    def attachment(self, name: str, make: Callable[[], C]) -> C:
        """Per-model state of a layer above the engine (its parsed chat templates, its
        embedding contexts): made on first use, owned by this engine, closed when it stops
        and before the model is freed (no module keeps per-model state)."""
        with self._cv:
            if self._stopping:
                raise EngineStopped(f"model {self.model_id!r} {self._stopped_why}")
            obj = self._attachments.get(name)
            if obj is None:
                obj = self._attachments[name] = make()
            return obj  # type: ignore[return-value]

    def stop(self) -> None:
        """Stop the loop, fail what is queued or running, free native memory."""
        with self._cv:
            self._stopping = True
            self.ctx.request_abort()
            self._cv.notify()
        self._thread.join()
        for obj in self._attachments.values():
            obj.close()
        self._attachments.clear()
        self.session_commands.forget_all()
        self.pool.close()
        self.model.close()

    def _call(self, fn: Callable[[], Any], interrupt: bool = False, timeout: float = COMMAND_TIMEOUT_S) -> Any:
        """Run fn on the loop thread between ticks; bounded wait (the loop may be wedged)."""
        fut: Future = Future()
        with self._cv:
            if self._stopping:
                raise EngineStopped(f"model {self.model_id!r} {self._stopped_why}")
            self._commands.append((fn, fut))
            if interrupt and self._in_decode:
                self.ctx.request_abort()
            self._cv.notify()
        try:
            return fut.result(timeout)
        except TimeoutError:
            raise TimeoutError(f"model {self.model_id!r}: the loop did not answer within "
                               f"{timeout:.0f} s") from None

    # --- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._stopping or self.table.pending or self.table.active or self._commands):
                        self.phase = "idle"
                        self._cv.wait()
                    if self._stopping:
                        break
                self._tick()
        except BaseException as e:  # never let the loop die silently: fail everyone, refuse the rest
            with self._cv:
                self._stopping = True
                self._stopped_why = f"stopped: its loop failed ({type(e).__name__}: {e}); unload and load it again"
            self._fail_all(EngineStopped(f"model {self.model_id!r} {self._stopped_why}"))
            raise
        self._fail_all(EngineStopped(f"model {self.model_id!r} was unloaded"))

    def _fail_all(self, reason: BaseException) -> None:
        for req in self.table.take_all():
            self.table.fail(req, reason)
        with self._cv:
            commands = list(self._commands)
            self._commands.clear()
        for _, fut in commands:
            fut.set_exception(EngineStopped(f"model {self.model_id!r} was unloaded"))
        self.phase = "idle"

    def _tick(self) -> None:
        self.last_active = time.monotonic()
        self._run_commands()
        self._admit()
        for req in [r for r in self.table.active if r.cancel_requested]:
            self.results.finish(req, "cancelled")
        self.timeouts.check()
        batch = self._plan()
        if batch is None:
            return
        rc = self._decode(batch)
        if rc != 0:
            self.recovery.decode_failed(rc, batch)
            return
        self.results.apply(batch)
        if batch.verifies:
            self.speculation.apply(batch)

    def _run_commands(self) -> None:
        while True:
            with self._cv:
                if not self._commands:
                    return
                fn, fut = self._commands.popleft()
            try:
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - the command's error is its caller's
                fut.set_exception(e)

    def _admit(self) -> None:
        if self.adapters.change_waiting:
            if self.table.active:
                return  # hold admissions until the requests admitted under the old set end
            self.adapters.apply()
        self.admission.admit()

    # --- step 1: plan ----------------------------------------------------------------------
    def _plan(self) -> DecodeBatch | None:
        """The strategy's plan for the running requests, checked, as native rows. A plan
        that cannot run fails the running requests (the loop goes on)."""
        active = self.table.active
        if not active:
            return None
        self.speculation.attach_drafts(active)
        views = [view_of(r) for r in active]
        try:
            plan = self.strategy.plan(views, self.budget)
            if isinstance(plan, BatchPlan) and isinstance(plan.takes, (list, tuple)):
                plan = BatchPlan(list(plan.takes))  # a snapshot: what is checked is what runs
            problem = plan_problem(plan, views, self.budget)
        except Exception as e:  # noqa: BLE001 - a user's strategy: its error fails the requests, not the loop
            problem = f"plan() raised {describe(e)}"
        if problem is not None:
            self._bad_plan(problem)
            return None
        batch = build_batch(plan, {r.ref: r for r in active})
        self.phase = "prefilling" if any(r.phase == "prefilling" for r in active) else "generating"
        return batch

    def _bad_plan(self, problem: str) -> None:
        self.counters["bad_batch_plans"] += 1
        err = InvalidBatchPlan(strategy_name(self.strategy), problem)
        for req in list(self.table.active):
            self.table.fail(req, err)

    # --- step 2: decode ----------------------------------------------------------------------
    def _decode(self, batch: DecodeBatch) -> int:
        """One native decode (GIL released, within decode_budget_ms); llama_decode's code."""
        now = time.perf_counter()
        for s in batch.slices:
            if s.request.phase == "prefilling" and s.request.prefill_started_at is None:
                s.request.prefill_started_at = now
        with self._cv:
            self._in_decode = {s.request.ref for s in batch.slices}
            self.ctx.clear_abort()
        rc = self.ctx.decode(batch.tokens, batch.pos, batch.seq, batch.logits, float(self.cfg.decode_budget_ms))
        batch.decode_s = time.perf_counter() - now
        with self._cv:
            self._in_decode = set()
        self.counters["decode_calls"] += 1
        if rc == 0:
            self.counters["decoded_tokens"] += len(batch)
        return rc
