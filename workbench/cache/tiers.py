"""The tiers users describe (``shared.make_tier``): a name, a byte budget (None = unbounded)
and where the bytes live. `RamTier`: process memory (lost with the process); `ShmTier` and
`DiskTier`: a private directory (chunk files under /dev/shm survive a process or
kernel-module restart but not a reboot, disk files survive both). The cache turns each into
a chunk tier (``chunk_tier_admin.to_chunk_tier``), which stores the bytes and keeps its
budget; these only describe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from workbench.cache import store


class Tier:
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

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "budget_bytes": self.budget_bytes,
                "persistent": self.persistent}


class RamTier(Tier):
    """Chunks in process memory."""

    kind = "ram"

    def __init__(self, name: str = "ram", budget_bytes: int | None = 1 << 30) -> None:
        super().__init__(name, budget_bytes)


class FileTier(Tier):
    """Files crash-safely published under `root` (a private directory, created 0700)."""

    kind = "file"
    persistent = True

    def __init__(self, name: str, root: str | os.PathLike[str], budget_bytes: int | None) -> None:
        super().__init__(name, budget_bytes)
        self.root = store.ensure_private_dir(Path(root))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "root": str(self.root)}


def default_shm_root(name: str) -> Path:
    return Path("/dev/shm") / f"workbench-{os.getuid()}" / name


def default_disk_root(name: str) -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_path("llama-workbench")) / "kv" / name


class ShmTier(FileTier):
    """Files in shared memory (default /dev/shm/workbench-<uid>/<name>; configure_cache and
    add_tier give a tier without a root ``chunk_tier_admin.default_root`` instead)."""

    kind = "shm"

    def __init__(self, name: str = "shm", root: str | os.PathLike[str] | None = None,
                 budget_bytes: int | None = 4 << 30) -> None:
        if root is None:
            if not Path("/dev/shm").is_dir():
                raise FileNotFoundError("/dev/shm does not exist here; pass root= explicitly")
            root = default_shm_root(name)
        super().__init__(name, root, budget_bytes)


class DiskTier(FileTier):
    """Files on disk (default the user cache dir's kv/<name>; configure_cache and add_tier
    give a tier without a root ``chunk_tier_admin.default_root`` instead)."""

    kind = "disk"

    def __init__(self, name: str = "disk", root: str | os.PathLike[str] | None = None,
                 budget_bytes: int | None = 32 << 30) -> None:
        super().__init__(name, default_disk_root(name) if root is None else root, budget_bytes)
