"""Where the build put things: ``python bench/_paths.py build-dir | tool NAME``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_dir() -> Path:
    """The scikit-build-core build directory (build/<wheel tag>) holding CMakeCache.txt."""
    caches = sorted((ROOT / "build").glob("*/CMakeCache.txt"), key=lambda p: p.stat().st_mtime)
    if not caches:
        raise SystemExit("no build directory under build/: run `make build` first")
    return caches[-1].parent


def tool(name: str) -> Path:
    """Path of a llama.cpp program built by `make tools` (e.g. llama-bench)."""
    found = sorted(build_dir().glob(f"**/bin/{name}")) + sorted(build_dir().glob(f"**/{name}"))
    for p in found:
        if p.is_file():
            return p
    raise FileNotFoundError(f"{name} is not built: run `make tools`")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "build-dir"
    print(build_dir() if what == "build-dir" else tool(sys.argv[2]))
