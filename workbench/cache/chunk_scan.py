"""What a chunk store's directory holds at start-up, each file checked (chunk_store.scan).

Every `<key>.kvc` is read without its payload (header, tokens, sizes, key recomputed) and
every `<key>.kvm` in full; a file whose name is not its key, a version 1 row file (`*.kv`)
and any file that fails a check is handed to `reject` with its reason; tmp files whose
writer is gone (or older than `tmp_ttl_s`) are deleted. Payload checksums are checked at
each chunk's first read, as for row files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.cache.chunk_format import (
    CHUNK_SUFFIX,
    MANIFEST_SUFFIX,
    ChunkMeta,
    Manifest,
    chunk_file_size,
    read_chunk,
    read_manifest,
)
from workbench.cache.format import CorruptReason, CorruptRow
from workbench.cache.store import ROW_SUFFIX, TmpSweep, scan_entries


@dataclass(slots=True)
class DirContents:
    chunks: dict[bytes, tuple[ChunkMeta, int]] = field(default_factory=dict)  # key -> (meta, file size)
    manifests: list[tuple[str, Manifest]] = field(default_factory=list)      # (path, manifest)
    tmp_removed: int = 0


def read_dir(root: Path, reject: Callable[[str, str], None], tmp_ttl_s: float = 600.0) -> DirContents:
    out = DirContents()
    tmp = TmpSweep()
    for entry in scan_entries(root, tmp_ttl_s, tmp):
        name = entry.name
        try:
            if name.endswith(CHUNK_SUFFIX):
                meta, _, length = read_chunk(entry.path, load_payload=False)
                if name != meta.key.hex() + CHUNK_SUFFIX:
                    raise CorruptRow(CorruptReason.KEY_MISMATCH, name)
                out.chunks[meta.key] = (meta, chunk_file_size(meta.n_tokens, length))
            elif name.endswith(MANIFEST_SUFFIX):
                m = read_manifest(entry.path)
                if name != m.key + MANIFEST_SUFFIX:
                    raise CorruptRow(CorruptReason.KEY_MISMATCH, name)
                out.manifests.append((entry.path, m))
            elif name.endswith(ROW_SUFFIX):
                raise CorruptRow(CorruptReason.BAD_VERSION, "a version 1 row file")
        except CorruptRow as exc:
            reject(entry.path, exc.reason.value)
        except OSError:
            continue  # vanished, or unreadable: not adopted, left alone
    out.tmp_removed = tmp.removed
    return out
