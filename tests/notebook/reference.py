"""A slow, obvious replay of a trace with real token ids: the reference the eviction lab's fast
replay (virtual tokens, its plan, the native replay) must agree with under eviction, at
budgets a real model run would take too long to fill. The cache is a real ChunkStore for the
chunk model (``cache_factory``: tests/unit/test_lab_vs_store.py's ``store_cache``) or, for
the whole-row model, ``WholeRows`` below: every row stored in full, shared with no other,
victims ranked in full at each eviction by the cache's policies (what the cache's row
storage did before issue 26; the lab's SimCache ranks lazily). The save rule and the hit
kinds are the engine's own (cache/save_rule.py, HitKind), checked against the engine itself
in test_lab_model.py, request by request; what this checks is the lab's replay of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.cache import CacheNamespace, HitKind
from workbench.cache.keys import row_key_from_bytes, token_bytes
from workbench.cache.policies import PolicySpec, get_policy
from workbench.cache.save_rule import SaveSettings, prefill_saves
from workbench.cache.types import Match, RowStats, SaveReason
from workbench.lab.row_catalog import Catalog
from workbench.lab.row_level import Level
from workbench.lab.traces import Trace

NS = CacheNamespace("cd" * 32, scope="reference")


class WholeRows:
    """One tier of ``size_bytes`` holding whole rows (a row's bytes: its payload), the plain
    way: a catalog (prefix index, one pin per namespace), a level (budget, the policy's
    hooks) asked for victims, in full, whenever a put needs room."""

    def __init__(self, size_bytes: int, policy: PolicySpec, clock: Callable[[], float], block_size: int) -> None:
        self.catalog = Catalog(block_size)
        self.level = Level(size_bytes, get_policy(policy))
        self.clock = clock

    def __contains__(self, key: object) -> bool:
        return key in self.catalog

    def lookup(self, ns: CacheNamespace, tokens: list[int]) -> Match | None:
        return self.catalog.longest_prefix(ns.digest(), token_bytes(tokens))

    def get(self, key: str) -> bool | None:
        entry = self.catalog.get(key)
        if entry is None:
            return None
        self.catalog.touch(entry.stats, self.clock())
        self.level.hit(entry.stats)
        return True

    def pin(self, key: str) -> None:
        self.catalog.pin(self.catalog.entry(key))

    def put(self, ns: CacheNamespace, tokens: list[int], payload: bytes, reason: str, **_: Any) -> None:
        raw, why = token_bytes(tokens), SaveReason.parse(reason)
        key = row_key_from_bytes(ns.digest(), raw)
        pinned = why is SaveReason.AGENT_PREFIX
        if key in self.catalog:
            if pinned:
                self.pin(key)
            return
        if not self.level.fits(len(payload)):
            return
        row = RowStats(key, len(payload), len(tokens), self.clock(), pinned=pinned, reason=why)
        self.level.admit(row)
        rows = {k: e.stats for k, e in self.catalog.entries.items()}
        for victim in self.level.choose_victims(self.level.overflow(len(payload)), rows, self.clock()):
            self.level.discard(rows[victim], evicted=True)
            self.catalog.forget(victim)
        self.catalog.add(key, ns.digest(), raw, row)
        self.level.add(row, len(payload))


def reference_replay(trace: Trace, policy: PolicySpec, size_bytes: int, bytes_per_token: int, *,
                     checkpoint_every: int | None = 2048, block_size: int = 16, min_tokens: int = 16,
                     saves: tuple[str, ...] = ("checkpoint", "agent_prefix", "prompt", "finish"),
                     checkpoint_min: int = 0, checkpoint_max: int | None = None,
                     cache_factory: Callable[..., Any] | None = None,
                     ) -> list[tuple[str, int]]:
    """(hit kind, prefill tokens saved) per request, following the engine's rules
    (`Engine._start`, `_save_points`, `_finish`), written out the plain way. The cache is
    ``WholeRows``, or `cache_factory(size_bytes, policy, clock)` (the same calls)."""
    clock = [0.0]
    if cache_factory is None:
        cache: Any = WholeRows(size_bytes, policy, lambda: clock[0], block_size)
    else:
        cache = cache_factory(size_bytes, policy, lambda: clock[0])
    rule = SaveSettings(checkpoint_every if "checkpoint" in saves else None, checkpoint_min, checkpoint_max,
                        min_tokens)
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

        agent = None
        if "agent_prefix" in saves and req.pin_segments:
            agent = sum(int(trace.seg_len[s]) for s in req.prompt[:req.pin_segments])
        if agent is not None and agent <= start:   # pinned at admission, before any save
            from workbench.cache.keys import row_key

            key = row_key(NS.digest(), prompt[:agent])
            if key in cache:
                cache.pin(key)
        for pos, what in prefill_saves(plen, start, rule, agent=agent):   # the engine's rule
            if what in saves:
                put(pos, "agent_prefix" if what == "agent_prefix" else reason)
        if "finish" in saves and req.reply is not None:
            full = prompt + trace.segment_tokens(req.reply)
            n = len(full) - 1  # the end-of-turn token is sampled, never decoded
            if n > plen:
                cache.put(NS, full[:n], b"\0" * (n * bytes_per_token), "finish")
    return out
