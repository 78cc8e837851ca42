"""Where a request's prefill stops to save prefix-cache rows. A mixin of :class:`Engine`."""

from __future__ import annotations

from ..cache import SaveReason
from .request import Request


class CacheSaves:
    def _save_points(self, req: Request) -> list[tuple[int, SaveReason]]:
        """Where this request's prefill stops to save a row: the agent prefix, cold
        checkpoints of a long prompt, and the end of the prompt."""
        n, start = len(req.prompt), req.n_past
        base = SaveReason.COLD if req.hit_kind == "cold" else SaveReason.CONTINUED
        points: dict[int, SaveReason] = {}
        every = self.cfg.cold_checkpoint_interval
        if every:
            for pos in range(every, n, every):
                if pos > start:
                    points[pos] = base
        if n >= self.cfg.cache_min_tokens and req.prompt_key is None:
            points[n] = base
        agent = req.opts.prefix_checkpoint_len
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
        key = self.kvcache.save(self.ctx, req.seq, tokens, req.opts.cache_scope, reason, sync=req.sync_saves)
        if key is None:
            self.counters["cache_saves_dropped"] += 1
        else:
            req.rows_created += 1
        return key
