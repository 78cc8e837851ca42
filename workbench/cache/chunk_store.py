"""The chunked KV cache's storage in one directory (or in memory): rows as manifests over
shared chunks.

A row of ``tokens`` is stored as the chunks ``chunk_format.chunks_of`` names (keys by
``keys.chunk_keys``) plus a manifest; a chunk another row already stored is not written
again, so a prefix shared by many rows, sessions or turns is stored once. What is kept per
chunk (``ChunkInfo``): its size, its parent, the rows whose manifests name it (its
refcount), how many stored chunks continue it (its children) and its policy bookkeeping.

* **Serving.** ``read_row`` returns a row's chunk payloads only when its manifest and every
  chunk verify (format checks, keys recomputed, payload checksums); a chunk that fails is
  deleted with every row that names it, and the read raises ``CorruptRow``. ``lookup`` gives
  the longest stored prefix of a prompt: a row (a manifest whose tokens are a prefix of the
  prompt) or a chain of full chunks of the prompt's own keys, whichever is longer.
* **Crash safety.** Chunks, then the manifest, each by ``store.publish_file`` (tmp, fsync,
  link, fsync dir): a crash leaves at worst chunks without a manifest (kept when full, as
  servable prefixes; a tail chunk no manifest names is deleted at scan) and tmp files.
* **Scan.** Adopts chunks that verify and whose parent chain is present, and manifests whose
  chunks are all present; deletes and counts the rest (``rejected_<reason>``, orphans), and
  rejects files of other format versions (version 1 rows, ``*.kv``) as ``bad_version``.
* **Eviction, leaves first.** Only a chunk no stored chunk continues is a candidate; the
  policy (any of policies.py, scored per chunk on the chunk's ``RowStats``) orders the
  candidates, chunks of pinned or live rows last. Evicting a chunk drops the rows that end
  at it; its parent may become a leaf in turn. A full chunk no row names stays as a
  servable prefix until it is evicted; a tail chunk no row names is deleted at once.

Not thread-safe by itself: the caller serialises calls (one lock, as TieredCache does).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.cache import keys
from workbench.cache.chunk_catalog import ChunkCatalog, ChunkInfo
from workbench.cache.chunk_backends import ChunkDir, ChunkMemory
from workbench.cache.chunk_ram import RamChunks
from workbench.cache.chunk_format import (
    CHUNK_SUFFIX,
    ChunkMeta,
    Manifest,
    chunk_file_size,
    chunks_of,
    manifest_size,
)
from workbench.cache.counters import Counters
from workbench.cache.format import CorruptReason, CorruptRow
from workbench.cache.policies import DEFAULT_POLICY, EvictionPolicy, get_policy
from workbench.cache.store import (
    unlink_quietly,
)
from workbench.cache.types import SaveReason

DEFAULT_CHUNK_SIZE = 256


class ChunkStore(ChunkCatalog):
    """Rows as manifests over content-addressed chunks in one private directory (``root``),
    or in process memory (``root=None``)."""

    def __init__(self, root: str | os.PathLike[str] | None, budget_bytes: int | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, policy: Any = DEFAULT_POLICY,
                 counters: Counters | None = None, clock: Callable[[], float] = time.time,
                 ram_budget_bytes: int = 0, name: str | None = None) -> None:
        super().__init__(chunk_size)
        self.files: ChunkDir | ChunkMemory = (ChunkMemory(name or "ram") if root is None
                                              else ChunkDir(root, name))
        if root is None and ram_budget_bytes:
            raise ValueError("a store in memory has no RAM copies (ram_budget_bytes must be 0)")
        self.budget = budget_bytes
        self.policy: EvictionPolicy = get_policy(policy)
        self.counters = counters or Counters()
        self.clock = clock
        self.used = 0
        self.ram = RamChunks(ram_budget_bytes, self.score, self.counters)  # copies, per chunk
        set_capacity = getattr(self.policy, "set_capacity", None)
        if set_capacity is not None:
            set_capacity(budget_bytes)

    # --- where things live ----------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The directory (a store in memory has none)."""
        if not isinstance(self.files, ChunkDir):
            raise AttributeError("this chunk store keeps its chunks in memory")
        return self.files.root

    def _chunk_path(self, key: bytes) -> Path:
        return self.root / f"{key.hex()}{CHUNK_SUFFIX}"

    def _adopt_chunk(self, meta: ChunkMeta, size: int, created_at: float) -> ChunkInfo:
        self.used += size
        info = self.add_chunk(meta, size, created_at)
        self._hook("on_admit", info)
        self._hook("on_insert", info)
        return info

    def _hook(self, name: str, info: ChunkInfo) -> None:
        """A policy's optional hook (policies.py), called with the chunk's RowStats."""
        fn = getattr(self.policy, name, None)
        if fn is not None:
            fn(info.stats)

    def _absorb(self, c: ChunkInfo) -> None:
        """Tail chunks whose positions ``c`` holds too go; their rows are served by ``c``."""
        for t in self.covered_tails(c):
            self.move_rows(t, c)
            self._drop_chunk(t.key)
            self.counters.inc("tails_absorbed")

    # --- writing -----------------------------------------------------------------------

    def put_row(self, namespace: bytes, fingerprint: bytes, tokens: keys.Tokens,
                pieces: Sequence[bytes], reason: SaveReason = SaveReason.FINISH, *,
                pinned: bool = False) -> str | None:
        """Store a row; ``pieces``: the payloads of its chunks from ``missing()`` on (chunks
        stored already are not written again). Returns the row key, None when the row cannot
        fit the budget."""
        raw = keys.token_bytes(tokens)
        key = keys.row_key_from_bytes(namespace, raw)
        if key in self.rows:
            self.counters.inc("saves_duplicate")
            return key
        now = self.clock()
        metas = chunks_of(namespace, fingerprint, raw, self.chunk_size, now)
        first = len(metas) - len(pieces)
        if first < 0 or first > self.missing(namespace, raw):
            raise ValueError(f"{len(pieces)} chunk payloads for a row whose stored chunks end before chunk {first}")
        manifest = Manifest(key, namespace, fingerprint, raw, self.chunk_size, tuple(m.key for m in metas),
                            SaveReason(reason), now, 0, pinned)
        covered = self.missing(namespace, raw) == len(metas)
        new = [(m, p) for m, p in zip(metas[first:], pieces) if m.key not in self.chunks and not covered]
        need = sum(chunk_file_size(m.n_tokens, len(p)) for m, p in new) + manifest_size(len(raw) // 4, len(metas))
        if not self._make_room(need, keep=set(manifest.chunks) | set(self.resolve(manifest) or ())):
            self.counters.inc("saves_too_large")
            return None
        written = []
        for m, p in new:
            written.append(self._adopt_chunk(m, self.files.write_chunk(m, p), now))
            self.ram.promote(written[-1], p, self.chunks)
            self.counters.inc("chunks_written")
        self.counters.inc("chunks_shared", len(metas) - len(new))
        self.used += self.files.write_manifest(manifest)
        served_by = self.resolve(manifest)
        assert served_by is not None
        self.add_row(manifest, served_by)
        for c in written:
            self._absorb(c)
        if pinned:
            self.pin(key)
        self.counters.inc(f"saves_{SaveReason(reason).name.lower()}")
        return key

    def pin(self, key: str, pinned: bool = True) -> None:
        """Pin a row (its chunks are evicted last), or unpin it (``pinned=False``). The flag
        lives in the manifest, rewritten crash-safely under a fresh name then renamed over
        the old one. KeyError for a row not held."""
        m = self.rows[key]
        if m.pinned != pinned:
            m = Manifest(m.key, m.namespace, m.fingerprint, m.tokens, m.chunk_size, m.chunks, m.reason,
                         m.created_at, m.hits, pinned)
            self.files.replace_manifest(m)
            self.rows[key] = m
        self.protect(self.row_chunks[key])

    # --- reading -----------------------------------------------------------------------

    def read_chunks(self, chunk_keys: Sequence[bytes], max_payload: int | None = None) -> list[bytes]:
        """The payloads of a chain of chunks, each verified; CorruptRow (the bad chunk and
        the rows naming it removed) when one does not verify or its payload is longer than
        ``max_payload`` (default: the store's budget), KeyError when one is not stored."""
        out = []
        from_files = []
        now = self.clock()
        for k in chunk_keys:
            if k not in self.chunks:
                raise KeyError(k.hex())
            payload = self.ram.get(k)
            if payload is not None:
                self.counters.inc("chunk_reads_ram")
                out.append(payload)
                continue
            try:
                payload = self.files.read_chunk(k, self.budget if max_payload is None else max_payload)
            except CorruptRow as exc:
                self.reject_chunk(k, exc.reason)
                raise
            self.counters.inc("chunk_reads_file")
            from_files.append((k, payload))
            out.append(payload)
        chain = frozenset(chunk_keys)
        for k, payload in from_files:
            self.ram.promote(self.chunks[k], payload, self.chunks, keep=chain)
        for k in chunk_keys:
            stats = self.chunks[k].stats
            stats.hits += 1
            stats.last_hit_at = now
            stats.seq = self.tick()
            self._hook("on_hit", self.chunks[k])
        return out

    def read_row(self, key: str, max_payload: int | None = None) -> tuple[Manifest, tuple[bytes, ...], list[bytes]]:
        """(manifest, the keys of the chunks that serve it, their verified payloads); join them
        with ``n_tokens=manifest.n_tokens`` (a covering chunk holds more positions)."""
        m = self.rows[key]
        served_by = self.row_chunks[key]
        return m, served_by, self.read_chunks(served_by, max_payload)

    # --- removing and evicting ---------------------------------------------------------

    def reject_chunk(self, key: bytes, reason: CorruptReason) -> None:
        self.counters.inc(f"rejected_{reason.value}")
        self.counters.inc("rejected_total")
        self._drop_chunk(key)

    def remove_row(self, key: str) -> bool:
        """Delete a row's manifest; its chunks stay while another row names them or, full
        ones, as servable prefixes; a tail chunk no row names goes."""
        popped = self.pop_row(key)
        if popped is None:
            return False
        m, served_by = popped
        self.files.delete_manifest(key)
        self.used -= manifest_size(m.n_tokens, len(m.chunks))
        tail = self.chunks.get(served_by[-1])
        if tail is not None and not tail.full and not tail.rows and not self.children(tail.key):
            self._drop_chunk(tail.key)
        return True

    def _drop_chunk(self, key: bytes) -> None:
        """Delete a chunk, everything that continues it, and the rows that name it."""
        info = self.chunks.get(key)
        if info is None:
            return
        for child in list(self.kids.get(key, ())):
            self._drop_chunk(child)
        for row in list(info.rows):
            self.remove_row(row)
        if key not in self.chunks:  # removing the rows dropped it as an unnamed tail
            return
        self.pop_chunk(key)
        self.ram.discard(key)
        self._hook("on_remove", info)
        self.used -= info.size
        self.files.delete_chunk(key)

    def score(self, info: ChunkInfo) -> float:
        return self.policy.priority(info.stats, self.clock())

    def _make_room(self, need: int, keep: set[bytes]) -> bool:
        if self.budget is None:
            return True
        if need > self.budget:
            return False
        while self.used + need > self.budget:
            victim = self._victim(keep)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _evict(self, victim: ChunkInfo) -> None:
        self.counters.inc("evictions_chunks")
        self._hook("on_evict", victim)
        self._drop_chunk(victim.key)

    def _victim(self, keep: set[bytes]) -> ChunkInfo | None:
        """The leaf to evict: the policy's own choice when it makes one (s3fifo), with every
        chunk that is not an evictable leaf treated as protected; else the lowest score."""
        choose = getattr(self.policy, "victim", None)
        if choose is not None:
            def held(hex_key: str) -> bool:
                c = self.chunks.get(bytes.fromhex(hex_key))
                return c is None or c.key in keep or c.stats.protected or self.children(c.key) > 0
            picked = choose(held)
            c = None if picked is None else self.chunks.get(bytes.fromhex(picked))
            if c is not None and not held(picked):
                return c
        now = self.clock()
        heap = [(c.stats.protected, self.policy.priority(c.stats, now), c.stats.seq, c.key)
                for c in self.leaves() if c.key not in keep]
        return self.chunks[heapq.nsmallest(1, heap)[0][3]] if heap else None

    def evict_bytes(self, n: int) -> int:
        """Evict leaves until at least ``n`` bytes are freed; returns the bytes freed."""
        before = self.used
        while before - self.used < n:
            victim = self._victim(set())
            if victim is None:
                break
            self._evict(victim)
        return before - self.used

    # --- start-up ------------------------------------------------------------------------

    def scan(self, *, tmp_ttl_s: float = 600.0) -> dict[str, int]:
        """Adopt what verifies (see the module doc); returns what was rejected, by reason."""
        rejected: dict[str, int] = {}

        def reject(path: str, reason: str) -> None:
            unlink_quietly(path)
            rejected[reason] = rejected.get(reason, 0) + 1
            self.counters.inc(f"rejected_{reason}")
            self.counters.inc("rejected_total")

        found = self.files.scan(reject, tmp_ttl_s)
        self.counters.inc("orphans_removed", found.tmp_removed)
        self._adopt_chains(found.chunks)
        manifests = found.manifests
        for path, m in manifests:
            served_by = None if m.key in self.rows else self.resolve(m)
            if served_by is None:
                if m.key not in self.rows:
                    reject(path, "missing_chunk")
                continue
            self.used += manifest_size(m.n_tokens, len(m.chunks))
            self.add_row(m, served_by)
        for info in list(self.chunks.values()):
            if info.key in self.chunks:
                self._absorb(info)  # a writer killed between a chunk and the absorption
        for info in [c for c in self.chunks.values() if not c.full and not c.rows and not self.children(c.key)]:
            self.counters.inc("orphans_removed")
            self._drop_chunk(info.key)
        return rejected

    def _adopt_chains(self, found: dict[bytes, tuple[ChunkMeta, int]]) -> None:
        """Adopt chunks parent first; a chunk whose parent is absent is an orphan."""
        pending = dict(found)
        progress = True
        while pending and progress:
            progress = False
            for k, (meta, size) in list(pending.items()):
                if meta.parent is None or meta.parent in self.chunks:
                    self._adopt_chunk(meta, size, meta.created_at)
                    del pending[k]
                    progress = True
        for k in pending:
            self.counters.inc("orphans_removed")
            self.files.delete_chunk(k)

    # --- views -----------------------------------------------------------------------------

    def chunk_rows(self) -> list[dict[str, Any]]:
        """One dict per chunk: key, parent, tokens, bytes, refcount, children, score, tier."""
        return self.chunk_view(self.score, lambda c: "ram" if c.key in self.ram else self.files.name)

    def row_views(self) -> list[dict[str, Any]]:
        return self.row_view()
