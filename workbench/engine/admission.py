"""Admission: queued requests onto sequences (FIFO), then each one's starting point.

A request starts from the longest KV it can reuse: its session's live KV (sticky, or a
``continue_session`` continuation; restored from the session's own row when it lost its
sequence), else the longest prefix another live sequence of its scope holds, copied
(``shared``: live_share.py) unless the cache holds more, else the longest cached prefix (or
``parent_key``'s row), else nothing (cold). A queued request whose prefix another request
is prefilling now waits for it in the queue (live_share.py), so the prefix is computed once.
At least its last prompt token is always decoded again, to get logits to sample from. Its
save points are set here (cache_saves.SavePoints.plan).

State: ``last_hit``, the newest admission's hit (read by any thread); the rest it is given.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from .. import _native
from ..cache import HitKind
from ..cache.types import reusable
from .cache_saves import SavePoints
from .grammars import sampler_refused
from .live_share import LiveShare, reuse_limit
from .prefix_cache import EngineCache
from .request import Request
from .request_setup import sampler_params
from .request_table import RequestTable
from .seq_pool import SeqPool
from .sessions import common_prefix


class Admission:
    def __init__(self, model: Any, pool: SeqPool, table: RequestTable, saves: SavePoints, share: LiveShare,
                 kvcache: EngineCache | None, counters: collections.Counter[str], lock: threading.Condition) -> None:
        self._model = model
        self._share = share
        self._pool = pool
        self._table = table
        self._saves = saves
        self._kvcache = kvcache
        self._counters = counters
        self._lock = lock
        self.last_hit: dict[str, Any] | None = None

    def admit(self) -> None:
        for req in self._place():
            self._start(req)

    def _place(self) -> list[Request]:
        """Queued requests onto sequences, in order: the first that finds no sequence waits,
        so does everyone behind it. Passed over and left queued: a cancelled request (the
        tick finishes it, loop.py, before and after admission) and one waiting for a prefill
        of its prefix under way (live_share.py)."""
        placed: list[Request] = []
        pending = self._table.pending
        if not pending:   # most ticks (read without the lock: one queued now is placed next tick)
            return placed
        with self._lock:
            for req in list(pending):
                if req.cancel_requested:
                    continue
                sess = req.session
                had_kv = sess is not None and sess.seq is not None
                if not had_kv:
                    if self._pool.n_placeable() == 0:
                        break
                    if self._share.waits(req):
                        continue
                seq = sess.seq if had_kv else self._pool.take()
                if seq is None:
                    break
                pending.remove(req)
                req.place(seq, list(sess.tokens) if had_kv else [])
                if sess is not None:
                    sess.seq = seq
                self._table.active.append(req)
                placed.append(req)
        return placed

    def _start(self, req: Request) -> None:
        try:
            req.start_sampler(_native.Sampler(self._model, sampler_params(req)))
        except ValueError as e:
            self._table.fail(req, sampler_refused(req.opts, e))
            return
        use_cache = self._kvcache is not None and req.opts.cache
        reuse = self._reuse(req, use_cache)
        assert req.seq is not None
        self._pool.trim(req.seq, reuse)
        req.start_prefill(reuse, self._cold_upto(req, reuse))
        req.plan_saves(self._saves.plan(req, use_cache))   # reads the reuse start_prefill set
        self._counters[req.hit_kind.counter] += 1
        self.last_hit = {"ref": req.ref, "kind": req.hit_kind.value, "reused_tokens": reuse, "prefix_len": reuse,
                         "prompt_tokens": len(req.prompt), "session_id": req.opts.session_id}

    def _shared(self, req: Request, limit: int) -> int:
        """The prefix another live sequence holds, copied, when no shorter than what the
        cache could restore; 0 when none (or the copy failed)."""
        if limit <= 0 or not self._share.allowed(req):
            return 0
        src = self._share.best(req, limit)
        if src is None or self._share.cached(req, limit) > src.n_tokens:
            return 0
        assert req.seq is not None
        n = self._share.copy(src, req.seq)
        if n > 0:
            req.reused_from(HitKind.SHARED, shared_from=src.label)
        return n

    @staticmethod
    def _cold_upto(req: Request, reuse: int) -> int:
        """How much of the reused KV a cold prefill would have computed alike: a restored row
        all of it (rows hold only such KV, cache_saves.py); a session's live KV up to where
        its earlier turns' own decodes begin."""
        if req.hit_kind in (HitKind.STICKY, HitKind.CONTINUATION) and req.session is not None:
            return min(reuse, req.session.cold_upto)
        return reuse

    def _own_row(self, req: Request, limit: int) -> int:
        """A session that lost its sequence gets its KV back from its own row (cache_saves.py),
        when that row holds a prefix of the prompt: the KV its sticky turn would have
        continued. 0 when there is none (the request then looks the prompt up as any other)."""
        sess = req.session
        assert self._kvcache is not None and req.seq is not None
        if sess is None or not sess.own_row or sess.live_key is None or len(sess.tokens) > limit + 1:
            return 0
        if req.prompt[: len(sess.tokens)] != sess.tokens:
            return 0
        # a save still queued is waited for (briefly) by the restore, as a parent_key's is
        restored = self._kvcache.restore(self._pool, req.seq, req.prompt[: limit + 1], req.opts.cache_scope,
                                         sess.live_key, own=sess.own_id)
        if restored is None:
            return 0
        if restored.key != sess.live_key:   # the row went meanwhile: not this session's KV
            self._pool.trim(req.seq, 0)
            return 0
        return min(restored.n_tokens, limit)

    def _reuse(self, req: Request, use_cache: bool) -> int:
        """Prompt tokens whose KV the sequence holds now (sets the hit kind); never past a
        request's first row with logits (``out_from``: scoring, verify), which is decoded."""
        limit = reuse_limit(req)
        reuse = min(common_prefix(req.kv_tokens, req.prompt), limit)
        if reuse == 0 and use_cache and limit > 0:
            reuse = self._own_row(req, limit)   # the session's KV, back from its own row
        if reuse > 0:
            req.reused_from(HitKind.CONTINUATION if req.continues else HitKind.STICKY)
            return reuse
        shared = self._shared(req, limit)
        if shared > 0:
            return shared
        if not use_cache or limit <= 0:
            return 0
        assert self._kvcache is not None and req.seq is not None
        # looked up as a prompt that ends right after the limit, so the hit kind (and what is
        # read) is relative to the tokens that may be reused
        restored = self._kvcache.restore(self._pool, req.seq, req.prompt[: limit + 1], req.opts.cache_scope,
                                         req.opts.parent_key)
        if restored is None:
            return 0
        whole = restored.n_tokens == reusable(len(req.prompt))   # the prompt's own row
        req.reused_from(restored.kind, restored.shared_end, restored.key if whole else None, restored.saved_by)
        return min(restored.n_tokens, limit)
