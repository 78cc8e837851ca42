"""The process-wide prefix cache: one cache every loaded model shares (a :class:`ChunkedCache`:
chunks of ``chunk_size`` positions by default, whole rows with ``storage='rows'``), and the
tiers users describe as dicts (``configure_cache``, ``add_tier``)."""

from __future__ import annotations

import inspect
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidOption
from .chunk_store import DEFAULT_CHUNK_SIZE, WHOLE_ROWS
from .chunk_peer_scan import PeerMemo
from .chunked import ChunkedCache, chunked_cache
from .interface import PrefixCache
from .policies import DEFAULT_POLICY
from .tiers import DiskTier, RamTier, ShmTier, Tier

DEFAULT_RAM_BUDGET = 1 << 30
STORAGES = ("rows", "chunks")
_lock = threading.Lock()
_cache: PrefixCache | None = None


def shared_cache() -> PrefixCache:
    """The cache every model uses; created on first use with one RAM tier (1 GiB)."""
    global _cache
    with _lock:
        if _cache is None:
            _cache = chunked_cache([(RamTier("ram", DEFAULT_RAM_BUDGET), None)], DEFAULT_POLICY, DEFAULT_CHUNK_SIZE)
        return _cache


def configure(tiers: Sequence[Mapping[str, Any]], policy: Any = DEFAULT_POLICY, writer_workers: int | None = None,
              writer_queue: int | None = None, storage: str = "chunks",
              chunk_size: int | None = None) -> PrefixCache:
    """Replace the shared cache with one built from tier specs (fastest first); persistent
    tiers are scanned, so rows saved before a restart are adopted (and bad files removed).
    Its writer pool: ``writer_workers`` threads, ``writer_queue`` saves queued or running
    (None: ChunkedCache's defaults, 2 and 8). ``storage='chunks'``: rows as manifests over
    chunks of ``chunk_size`` positions (None: DEFAULT_CHUNK_SIZE); ``'rows'``: the same store
    with whole-row chunks (``WHOLE_ROWS``; ``chunk_size`` must be None)."""
    cache = build(tiers, policy, writer_workers, writer_queue, storage, chunk_size)
    cache.scan()
    return install(cache)


def build(tiers: Sequence[Mapping[str, Any]], policy: Any = DEFAULT_POLICY, writer_workers: int | None = None,
          writer_queue: int | None = None, storage: str | None = None, chunk_size: int | None = None) -> PrefixCache:
    """A cache as ``configure`` builds it (None: configure's defaults), not scanned yet and
    not installed: a process whose tiers live peers share (a cluster's replica restarting)
    adopts their files with ``PeerRows.adopt(force=True)`` instead of the start-up scan,
    which would delete what a peer has in flight."""
    defaults = inspect.signature(configure).parameters
    storage = defaults["storage"].default if storage is None else storage
    pool: dict[str, Any] = {k: v for k, v in (("save_workers", writer_workers), ("max_pending_saves", writer_queue))
                            if v is not None}
    return make_chunked(tiers, policy, store_chunk_size(storage, chunk_size), pool)


def store_chunk_size(storage: str, chunk_size: int | None) -> int:
    """The chunk size of the store a ``storage`` and ``chunk_size`` describe (whole rows:
    WHOLE_ROWS; ``cache_admin.check_storage`` checks the pair)."""
    if storage == "rows":
        return WHOLE_ROWS
    return DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size


def install(cache: PrefixCache) -> PrefixCache:
    """Make ``cache`` the shared cache (the old one is closed)."""
    global _cache
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


def make_chunked(tiers: Sequence[Mapping[str, Any]], policy: Any, chunk_size: int,
                 pool: Mapping[str, Any]) -> ChunkedCache:
    """A chunked cache over these tiers (at most one each of ram, shm, disk, fastest first;
    ``chunked.chunked_cache``). A directory tier needs an explicit root of its own
    (``chunk_tier_admin.fill_roots`` gives one): its scan deletes what is not the store's."""
    for spec in tiers:
        if isinstance(spec, Mapping) and spec.get("kind") in ("shm", "disk") and spec.get("root") is None:
            raise InvalidOption("root", None, "a directory of its own for chunk storage (its scan deletes "
                                "files that are not the store's)", "tier")
    return chunked_cache([(make_tier(s), s.get("policy")) for s in tiers], policy, chunk_size, **pool)


class PeerRows:
    """What other processes publish to this process's persistent tiers (a shm or disk root
    they share: the replicas of a cluster, two notebooks on one machine), adopted without
    an explicit rescan. :meth:`adopt`, called where a lookup is about to happen, costs a
    stat per persistent tier when nothing changed; a directory that changed is looked at
    with the cache's adopt-only rescan (``adopt_peer_files``, chunk_peer_scan.py): new chunks
    parent first, new manifests whose chunks are held, chunks whose files a peer removed
    forgotten, nothing deleted. When it skipped something of this process's own in flight,
    the next look lists again.

    The publish protocol makes a file visible only once whole and fsynced, so a peer's row
    is adopted as a restart adopts it."""

    # mtimes are coarse (a clock tick): a directory changed within this of its last listing
    # is listed again, so a row published in the same tick as that listing is not missed
    FRESH_NS = 1_000_000_000

    def __init__(self) -> None:
        self._looked: dict[str, tuple[int, int]] = {}  # root -> (its mtime, when it was listed)
        self._lock = threading.Lock()  # one look at a time: a second caller waits for the scan
        # a cache's tiers are fixed between looks: its roots once, and the rescan's memo
        self._memo: tuple[weakref.ref[PrefixCache], int, dict[str, str], PeerMemo] | None = None

    def adopt(self, cache: PrefixCache | None = None, *, force: bool = False) -> int:
        """Adopt what peers published since the last look (every persistent tier with
        ``force``, changed or not); returns how many rows were new to the cache."""
        cache = shared_cache() if cache is None else cache
        with self._lock:
            roots, memo = self._tiers(cache)
            changed = [root for root in roots if self._changed(root) or force]
            if not changed:
                return 0
            result = cache.adopt_peer_files(memo)
            if result.deferred:
                for root in changed:
                    self._looked.pop(root, None)
            return result.rows

    def _tiers(self, cache: PrefixCache) -> tuple[dict[str, str], PeerMemo]:
        """The persistent tiers' roots -> their names, and the rescan's memo for ``cache``."""
        held = self._memo
        if held is not None and held[0]() is cache and held[1] == cache.tier_generation:
            return held[2], held[3]
        roots = {str(t["root"]): str(t["name"]) for t in cache.list_tiers() if t.get("persistent") and t.get("root")}
        self._memo = (weakref.ref(cache), cache.tier_generation, roots, PeerMemo())
        return roots, self._memo[3]

    def _changed(self, root: str) -> bool:
        try:
            mtime = os.stat(root).st_mtime_ns
        except OSError:
            return False
        looked = self._looked.get(root)
        if looked is not None and looked[0] == mtime and looked[1] - mtime > self.FRESH_NS:
            return False
        self._looked[root] = (mtime, time.time_ns())
        return True
