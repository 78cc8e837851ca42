"""Public calls over the shared KV prefix cache: tiers, rows, chunks, eviction.

The cache is process-wide (every loaded model uses it; rows are keyed by model
fingerprint, KV layout and cache scope). It starts with one RAM tier of 1 GiB in chunk storage (rows as manifests over
shared KV chunks of 64 positions); add shm and disk tiers with :func:`add_tier`, or replace
the whole stack with :func:`configure_cache` (``storage='rows'``: each row's KV one
whole-row chunk; docs/cache.md, "Chunk storage in the engine").
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .cache import DEFAULT_POLICY, get_policy
from .cache import shared
from .cache.chunk_tier_admin import fill_roots
from .errors import InvalidOption
from .options import check_bool, check_int, check_number
from .options.rules import one_of

# chunk_size bounds: below 16 positions a chunk's fixed costs (a 40-byte header, the KV
# layout of ~1 KB, a file and an fsync) outweigh its KV on small models; above 8192 a
# prefix is shared only in pieces longer than most system prompts
CHUNK_SIZE_MIN, CHUNK_SIZE_MAX = 16, 8192


def configure_cache(tiers: Sequence[Mapping[str, Any]], policy: Any = DEFAULT_POLICY, writer_workers: int | None = None,
                    writer_queue: int | None = None, storage: str = "chunks",
                    chunk_size: int | None = None) -> dict[str, Any]:
    """Replace the cache with these tiers (fastest first), e.g.
    ``[{'kind': 'ram', 'budget_bytes': 2**30}, {'kind': 'shm', 'budget_bytes': 4 * 2**30},
    {'kind': 'disk', 'root': '~/kv', 'budget_bytes': 50 * 2**30}]``. Persistent tiers are
    scanned: valid rows from before a restart are adopted, corrupt files removed and counted.
    Background saves run on ``writer_workers`` threads, at most ``writer_queue`` queued or
    running (a save past that is dropped and counted as saves_dropped); None = the cache's
    defaults (2 and 8).

    ``storage``: ``'chunks'`` (the default: each row a manifest over KV chunks of
    ``chunk_size`` positions, 16..8192, None = 64, shared by every row with the same
    prefix) or ``'rows'`` (``chunk_size`` None: each row's new KV one chunk, ending where
    the row ends or where a shared prefix does, a longer row's chunk serving the shorter rows
    it extends). Tiers: at most one of each kind, ``ram``, ``shm``, ``disk`` in that order,
    each with its budget and policy, shm and disk each in a directory of its own
    (``chunk_tier_admin.default_root``); a RAM tier alone keeps the chunks in memory, above
    shm or disk it holds copies of their chunks; chunks are demoted and promoted between
    the tiers one at a time: docs/cache.md, "Chunked storage"."""
    check_storage(storage, chunk_size, "cache")
    if isinstance(tiers, (Mapping, str, bytes)) or not isinstance(tiers, Sequence) or not tiers:
        raise InvalidOption("tiers", tiers, "a non-empty list of tier dicts", "cache")
    _check_policy("policy", policy, none_ok=False)
    check_int("writer_workers", writer_workers, 1, 64, none_ok=True, where="cache")
    check_int("writer_queue", writer_queue, 1, 65536, none_ok=True, where="cache")
    for i, spec in enumerate(tiers):
        if isinstance(spec, Mapping):
            _check_tier_names(f"tiers[{i}].", spec.get("name"), spec.get("policy"))
    tiers = fill_roots(tiers)
    return shared.configure(tiers, policy, writer_workers, writer_queue, storage, chunk_size).info()


def check_storage(storage: Any, chunk_size: Any, where: str) -> None:
    """``storage`` and ``chunk_size`` as configure_cache takes them (a cluster's replicas too)."""
    one_of(*shared.STORAGES)("storage", storage, where)
    if storage == "rows" and chunk_size is not None:
        raise InvalidOption("chunk_size", chunk_size, "None with storage='rows' (each row is one chunk)", where)
    check_int("chunk_size", chunk_size, CHUNK_SIZE_MIN, CHUNK_SIZE_MAX, none_ok=True, where=where)


def _check_policy(key: str, policy: Any, none_ok: bool = True) -> None:
    """An eviction policy the cache can make: a name, a policy class or instance, a function;
    None (the tier's or the cache's default) where ``none_ok``."""
    if policy is None and none_ok:
        return
    try:
        get_policy(policy)
    except (TypeError, ValueError) as e:
        raise InvalidOption(key, policy, f"an eviction policy ({e})", "tier") from None


def _check_tier_names(prefix: str, name: Any, policy: Any) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidOption(prefix + "name", name, "a non-empty string or None (the kind)", "tier")
    _check_policy(prefix + "policy", policy)


def add_tier(kind: str, name: str | None = None, root: str | None = None,
             budget_bytes: int | None = None, policy: Any = None, position: int | None = None) -> dict[str, Any]:
    """Add a tier below the others (or at ``position``); a persistent one is scanned. In
    chunk storage a tier goes to its kind's place (ram, shm, disk; one of each), and a shm or
    disk tier added under a lone RAM tier first takes RAM's chunks (docs/cache.md)."""
    _check_tier_names("", name, policy)
    check_int("position", position, 0, len(list_tiers()), none_ok=True)
    spec = {"kind": kind, "name": name, "root": root, "budget_bytes": budget_bytes, "policy": policy}
    cache = shared.shared_cache()
    spec = {k: v for k, v in spec.items() if v is not None}
    tier = shared.make_tier(cache.tier_spec(spec))
    try:
        cache.add_tier(tier, policy, position=position)
    except ValueError as e:
        raise InvalidOption("name", tier.name, f"a tier name not in use ({e})", "tier") from None
    return next(t for t in cache.list_tiers() if t["name"] == tier.name)


def remove_tier(name: str, purge: bool = False) -> int:
    """Detach a tier; returns the rows that left the cache (files stay unless ``purge``). In
    chunk storage the chunks no other tier holds leave, with the rows naming them; the last
    tier stays (docs/cache.md)."""
    check_bool("purge", purge)
    cache = shared.shared_cache()
    _tier_name(cache, name)
    return cache.remove_tier(name, purge=purge)


def _chunks() -> list[dict[str, Any]]:
    return shared.shared_cache().chunk_rows()


def _tier_name(cache: Any, name: Any) -> str:
    names = [t["name"] for t in cache.list_tiers()]
    if not isinstance(name, str) or name not in names:
        raise InvalidOption("tier", name, "the name of a tier: " + ", ".join(map(str, names)), "tier")
    return name


def list_tiers() -> list[dict[str, Any]]:
    return shared.shared_cache().list_tiers()


def cache_info() -> dict[str, Any]:
    """Storage (``'chunks'`` or ``'rows'``), the chunk size (None for whole rows), rows, pins,
    tiers (with their policies and usage) and counters."""
    return shared.shared_cache().info()


def cache_rows() -> list[dict[str, Any]]:
    """Every row: key preview, tokens, bytes, tier(s), save reason, hits, last hit, pinned,
    live and its eviction score under its tier's policy (lower goes first)."""
    return shared.shared_cache().rows()


def cache_chunks() -> list[dict[str, Any]]:
    """Every chunk of a chunked cache (``configure_cache(storage='chunks')``): key, parent,
    tokens, bytes, refcount (rows naming it), children, leaf, protected, its eviction score
    (lower goes first; only leaves are evicted), hits and tier. InvalidOption with rows."""
    return _chunks()


def wait_for_saves(timeout_s: float | None = 30.0) -> bool:
    """Wait until every background row save has been written (or dropped); False on
    timeout. complete()/stream() save finish rows off the decode path."""
    timeout = check_number("timeout_s", timeout_s, 0.0, threading.TIMEOUT_MAX, none_ok=True,
                           what="a number of seconds")
    return shared.shared_cache().wait_for_saves(timeout)


def evict_bytes(n: int, tier: str | None = None) -> int:
    """Free at least ``n`` bytes of ``tier`` by its policy, demoting down the tiers; pinned
    rows go last. Default tier: in chunk storage the last (where chunks leave the cache,
    leaves first), with rows the top one. Returns the bytes freed there."""
    check_int("n", n, 0, None)
    cache = shared.shared_cache()
    if tier is not None:
        _tier_name(cache, tier)
    return cache.evict_bytes(n, tier)


def pin_row(key: str) -> str | None:
    """Protect a row from eviction (one pin per namespace: returns the row it displaced)."""
    return _on_row(key, shared.shared_cache().pin)


def unpin_row(key: str) -> bool:
    """Let a row be evicted again; False if it was not pinned. InvalidOption for a key the
    cache does not hold (as pin_row)."""
    return _on_row(key, shared.shared_cache().unpin)


def _on_row(key: Any, op: Any) -> Any:
    if not isinstance(key, str):
        raise InvalidOption("key", key, "the key of a cached row (a string)")
    try:
        return op(key)
    except KeyError:
        raise InvalidOption("key", key, "the key of a cached row") from None
