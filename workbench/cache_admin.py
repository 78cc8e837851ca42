"""Public calls over the shared KV prefix cache: tiers, rows, eviction.

The cache is process-wide (every loaded model uses it; rows are keyed by model
fingerprint, KV layout and cache scope). It starts with one RAM tier of 1 GiB; add shm and
disk tiers with :func:`add_tier`, or replace the whole stack with :func:`configure_cache`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .engine import prefix_cache
from .errors import InvalidOption


def configure_cache(tiers: Sequence[Mapping[str, Any]], policy: Any = "frecency") -> dict[str, Any]:
    """Replace the cache with these tiers (fastest first), e.g.
    ``[{'kind': 'ram', 'budget_bytes': 2**30}, {'kind': 'shm', 'budget_bytes': 4 * 2**30},
    {'kind': 'disk', 'root': '~/kv', 'budget_bytes': 50 * 2**30}]``. Persistent tiers are
    scanned: valid rows from before a restart are adopted, corrupt files removed and counted."""
    if isinstance(tiers, Mapping) or not isinstance(tiers, Sequence) or not tiers:
        raise InvalidOption("tiers", tiers, "a non-empty list of tier dicts", "cache")
    return prefix_cache.configure(tiers, policy).info()


def add_tier(kind: str, name: str | None = None, root: str | None = None,
             budget_bytes: int | None = None, policy: Any = None, position: int | None = None) -> dict[str, Any]:
    """Add a tier below the others (or at ``position``); a persistent one is scanned."""
    spec = {"kind": kind, "name": name, "root": root, "budget_bytes": budget_bytes, "policy": policy}
    tier = prefix_cache.make_tier({k: v for k, v in spec.items() if v is not None})
    cache = prefix_cache.shared_cache()
    try:
        cache.add_tier(tier, policy, position=position)
    except ValueError as e:
        raise InvalidOption("name", tier.name, f"a tier name not in use ({e})", "tier") from None
    if tier.persistent:
        cache.scan()
    return next(t for t in cache.list_tiers() if t["name"] == tier.name)


def remove_tier(name: str, purge: bool = False) -> int:
    """Detach a tier; returns the rows that left the cache (files stay unless ``purge``)."""
    cache = prefix_cache.shared_cache()
    if name not in {t["name"] for t in cache.list_tiers()}:
        raise InvalidOption("name", name, "the name of a tier: " + ", ".join(t["name"] for t in cache.list_tiers()),
                            "tier")
    return cache.remove_tier(name, purge=purge)


def list_tiers() -> list[dict[str, Any]]:
    return prefix_cache.shared_cache().list_tiers()


def cache_info() -> dict[str, Any]:
    """Rows, pins, tiers (with their policies and usage) and counters."""
    return prefix_cache.shared_cache().info()


def cache_rows() -> list[dict[str, Any]]:
    """Every row: key preview, tokens, bytes, tier(s), save reason, hits, last hit, pinned,
    live and its eviction score under its tier's policy (lower goes first)."""
    return prefix_cache.shared_cache().rows()


def wait_for_saves(timeout_s: float | None = 30.0) -> bool:
    """Wait until every background row save has been written (or dropped); False on
    timeout. complete()/stream() save finish rows off the decode path."""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or timeout_s < 0):
        raise InvalidOption("timeout_s", timeout_s, "a number of seconds >= 0, or None (no bound)")
    return prefix_cache.shared_cache().wait_for_saves(timeout_s)


def evict_bytes(n: int, tier: str | None = None) -> int:
    """Free at least ``n`` bytes of ``tier`` (default: the top one), demoting rows down the
    tiers by its policy; pinned rows go last. Returns the bytes freed there."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidOption("n", n, "a non-negative number of bytes")
    return prefix_cache.shared_cache().evict_bytes(n, tier)


def pin_row(key: str) -> str | None:
    """Protect a row from eviction (one pin per namespace: returns the row it displaced)."""
    try:
        return prefix_cache.shared_cache().pin(key)
    except KeyError:
        raise InvalidOption("key", key, "the key of a cached row") from None


def unpin_row(key: str) -> bool:
    return prefix_cache.shared_cache().unpin(key)
