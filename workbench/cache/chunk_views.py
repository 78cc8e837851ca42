"""What a chunked cache shows of itself: its rows (the columns of ``TieredCache.rows``), its
tiers (the RAM copies and the directory, or memory alone) and where a chain's chunks are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.cache.chunk_store import ChunkStore


def tier_of(store: ChunkStore, chunks: Sequence[bytes]) -> str:
    """The slowest tier holding one of ``chunks``: 'ram' when RAM copies hold them all."""
    if store.ram.budget and chunks and all(k in store.ram for k in chunks):
        return "ram"
    return store.files.name


def row_dicts(store: ChunkStore, row_hits: dict[str, tuple[int, float]]) -> list[dict[str, Any]]:
    """One dict per row: the row cache's columns (its ``score`` is the score of its last
    chunk, the one eviction takes first), n_chunks and own_bytes (chunks no other row uses)."""
    now = store.clock()
    out = []
    for key, m in store.rows.items():
        served_by = store.row_chunks[key]
        infos = [store.chunks[k] for k in served_by]
        hits, last = row_hits.get(key, (0, None))
        tier = tier_of(store, served_by)
        out.append({
            "key": key, "key_preview": key[:12], "scope": m.namespace.hex()[:12], "n_tokens": m.n_tokens,
            "bytes": sum(c.size for c in infos), "own_bytes": sum(c.size for c in infos if c.refcount == 1),
            "n_chunks": len(served_by), "tier": tier,
            "tiers": ["ram", store.files.name] if tier == "ram" and store.files.persistent else [tier],
            "reason": m.reason.name.lower(), "hits": hits, "last_hit_at": last, "created_at": m.created_at,
            "pinned": m.pinned, "live": key in store.live,
            "score": store.policy.priority(infos[-1].stats, now),
        })
    return out


def tier_dicts(store: ChunkStore, dir_kind: str) -> list[dict[str, Any]]:
    """The RAM copies (when a directory has them) and the directory, or memory alone, with
    the keys of ``TieredCache.list_tiers`` plus the chunks each holds."""
    policy = store.policy.name
    if not store.files.persistent:
        return [{"name": store.files.name, "kind": "ram", "policy": policy, "budget_bytes": store.budget,
                 "used_bytes": store.used, "reserved_bytes": 0, "rows": len(store.rows),
                 "chunks": len(store.chunks), "persistent": False, "root": None}]
    out = []
    if store.ram.budget:
        in_ram = sum(all(k in store.ram for k in served) for served in store.row_chunks.values())
        out.append({"name": "ram", "kind": "ram", "policy": policy, "budget_bytes": store.ram.budget,
                    "used_bytes": store.ram.used, "reserved_bytes": 0, "rows": in_ram,
                    "chunks": len(store.ram.payloads), "persistent": False, "root": None})
    out.append({"name": store.files.name, "kind": dir_kind, "policy": policy, "budget_bytes": store.budget,
                "used_bytes": store.used, "reserved_bytes": 0, "rows": len(store.rows),
                "chunks": len(store.chunks), "persistent": True, "root": str(store.root)})
    return out
