"""Live prefix sharing: a request starts from KV that another live sequence of its cache
scope holds (a running request, or an idle session), copied into its own sequence, instead
of restoring it from the prefix cache or prefilling it.

* **What is shared.** Only KV a cold prefill computes alike (``SavePoints.cold_len`` for a
  request, ``Session.cold_upto`` for a session: all of it on a deterministic model), never
  past the request's reusable limit, and only between sequences of the same cache scope (and
  so of the same model, adapters and KV layout: one engine). So a shared hit gives the reply
  a cold run gives; its hit kind is ``shared`` (``Request.shared_from`` names the source).
  A live source is taken when it holds at least ``cache_min_tokens`` and no fewer tokens
  than the prefix cache could restore (a copy moves no bytes through the cache).
* **How it is copied.** In a unified KV (the default mode) llama.cpp's ``seq_cp`` adds the
  request's sequence to the source's cells: nothing moves, and the cells count once in the
  KV until the sequences let go of them. With a KV stream per sequence (deterministic mode)
  the source's state is copied into the request's stream (``state_seq_get`` /
  ``state_seq_set``, a synchronous copy: llama.cpp's cross-stream ``seq_cp`` copies whole
  streams at the next decode, too late for a save or a later restore into the same stream)
  and cut to the shared length.
* **Waiting for a prefill under way.** A queued request whose prefix another request of its
  scope is prefilling now (or was placed this tick to prefill) is not placed yet: it waits in
  the queue, holding no sequence, until that prefill covers the prefix, the other request
  ends or stops extending cold KV, or ``share_wait_ms`` passes (``share_waits``,
  ``share_waits_expired``); then it is placed and takes the best source there is. It waits
  only when the prefill under way would give it at least ``WAIT_MIN_TOKENS`` (64, and
  ``cache_min_tokens``) more than a live sequence or the cache holds now, and at most once.
  A waiting request stays queued for every purpose (cancel, ``timeout_s``, ``request_info``
  with ``waiting_for``).

Counters: ``hits_shared`` (the hit kind's), ``shared_tokens`` (tokens copied),
``share_waits``, ``share_waits_expired``, ``share_failed`` (a copy that did not leave the
sequence holding exactly the prefix: emptied, and the request looks the prompt up in the
cache as any other).

State: none of its own; the loop thread is its only caller.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from ..cache.types import reusable
from ..options import LoadConfig
from .cache_saves import SavePoints
from .prefix_cache import EngineCache
from .request import Request
from .request_table import RequestTable
from .seq_pool import SeqPool
from .sessions import SessionTable, common_prefix

COUNTER_NAMES = ("shared_tokens", "share_waits", "share_waits_expired", "share_failed")
# a wait must save at least this many prompt tokens (and cache_min_tokens): a wait lasts a
# prefill chunk or more, which computes far more than a few tokens (a chat template's shared
# system line, ~30 tokens, is prefilled rather than waited for)
WAIT_MIN_TOKENS = 64


@dataclass(slots=True, frozen=True)
class Source:
    """A live sequence ``seq`` whose first ``n_tokens`` positions a request may copy."""

    seq: int
    n_tokens: int
    label: str   # 'request 12' or 'session <id>'


def reuse_limit(req: Request) -> int:
    """The most prompt tokens a request may start from: all but its last, never past its
    first row with logits (``out_from``: scoring, verify), which is decoded."""
    limit = reusable(len(req.prompt))
    return limit if req.out_from is None else min(limit, req.out_from)


class LiveShare:
    def __init__(self, cfg: LoadConfig, pool: SeqPool, table: RequestTable, sessions: SessionTable,
                 saves: SavePoints, kvcache: EngineCache | None, counters: collections.Counter[str]) -> None:
        self._kvcache = kvcache
        self._on = cfg.share_prefixes
        self._min = cfg.cache_min_tokens
        self._min_wait = max(cfg.cache_min_tokens, WAIT_MIN_TOKENS)
        self._wait_s = cfg.share_wait_ms / 1000.0
        self._pool = pool
        self._table = table
        self._sessions = sessions
        self._saves = saves
        self._counters = counters

    def allowed(self, req: Request) -> bool:
        """May ``req`` start from a live sequence's KV? Not with ``cache=False`` (a cold run
        asked for), nor when it names its row (``parent_key``)."""
        return self._on and req.opts.cache and req.opts.parent_key is None

    # --- at admission: the request holds its sequence ------------------------------------
    def best(self, req: Request, limit: int) -> Source | None:
        """The live sequence of ``req``'s scope holding the longest shareable prefix of its
        prompt (at most ``limit`` tokens, at least ``cache_min_tokens``); None when none."""
        best: Source | None = None
        for src in self._table.active:
            if src is req or src.seq is None or src.admitted_at is None or src.opts.cache_scope != req.opts.cache_scope:
                continue
            n = min(self._request_prefix(src, req.prompt), limit)
            if n >= self._min and (best is None or n > best.n_tokens):
                best = Source(src.seq, n, f"request {src.ref}")
        for sess in self._sessions.idle_pinned():
            if sess.scope != req.opts.cache_scope or sess.seq is None or sess.seq == req.seq:
                continue
            n = min(common_prefix(sess.tokens, req.prompt), self._saves.session_cold_len(sess), limit)
            if n >= self._min and (best is None or n > best.n_tokens):
                best = Source(sess.seq, n, f"session {sess.session_id!r}")
        return best

    def copy(self, src: Source, dst: int) -> int:
        """Copy the first ``src.n_tokens`` positions of ``src.seq`` into ``dst`` (emptied
        first); the tokens copied, 0 when the copy failed (``dst`` is left empty)."""
        ctx, n = self._pool.ctx, src.n_tokens
        self._pool.trim(dst, 0)
        if ctx.kv_streams == 1:
            ctx.seq_cp(src.seq, dst, 0, n)
        else:
            try:
                read = ctx.state_seq_set(dst, ctx.state_seq_get(src.seq))
            except ValueError:
                read = 0
            self._pool.trim(dst, n if read else 0)
        if ctx.seq_pos_min(dst) != 0 or ctx.seq_pos_max(dst) != n - 1:
            self._pool.trim(dst, 0)
            self._counters["share_failed"] += 1
            return 0
        self._counters["shared_tokens"] += n
        return n

    def _request_prefix(self, src: Request, prompt: list[int]) -> int:
        """How much of ``prompt`` the running request ``src``'s cold-alike KV holds."""
        n = self._saves.cold_len(src, src.n_past)
        held = src.prompt if n <= len(src.prompt) else src.prompt + src.generated
        return min(common_prefix(held, prompt), n)

    # --- in the queue: wait for a prefill under way? ---------------------------------------
    def waits(self, req: Request) -> bool:
        """Should the queued ``req`` stay queued this tick, for a prefill of its prefix under
        way (see the module doc)?"""
        if req.share_wait is not None:
            return self._still_waits(req)
        if req.share_waited or self._wait_s <= 0 or not self.allowed(req):
            return False
        target = self._prefilling_source(req)
        if target is None or target[1] - self.held_now(req, reuse_limit(req)) < self._min_wait:
            req.share_wait_over()
            return False
        req.wait_for_share(target[0].ref, target[1], time.perf_counter() + self._wait_s)
        self._counters["share_waits"] += 1
        return True

    def held_now(self, req: Request, limit: int) -> int:
        """The longest prefix of ``req``'s prompt a live sequence or the prefix cache holds."""
        live = self.best(req, limit)
        return max(live.n_tokens if live is not None else 0, self.cached(req, limit))

    def cached(self, req: Request, limit: int) -> int:
        """What the prefix cache could restore of ``req``'s prompt (up to ``limit``)."""
        if self._kvcache is None or not req.opts.cache:
            return 0
        return min(self._kvcache.cached_prefix_len(req.prompt[: limit + 1], req.opts.cache_scope), limit)

    def _prefilling_source(self, req: Request) -> tuple[Request, int] | None:
        """The request of ``req``'s scope whose prefill under way will hold the longest
        prefix of its prompt (at least ``cache_min_tokens``), and that length."""
        limit, best = reuse_limit(req), None
        for src in self._table.active:
            if src.opts.cache_scope != req.opts.cache_scope or not self._extends(src):
                continue
            n = min(common_prefix(src.prompt, req.prompt), reusable(len(src.prompt)), limit)
            if n >= self._min and n > self._have(src) and (best is None or n > best[1]):
                best = (src, n)
        return best

    def _still_waits(self, req: Request) -> bool:
        assert req.share_wait is not None
        ref, n, deadline = req.share_wait
        src = self._table.by_ref.get(ref)
        if src is not None and self._extends(src) and self._have(src) < n:
            if time.perf_counter() < deadline:
                return True
            self._counters["share_waits_expired"] += 1
        req.share_wait_over()
        return False

    def _extends(self, src: Request) -> bool:
        """Is ``src`` (or will it be) prefilling cold-alike KV? Placed this tick and not
        started yet counts; so does a prefill whose KV is all cold-alike so far."""
        if src.cancel_requested or src.seq is None:
            return False
        if src.admitted_at is None:
            return True
        return src.phase == "prefilling" and self._saves.cold_len(src, src.n_past) == src.n_past

    def _have(self, src: Request) -> int:
        return 0 if src.admitted_at is None else self._saves.cold_len(src, src.n_past)
