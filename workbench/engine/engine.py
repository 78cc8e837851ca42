"""One loaded model: the native model and context, and the loop thread that drives them.

The loop owns the context, the sequences and the sessions. Each tick it runs queued
commands (end/reset session), admits queued requests onto sequences, builds ONE batch
(decode rows + prefill chunks, see scheduler.py), runs one native decode with the GIL
released and a wall-clock budget, then samples each sequence that produced logits.
Other threads talk to it only through the admission queue, the command queue, a request's
cancel flag, and plain attributes they read (phase, counts) without waiting on the loop.
Sessions, adapters, cache save points and decode-failure recovery live in mixins
(session_ops, adapter_ops, cache_saves, recovery).
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .. import _native
from ..errors import (ContextOverflow, EngineStopped, InvalidOption, LoadError, NoSession, QueueFull, SeqCapacity,
                      SessionBusy, TranscriptMismatch)
from ..models import check_model_file, fingerprint
from ..models.probe import probe
from ..options import LoadConfig, RequestOptions
from ..cache import HitKind, SaveReason
from .grammars import GrammarCache, grammar_dead_end
from .prefix_cache import EngineCache
from .request import Request, next_ref
from .scheduler import plan_batch
from .adapter_ops import AdapterOps, AdapterSlot
from .cache_saves import CacheSaves
from .recovery import Recovery
from .session_ops import COMMAND_TIMEOUT_S, SessionOps
from .sessions import SessionTable, common_prefix

COUNTER_NAMES = ("decode_calls", "decoded_tokens", "decode_aborted", "decode_timeouts", "finished_stop",
                 "finished_length", "finished_cancelled", *(kind.counter for kind in HitKind),
                 "sessions_reclaimed", "sessions_reset", "cache_restore_failed", "cache_seq_not_cleared",
                 "cache_saves_dropped", "cache_evicted_sessions", "adapter_changes")


class Engine(SessionOps, AdapterOps, CacheSaves, Recovery):
    """A loaded model and its loop thread. Create with :meth:`load`."""

    def __init__(self, model_id: str, path: Path, cfg: LoadConfig, native_model: Any, ctx_params: dict[str, Any]):
        self.model_id = model_id
        self.path = path
        self.cfg = cfg
        self.model = native_model
        self.ctx_params = ctx_params
        self.ctx = _native.Context(native_model, ctx_params)
        self.fingerprint = fingerprint(path)
        self.loaded_at = time.time()
        self.last_active = time.monotonic()
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTER_NAMES, 0))
        n_batch = self.ctx.n_batch
        if cfg.prefill_chunk_size is None:
            self.chunk: int | None = None
        elif cfg.prefill_chunk_size == -1:
            self.chunk = max(64, n_batch // 4)
        else:
            self.chunk = cfg.prefill_chunk_size
        self.grammars = GrammarCache(native_model)
        gpu_layers = cfg.n_gpu_layers if _native.cuda else 0
        self.kvcache = EngineCache(self.fingerprint, native_model.desc, dict(ctx_params, n_gpu_layers=gpu_layers),
                                   self.counters, native_model.n_layer * native_model.n_embd) if cfg.cache else None
        self.sessions = SessionTable()
        # LoRA: the applied set, and a requested set applied once nothing is running (every
        # request runs under one adapter set from admission to end)
        self.adapters: list[AdapterSlot] = []
        self._adapter_target: list[AdapterSlot] | None = None
        # state shared with other threads: written by the loop, read anywhere
        self.phase = "idle"
        self.last_hit: dict[str, Any] | None = None
        self.pending: collections.deque[Request] = collections.deque()
        self.active: list[Request] = []
        self.requests: dict[int, Request] = {}
        self._free_seqs = list(range(self.ctx.n_seq_max))
        self._commands: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._in_decode: set[int] = set()
        self._thread = threading.Thread(target=self._run, name=f"workbench-loop-{model_id}", daemon=True)
        self._thread.start()

    # --- construction ------------------------------------------------------------------
    @classmethod
    def load(cls, model_id: str, path: Path, cfg: LoadConfig) -> "Engine":
        path = check_model_file(path)
        n_gpu = cfg.n_gpu_layers if _native.cuda else 0
        # in a child process first: llama.cpp aborts the process on many malformed files
        probe(path, fingerprint(path), cfg)
        try:
            native_model = _native.Model(str(path), n_gpu, cfg.use_mmap, False)
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
    def submit(self, prompt: list[int], opts: RequestOptions, *, continue_session: bool = False,
               expect_committed: list[int] | None = None, sync_saves: bool = False) -> Request:
        """Queue a request; admission errors (capacity, sessions, grammar) raise here."""
        grammar = self.grammars.for_request(opts.grammar, opts.json_schema)
        seed = opts.seed if opts.seed is not None else random.randrange(2**32 - 1)
        with self._cv:
            if self._stopping:
                raise EngineStopped(f"model {self.model_id!r} is being unloaded")
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
            if len(prompt) >= self.ctx.n_ctx:
                raise ContextOverflow(len(prompt), self.ctx.n_ctx, "leave room for at least one generated token")
            if opts.prefix_checkpoint_len is not None and opts.prefix_checkpoint_len > len(prompt):
                raise InvalidOption("prefix_checkpoint_len", opts.prefix_checkpoint_len,
                                    f"at most the prompt length ({len(prompt)})")
            if sess is None or sess.seq is None:
                placeable = len(self._free_seqs) + len(self.sessions.idle_pinned()) - len(self.pending)
                if opts.on_full == "error" and placeable <= 0:
                    raise SeqCapacity(self.model_id, self.ctx.n_seq_max)
                if 1 - placeable > self.cfg.max_queue:
                    raise QueueFull(self.model_id, self.cfg.max_queue)
            req = Request(ref=next_ref(), model_id=self.model_id, prompt=list(prompt), opts=opts, seed=seed)
            req.grammar = grammar
            req.continues = continue_session
            req.reasoning_budget = self._reasoning_budget(opts, req.prompt)
            req.special = self._special_ids(opts.render_special)
            req.sync_saves = sync_saves
            if sid is not None:
                req.session = self.sessions.get_or_create(sid, opts.cache_scope)
                req.session.busy_ref = req.ref
            self.pending.append(req)
            self.requests[req.ref] = req
            self._cv.notify()
        return req

    def _special_ids(self, render: bool | tuple[str, ...]) -> bool | frozenset[int]:
        """render_special as the loop uses it: a bool, or the ids whose text is shown."""
        if isinstance(render, bool):
            return render
        ids = set()
        for s in render:
            t = self.model.tokenize(s, False, True)
            if len(t) != 1 or self.model.token_to_piece(t[0], False) == self.model.token_to_piece(t[0], True):
                raise InvalidOption("render_special", list(render),
                                    f"special tokens of this model ({s!r} is not one)")
            ids.add(t[0])
        return frozenset(ids)

    def _reasoning_budget(self, opts: RequestOptions, prompt: list[int]) -> dict[str, Any] | None:
        """The budget sampler's token sequences. A prompt that ends with the start marker
        (the template opened the block) starts the count at the first generated token, as
        the thinking splitter does."""
        rb = opts.reasoning_budget
        if rb is None:
            return None
        tok = lambda s: self.model.tokenize(s, False, True) if s else []  # noqa: E731
        end = tok(rb["end"])
        if not end:
            raise InvalidOption("reasoning_budget", rb, "an end marker that tokenizes to at least one token")
        tail = self.model.detokenize(prompt[-16:], False, True).decode("utf-8", "replace").rstrip()
        return {"budget": rb["tokens"], "start": tok(rb["start"]), "end": end, "forced": tok(rb["message"]) + end,
                "inside": not rb["start"] or tail.endswith(rb["start"])}

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
        return len(self.active)

    def pending_len(self) -> int:
        """Requests waiting for a sequence."""
        return len(self.pending)

    def info(self) -> dict[str, Any]:
        m, c = self.model, self.ctx
        with self._cv:
            pinned_idle = len(self.sessions.idle_pinned())
            n_sessions = len(self.sessions)
        return {
            "model_id": self.model_id,
            "path": str(self.path),
            "fingerprint": self.fingerprint,
            "desc": m.desc,
            "n_params": m.n_params,
            "size_bytes": m.size,
            "n_vocab": m.n_vocab,
            "n_ctx_train": m.n_ctx_train,
            "n_ctx": c.n_ctx,
            "n_batch": c.n_batch,
            "n_ubatch": c.n_ubatch,
            "n_seq_max": c.n_seq_max,
            "n_threads": c.n_threads,
            "flash_attn": self.ctx_params["flash_attn"],
            "type_k": self.ctx_params["type_k"],
            "type_v": self.ctx_params["type_v"],
            "prefill_chunk_size": self.chunk,
            "available_seqs": len(self._free_seqs),
            "pinned_idle_seqs": pinned_idle,
            "sessions": n_sessions,
            "phase": self.phase,
            "queue_depth": len(self.active),
            "pending_len": len(self.pending),
            "grammar_cache": self.grammars.stats(),
            "adapters": [a.info() for a in self.adapter_list()],
            "has_chat_template": m.chat_template is not None,
            "gpu": bool(_native.cuda),
        }

    def stop(self) -> None:
        """Stop the loop, fail what is queued or running, free native memory."""
        with self._cv:
            self._stopping = True
            self.ctx.request_abort()
            self._cv.notify()
        self._thread.join()
        for sess in self.sessions:       # its sessions' rows become ordinary rows
            self._session_row(sess, None)
        self.ctx.close()
        self.model.close()

    def _call(self, fn: Callable[[], Any], interrupt: bool = False, timeout: float = COMMAND_TIMEOUT_S) -> Any:
        """Run fn on the loop thread between ticks; bounded wait (the loop may be wedged)."""
        fut: Future = Future()
        with self._cv:
            if self._stopping:
                raise EngineStopped(f"model {self.model_id!r} is being unloaded")
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
                    while not (self._stopping or self.pending or self.active or self._commands):
                        self.phase = "idle"
                        self._cv.wait()
                    if self._stopping:
                        break
                self._tick()
        except BaseException as e:  # never let the loop die silently: fail everyone
            self._fail_all(e if isinstance(e, Exception) else EngineStopped(repr(e)))
            raise
        self._fail_all(EngineStopped(f"model {self.model_id!r} was unloaded"))

    def _fail_all(self, reason: BaseException) -> None:
        with self._cv:
            victims = list(self.pending) + list(self.active)
            self.pending.clear()
            commands = list(self._commands)
            self._commands.clear()
        for req in victims:
            self._retire(req, keep_kv=False)
            req.fail(reason)
        for _, fut in commands:
            fut.set_exception(EngineStopped(f"model {self.model_id!r} was unloaded"))
        self.phase = "idle"

    def _tick(self) -> None:
        self.last_active = time.monotonic()
        self._run_commands()
        self._admit()
        for req in [r for r in self.active if r.cancel_requested]:
            self._finish(req, "cancelled")
        if not self.active:
            return
        plan = plan_batch(self.active, self.ctx.n_batch, self.chunk)
        if not plan.slices:
            return
        self.phase = "prefilling" if any(r.phase == "prefilling" for r in self.active) else "generating"
        now = time.perf_counter()
        for s in plan.slices:
            r = s.request
            if r.phase == "prefilling" and r.prefill_started_at is None:
                r.prefill_started_at = now  # type: ignore[attr-defined]
        with self._cv:
            self._in_decode = {s.request.ref for s in plan.slices}  # type: ignore[attr-defined]
            self.ctx.clear_abort()
        rc = self.ctx.decode(plan.tokens, plan.pos, plan.seq, plan.logits, float(self.cfg.decode_budget_ms))
        with self._cv:
            self._in_decode = set()
        self.counters["decode_calls"] += 1
        if rc != 0:
            self._decode_failed(rc, plan)
            return
        self.counters["decoded_tokens"] += len(plan)
        now = time.perf_counter()
        for s in plan.slices:
            req: Request = s.request  # type: ignore[assignment]
            req.n_past += s.take
            del req.feed[: s.take]
            if req.phase == "prefilling":
                req.prefilled += s.take
                while req.boundaries and req.boundaries[0][0] <= req.n_past:
                    pos, reason = req.boundaries.pop(0)
                    if pos == req.n_past and reason is not None:
                        key = self._save(req, req.prompt[:pos], reason)
                        if pos >= len(req.prompt) - 1:   # the prompt row (or an agent prefix of all of it)
                            req.prompt_key = key
            if s.logits_row is not None:
                if req.phase == "prefilling":
                    req.prefill_done_at = now
                    req.phase = "generating"
                if req.opts.response_tokens == 0:
                    self._finish(req, "length")     # prefill only: nothing to sample
                else:
                    self._sample(req, s.logits_row)

    def _run_commands(self) -> None:
        while True:
            with self._cv:
                if not self._commands:
                    return
                fn, fut = self._commands.popleft()
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)

    # --- admission -----------------------------------------------------------------------
    def _admit(self) -> None:
        if self._adapter_target is not None:
            if self.active:
                return  # hold admissions until the requests admitted under the old set end
            self._apply_adapters()
        placed: list[Request] = []
        with self._cv:
            while self.pending:
                req = self.pending[0]
                if req.cancel_requested:
                    self.pending.popleft()
                    self._retire(req, keep_kv=False)
                    req.finish("cancelled")
                    continue
                sess = req.session
                had_kv = sess is not None and sess.seq is not None
                seq = sess.seq if had_kv else self._take_seq()
                if seq is None:
                    break  # FIFO: the head waits for a sequence, so does everyone behind it
                self.pending.popleft()
                req.seq = seq
                req.kv_tokens = list(sess.tokens) if had_kv else []
                if sess is not None:
                    sess.seq = seq
                self.active.append(req)
                placed.append(req)
        for req in placed:
            self._start(req)

    def _take_seq(self) -> int | None:
        """A free sequence, else the least recently used idle session's (never an in-flight one)."""
        if self._free_seqs:
            return self._free_seqs.pop(0)
        idle = self.sessions.idle_pinned()
        if not idle:
            return None
        victim = idle[0]
        seq, victim.seq = victim.seq, None
        self.ctx.seq_rm(seq, -1, -1)
        self.counters["sessions_reclaimed"] += 1
        return seq

    def _start(self, req: Request) -> None:
        try:
            req.sampler = _native.Sampler(self.model, _sampler_params(req))
        except ValueError as e:
            self._retire(req, keep_kv=False)
            req.fail(e)
            return
        # keep the longest common prefix of what the sequence holds; at least one prompt
        # token must be decoded again to get logits to sample from
        reuse = min(common_prefix(req.kv_tokens, req.prompt), len(req.prompt) - 1)
        if reuse > 0:
            req.hit_kind = HitKind.CONTINUATION if req.continues else HitKind.STICKY
        use_cache = self.kvcache is not None and req.opts.cache
        if reuse == 0 and use_cache and len(req.prompt) > 1:
            restored = self.kvcache.restore(self.ctx, req.seq, req.prompt, req.opts.cache_scope,
                                            req.opts.parent_key)
            if restored is not None:
                reuse = min(restored.n_tokens, len(req.prompt) - 1)
                req.hit_kind = restored.kind
                if restored.n_tokens == len(req.prompt) - 1:
                    req.prompt_key = restored.key
        self.ctx.seq_rm(req.seq, reuse, -1)
        req.kv_tokens = []
        req.n_past = req.reused = reuse
        req.feed = req.prompt[reuse:]
        req.boundaries = self._save_points(req, use_cache)
        req.admitted_at = time.perf_counter()
        req.phase = "prefilling"
        self.counters[req.hit_kind.counter] += 1
        self.last_hit = {"ref": req.ref, "kind": req.hit_kind.value, "reused_tokens": reuse,
                         "prompt_tokens": len(req.prompt), "session_id": req.opts.session_id}

    # --- per token -----------------------------------------------------------------------
    def _sample(self, req: Request, row: int) -> None:
        try:
            token = req.sampler.sample(self.ctx, row)
        except ValueError as e:  # the grammar left no token to sample (csrc/sampler.cpp)
            self._retire(req, keep_kv=False)
            req.fail(grammar_dead_end(req.opts.grammar, req.opts.json_schema, e))
            return
        now = time.perf_counter()
        if req.first_token_at is None:
            req.first_token_at = now
        if self.model.is_eog(token):
            self._finish(req, "stop")
            return
        req.generated.append(token)
        req.last_token_at = now
        special = req.special if isinstance(req.special, bool) else token in req.special
        req.emit_token(token, self.model.token_to_piece(token, special))
        if req.text is not None and req.text.stop_hit is not None:
            self._finish(req, "stop")
        elif len(req.generated) >= req.opts.response_tokens or req.n_past + 1 >= self.ctx.n_ctx:
            self._finish(req, "length")
        else:
            req.feed = [token]

    # --- the end of a request --------------------------------------------------------------
    def _finish(self, req: Request, reason: str) -> None:
        req.finish_key = req.prompt_key
        if (reason != "cancelled" and self.kvcache is not None and req.opts.cache and req.seq is not None
                and req.n_past > len(req.prompt)):
            req.finish_key = self._save(req, (req.prompt + req.generated)[: req.n_past], SaveReason.FINISH)
        self._retire(req, keep_kv=True)
        req.finish(reason)  # type: ignore[arg-type]
        self.counters[f"finished_{reason}"] += 1

    def _retire(self, req: Request, keep_kv: bool) -> None:
        """Free what the request holds. A session keeps its sequence and KV when keep_kv."""
        if req.sampler is not None:
            req.sampler.close()
            req.sampler = None
        if req in self.active:
            self.active.remove(req)
        with self._cv:
            self.requests.pop(req.ref, None)
            sess = req.session
            owned = sess is not None and self.sessions.holds(sess) and sess.busy_ref == req.ref
            if owned:
                sess.busy_ref = None
                sess.last_used = time.monotonic()
                if keep_kv and req.seq is not None:
                    sess.tokens = (req.prompt + req.generated)[: req.n_past]
                    req.seq = None  # stays pinned to the session
                    return
                if req.seq is None:
                    return  # never admitted: the session's pinned KV is untouched
                sess.seq = None
            if req.seq is not None:
                self.ctx.seq_rm(req.seq, -1, -1)
                self._free_seqs.append(req.seq)
                self._free_seqs.sort()
                req.seq = None


def _sampler_params(req: Request) -> dict[str, Any]:
    o = req.opts
    return {
        "temperature": o.temperature,
        "top_k": o.top_k,
        "top_p": o.top_p,
        "min_p": o.min_p,
        "repetition_penalty": o.repetition_penalty,
        "repeat_last_n": o.repeat_last_n,
        "seed": req.seed,
        "grammar_proto": req.grammar,
        "reasoning_budget": req.reasoning_budget,
        "ignore_eos": o.ignore_eos,
    }


def model_id_for(path: Path, taken: set[str]) -> str:
    base = path.name[:-5] if path.name.endswith(".gguf") else path.name
    base = base.lower() or "model"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    return candidate
