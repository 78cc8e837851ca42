"""Where a request's prefill stops to save prefix-cache rows. A mixin of :class:`Engine`."""

from __future__ import annotations

from typing import Any

from ..cache import HitKind, SaveReason
from .request import Request


class CacheSaves:
    def _save_points(self, req: Request, use_cache: bool) -> list[tuple[int, SaveReason | None]]:
        """Where this request's prefill stops: before its last prompt token (always: that
        token is decoded alone, so a warm start that restores everything before it and
        decodes it alone computes exactly what the cold run did), and, with the cache, to
        save rows: the agent prefix, cold checkpoints of a long prompt, and the prompt
        without its last token (unless an agent prefix row covers the whole prompt). A None
        reason stops without saving."""
        n, start = len(req.prompt), req.n_past
        points: dict[int, SaveReason | None] = {}
        if n - 1 > start:
            points[n - 1] = None
        if not use_cache:
            return sorted(points.items())
        base = SaveReason.COLD if req.hit_kind is HitKind.COLD else SaveReason.CONTINUED
        every, lo, hi = self.cfg.cold_checkpoint_interval, self.cfg.cold_min_tokens, self.cfg.cold_max_tokens
        if every:
            # inside the cold_min/cold_max band: each row holds the whole prefix, so an
            # unbounded run of checkpoints on a very long prompt stores O(n^2) bytes
            for pos in range(every, min(n - 1, hi + 1) if hi is not None else n - 1, every):
                if pos > start and pos >= lo:
                    points[pos] = base
        agent = req.opts.prefix_checkpoint_len
        if n - 1 >= self.cfg.cache_min_tokens and req.prompt_key is None and n - 1 > start and agent != n:
            points[n - 1] = base
        if agent is not None and agent > start:
            points[agent] = SaveReason.AGENT_PREFIX
        elif agent is not None:
            # already in the KV (restored or sticky): pin the row of exactly that prefix
            key = self.kvcache.key_for(req.prompt[:agent], req.opts.cache_scope)  # type: ignore[union-attr]
            if key in self.kvcache.cache:  # type: ignore[union-attr]
                self.kvcache.cache.pin(key)  # type: ignore[union-attr]
        return sorted(points.items())

    def _save(self, req: Request, tokens: list[int], reason: SaveReason) -> str | None:
        assert self.kvcache is not None and req.seq is not None
        live = req.session is not None and reason is SaveReason.FINISH
        saved = self.kvcache.save(self.ctx, req.seq, tokens, req.opts.cache_scope, reason, sync=req.sync_saves,
                                  live=live)
        if saved is None:
            self.counters["cache_saves_dropped"] += 1
            return None
        if saved.new:
            req.stored_upto = max(req.stored_upto, len(tokens))
        if live:
            self._session_row(req.session, saved.key)
        return saved.key

    def _session_row(self, sess: Any, key: str | None) -> None:
        """The session's newest row is the live one (what its next turn restores from if its
        sequence is reclaimed); the previous one becomes an ordinary row. key=None: the
        session is gone."""
        if self.kvcache is not None and sess.live_key is not None and sess.live_key != key:
            self.kvcache.set_live(sess.live_key, False)
        sess.live_key = key
