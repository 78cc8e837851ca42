"""The whole-row model's rows (simcache.py): their bookkeeping, the prefix index over them,
and the pins. Not thread-safe (a replay runs in one thread).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from workbench.cache.prefix_index import PrefixIndex
from workbench.cache.types import Match, RowStats


@dataclass(slots=True)
class Entry:
    """One cached row: its namespace and its stats."""

    namespace: bytes
    stats: RowStats


class Catalog:
    """Rows by key, their prefix index, and at most one pinned row per namespace."""

    def __init__(self, block_size: int) -> None:
        self.index = PrefixIndex(block_size)
        self.entries: dict[str, Entry] = {}
        self.pins: dict[bytes, str] = {}
        self._seq = itertools.count(1)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def get(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def entry(self, key: str) -> Entry:
        entry = self.entries.get(key)
        if entry is None:
            raise KeyError(f"no cached row {key}")
        return entry

    def next_seq(self) -> int:
        """The logical access clock that breaks priority ties."""
        return next(self._seq)

    def add(self, key: str, namespace: bytes, tokens: bytes, stats: RowStats) -> Entry:
        """Register a row of ``tokens`` (int32 bytes; the caller has checked the key is new)."""
        entry = Entry(namespace, stats)
        self.index.insert(namespace, tokens, key)
        self.entries[key] = entry
        stats.seq = self.next_seq()
        if stats.pinned:
            self.pin(entry)
        return entry

    def forget(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        self.index.remove(key)
        if entry is not None and self.pins.get(entry.namespace) == key:
            del self.pins[entry.namespace]

    def touch(self, stats: RowStats, now: float) -> None:
        """Record a hit."""
        stats.hits += 1
        stats.last_hit_at = now
        stats.seq = self.next_seq()

    def pin(self, entry: Entry) -> str | None:
        """Pin a row; unpin and return the row previously pinned in its namespace."""
        key = entry.stats.key
        old = self.pins.get(entry.namespace)
        if old is not None and old != key and old in self.entries:
            self.entries[old].stats.pinned = False
        self.pins[entry.namespace] = key
        entry.stats.pinned = True
        return old if old != key else None

    def unpin(self, key: str) -> bool:
        """Unpin a row; False if it was not pinned."""
        entry = self.entry(key)
        was = entry.stats.pinned
        entry.stats.pinned = False
        if self.pins.get(entry.namespace) == key:
            del self.pins[entry.namespace]
        return was

    def longest_prefix(self, namespace: bytes, tokens: bytes) -> Match | None:
        return self.index.longest_prefix(namespace, tokens)
