"""One loaded model: the native model, the parts that run it, and its public surface.

`Engine` composes (each part in its own module, with its own declared state):

- ``pool`` (seq_pool.SeqPool): the native context and its sequences, the only code that
  takes, frees, reclaims, trims or resets them;
- ``sessions`` (sessions.SessionTable) and ``session_commands`` (end / reset / evict);
- ``table`` (request_table.RequestTable): pending, active and live requests, and retiring;
- ``adapters`` (adapter_ops.AdapterSet), ``saves`` (cache_saves.SavePoints),
  ``admission`` (admission.Admission), ``results`` (results.BatchResults: sampling, events,
  finishing), ``recovery`` (recovery.Recovery), ``timeouts`` (timeouts.Timeouts);
- ``strategy`` (scheduler: the load option ``batch_strategy``);
- ``loop`` (loop.Loop): the loop thread and its tick, with the command queue
  (commands.CommandQueue) that runs session commands on it.

Everything here may be called from any thread: requests are queued (``submit``), cancels
flagged, session commands handed to the loop with a bounded wait, facts read without
waiting on the loop.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .. import _native
from ..cache import HitKind, SaveReason
from ..errors import (
    ContextOverflow,
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
from .cache_saves import SavePoints
from .commands import COMMAND_TIMEOUT_S
from .events import ModelPhase
from .history import History
from .grammars import GrammarCache
from .kernel_rows import KernelRows
from .loop import Loop, LoopParts
from .naming import model_facts, model_id_for  # noqa: F401 - registry takes model_id_for from here
from .prefix_cache import EngineCache
from .recovery import Recovery
from .request import Request, next_ref
from .request_setup import logit_bias_ids, reasoning_budget, special_ids
from .live_share import COUNTER_NAMES as SHARE_COUNTERS, LiveShare
from .request_table import RequestTable
from .results import BatchResults
from .scheduler import Budget, strategy_for
from .seq_pool import SeqPool
from .session_commands import COUNTER_NAMES as SESSION_COUNTERS, SessionCommands
from .scoring import Scoring, ScoreState
from .speculation import COUNTER_NAMES as SPEC_COUNTERS, Speculation, check_speculative
from .sessions import Session, SessionTable, common_prefix
from .timeouts import COUNTER_NAMES as TIMEOUT_COUNTERS, Timeouts

COUNTER_NAMES = ("decode_calls", "decoded_tokens", "pad_rows", "pad_refused", "decode_aborted", "decode_timeouts",
                 "finished_stop", "finished_length", "finished_cancelled", *(kind.counter for kind in HitKind),
                 "sessions_reclaimed", "sessions_reset", "cache_restore_failed", "cache_seq_not_cleared",
                 "cache_saves_dropped", "cache_saves_not_cold", "cache_evicted_sessions", "adapter_changes",
                 "bad_batch_plans",
                 *SPEC_COUNTERS, *TIMEOUT_COUNTERS, *SESSION_COUNTERS, *SHARE_COUNTERS)


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


def out_rows(verify_from: int | None, score: ScoreState | None) -> dict[str, Any]:
    """The rows with logits of a verify() request (its argmax from ``verify_from`` on) or a
    scoring request (``score``, every row from its start on); none for any other."""
    if score is not None:
        return {"score": score, "out_from": score.start}
    return {"verify_from": verify_from, "out_from": verify_from}

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
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTER_NAMES, 0))
        self.grammars = GrammarCache(native_model)
        self.history = History(cfg.history_size)
        self._attachments: dict[str, Closable] = {}
        self._cv = threading.Condition()
        self._compose()
        n_batch = self.ctx.n_batch
        chunk = cfg.prefill_chunk_size
        self.chunk: int | None = max(64, n_batch // 4) if chunk == -1 else chunk
        self.budget = Budget(n_batch, self.chunk)
        self.strategy = strategy_for(cfg.batch_strategy)
        parts = LoopParts(self.pool, self.table, self.adapters, self.admission, self.results,
                          self.speculation, self.scoring, self.recovery, self.timeouts)
        kernels = KernelRows(n_batch, self.ctx.n_ubatch, self.ctx.n_ctx, cfg.deterministic)
        self.loop = Loop(model_id, parts, self.strategy, self.budget, cfg.decode_budget_ms, self.counters, self._cv,
                         kernels, check_plans=not isinstance(cfg.batch_strategy, str))
        self.loop.start()

    def _compose(self) -> None:
        cfg, counters, lock = self.cfg, self.counters, self._cv
        gpu_layers = cfg.n_gpu_layers if _native.cuda else 0
        self.kvcache = EngineCache(self.fingerprint, self.model.desc, dict(self.ctx_params, n_gpu_layers=gpu_layers),
                                   counters, self.model.n_layer * self.model.n_embd,
                                   self.model_id) if cfg.cache else None
        self.sessions = SessionTable()
        self.pool = SeqPool(self.model, self.ctx_params, self.sessions, counters, lock)
        self.table = RequestTable(self.pool, self.sessions, lock)
        self.adapters = AdapterSet(self.pool, self.kvcache, counters, lock)
        self.saves = SavePoints(cfg, self.kvcache, self.pool, counters)
        self.share = LiveShare(cfg, self.pool, self.table, self.sessions, self.saves, self.kvcache, counters)
        self.admission = Admission(self.model, self.pool, self.table, self.saves, self.share, self.kvcache, counters,
                                   lock)
        self.session_commands = SessionCommands(self.sessions, self.pool, self.table, self.saves, counters, lock)
        self.recovery = Recovery(self.pool, self.table, self.adapters, counters, cfg.decode_budget_ms)
        self.results = BatchResults(self.model, self.pool, self.table, self.saves, counters)
        self.speculation = Speculation(self.model, self.pool, self.results, counters)
        self.scoring = Scoring(self.pool, self.table, self.results)
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

    @property
    def phase(self) -> ModelPhase:
        return self.loop.phase

    @property
    def last_active(self) -> float:
        """time.monotonic() of the loop's latest tick (or of the load)."""
        return self.loop.last_active

    def submit(self, prompt: list[int], opts: RequestOptions, *, continue_session: bool = False,
               expect_committed: list[int] | None = None, sync_saves: bool = False,
               verify_from: int | None = None, draft: Engine | None = None,
               score: ScoreState | None = None) -> Request:
        """Queue a request; admission errors (capacity, sessions, grammar) raise here.
        ``verify_from``: a verify() request, the argmax of every row from there on;
        ``draft``: the Engine of ``speculative={'draft': id}``; ``score``: a scoring
        request's state (engine/scoring.py), logits on every row from its start on."""
        check_speculative(opts.speculative, self, draft)
        grammar = self.grammars.for_request(opts.grammar, opts.json_schema, opts.grammar_root)
        seed = opts.seed if opts.seed is not None else random.randrange(2**32 - 1)
        with self._cv:
            self.loop.refuse_if_stopped()
            sess = self._session_for(opts, continue_session, expect_committed)
            if continue_session:
                assert sess is not None
                prompt = sess.tokens + list(prompt)
            self._check_room(prompt, opts, needs_seq=sess is None or sess.seq is None)
            derived = self._derived(list(prompt), opts)
            session = None if opts.session_id is None else self.sessions.get_or_create(opts.session_id,
                                                                                      opts.cache_scope)
            req = Request(ref=next_ref(), model_id=self.model_id, prompt=list(prompt), opts=opts, seed=seed,
                          session=session, history=self.history, grammar=grammar, continues=continue_session,
                          sync_saves=sync_saves, draft_engine=draft, **derived, **out_rows(verify_from, score))
            if session is not None:
                session.busy_ref = req.ref
            self.table.add(req)
            self._cv.notify()
        return req

    def _session_for(self, opts: RequestOptions, continue_session: bool,
                     expect_committed: list[int] | None) -> Session | None:
        """The request's existing session (None: none yet, or no session_id), checked: not
        busy; for ``continue_session``, present and holding ``expect_committed`` if given."""
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
        return sess

    def _derived(self, prompt: list[int], opts: RequestOptions) -> dict[str, Any]:
        """The options in the model's tokens: the reasoning budget, render_special's ids,
        logit_bias by token id."""
        return {"reasoning_budget": reasoning_budget(self.model, opts, prompt),
                "special": special_ids(self.model, opts.render_special),
                "logit_bias": logit_bias_ids(self.model, opts)}

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
        """Idempotent; observed at the next token boundary (a long prefill is interrupted;
        a queued request leaves the queue at the next tick)."""
        if req.phase == "done":
            return
        req.cancel()
        self.loop.cancelled(req)

    def queue_depth(self) -> int:
        """Requests running on a sequence now."""
        return len(self.table.active)

    def pending_len(self) -> int:
        """Requests waiting for a sequence."""
        return len(self.table.pending)

    def info(self) -> dict[str, Any]:
        with self._cv:   # held throughout: a context being recreated (SeqPool.reset) is never read
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
        self.loop.call(lambda: self.session_commands.end(session_id, scope))

    def reset_session(self, session_id: Hashable, scope: str) -> str:
        """Force-drop a session (its in-flight request ends with SessionReset)."""
        return self.loop.call(lambda: self.session_commands.reset(session_id, scope), interrupt=True)

    def evict(self, reason: SaveReason = SaveReason.EVICT) -> int:
        """Save every idle session's live KV to the prefix cache and release its sequence;
        bounded by evict_save_timeout_ms; returns the rows saved."""
        budget_s = self.cfg.evict_save_timeout_ms / 1000
        return self.loop.call(lambda: self.session_commands.evict(reason, budget_s),
                              timeout=budget_s + COMMAND_TIMEOUT_S)

    def session_info(self, scope: str | None = None) -> list[dict[str, Any]]:
        """Every session, or those of one cache scope."""
        with self._cv:
            return [s.info() for s in self.sessions if scope is None or s.scope == scope]

    def attachment(self, name: str, make: Callable[[], C]) -> C:
        """Per-model state of a layer above the engine (its parsed chat templates, its
        embedding contexts): made on first use, owned by this engine, closed when it stops
        and before the model is freed (no module keeps per-model state)."""
        with self._cv:
            self.loop.refuse_if_stopped()
            obj = self._attachments.get(name)
            if obj is None:
                obj = self._attachments[name] = make()
            return obj  # type: ignore[return-value]

    def stop(self) -> None:
        """Stop the loop, fail what is queued or running, free native memory."""
        self.loop.stop()
        for obj in self._attachments.values():
            obj.close()
        self._attachments.clear()
        self.session_commands.forget_all()
        self.pool.close()
        self.model.close()
