"""A slow, obvious replay of a trace through a real TieredCache with real token ids: the
reference the eviction lab's fast replay (virtual tokens, SimCache) must agree with under
eviction, at budgets a real model run would take too long to fill. The engine's rules
themselves are checked against the engine (test_lab_model.py, request by request); the
hit kinds here come from the one definition, HitKind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.cache import CacheNamespace, HitKind, RamTier, TieredCache
from workbench.cache.policies import PolicySpec
from workbench.lab.traces import Trace

NS = CacheNamespace("cd" * 32, scope="reference")


def reference_replay(trace: Trace, policy: PolicySpec, size_bytes: int, bytes_per_token: int, *,
                     checkpoint_every: int | None = 2048, block_size: int = 16, min_tokens: int = 16,
                     saves: tuple[str, ...] = ("checkpoint", "agent_prefix", "prompt", "finish"),
                     checkpoint_min: int = 0, checkpoint_max: int | None = None,
                     cache_factory: Callable[..., Any] | None = None,
                     ) -> list[tuple[str, int]]:
    """(hit kind, prefill tokens saved) per request, following the engine's rules
    (`Engine._start`, `_save_points`, `_finish`), written out the plain way. The cache is a
    one-tier TieredCache, or `cache_factory(size_bytes, policy, clock)` (the same calls)."""
    clock = [0.0]
    if cache_factory is None:
        cache = TieredCache([RamTier("ram", size_bytes)], policy=policy, clock=lambda: clock[0],
                            block_size=block_size)
    else:
        cache = cache_factory(size_bytes, policy, lambda: clock[0])
    step = None
    if "checkpoint" in saves and checkpoint_every is not None:
        step = -(-checkpoint_every // block_size) * block_size
    out = []
    for i in range(len(trace)):
        req = trace[i]
        clock[0] = req.arrival_s
        prompt = trace.prompt_token_ids(i)
        plen = len(prompt)
        # no lookup for a one-token prompt: nothing could be reused
        match = cache.lookup(NS, prompt) if plen > 1 else None
        matched = 0
        if match is not None and cache.get(match.key) is not None:
            matched = match.n_tokens
        start = min(matched, plen - 1)  # the last prompt token is always decoded alone
        kind = HitKind.of(matched, plen).value
        out.append((kind, start))
        reason = "continued" if matched else "cold"

        def put(n: int, why: str, prompt: list[int] = prompt, **kw: Any) -> None:
            cache.put(NS, prompt[:n], b"\0" * (n * bytes_per_token), why, **kw)

        points: dict[int, tuple[str, dict[str, Any]]] = {}
        if step:
            for pos in range(step, plen - 1, step):
                if pos > start and checkpoint_min <= pos and (checkpoint_max is None or pos <= checkpoint_max):
                    points[pos] = (reason, {})
        agent = None
        if "agent_prefix" in saves and req.pin_segments:
            agent = sum(int(trace.seg_len[s]) for s in req.prompt[:req.pin_segments])
        if "prompt" in saves and plen - 1 >= min_tokens and plen - 1 > start and agent != plen:
            points[plen - 1] = (reason, {})  # the prompt without its last token
        if agent is not None:
            if agent > start:
                points[agent] = ("agent_prefix", {})
            else:
                from workbench.cache.keys import row_key

                key = row_key(NS.digest(), prompt[:agent])
                if key in cache:
                    cache.pin(key)
        for pos, (why, kw) in sorted(points.items()):
            put(pos, why, **kw)
        if "finish" in saves and req.reply is not None:
            full = prompt + trace.segment_tokens(req.reply)
            n = len(full) - 1  # the end-of-turn token is sampled, never decoded
            if n > plen:
                cache.put(NS, full[:n], b"\0" * (n * bytes_per_token), "finish")
    return out
