"""Names the engine gives: a model id from its file name, a user's exception in a message."""

from __future__ import annotations

from pathlib import Path


def describe(e: Exception) -> str:
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 - a user's exception whose str() raises
        return type(e).__name__


def model_id_for(path: Path, taken: set[str]) -> str:
    base = path.name.removesuffix(".gguf")
    base = base.lower() or "model"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    return candidate
