"""One loaded model: the native model and context, and the loop thread that drives them.

The loop owns the context. Each tick it admits queued requests onto free sequences, builds
ONE batch (decode rows + prefill chunks, see scheduler.py), runs one native decode with the
GIL released and a wall-clock budget, then samples each sequence that produced logits.
Other threads talk to it only through the admission queue, a request's cancel flag, and
plain attributes they read (phase, queue depth) without waiting on the loop.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from pathlib import Path
from typing import Any

from .. import _native
from ..errors import (ContextOverflow, DecodeFailed, DecodeTimeout, EngineStopped, LoadError, QueueFull)
from ..models import check_model_file, fingerprint
from ..options import LoadConfig, RequestOptions, default_threads
from .request import Request, next_ref
from .scheduler import plan_batch

DEFAULT_N_CTX = 8192


class Engine:
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
        n_batch = self.ctx.n_batch
        if cfg.prefill_chunk_size is None:
            self.chunk: int | None = None
        elif cfg.prefill_chunk_size == -1:
            self.chunk = max(64, n_batch // 4)
        else:
            self.chunk = cfg.prefill_chunk_size
        # state shared with other threads: written by the loop, read anywhere
        self.phase = "idle"
        self.pending: collections.deque[Request] = collections.deque()
        self.active: list[Request] = []
        self.requests: dict[int, Request] = {}
        self.counters: collections.Counter[str] = collections.Counter()
        self._free_seqs = list(range(self.ctx.n_seq_max))
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
        try:
            native_model = _native.Model(str(path), n_gpu, cfg.use_mmap, False)
        except _native.NativeError as e:
            raise LoadError(str(e)) from None
        n_threads = cfg.n_threads or default_threads()
        n_ctx = cfg.n_ctx or min(native_model.n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
        ctx_params = {
            "n_ctx": n_ctx,
            "n_batch": cfg.n_batch,
            "n_ubatch": min(cfg.n_ubatch, cfg.n_batch),
            "n_seq_max": cfg.n_seq_max,
            "n_threads": n_threads,
            "n_threads_batch": cfg.n_threads_batch or n_threads,
            "flash_attn": cfg.flash_attn,
            "type_k": cfg.type_k,
            "type_v": cfg.type_v,
        }
        try:
            return cls(model_id, path, cfg, native_model, ctx_params)
        except _native.NativeError as e:
            native_model.close()
            raise LoadError(str(e)) from None

    # --- public, any thread --------------------------------------------------------------
    def submit(self, prompt: list[int], opts: RequestOptions) -> Request:
        n_ctx = self.ctx.n_ctx
        if len(prompt) >= n_ctx:
            raise ContextOverflow(len(prompt), n_ctx, "leave room for at least one generated token")
        seed = opts.seed if opts.seed is not None else random.randrange(2**32 - 1)
        req = Request(ref=next_ref(), model_id=self.model_id, prompt=list(prompt), opts=opts, seed=seed)
        with self._cv:
            if self._stopping:
                raise EngineStopped(f"model {self.model_id!r} is being unloaded")
            if len(self.pending) >= self.cfg.max_queue and not self._free_seqs:
                raise QueueFull(self.model_id, self.cfg.max_queue)
            self.pending.append(req)
            self.requests[req.ref] = req
            self._cv.notify()
        return req

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
        return len(self.pending)

    def info(self) -> dict[str, Any]:
        m, c = self.model, self.ctx
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
            "phase": self.phase,
            "queue_depth": len(self.pending),
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
        self.ctx.close()
        self.model.close()

    # --- the loop ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stopping and not self.pending and not self.active:
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
        for req in victims:
            self._release(req)
            req.fail(reason)
        self.active.clear()
        self.phase = "idle"

    def _tick(self) -> None:
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
        budget = float(self.cfg.decode_budget_ms)
        rc = self.ctx.decode(plan.tokens, plan.pos, plan.seq, plan.logits, budget)
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
            if s.logits_row is not None:
                if req.phase == "prefilling":
                    req.prefill_done_at = now
                    req.phase = "generating"
                self._sample(req, s.logits_row)

    def _admit(self) -> None:
        with self._cv:
            while self.pending and self._free_seqs:
                req = self.pending.popleft()
                if req.cancel_requested:
                    self.requests.pop(req.ref, None)
                    req.finish("cancelled")
                    continue
                req.seq = self._free_seqs.pop(0)
                self.active.append(req)
        for req in self.active:
            if req.phase == "queued":
                req.admitted_at = time.perf_counter()
                try:
                    req.sampler = _native.Sampler(self.model, _sampler_params(req))
                except ValueError as e:
                    self._release(req)
                    self.active.remove(req)
                    req.fail(e)
                    continue
                self.ctx.seq_rm(req.seq, -1, -1)
                req.feed = list(req.prompt)
                req.phase = "prefilling"

    def _sample(self, req: Request, row: int) -> None:
        token = req.sampler.sample(self.ctx, row)
        now = time.perf_counter()
        if req.first_token_at is None:
            req.first_token_at = now
        if self.model.is_eog(token):
            self._finish(req, "stop")
            return
        req.generated.append(token)
        req.last_token_at = now
        req.emit_token(token, self.model.token_to_piece(token, False))
        if req.text is not None and req.text.stop_hit is not None:
            self._finish(req, "stop")
        elif len(req.generated) >= req.opts.response_tokens or req.n_past + 1 >= self.ctx.n_ctx:
            self._finish(req, "length")
        else:
            req.feed = [token]

    def _finish(self, req: Request, reason: str) -> None:
        self._release(req)
        if req in self.active:
            self.active.remove(req)
        self.requests.pop(req.ref, None)
        req.finish(reason)  # type: ignore[arg-type]
        self.counters[f"finished_{reason}"] += 1

    def _release(self, req: Request) -> None:
        if req.sampler is not None:
            req.sampler.close()
            req.sampler = None
        if req.seq is not None:
            self.ctx.seq_rm(req.seq, -1, -1)
            with self._cv:
                self._free_seqs.append(req.seq)
                self._free_seqs.sort()
            req.seq = None
        self.requests.pop(req.ref, None)

    def _decode_failed(self, rc: int, plan: Any) -> None:
        # roll every sequence in the batch back to where it was: ubatches already
        # processed stay in the KV cache after an abort or a fatal error
        for s in plan.slices:
            self.ctx.seq_rm(s.request.seq, s.request.n_past, -1)
        reason = self.ctx.abort_reason if rc == 2 else ""
        self.ctx.clear_abort()
        if rc == 2 and reason == "cancelled":
            self.counters["decode_aborted"] += 1
            return  # cancelled requests finish next tick; the others redo their rows
        if rc == 2 and reason == "timeout":
            self.counters["decode_timeouts"] += 1
            err = DecodeTimeout(f"a decode step ran past decode_budget_ms={self.cfg.decode_budget_ms} "
                                f"and was aborted; the context was recreated")
            for req in list(self.active):
                self._release(req)
                req.fail(err)
            self.active.clear()
            self.ctx.close()
            self.ctx = _native.Context(self.model, self.ctx_params)
            self._free_seqs = list(range(self.ctx.n_seq_max))
            return
        if rc == 1 and self.active:
            # no KV slot: the sequences together outgrew the shared context; the newest yields
            victim = self.active[-1]
            self._release(victim)
            self.active.remove(victim)
            victim.fail(ContextOverflow(victim.n_past + len(victim.feed), self.ctx.n_ctx,
                                        "the KV cache is full with the other running sequences"))
            return
        err = DecodeFailed(rc)
        for req in [s.request for s in plan.slices]:
            self._release(req)  # type: ignore[arg-type]
            if req in self.active:
                self.active.remove(req)  # type: ignore[arg-type]
            req.fail(err)  # type: ignore[attr-defined]


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
        "grammar": o.grammar,
        "ignore_eos": o.ignore_eos,
    }


def model_id_for(path: Path, taken: set[str]) -> str:
    base = path.name
    for suffix in (".gguf",):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    base = base.lower() or "model"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    return candidate


