"""What a chunked cache shows of itself: its rows (one dict each: tokens, bytes, tiers,
hits, pins, score), its tiers (each tier's description plus the rows and chunks it holds) and where a chain's
chunks are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.cache.chunk_store import ChunkStore


def tier_of(store: ChunkStore, chunks: Sequence[bytes]) -> str | None:
    """The slowest of the tiers a chain is read from (each chunk from the fastest tier
    holding it): 'ram' when RAM holds them all."""
    index = {t.name: i for i, t in enumerate(store.tiers)}
    known = [names[0] for names in map(store.tier_names, chunks) if names]
    return max(known, key=index.__getitem__) if known else None


def row_dicts(store: ChunkStore, row_hits: dict[str, tuple[int, float]]) -> list[dict[str, Any]]:
    """One dict per row: key, tokens, bytes, tier, reason, hits, pins (its ``score`` is the score of its last
    chunk, the one eviction takes first; ``tiers`` every tier holding one of its chunks),
    n_chunks and own_bytes (chunks no other row uses). One clock reading for every row
    (``now``, also each score's); ``seq``: the last chunk's logical access clock, which
    breaks ties in eviction order."""
    out, now = [], store.clock()
    for key, m in store.rows.items():
        served_by = store.row_chunks[key]
        infos = [store.chunks[k] for k in served_by]
        hits, last = row_hits.get(key, (0, None))
        held = {name for k in served_by for name in store.tier_names(k)}
        out.append({
            "key": key, "key_preview": key[:12], "scope": m.namespace.hex()[:12], "n_tokens": m.n_tokens,
            "bytes": sum(c.size for c in infos), "own_bytes": sum(c.size for c in infos if c.refcount == 1),
            "n_chunks": len(served_by), "tier": tier_of(store, served_by),
            "tiers": [t.name for t in store.tiers if t.name in held],
            "reason": m.reason.name.lower(), "hits": hits, "last_hit_at": last, "created_at": m.created_at,
            "pinned": m.pinned, "live": key in store.live, "score": store.score(infos[-1], now),
            "now": now, "seq": infos[-1].stats.seq,
        })
    return out


def tier_dicts(store: ChunkStore) -> list[dict[str, Any]]:
    """Each tier, fastest first: its ``describe()`` (name, kind, budget, policy, usage); ``rows``: the
    rows one of whose chunks it holds; ``chunks``: the chunks it holds."""
    out = []
    for t in store.tiers:
        rows = sum(any(k in t for k in served) for served in store.row_chunks.values())
        out.append({**t.describe(), "rows": rows})
    return out
