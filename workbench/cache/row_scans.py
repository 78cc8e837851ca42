"""Adopting row files a tier's directory holds (a mixin of `TieredCache`): the start-up
`scan` of every persistent tier, and `adopt_files`, a scan of given names only (the rows
live peers published to a shared directory since the last look: `shared.PeerRows`).

Both verify headers, tokens and sizes (payloads at their first read, or with
`verify_payload`), delete and count what fails, and leave a row this process is writing
(published, not yet committed) or moving between tiers to its own commit. The host
provides `_lock`, `_counters`, `_catalog` and `_stack`, and `_inflight` (the puts being
written: key -> (namespace, tokens)).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from workbench.cache import store
from workbench.cache.catalog import Catalog
from workbench.cache.counters import Counters
from workbench.cache.format import RowMeta
from workbench.cache.levels import Level
from workbench.cache.placement import TierStack
from workbench.cache.store import ScanReport
from workbench.cache.tiers import FileTier
from workbench.cache.types import RowStats, SaveReason


class RowScans:
    _lock: threading.RLock
    _counters: Counters
    _catalog: Catalog
    _stack: TierStack
    _inflight: dict[str, tuple[bytes, bytes]]

    def scan(
        self, *, verify_payload: bool = False, expected_fingerprint: bytes | None = None
    ) -> dict[str, ScanReport]:
        """Adopt the rows persistent tiers already hold (start-up); remove what fails to
        verify and tmp orphans. Headers, tokens and sizes are checked here; payloads only
        with `verify_payload`, since every read verifies its payload anyway (a corrupt one
        is rejected and counted at its first read), so start-up costs the same with a full
        tier as with an empty one. With `expected_fingerprint` (a tier dedicated to one
        model), rows of other models are removed too. Pins come back from the row headers
        (the newest pinned row of each namespace)."""
        with self._lock:
            levels = [level for level in self._stack.levels if level.tier.persistent]
        reports: dict[str, ScanReport] = {}
        for level in levels:
            report = level.tier.scan(verify_payload=verify_payload, expected_fingerprint=expected_fingerprint)
            reports[level.name] = report
            self._take(level, report)
        return reports

    def adopt_files(self, tier: str, names: Iterable[str]) -> int:
        """Adopt the row files ``names`` (``<key>.kv``) of the persistent tier ``tier`` only,
        checked as ``scan`` checks each (what fails is deleted and counted; a name that is
        no row file or is gone is skipped); rows held already are left as they are. Returns
        how many rows were new to the cache. ValueError for a tier that is not a directory."""
        with self._lock:
            level = self._stack.level(tier)
            held = set(self._catalog.entries)
        if not isinstance(level.tier, FileTier):
            raise ValueError(f"tier {tier!r} keeps no files")
        wanted = [n for n in names if n[:-len(store.ROW_SUFFIX)] not in held]
        if not wanted:
            return 0
        report = store.scan_files(level.tier.root, wanted, max_payload=level.tier.payload_bound())
        return self._take(level, report)

    def _take(self, level: Level, report: ScanReport) -> int:
        """Count what a scan rejected, adopt its rows (oldest first), make room; returns how
        many rows were new to the cache."""
        for reason, n in report.rejected.items():
            self._counters.inc(f"rejected_{reason}", n)
        self._counters.inc("rejected_total", report.n_rejected)
        self._counters.inc("orphans_removed", report.orphans_removed)
        with self._lock:
            oldest_first = sorted(report.rows, key=lambda r: r[0].created_at)
            new = sum(self._adopt(level, meta, size) for meta, size in oldest_first)
            over = level.overflow()
            jobs = self._stack.evict_from(level, over) if over > 0 else []
        self._stack.run(jobs)
        return new

    def _adopt(self, level: Level, meta: RowMeta, size: int) -> bool:
        """Take a row found by a scan into the catalog and the level's accounting (not a row
        this process is putting or moving: its put or move commits it, with its own stats);
        True when the row was new to the catalog."""
        if meta.key in self._inflight or meta.key in self._stack.moving:
            return False
        if self._catalog.conflicts(meta.key, meta.namespace, meta.tokens):
            self._counters.inc("key_collisions")
            return False
        entry = self._catalog.get(meta.key)
        new = entry is None
        if entry is None:
            payload_len = size - level.tier.stored_size(meta.n_tokens, 0)
            stats = RowStats(meta.key, payload_len, meta.n_tokens, meta.created_at,
                             hits=meta.hits, reason=meta.reason)
            entry = self._catalog.add(meta, stats)
        if meta.key not in level:
            level.admit(entry.stats)
            level.add(entry.stats, size)
        if meta.pinned or meta.reason is SaveReason.AGENT_PREFIX:
            self._catalog.pin(entry)  # rows come sorted by creation time: the newest pin wins
        self._stack.update_tier(meta.key)
        return new


__all__ = ["RowScans"]
