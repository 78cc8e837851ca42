"""Tiered, crash-safe, content-addressed KV prefix cache (model independent).

Layers, calls going downward only:
    interface   PrefixCache, the one interface its callers use, and SequenceKv, the
                adapter it moves KV through (engine/kv_access.py)
    chunked     ChunkedCache, PrefixCache's implementation (both storages: chunks, and
                whole rows as whole-row chunks) over chunk_store and its chunk_* modules
    policies    lru, lfu, frecency, gdsf, s3fifo (s3fifo.py, over csrc/eviction.h)
    prefix_index longest cached prefix by chained block hashes + token equality
    tiers       RamTier, ShmTier, DiskTier: the tiers users describe
    chunk_format the chunk and manifest file layouts and their verification
    store       private directories, the crash-safe publish, tmp files at a scan
    format      why a file is refused (CorruptReason, CorruptRow), the safe open
    keys        CacheNamespace, row keys, block hashes
    save_queue  the bounded background writer pool
See docs/cache.md for the design choices.
"""

from workbench.cache.counters import Counters
from workbench.cache.interface import PrefixCache, SequenceKv
from workbench.cache.format import CorruptReason, CorruptRow
from workbench.cache.keys import CacheNamespace, block_hashes, row_key, token_bytes
from workbench.cache.policies import (
    GDSF,
    LFU,
    LRU,
    DEFAULT_POLICY,
    POLICIES,
    EvictionPolicy,
    Frecency,
    FunctionPolicy,
    get_policy,
)
from workbench.cache.prefix_index import KeyConflict, PrefixIndex
from workbench.cache.s3fifo import S3FIFO
from workbench.cache.save_queue import SaveQueue
from workbench.cache.tiers import DiskTier, RamTier, ShmTier, Tier
from workbench.cache.types import HitKind, Match, RowStats, SaveReason

__all__ = [
    "DEFAULT_POLICY", "GDSF", "LFU", "LRU", "POLICIES", "S3FIFO",
    "CacheNamespace", "CorruptReason", "CorruptRow", "Counters", "DiskTier",
    "EvictionPolicy", "Frecency", "FunctionPolicy", "HitKind", "KeyConflict", "Match",
    "PrefixCache", "PrefixIndex", "RamTier", "RowStats", "SaveQueue",
    "SaveReason", "SequenceKv", "ShmTier", "Tier",
    "block_hashes", "get_policy", "row_key", "token_bytes",
]
