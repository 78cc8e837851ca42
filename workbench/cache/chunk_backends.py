"""Where a chunk store keeps its chunks and manifests: files in a private directory
(`ChunkDir`: crash-safe publish, start-up scan) or process memory (`ChunkMemory`: lost with
the process, nothing to scan). Both account a chunk at its file size (header, tokens,
payload), so a store's byte counts do not depend on where it keeps them. A chunk that is not
there when read raises `ChunkGone` (evicted or moved meanwhile: the store decides whether
that is a miss or a missing file).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from workbench.cache.chunk_format import (
    CHUNK_SUFFIX,
    MANIFEST_SUFFIX,
    ChunkMeta,
    Manifest,
    chunk_file_size,
    encode_chunk,
    encode_manifest,
    manifest_size,
    read_chunk,
)
from workbench.cache.chunk_scan import DirContents, read_dir
from workbench.cache.store import TMP_MARK, ensure_private_dir, fsync_dir, publish_file, unlink_quietly


class ChunkGone(KeyError):
    """The chunk is not (or no longer) where it was read from."""


class ChunkDir:
    """Chunk files `<key>.kvc` and manifests `<row key>.kvm` in one private directory."""

    persistent = True

    def __init__(self, root: str | os.PathLike[str], name: str | None = None) -> None:
        self.root = ensure_private_dir(Path(root))
        self.name = name or self.root.name

    def chunk_path(self, key: bytes) -> Path:
        return self.root / f"{key.hex()}{CHUNK_SUFFIX}"

    def manifest_path(self, key: str) -> Path:
        return self.root / f"{key}{MANIFEST_SUFFIX}"

    def write_chunk(self, meta: ChunkMeta, payload: bytes) -> int:
        publish_file(self.root, self.chunk_path(meta.key), meta.key.hex(), (encode_chunk(meta, payload), payload))
        return chunk_file_size(meta.n_tokens, len(payload))

    def read_chunk(self, key: bytes, max_payload: int | None) -> bytes:
        """The verified payload; CorruptRow when it does not verify, ChunkGone when the file is
        not there."""
        try:
            return read_chunk(self.chunk_path(key), max_payload=max_payload)[1]
        except FileNotFoundError:
            raise ChunkGone(key.hex()) from None

    def has(self, key: bytes) -> bool:
        return self.chunk_path(key).is_file()

    def delete_chunk(self, key: bytes) -> None:
        unlink_quietly(self.chunk_path(key))

    def write_manifest(self, m: Manifest) -> int:
        publish_file(self.root, self.manifest_path(m.key), m.key, (encode_manifest(m),))
        return manifest_size(m.n_tokens, len(m.chunks))

    def replace_manifest(self, m: Manifest) -> None:
        """Rewrite a manifest (a pin): crash-safely under a fresh name, renamed over the old."""
        tmp = self.root / f"{m.key}{TMP_MARK}pin{MANIFEST_SUFFIX}"
        unlink_quietly(tmp)
        publish_file(self.root, tmp, m.key, (encode_manifest(m),))
        os.replace(tmp, self.manifest_path(m.key))
        fsync_dir(self.root)

    def delete_manifest(self, key: str) -> None:
        unlink_quietly(self.manifest_path(key))

    def scan(self, reject: Callable[[str, str], None], tmp_ttl_s: float) -> DirContents:
        return read_dir(self.root, reject, tmp_ttl_s)


class ChunkMemory:
    """Chunks and manifests in process memory."""

    persistent = False

    def __init__(self, name: str = "ram") -> None:
        self.name = name
        self.payloads: dict[bytes, bytes] = {}

    def write_chunk(self, meta: ChunkMeta, payload: bytes) -> int:
        self.payloads.setdefault(meta.key, payload)
        return chunk_file_size(meta.n_tokens, len(payload))

    def read_chunk(self, key: bytes, max_payload: int | None) -> bytes:
        payload = self.payloads.get(key)
        if payload is None:
            raise ChunkGone(key.hex())
        return payload

    def has(self, key: bytes) -> bool:
        return key in self.payloads

    def delete_chunk(self, key: bytes) -> None:
        self.payloads.pop(key, None)

    def write_manifest(self, m: Manifest) -> int:
        return manifest_size(m.n_tokens, len(m.chunks))

    def replace_manifest(self, m: Manifest) -> None:
        return None

    def delete_manifest(self, key: str) -> None:
        return None

    def scan(self, reject: Callable[[str, str], None], tmp_ttl_s: float) -> DirContents:
        return DirContents()
