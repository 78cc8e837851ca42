"""Save points: where a request's prefill stops, and the prefix-cache rows saved there.

A row holds only KV that a cold prefill of its tokens computes bit for bit, so that a hit
never changes a reply (docs/architecture.md, "Warm equals cold"). On a deterministic model
that is all of it. In the default mode it is the KV of prompt rows decoded on ggml's tiled
kernel (engine/kernel_rows.py), and a request tracks how far that reaches
(``Request.cold_upto``): the last prompt token and every generated token are decoded on the
row kernel, so a finish row, a session's live KV past its first turn's prompt and an agent
prefix that is the whole prompt are not stored past that point (``cache_saves_not_cold``
counts the saves left out).

A session's own KV is kept anyway, for the session alone: in the default mode each turn's
end and ``evict`` save all of it as the session's **own row**, in a namespace of its own
(``EngineCache.namespace(scope, own=Session.own_id)``) that no other request's lookup reaches. When
the session has lost its sequence (reclaimed, evicted), its next turn restores that row by
key and continues as a sticky turn would have (admission.py: reported ``sticky``). Only the
newest own row of a session is kept: the one before is removed, and so is the last one
when the session ends.

State: none of its own beyond its dependencies (the load config's checkpoint settings,
the engine's :class:`~.prefix_cache.EngineCache` or None, the sequence pool whose context
holds the KV, the counters). A request carries its remaining points in ``boundaries``; the
batch strategy ends a chunk exactly at the next one (scheduler.prefill_take).
"""

from __future__ import annotations

import collections

from ..cache import HitKind, SaveReason
from ..cache.save_rule import AGENT_PREFIX, SaveSettings, finish_tokens, prefill_saves
from ..cache.types import reusable
from ..options import LoadConfig
from .prefix_cache import EngineCache
from .request import Request
from .seq_pool import SeqPool
from .sessions import Session


class SavePoints:
    def __init__(self, cfg: LoadConfig, kvcache: EngineCache | None, pool: SeqPool,
                 counters: collections.Counter[str]) -> None:
        self._cfg = cfg
        self._kvcache = kvcache
        self._pool = pool
        self._counters = counters
        self._settings = SaveSettings(cfg.cold_checkpoint_interval, cfg.cold_min_tokens, cfg.cold_max_tokens,
                                      cfg.cache_min_tokens)

    def plan(self, req: Request, use_cache: bool) -> list[tuple[int, SaveReason | None]]:
        """Where this request's prefill stops: before its last prompt token (always: that
        token is decoded alone, so a warm start that restores everything before it and
        decodes it alone computes exactly what the cold run did), and, with the cache, to
        save rows: the agent prefix, cold checkpoints of a long prompt, and the prompt
        without its last token (unless an agent prefix row covers the whole prompt). A None
        reason stops without saving."""
        n, start = len(req.prompt), req.n_past
        points: dict[int, SaveReason | None] = {}
        if reusable(n) > start:
            points[reusable(n)] = None
        if not use_cache or self._kvcache is None:
            return sorted(points.items())
        agent = self.agent_end(req)
        if agent is not None and agent <= start:
            # already in the KV (restored or sticky): pin the row of exactly that prefix
            key = self._kvcache.key_for(req.prompt[:agent], req.opts.cache_scope)
            if key in self._kvcache.cache:
                self._kvcache.cache.pin(key)
        if self.cold_len(req, start) < start:
            return sorted(points.items())   # it continues KV that decodes computed: no row of it is cold
        base = SaveReason.COLD if req.hit_kind is HitKind.COLD else SaveReason.CONTINUED
        for pos, kind in prefill_saves(n, start, self._settings, agent=agent, prompt_found=req.prompt_key is not None):
            points[pos] = SaveReason.AGENT_PREFIX if kind == AGENT_PREFIX else base
        return sorted(points.items())

    def cold_len(self, req: Request, n: int) -> int:
        """Of the first ``n`` positions of the request's sequence, how many hold the KV a cold
        prefill computes: all on a deterministic model, else up to ``req.cold_upto``."""
        return n if self._cfg.deterministic else min(n, req.cold_upto)

    def session_cold_len(self, sess: Session) -> int:
        """Of a session's live KV, how many leading positions hold what a cold prefill
        computes: all on a deterministic model, else up to ``sess.cold_upto``."""
        n = len(sess.tokens)
        return n if self._cfg.deterministic else min(n, sess.cold_upto)

    def agent_end(self, req: Request) -> int | None:
        """Where the agent prefix's pinned row ends: its length, except that in the default
        mode a prefix that is the whole prompt stops before the last token (decoded alone,
        on the row kernel, that token's KV is not what a longer prompt's prefill computes)."""
        agent = req.opts.prefix_checkpoint_len
        if agent is None or self._cfg.deterministic:
            return agent
        return min(agent, reusable(len(req.prompt)))

    def reached(self, req: Request) -> None:
        """After a prefill chunk: save the rows of the points it ended at."""
        while req.boundaries and req.boundaries[0][0] <= req.n_past:
            pos, reason = req.pop_boundary()
            if pos != req.n_past or reason is None:
                continue
            if self.cold_len(req, pos) < pos:
                self._counters["cache_saves_not_cold"] += 1
                continue
            key = self.save(req, req.prompt[:pos], reason)
            if key is not None and pos >= reusable(len(req.prompt)):   # the prompt row (or an agent prefix of all)
                req.prompt_row(key)

    def at_finish(self, req: Request, reason: str) -> str | None:
        """The request's finish key: a row of everything it decoded, else its prompt's row.
        In the default mode the decoded part is not cold KV: no finish row (the prompt's row
        is the key, None after a sticky turn); a session's whole KV goes to its own row."""
        if reason == "cancelled" or self._kvcache is None or not req.opts.cache or req.seq is None:
            return req.prompt_key
        n = self.cold_len(req, req.n_past)
        if n == req.n_past:
            if finish_tokens(len(req.prompt), n):
                return self.save(req, (req.prompt + req.generated)[:n], SaveReason.FINISH)
            return req.prompt_key
        if finish_tokens(len(req.prompt), req.n_past):
            self._counters["cache_saves_not_cold"] += 1
        if req.session is not None:
            self.save(req, (req.prompt + req.generated)[: req.n_past], SaveReason.FINISH, own=req.session.own_id)
        return req.prompt_key

    def save(self, req: Request, tokens: list[int], reason: SaveReason, own: str | None = None) -> str | None:
        """``own``: the session's own row, its ``own_id`` (see the module doc)."""
        assert self._kvcache is not None and req.seq is not None
        live = req.session is not None and reason is SaveReason.FINISH
        saved = self._kvcache.save(self._pool, req.seq, tokens, req.opts.cache_scope, reason,
                                   sync=req.sync_saves, live=live, marks=self.marks(req), own=own)
        if saved is None:
            self._counters["cache_saves_dropped"] += 1
            return None
        if saved.new:
            req.stored(len(tokens))
        if live:
            self.session_row(req.session, saved.key, own is not None)
        return saved.key

    @staticmethod
    def marks(req: Request) -> tuple[int, ...]:
        """Where the request's shared prefixes end (its system prompt, its agent prefix given or
        restored): chunk storage ends a chunk at each (docs/cache.md, "Chunked storage"), so
        a pinned prefix's last chunk is never absorbed into one task's continuation."""
        ends = (req.opts.prefix_checkpoint_len, req.shared_end)
        return (*req.opts.cache_boundaries, *(e for e in ends if e is not None))

    def save_session(self, sess: Session, reason: SaveReason) -> bool:
        """Save an idle session's live KV as its row (synchronously), before its sequence is
        released; False when not saved. In the default mode, as its own row when it holds
        KV that decodes computed (see the module doc)."""
        if self._kvcache is None or not sess.tokens or sess.seq is None:
            return False
        own = sess.own_id if self.session_cold_len(sess) < len(sess.tokens) else None
        row = self._kvcache.save(self._pool, sess.seq, sess.tokens, sess.scope, reason, sync=True, live=True, own=own)
        if row is not None:
            self.session_row(sess, row.key, own is not None)
        return row is not None

    def session_row(self, sess: Session, key: str | None, own: bool = False) -> None:
        """The session's newest row is the live one (what its next turn restores from if its
        sequence is reclaimed); the previous one becomes an ordinary row, or goes when it was
        the session's own (nobody else can restore it). key=None: the session is gone."""
        old = sess.live_key
        if self._kvcache is not None and old is not None and old != key:
            self._kvcache.set_live(old, False)   # a save still queued lands not live
            if sess.own_row:
                self._kvcache.remove(old)
        sess.live_key, sess.own_row = key, own and key is not None
