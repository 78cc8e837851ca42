"""Tiered, crash-safe, content-addressed KV prefix cache (model independent).

Layers, calls going downward only:
    interface   PrefixCache, the one interface its callers use (both storages implement
                it), and SequenceKv, the adapter it moves KV through (engine/kv_access.py)
    chunked     ChunkedCache (the default storage) over chunk_store and its chunk_* modules
    tiered      TieredCache: put/get/lookup over ordered tiers, pins, counters
    levels      a tier bound to its eviction policy, with its byte accounting
    policies    lru, lfu, frecency, gdsf, s3fifo (s3fifo.py, over csrc/eviction.h)
    prefix_index longest cached prefix by chained block hashes + token equality
    tiers       RamTier, ShmTier, DiskTier (storage only)
    store       crash-safe publish / detach / scan of row files
    format      the row file layout and its verification
    keys        CacheNamespace, row keys, block hashes
    save_queue  the bounded background writer pool
See docs/cache.md for the design choices.
"""

from workbench.cache.counters import Counters
from workbench.cache.interface import PrefixCache, SequenceKv
from workbench.cache.format import ChecksumAlgo, CorruptReason, CorruptRow, Row, RowMeta, encode_row, read_row
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
from workbench.cache.store import ScanReport, publish_row, scan_dir
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier, RamTier, RowMissing, ShmTier, Tier
from workbench.cache.types import HitKind, Match, RowStats, SaveReason

__all__ = [
    "DEFAULT_POLICY", "GDSF", "LFU", "LRU", "POLICIES", "S3FIFO",
    "CacheNamespace", "ChecksumAlgo", "CorruptReason", "CorruptRow", "Counters", "DiskTier",
    "EvictionPolicy", "Frecency", "FunctionPolicy", "HitKind", "KeyConflict", "Match",
    "PrefixCache", "PrefixIndex", "RamTier", "Row", "RowMeta", "RowMissing", "RowStats", "SaveQueue",
    "SaveReason", "ScanReport", "SequenceKv", "ShmTier", "Tier", "TieredCache",
    "block_hashes", "encode_row", "get_policy", "publish_row", "read_row", "row_key",
    "scan_dir", "token_bytes",
]
