"""The tiered KV prefix cache: one index over RAM, shm and disk tiers.

Tiers are ordered fastest first. A new row goes to the first tier (or a named one) that can
hold it; making room evicts rows by that tier's policy and demotes them to the next tier
that can hold them; from the last tier they are dropped. Pinned and live rows go last.

Promotion is inclusive: a hit in a lower tier copies the row up to the top tier and keeps
the lower copy, so a read never removes a persistent copy (a crash after a promotion still
finds the row on disk), and demoting the row again later costs no write: a row evicted
from a tier that has a copy further down just drops the upper copy. Budgets count every
copy where it is stored.

Scanning (the start-up `scan`, `adopt_files` of given names): row_scans.py.

Concurrency: one RLock guards the catalog, the tier accounting and the policies. Payload
I/O (writing row files, reading them back, copying demoted rows) runs outside it (see
`placement`). A row being demoted is briefly in no tier; a `get` then returns None (a
miss, never a wrong payload).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from workbench.cache import keys
from workbench.cache.catalog import Catalog
from workbench.cache.counters import Counters
from workbench.cache.format import CorruptReason, CorruptRow, RowMeta
from workbench.cache.interface import Held, MaxPayload, PrefixCache, Restored, Saved, SequenceKv
from workbench.cache.keys import CacheNamespace, Tokens
from workbench.cache.levels import Level
from workbench.cache.placement import Job, TierStack
from workbench.cache.policies import DEFAULT_POLICY, PolicySpec, get_policy
from workbench.cache.queued import PendingSaves
from workbench.cache.row_scans import RowScans
from workbench.cache.tiers import Detached, RowMissing, Tier
from workbench.cache.types import HitKind, Match, RowStats, SaveReason


class TieredCache(RowScans, PrefixCache):
    """Content-addressed KV prefix cache over ordered tiers; all methods are thread-safe."""

    storage = "rows"

    def __init__(
        self,
        tiers: Iterable[Tier | tuple[Tier, PolicySpec]] = (),
        *,
        policy: PolicySpec = DEFAULT_POLICY,
        block_size: int = 16,
        clock: Callable[[], float] = time.time,
        save_workers: int = 2,
        max_pending_saves: int = 8,
    ) -> None:
        self._lock = threading.RLock()
        self._counters = Counters()
        self._catalog: Catalog = Catalog(block_size)
        self._stack = TierStack(self._catalog, self._counters, self._lock, clock)
        self._inflight: dict[str, tuple[bytes, bytes]] = {}  # puts being written: (ns, tokens)
        self._default_policy = policy
        self._clock = clock
        self.pending = PendingSaves(self._lock, self._counters, self._catalog, self.put, self.set_live,
                                    workers=save_workers, max_pending=max_pending_saves)
        for item in tiers:
            tier, spec = item if isinstance(item, tuple) else (item, None)
            self._add_level(tier, spec)

    # -- tiers -----------------------------------------------------------------------------
    def add_tier(self, tier: Tier, policy: PolicySpec | None = None, *, position: int | None = None) -> None:
        """Add a tier (slowest last unless `position` is given); a persistent one is scanned
        (its rows adopted). A policy name or class makes a fresh instance for this tier;
        never share one stateful instance between tiers."""
        self._add_level(tier, policy, position)
        if tier.persistent:
            self.scan()

    def tier_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(spec)

    def _add_level(self, tier: Tier, policy: PolicySpec | None = None, position: int | None = None) -> None:
        with self._lock:
            levels = self._stack.levels
            if any(level.name == tier.name for level in levels):
                raise ValueError(f"a tier named {tier.name!r} already exists")
            level = Level(tier, get_policy(self._default_policy if policy is None else policy))
            levels.insert(len(levels) if position is None else position, level)

    def remove_tier(self, name: str, *, purge: bool = False) -> int:
        """Detach a tier; rows held nowhere else leave the cache. Files stay on disk unless
        `purge` (a RAM tier is always cleared). Returns how many rows left the cache."""
        with self._lock:
            level = self._stack.level(name)
            self._stack.levels.remove(level)
            dropped = 0
            for key in list(level.sizes):
                entry = self._catalog.get(key)
                if entry is not None:
                    level.discard(entry.stats, evicted=False)
                if purge or not level.tier.persistent:
                    level.tier.delete(key)
                self._stack.update_tier(key)
                if self._stack.forget_if_homeless(key):
                    dropped += 1
            return dropped

    def list_tiers(self) -> list[dict[str, Any]]:
        with self._lock:
            return [level.describe() for level in self._stack.levels]

    # -- the engine's calls ----------------------------------------------------------------
    def restore(self, namespace: CacheNamespace, prompt: list[int], parent_key: str | None, kv: SequenceKv,
                max_payload: MaxPayload) -> Restored | None:
        """Load the row serving ``prompt`` (waiting briefly for one the writer pool has not
        stored yet: the previous turn's finish row, say). A state llama.cpp refuses (a
        malformed state, more cells than the context holds) leaves every tier, so no later
        request or process meets it (rejected_bad_state)."""
        match, by_key = self.find_prefix(namespace, prompt, parent_key)
        if match is None:
            return None
        payload = self.get(match.key, max_payload=max_payload(match.n_tokens))
        if payload is None:
            return None
        with self.timed("unpack_ns"):
            loaded = kv.load_state(payload, match.n_tokens)
        if not loaded:
            self.reject(match.key, CorruptReason.BAD_STATE)
            return None
        return Restored(match.n_tokens, HitKind.of(match.n_tokens, len(prompt), by_key=by_key), match.key,
                        match.tier)

    def save(self, namespace: CacheNamespace, tokens: list[int], kv: SequenceKv, reason: SaveReason, *,
             sync: bool = False, live: bool = False, marks: Sequence[int] = ()) -> Saved | None:
        """The sequence's whole state, copied on the caller's thread, stored synchronously or
        by the writer pool (a full pool drops it: saves_dropped). ``marks`` are not used."""
        key = keys.row_key(namespace.digest(), tokens)
        if key in self:
            return self.keep_stored(key, reason, live)
        with self.timed("pack_ns"):
            payload = kv.state()
        if sync:
            stored = self.put(namespace, tokens, payload, reason, live=live)
            return None if stored is None else Saved(stored, new=True)
        return Saved(key, new=True) if self.put_async(namespace, tokens, payload, reason, live=live) else None

    def held(self, namespace: CacheNamespace, tokens: Tokens) -> Held:
        raw = keys.token_bytes(tokens)
        with self._lock:
            match = self._catalog.longest_prefix(keys.digest_of(namespace), raw)
            return Held(0, None) if match is None else Held(match.n_tokens, self._stack.top_name(match.key))

    # -- rows ------------------------------------------------------------------------------
    def put(
        self,
        namespace: CacheNamespace,
        tokens: Tokens,
        payload: bytes,
        reason: SaveReason | str = SaveReason.FINISH,
        *,
        pinned: bool = False,
        live: bool = False,
        tier: str | None = None,
    ) -> str | None:
        """Store the KV `payload` of `tokens`; return its key, or None if it was not stored
        (too large for every tier, a key collision, or a write error). An agent_prefix
        row is pinned; at most one row per namespace is pinned. `live` marks it as a live
        session's KV (see `set_live`)."""
        reason = SaveReason.parse(reason)
        pinned = pinned or reason is SaveReason.AGENT_PREFIX
        ns = namespace.digest()
        raw = keys.token_bytes(tokens)
        if not raw:
            raise ValueError("cannot cache an empty prefix")
        key = keys.row_key_from_bytes(ns, raw)
        now = self._clock()
        with self._lock:
            start = 0 if tier is None else self._stack.levels.index(self._stack.level(tier))
            if key in self._catalog or key in self._inflight:
                return self._duplicate(key, ns, raw, pinned, live)
            self._inflight[key] = (ns, raw)
        stats = RowStats(key, len(payload), len(raw) // 4, now, pinned=pinned, reason=reason, live=live)
        meta = RowMeta(key, ns, namespace.fingerprint_bytes, raw, reason, now, 0, pinned)
        try:
            stored = self._stack.place(Job(meta, stats, Detached(payload=bytes(payload)), start, new=True))
        finally:
            with self._lock:
                self._inflight.pop(key, None)
        if stored:
            self._counters.inc(f"saves_{reason.name.lower()}")
        return key if stored else None

    def get(self, key: str, *, promote: bool = True, max_payload: int | None = None) -> bytes | None:
        """The payload of a row (verified if it comes from a file), or None. A hit in a lower
        tier is copied up to the top tier (unless `promote` is False); the lower copy stays.
        A file whose payload is longer than `max_payload` is rejected before it is read."""
        start = time.perf_counter_ns()
        with self._lock:
            entry = self._catalog.get(key)
            src = self._stack.top_index(key)
            if entry is None or src is None:
                self._counters.inc("get_misses")
                return None
            level = self._stack.levels[src]
        try:
            payload = level.tier.read(key, entry.fingerprint, max_payload)
        except (RowMissing, CorruptRow) as exc:
            with self._lock:
                self._stack.drop_copy(level, key, exc if isinstance(exc, CorruptRow) else None)
            self._counters.inc("get_misses")
            return None
        job = None
        with self._lock:
            # if the row left meanwhile the payload is still the verified KV of this key
            # (keys are content addresses), but there is no row left to update
            if self._catalog.get(key) is entry:
                self._catalog.touch(entry.stats, self._clock())
                for holder in self._stack.holding(key):
                    holder.hit(entry.stats)
                if src > 0 and promote:
                    job = Job(self._catalog.meta(key), entry.stats, Detached(payload=payload), 0, new=False)
                    self._stack.start_move(key)
        self._counters.inc("get_hits")
        if job is not None and self._stack.place(job):
            self._counters.inc("promotions")
        self._counters.inc("load_ns", time.perf_counter_ns() - start)
        return payload

    def lookup(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> Match | None:
        """Longest cached prefix of `tokens` across all tiers (nothing is loaded); counts
        the hit kind."""
        start = time.perf_counter_ns()
        raw = keys.token_bytes(tokens)
        with self._lock:
            match = self._catalog.longest_prefix(keys.digest_of(namespace), raw)
            if match is not None:
                match = Match(match.key, match.n_tokens, self._stack.top_name(match.key))
        self._count_kind(0 if match is None else match.n_tokens, len(raw) // 4)
        self._counters.inc("lookup_ns", time.perf_counter_ns() - start)
        return match

    def match_key(self, namespace: CacheNamespace | bytes, tokens: Tokens, key: str) -> Match | None:
        """The row `key` if it exists in `namespace` and its tokens are a prefix of `tokens`
        (a resume from a known key, e.g. a previous turn's finish key: no walk, tokens
        still compared). A row found counts as an exact hit (`HitKind.of(by_key=True)`); a
        miss counts nothing (the caller falls back to `lookup`)."""
        raw = keys.token_bytes(tokens)
        ns = keys.digest_of(namespace)
        with self._lock:
            entry = self._catalog.get(key)
            if entry is None or entry.namespace != ns:
                return None
            row = self._catalog.index.token_bytes(key)
            if not raw.startswith(row):
                return None
            match = Match(key, len(row) // 4, self._stack.top_name(key))
        self._count_kind(match.n_tokens, len(raw) // 4, by_key=True)
        return match

    def _count_kind(self, matched: int, prompt_len: int, *, by_key: bool = False) -> None:
        kind = HitKind.of(matched, prompt_len, by_key=by_key)
        self._counters.inc("misses_cold" if kind is HitKind.COLD else f"hits_{kind.value}")

    def cached_prefix_len(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> int:
        """Length of the longest cached prefix; a probe, so no counters move."""
        raw = keys.token_bytes(tokens)
        with self._lock:
            match = self._catalog.longest_prefix(keys.digest_of(namespace), raw)
        return 0 if match is None else match.n_tokens

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._catalog

    def __len__(self) -> int:
        with self._lock:
            return len(self._catalog)

    def keys(self) -> list[str]:
        """Keys of all rows, in insertion order."""
        with self._lock:
            return list(self._catalog.entries)

    def remove(self, key: str) -> bool:
        """Delete a row from every tier."""
        with self._lock:
            entry = self._catalog.get(key)
            if entry is None:
                return False
            for level in self._stack.levels:
                if level.discard(entry.stats, evicted=False):
                    level.tier.delete(key)
            self._catalog.forget(key)
            return True

    def reject(self, key: str, reason: CorruptReason) -> bool:
        """Delete a row its consumer refused although its file verified (llama.cpp refused
        the state: BAD_STATE) from every tier, counted as rejected_<reason>."""
        removed = self.remove(key)
        if removed:
            self._counters.inc(f"rejected_{reason.value}")
            self._counters.inc("rejected_total")
        return removed

    def evict_bytes(self, n: int, tier: str | None = None) -> int:
        """Free at least `n` bytes in `tier` (default: the top tier), demoting the evicted
        rows down the tiers (dropped from the last). Returns the bytes freed there."""
        with self._lock:
            if not self._stack.levels:
                return 0
            level = self._stack.levels[0] if tier is None else self._stack.level(tier)
            before = level.used
            jobs = self._stack.evict_from(level, n)
            freed = before - level.used
        self._stack.run(jobs)
        return freed

    # -- pins and live rows ----------------------------------------------------------------
    def pin(self, key: str) -> str | None:
        """Protect a row; the previously pinned row of its namespace (returned) is unpinned."""
        with self._lock:
            return self._catalog.pin(self._catalog.entry(key))

    def unpin(self, key: str) -> bool:
        """Unpin a row; False if it was not pinned."""
        with self._lock:
            return self._catalog.unpin(key)

    def set_live(self, key: str, live: bool = True) -> bool:
        """Mark a row as the KV of a live session (protected from eviction while live); a
        row whose save is queued gets the mark when it lands."""
        with self._lock:
            entry = self._catalog.get(key)
            if entry is None:
                return self.pending.defer_live(key, live)
            entry.stats.live = live
            return True

    # -- views -----------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One dict per row, all from one snapshot under the lock: `now` (one clock reading,
        the same in every row: a row's age is now - created_at, its idle time now - its last
        use), its `score` at `now` under the policy of the top tier holding it, and `seq`, the
        logical access clock breaking ties: a tier evicts by (pinned or live, score, seq),
        lowest first (s3fifo's score approximates its order)."""
        out = []
        with self._lock:
            now = self._clock()
            for key, entry in self._catalog.entries.items():
                s = entry.stats
                holders = self._stack.holding(key)
                top = holders[0] if holders else None
                out.append({
                    "key": key, "key_preview": key[:12], "scope": entry.namespace.hex()[:12],
                    "n_tokens": s.n_tokens, "bytes": s.size_bytes,
                    "tier": None if top is None else top.name, "tiers": [h.name for h in holders],
                    "reason": s.reason.name.lower(), "hits": s.hits, "last_hit_at": s.last_hit_at,
                    "created_at": s.created_at, "pinned": s.pinned, "live": s.live,
                    "score": None if top is None else top.score(s, now), "seq": s.seq, "now": now,
                })
        return out

    def counters(self) -> dict[str, int]:
        """A snapshot of the counters (see `counters.py`) plus gauges bytes_<tier>,
        rows_<tier> and rows."""
        snap = self._counters.snapshot()
        with self._lock:
            for level in self._stack.levels:
                snap[f"bytes_{level.name}"] = level.used
                snap[f"rows_{level.name}"] = len(level.sizes)
            snap["rows"] = len(self._catalog)
        return snap

    def record_ns(self, name: str, ns: int) -> None:
        """Add to a time total kept with the cache counters (the engine records pack_ns
        and unpack_ns, the time spent packing/unpacking llama.cpp sequence state)."""
        self._counters.inc(name, ns)

    def timed(self, name: str) -> AbstractContextManager[None]:
        """`with cache.timed("pack_ns"): ...` adds the block's duration to `name`."""
        return self._counters.timer(name)

    def info(self) -> dict[str, Any]:
        with self._lock:
            return {"storage": self.storage, "rows": len(self._catalog), "block_size": self._catalog.index.block_size,
                    "pinned": len(self._catalog.pins), "tiers": self.list_tiers(),
                    "counters": self.counters()}

    def close(self, wait: bool = True) -> None:
        """Finish (or abandon) pending background saves."""
        self.pending.close(wait=wait)

    # -- internals (lock held) -------------------------------------------------------------
    def _duplicate(self, key: str, ns: bytes, raw: bytes, pinned: bool, live: bool) -> str | None:
        if self._catalog.conflicts(key, ns, raw) or self._inflight.get(key, (ns, raw)) != (ns, raw):
            self._counters.inc("key_collisions")
            return None
        self._counters.inc("saves_duplicate")
        entry = self._catalog.get(key)
        if pinned and entry is not None:
            self._catalog.pin(entry)
        if live and entry is not None:
            entry.stats.live = True
        return key
