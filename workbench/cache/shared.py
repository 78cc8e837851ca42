"""The process-wide prefix cache: one :class:`TieredCache` every loaded model shares, and
the tiers users describe as dicts (``configure_cache``, ``add_tier``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidOption
from .tiered import TieredCache
from .tiers import DiskTier, RamTier, ShmTier, Tier

DEFAULT_RAM_BUDGET = 1 << 30
_lock = threading.Lock()
_cache: TieredCache | None = None


def shared_cache() -> TieredCache:
    """The cache every model uses; created on first use with one RAM tier (1 GiB)."""
    global _cache
    with _lock:
        if _cache is None:
            _cache = TieredCache([RamTier("ram", DEFAULT_RAM_BUDGET)])
        return _cache


def configure(tiers: Sequence[Mapping[str, Any]], policy: Any = "frecency", writer_workers: int | None = None,
              writer_queue: int | None = None) -> TieredCache:
    """Replace the shared cache with one built from tier specs (fastest first); persistent
    tiers are scanned, so rows saved before a restart are adopted (and bad files removed).
    Its writer pool: ``writer_workers`` threads, ``writer_queue`` saves queued or running
    (None: TieredCache's defaults)."""
    global _cache
    built: list[Tier | tuple[Tier, Any]] = [(make_tier(spec), spec.get("policy")) for spec in tiers]
    pool: dict[str, Any] = {k: v for k, v in (("save_workers", writer_workers), ("max_pending_saves", writer_queue))
                            if v is not None}
    cache = TieredCache(built, policy=policy, **pool)
    cache.scan()
    with _lock:
        old, _cache = _cache, cache
    if old is not None:
        old.close()
    return cache


TIER_KINDS = {"ram": RamTier, "shm": ShmTier, "disk": DiskTier}
TIER_KEYS = ("kind", "name", "root", "budget_bytes", "policy")


def make_tier(spec: Mapping[str, Any]) -> Tier:
    """A tier from ``{'kind': 'ram'|'shm'|'disk', 'name', 'root', 'budget_bytes', 'policy'}``."""
    if not isinstance(spec, Mapping):
        raise InvalidOption("tier", spec, "a dict with at least 'kind'", "tier")
    for key in spec:
        if key not in TIER_KEYS:
            raise InvalidOption(str(key), spec[key], "one of the tier keys " + ", ".join(TIER_KEYS), "tier")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in TIER_KINDS:
        raise InvalidOption("kind", kind, "'ram', 'shm' or 'disk'", "tier")
    budget = spec.get("budget_bytes", DEFAULT_RAM_BUDGET if kind == "ram" else None)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise InvalidOption("budget_bytes", budget, "a non-negative int or None (unbounded)", "tier")
    name = spec.get("name") or kind
    if kind == "ram":
        if spec.get("root") is not None:
            raise InvalidOption("root", spec["root"], "no root for a ram tier", "tier")
        return RamTier(name, budget)
    root = spec.get("root")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise InvalidOption("root", root, "a directory path (str or PathLike)", "tier")
    try:
        return TIER_KINDS[kind](name, root, budget)
    except (OSError, ValueError) as e:  # cannot create it, not a directory, not private; a NUL or
        # a lone surrogate in the path (ValueError, UnicodeEncodeError)
        raise InvalidOption("root", root, f"a private directory this process can create and write ({e})",
                            "tier") from None
