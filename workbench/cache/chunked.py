"""ChunkedCache: the prefix cache (the one implementation of ``PrefixCache``) behind the calls
the engine and cache_admin make of it, over one :class:`~workbench.cache.chunk_store.ChunkStore`.

Both storages are this cache: ``configure_cache(storage='chunks', chunk_size=...)``, the
default, and ``storage='rows'``, whole rows, which is the same store with chunks of
``WHOLE_ROWS`` positions (no grid: a row's new KV is one chunk ending where the row ends or
at a mark, and a longer row's chunk absorbs a shorter one it extends). In short:

* ``put`` takes the payloads of a row's chunks from ``missing()`` on (the engine cuts only
  those out of llama.cpp); ``lookup`` / ``match_key`` return a
  :class:`ChunkHit` (the serving chunk keys with the row key, or None for a chain of full
  chunks no row names), and ``read`` gives the chain's verified payloads, to be joined with
  ``n_tokens``.
* Storage is one store over tiers (RAM, shm, disk, fastest first; chunk_store.py): each
  chunk in one or more of them, demoted and promoted one at a time, a chain spanning them.
* ``reject_chain`` (a join llama.cpp's side refused although every checksum verified)
  drops the chain from its first chunk, with every row and chunk that continues it: which
  chunk was wrong is not known, so nothing of it is served again.

Thread-safe: the store's lock serialises the bookkeeping; payload reads and writes run
outside it (chunk_tier_moves.py), so a lookup does not wait behind a save's fsync.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from workbench.cache import keys
from workbench.cache import chunk_tier_admin
from workbench.cache import chunk_peer_scan
from workbench.cache.chunk_peer_scan import PeerMemo, PeerScan
from workbench.cache.chunk_catalog import ChunkPlan
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunk_tier_admin import CHUNK_TIERS, in_order, to_chunk_tier
from workbench.cache.chunk_tier_views import row_dicts, tier_dicts, tier_of
from workbench.cache.chunk_tier_admin import fill_roots
from workbench.cache.format import CorruptReason, CorruptRow
from workbench.cache.interface import Held, MaxPayload, PrefixCache, Restored, Saved, SequenceKv
from workbench.cache.keys import CacheNamespace, Tokens
from workbench.cache.policies import DEFAULT_POLICY, PolicySpec
from workbench.cache.queued import PendingSaves
from workbench.cache.tiers import Tier
from workbench.cache.types import HitKind, SaveReason
from workbench.errors import InvalidOption


@dataclass(slots=True, frozen=True)
class ChunkHit:
    """A stored prefix of ``n_tokens`` served by ``chunks`` (``key``: the row, None for a
    chain of full chunks); ``tier``: the slowest tier holding one of the chunks."""

    key: str | None
    n_tokens: int
    chunks: tuple[bytes, ...]
    tier: str | None


class _Prefixes:
    """The store's longest stored prefix and row keys, for PendingSaves' wait."""

    def __init__(self, store: ChunkStore) -> None:
        self._store = store

    def longest_prefix(self, namespace: bytes, tokens: bytes) -> Any:
        return self._store.lookup(namespace, tokens)

    def __contains__(self, key: object) -> bool:
        return key in self._store


#: The shortest chain no row names that a lookup serves (the default of the load option
#: cache_min_tokens, the shortest prefix worth a row): a prompt agreeing with a stored chunk
#: on a few leading tokens only (a chat template's opening) is cold,
#: rather than a partial hit joining a chunk to reuse those few tokens.
MIN_CHAIN_TOKENS = 16


class ChunkedCache(PrefixCache):

    def __init__(self, store: ChunkStore, *, dir_kind: str | None = None, save_workers: int = 2,
                 max_pending_saves: int = 8, min_chain_tokens: int = 1) -> None:
        self._lock: threading.RLock = store.lock
        if dir_kind is not None and store.tiers[-1].persistent:
            store.tiers[-1].kind = dir_kind  # 'disk' or 'shm': what the store's directory is
        self._store = store
        self._counters = store.counters
        self.pending = PendingSaves(self._lock, self._counters, _Prefixes(store), self.put, self.set_live,
                                    workers=save_workers, max_pending=max_pending_saves)
        self._row_hits: dict[str, tuple[int, float]] = {}  # row -> (hits, last hit)
        self.default_policy: PolicySpec = DEFAULT_POLICY  # an added tier's policy when it names none
        self.min_chain_tokens = min_chain_tokens  # chunked_cache: MIN_CHAIN_TOKENS
        self.tier_generation = 0  # +1 at each add_tier / remove_tier: what caches the tiers' roots keys on

    @property
    def chunk_size(self) -> int:
        return self._store.chunk_size

    @property
    def storage(self) -> str:
        """'rows' (whole rows: chunks of ``WHOLE_ROWS``) or 'chunks'."""
        return "rows" if self._store.chunk_size == WHOLE_ROWS else "chunks"

    def scan(self) -> dict[str, int]:
        """Adopt what the persistent tiers hold (start-up); rejected files by reason."""
        with self._lock:
            return self._store.scan()

    def adopt_peer_files(self, memo: PeerMemo | None = None) -> PeerScan:
        """Adopt what live peers (other processes sharing the directories) published since
        the last look, deleting nothing; forget chunks whose files peers removed
        (chunk_peer_scan.py). ``memo``: the caller's, kept between looks."""
        return chunk_peer_scan.rescan(self._store, memo)

    def add_tier(self, tier: Tier, policy: PolicySpec | None = None, *, position: int | None = None) -> None:
        """Add a tier at its kind's place (chunk_tier_admin.py: RAM's lone chunks are first
        written to a persistent tier added under it); a persistent one is scanned."""
        chunk_tier = to_chunk_tier(tier, self.default_policy if policy is None else policy)
        self.wait_for_saves(chunk_tier_admin.BUSY_S)
        chunk_tier_admin.add_tier(self._store, chunk_tier, position)
        self.tier_generation += 1
        if chunk_tier.persistent:
            self.scan()

    def remove_tier(self, name: str, *, purge: bool = False) -> int:
        """Detach a tier (chunk_tier_admin.py); returns how many rows left the cache."""
        self.wait_for_saves(chunk_tier_admin.BUSY_S)
        left = chunk_tier_admin.remove_tier(self._store, name, purge)
        self.tier_generation += 1
        return left

    def tier_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A shm or disk tier without a root gets its kind's default chunk directory."""
        return dict(fill_roots([spec])[0])

    # -- the engine's calls ----------------------------------------------------------------
    def restore(self, namespace: CacheNamespace, prompt: list[int], parent_key: str | None, kv: SequenceKv,
                max_payload: MaxPayload) -> Restored | None:
        """Join the longest stored prefix of ``prompt`` into ``kv``. The chain's payloads are
        verified here (checksums, keys recomputed); the native join checks keys, positions
        and layout again before llama.cpp sees the state, ending at the match's length (a
        row served by a longer chunk's first positions, a prompt that leaves a chunk). A
        refused join removes the chain (``reject_chain``: rejected_bad_state)."""
        hit, by_key = self.find_prefix(namespace, prompt, parent_key)
        if hit is None:
            return None
        pieces = self.read(hit, max_payload(self._longest(hit)))
        if pieces is None:
            return None
        with self.timed("unpack_ns"):
            loaded = kv.load_chunks(pieces, hit.chunks, hit.n_tokens)
        if not loaded:
            self.reject_chain(hit.chunks, CorruptReason.BAD_STATE)
            return None
        shared = hit.n_tokens if hit.key is not None and self.is_pinned(hit.key) else None
        saved_by, saved_at = self.origin(hit)
        return Restored(hit.n_tokens, HitKind.of(hit.n_tokens, len(prompt), by_key=by_key), hit.key, hit.tier,
                        shared, saved_by, saved_at)

    def origin(self, hit: ChunkHit) -> tuple[str | None, float | None]:
        """Who saved what ``hit`` serves, and when: its row's manifest; for a chain no row
        names, the oldest row through its last chunk (the save that wrote it). (None, None)
        when those rows went meanwhile."""
        with self._lock:
            m = self._store.rows.get(hit.key) if hit.key is not None else None
            if m is None and hit.chunks:
                info = self._store.chunks.get(hit.chunks[-1])
                rows = [self._store.rows[k] for k in (info.rows if info is not None else ()) if k in self._store.rows]
                m = min(rows, key=lambda r: r.created_at, default=None)
            return (None, None) if m is None else (m.saved_by, m.created_at)

    def save(self, namespace: CacheNamespace, tokens: list[int], kv: SequenceKv, reason: SaveReason, *,
             sync: bool = False, live: bool = False, marks: Sequence[int] = (), saved_by: str = "") -> Saved | None:
        """Only the chunks the cache lacks are cut out of llama.cpp (``plan``), then stored
        (synchronously, or by the writer pool)."""
        key = keys.row_key(namespace.digest(), tokens)
        if key in self:
            return self.keep_stored(key, reason, live)
        plan = self.plan(namespace, tokens, marks)
        with self.timed("pack_ns"):
            pieces = kv.cut(plan.keys, self.chunk_size, plan.first, plan.ends)
        if pieces is None:
            return None
        if sync:
            stored = self.put(namespace, tokens, pieces, reason, live=live, ends=plan.ends, saved_by=saved_by)
            return None if stored is None else Saved(stored, new=True)
        queued = self.put_async(namespace, tokens, pieces, reason, live=live, ends=plan.ends, saved_by=saved_by)
        return Saved(key, new=True) if queued else None

    def held(self, namespace: CacheNamespace, tokens: Tokens) -> Held:
        hit = self.probe(namespace, tokens)
        return Held(0, None) if hit is None else Held(hit.n_tokens, hit.tier)  # the chain a restore reads

    # -- rows ------------------------------------------------------------------------------
    def missing(self, namespace: CacheNamespace, tokens: Tokens) -> int:
        """The first chunk of a row of ``tokens`` not stored: cut from there."""
        with self._lock:
            return self._store.missing(namespace.digest(), tokens)

    def plan(self, namespace: CacheNamespace, tokens: Tokens, marks: Sequence[int] = ()) -> ChunkPlan:
        """Where a row of ``tokens`` is cut (shared prefixes ending at ``marks``) and from
        which chunk it is not stored (``ChunkCatalog.plan``): cut from there at its ends."""
        with self._lock:
            return self._store.plan(namespace.digest(), tokens, marks)

    def put(self, namespace: CacheNamespace, tokens: Tokens, pieces: list[bytes],
            reason: SaveReason | str = SaveReason.FINISH, *, pinned: bool = False, live: bool = False,
            ends: Sequence[int] | None = None, saved_by: str = "") -> str | None:
        """Store a row from its chunks' payloads (from ``missing()`` at the time of the cut
        on, cut at ``ends``: ``plan``'s); its key, or None when not stored: too large, a
        write error, or the chunks before the cut were evicted meanwhile
        (``saves_chunks_gone``)."""
        reason = SaveReason.parse(reason)
        pinned = pinned or reason is SaveReason.AGENT_PREFIX
        try:
            key = self._store.put_row(namespace.digest(), namespace.fingerprint_bytes, tokens, pieces, reason,
                                      ends=ends, saved_by=saved_by)
        except ValueError:
            self._counters.inc("saves_chunks_gone")
            return None
        except OSError:
            self._counters.inc("saves_failed")
            return None
        with self._lock:
            if key is not None and pinned and key in self._store:
                self.pin(key)
            if key is not None and live:
                self._store.set_live(key)
            return key

    def lookup(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> ChunkHit | None:
        """The longest stored prefix of ``tokens`` (a row or a chain of chunks); counts the
        hit kind (HitKind.of)."""
        start = time.perf_counter_ns()
        raw = keys.token_bytes(tokens)
        hit = self.probe(namespace, raw)
        self._count_kind(0 if hit is None else hit.n_tokens, len(raw) // 4)
        self._counters.inc("lookup_ns", time.perf_counter_ns() - start)
        return hit

    def match_key(self, namespace: CacheNamespace | bytes, tokens: Tokens, key: str) -> ChunkHit | None:
        """The row ``key`` when it is in ``namespace`` and a prefix of ``tokens`` (an exact
        hit, counted); None, counting nothing, otherwise."""
        raw = keys.token_bytes(tokens)
        with self._lock:
            m = self._store.rows.get(key)
            if m is None or m.namespace != keys.digest_of(namespace) or not raw.startswith(m.tokens):
                return None
            served_by = self._store.row_chunks[key]
            hit = ChunkHit(key, m.n_tokens, served_by, tier_of(self._store, served_by))
        self._count_kind(hit.n_tokens, len(raw) // 4, by_key=True)
        return hit

    def _count_kind(self, matched: int, prompt_len: int, *, by_key: bool = False) -> None:
        kind = HitKind.of(matched, prompt_len, by_key=by_key)
        self._counters.inc("misses_cold" if kind is HitKind.COLD else f"hits_{kind.value}")

    def _longest(self, hit: ChunkHit) -> int:
        """The most positions a chunk of ``hit`` holds (what its payload is bounded by: a file
        whose header claims more is refused before it is read); whole rows know it only
        from the catalog, chunks of ``chunk_size`` never hold more."""
        with self._lock:   # a put or an eviction may change the catalog meanwhile
            held = [self._store.chunks.get(k) for k in hit.chunks]
        return min(self.chunk_size, max((c.n_tokens for c in held if c is not None), default=0))

    def read(self, hit: ChunkHit, max_payload: int | None = None) -> list[bytes] | None:
        """The verified payloads of a hit's chunks; None (a miss) when one was evicted
        meanwhile or does not verify (then it is removed with what depends on it)."""
        start = time.perf_counter_ns()
        try:
            pieces = self._store.read_chunks(hit.chunks, max_payload)
        except (KeyError, CorruptRow):
            self._counters.inc("get_misses")
            return None
        with self._lock:
            if hit.key is not None and hit.key in self._store:
                hits, _ = self._row_hits.get(hit.key, (0, 0.0))
                self._row_hits[hit.key] = (hits + 1, self._store.clock())
        self._counters.inc("get_hits")
        self._counters.inc("load_ns", time.perf_counter_ns() - start)
        return pieces

    def reject_chain(self, chunks: tuple[bytes, ...], reason: CorruptReason) -> bool:
        """Remove a chain its consumer refused although it verified (see the module doc)."""
        with self._lock:
            if not chunks or chunks[0] not in self._store.chunks:
                return False
            self._store.reject_chunk(chunks[0], reason)
            return True

    def reject(self, key: str, reason: CorruptReason) -> bool:
        with self._lock:
            served_by = self._store.row_chunks.get(key)
            return served_by is not None and self.reject_chain(served_by, reason)

    def cached_prefix_len(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> int:
        """Length of the longest stored prefix; a probe, so no counters move."""
        hit = self.probe(namespace, tokens)
        return 0 if hit is None else hit.n_tokens

    def probe(self, namespace: CacheNamespace | bytes, tokens: Tokens) -> ChunkHit | None:
        """What ``lookup`` would find (the chain a restore reads, its tier), counting nothing."""
        with self._lock:
            m = self._served(self._store.lookup(keys.digest_of(namespace), keys.token_bytes(tokens)))
            return None if m is None else ChunkHit(m.key, m.n_tokens, m.chunks, tier_of(self._store, m.chunks))

    def _served(self, m: Any) -> Any:
        """A store match, or None for a chain no row names shorter than min_chain_tokens."""
        return None if m is None or (m.key is None and m.n_tokens < self.min_chain_tokens) else m

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._store

    def __len__(self) -> int:
        with self._lock:
            return len(self._store.rows)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._store.rows)

    def remove(self, key: str) -> bool:
        """Delete a row's manifest (its chunks stay while other rows or chains use them)."""
        with self._lock:
            self._row_hits.pop(key, None)
            return self._store.remove_row(key)

    def evict_bytes(self, n: int, tier: str | None = None) -> int:
        """Free at least ``n`` bytes of ``tier`` (default: the last, where chunks leave the
        cache, leaves first), by its policy: an upper tier's chunks are demoted (or, copies,
        dropped). Returns the bytes freed there."""
        return self._store.evict_bytes(n, tier)

    # -- pins and live rows ----------------------------------------------------------------
    def pin(self, key: str) -> str | None:
        """Protect a row; the previously pinned row of its namespace (returned) is unpinned,
        one pinned row per namespace. KeyError for a row not held."""
        with self._lock:
            ns = self._store.rows[key].namespace
            old = next((k for k, m in self._store.rows.items() if m.pinned and m.namespace == ns and k != key), None)
            if old is not None:
                self._store.pin(old, False)
            self._store.pin(key)
            return old

    def is_pinned(self, key: str) -> bool:
        """Whether ``key`` is a row held and pinned (an agent prefix)."""
        with self._lock:
            m = self._store.rows.get(key)
            return m is not None and m.pinned

    def unpin(self, key: str) -> bool:
        with self._lock:
            was = self._store.rows[key].pinned
            self._store.pin(key, False)
            return was

    def set_live(self, key: str, live: bool = True) -> bool:
        """Mark a row as the KV of a live session (its chunks protected from eviction while
        live); a row whose save is queued gets the mark when it lands."""
        with self._lock:
            return self._store.set_live(key, live) or self.pending.defer_live(key, live)

    # -- views -----------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One dict per row (``chunk_tier_views.row_dicts``): key, tokens, bytes and
        own_bytes (its chunks no other row uses), n_chunks, tiers, reason, hits, pins, and
        the score and seq eviction ranks it by, all at one clock reading."""
        with self._lock:
            return row_dicts(self._store, self._row_hits)

    def chunk_rows(self) -> list[dict[str, Any]]:
        """One dict per chunk: key, parent, tokens, bytes, refcount, children, leaf,
        protected, score (under the store's policy: lower goes first), hits, tier."""
        with self._lock:
            return self._store.chunk_rows()

    def list_tiers(self) -> list[dict[str, Any]]:
        with self._lock:
            return tier_dicts(self._store)

    def counters(self) -> dict[str, int]:
        """The counters plus gauges bytes_<tier>, rows_<tier>, rows and chunks."""
        snap = self._counters.snapshot()
        with self._lock:
            for t in tier_dicts(self._store):
                snap[f"bytes_{t['name']}"] = t["used_bytes"]
                snap[f"rows_{t['name']}"] = t["rows"]
            snap["rows"] = len(self._store.rows)
            snap["chunks"] = len(self._store.chunks)
        return snap

    def record_ns(self, name: str, ns: int) -> None:
        self._counters.inc(name, ns)

    def timed(self, name: str) -> AbstractContextManager[None]:
        return self._counters.timer(name)

    def info(self) -> dict[str, Any]:
        with self._lock:
            pinned = sum(m.pinned for m in self._store.rows.values())
        return {"storage": self.storage, "chunk_size": None if self.storage == "rows" else self.chunk_size,
                "rows": len(self),
                "pinned": pinned, "tiers": self.list_tiers(), "counters": self.counters()}

    def close(self, wait: bool = True) -> None:
        self.pending.close(wait=wait)


def chunked_cache(tiers: Sequence[tuple[Tier, PolicySpec | None]], policy: PolicySpec, chunk_size: int,
                  **pool: Any) -> ChunkedCache:
    """A chunked cache over these tiers (``shared.make_tier``'s, fastest first, each with its
    policy or None for ``policy``): RAM tiers in memory, shm and disk tiers as directories
    with their budgets. InvalidOption for an order chunk storage does not take (CHUNK_TIERS)."""
    if not in_order([t.kind for t, _ in tiers]):
        raise InvalidOption("tiers", [t.name for t, _ in tiers], CHUNK_TIERS, "cache")
    built = [to_chunk_tier(tier, policy if own is None else own) for tier, own in tiers]
    try:
        store = ChunkStore(tiers=built, chunk_size=chunk_size)
    except ValueError as e:
        raise InvalidOption("tiers", [t.name for t, _ in tiers], f"{CHUNK_TIERS} ({e})", "cache") from None
    cache = ChunkedCache(store, min_chain_tokens=MIN_CHAIN_TOKENS, **pool)
    cache.default_policy = policy
    return cache
