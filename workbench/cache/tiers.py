"""Storage tiers: where row payloads live. Policy and bookkeeping live in the cache.

`RamTier` keeps payloads in a dict (fast, lost with the process). `ShmTier` and `DiskTier`
keep one row file per key (see `format` and `store`): shm files under /dev/shm survive a
process or kernel-module restart but not a reboot, disk files survive both. A tier only
stores bytes and reports sizes; it does not enforce its budget (the cache does, since only
the cache knows which rows to evict).
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from workbench.cache import store
from workbench.cache.format import ChecksumAlgo, CorruptReason, CorruptRow, RowMeta, read_row, row_size



def effective_limit(budget: int | None, full_at: int | None) -> int | None:
    """The bytes a tier may hold: its budget, lowered to ``full_at`` once a write found its
    file system full (a disk smaller than the budget); None = no bound. One rule for both
    storages (levels.Level, chunk_tiers.ChunkTier)."""
    if full_at is None:
        return budget
    return full_at if budget is None else min(budget, full_at)

class RowMissing(LookupError):
    """The tier does not hold this key (never stored, or removed meanwhile)."""


class Detached:
    """A row taken out of a tier for demotion: read it once, then release it."""

    def __init__(self, payload: bytes | None = None, path: Path | None = None,
                 fingerprint: bytes | None = None) -> None:
        self._payload = payload
        self._path = path
        self._fingerprint = fingerprint

    def read(self) -> bytes:
        """The payload; a detached file is verified again (CorruptRow if it fails)."""
        if self._payload is not None:
            return self._payload
        assert self._path is not None
        return read_row(self._path, verify=True, expected_fingerprint=self._fingerprint).payload

    def release(self) -> None:
        self._payload = None
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            self._path = None


class Tier(ABC):
    """One level of storage with a byte budget (None = unbounded)."""

    kind: ClassVar[str] = "tier"
    persistent: ClassVar[bool] = False

    def __init__(self, name: str, budget_bytes: int | None) -> None:
        if not name:
            raise ValueError("a tier needs a name")
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0 or None, got {budget_bytes}")
        self.name = name
        self.budget_bytes = budget_bytes

    @abstractmethod
    def stored_size(self, n_tokens: int, payload_len: int) -> int:
        """Bytes a row of this shape occupies in this tier."""

    @abstractmethod
    def write(self, meta: RowMeta, payload: bytes) -> int:
        """Store a row; return the bytes it occupies."""

    @abstractmethod
    def read(self, key: str, expected_fingerprint: bytes | None = None, max_payload: int | None = None) -> bytes:
        """The payload; RowMissing if absent (or unreadable), CorruptRow if it fails to verify
        or a file's payload is longer than `max_payload` or this tier's budget."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove a row; False if absent."""

    @abstractmethod
    def detach(self, key: str, expected_fingerprint: bytes | None = None) -> Detached | None:
        """Take a row out for demotion; None if absent."""

    def scan(
        self, *, verify_payload: bool = True, expected_fingerprint: bytes | None = None
    ) -> store.ScanReport:
        """Rows found at start-up (none for a volatile tier)."""
        return store.ScanReport()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "budget_bytes": self.budget_bytes,
                "persistent": self.persistent}


class RamTier(Tier):
    """Payloads in process memory."""

    kind = "ram"

    def __init__(self, name: str = "ram", budget_bytes: int | None = 1 << 30) -> None:
        super().__init__(name, budget_bytes)
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def stored_size(self, n_tokens: int, payload_len: int) -> int:
        return payload_len

    def write(self, meta: RowMeta, payload: bytes) -> int:
        with self._lock:
            self._data[meta.key] = bytes(payload)
        return len(payload)

    def read(self, key: str, expected_fingerprint: bytes | None = None, max_payload: int | None = None) -> bytes:
        try:
            return self._data[key]  # already in memory: no bound to enforce
        except KeyError:
            raise RowMissing(key) from None

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def detach(self, key: str, expected_fingerprint: bytes | None = None) -> Detached | None:
        with self._lock:
            payload = self._data.pop(key, None)
        return None if payload is None else Detached(payload=payload)


class FileTier(Tier):
    """One crash-safely published row file per key under `root`."""

    kind = "file"
    persistent = True

    def __init__(self, name: str, root: str | os.PathLike[str], budget_bytes: int | None,
                 *, checksum: ChecksumAlgo = ChecksumAlgo.XXH3_128, tmp_ttl_s: float = 600.0) -> None:
        super().__init__(name, budget_bytes)
        self.root = store.ensure_private_dir(Path(root))
        self.checksum = checksum
        self.tmp_ttl_s = tmp_ttl_s

    def stored_size(self, n_tokens: int, payload_len: int) -> int:
        return row_size(n_tokens, payload_len)

    def write(self, meta: RowMeta, payload: bytes) -> int:
        return store.publish_row(self.root, meta, payload, self.checksum)

    def read(self, key: str, expected_fingerprint: bytes | None = None, max_payload: int | None = None) -> bytes:
        bounds = [b for b in (max_payload, self.payload_bound()) if b is not None]
        bound = min(bounds) if bounds else None
        try:
            row = read_row(store.row_path(self.root, key), verify=True,
                           expected_fingerprint=expected_fingerprint, max_payload=bound)
        except OSError:  # gone, or unreadable: a miss (CorruptRow covers FIFOs and symlinks)
            raise RowMissing(key) from None
        if row.meta.key != key:
            raise CorruptRow(CorruptReason.KEY_MISMATCH, f"file {key} holds {row.meta.key}")
        return row.payload

    def delete(self, key: str) -> bool:
        return store.remove_row(self.root, key)

    def detach(self, key: str, expected_fingerprint: bytes | None = None) -> Detached | None:
        path = store.detach_row(self.root, key)
        return None if path is None else Detached(path=path, fingerprint=expected_fingerprint)

    def scan(
        self, *, verify_payload: bool = True, expected_fingerprint: bytes | None = None
    ) -> store.ScanReport:
        return store.scan_dir(self.root, verify_payload=verify_payload, expected_fingerprint=expected_fingerprint,
                              tmp_ttl_s=self.tmp_ttl_s, max_payload=self.payload_bound())

    def payload_bound(self) -> int | None:
        """No row in this tier can be longer than its budget: a file that says otherwise (a
        sparse 40 GiB file with a valid header, say) is refused before it is read."""
        return self.budget_bytes

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "root": str(self.root)}


def default_shm_root(name: str) -> Path:
    return Path("/dev/shm") / f"workbench-{os.getuid()}" / name


def default_disk_root(name: str) -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_path("llama-workbench")) / "kv" / name


class ShmTier(FileTier):
    """Row files in shared memory (default /dev/shm/workbench-<uid>/<name>)."""

    kind = "shm"

    def __init__(self, name: str = "shm", root: str | os.PathLike[str] | None = None,
                 budget_bytes: int | None = 4 << 30, **kwargs: Any) -> None:
        if root is None:
            if not Path("/dev/shm").is_dir():
                raise FileNotFoundError("/dev/shm does not exist here; pass root= explicitly")
            root = default_shm_root(name)
        super().__init__(name, root, budget_bytes, **kwargs)


class DiskTier(FileTier):
    """Row files on disk (default: the user cache dir, .../llama-workbench/kv/<name>)."""

    kind = "disk"

    def __init__(self, name: str = "disk", root: str | os.PathLike[str] | None = None,
                 budget_bytes: int | None = 32 << 30, **kwargs: Any) -> None:
        super().__init__(name, default_disk_root(name) if root is None else root, budget_bytes, **kwargs)
