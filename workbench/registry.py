"""The loaded models: model id -> Engine. The one place the facade, the pressure poller and
the notebook views look a model up; every per-model call raises NotLoaded for an id that is
not loaded (or still loading)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from .engine.engine import Engine, model_id_for
from .errors import AlreadyLoaded, NotLoaded

_lock = threading.Lock()
_engines: dict[str, Engine | None] = {}  # None: the id is reserved while its model loads


def get(model: Any) -> Engine:
    """The Engine of a loaded model id (or the Engine itself); NotLoaded otherwise."""
    if isinstance(model, Engine):
        model = model.model_id
    with _lock:
        eng = _engines.get(model) if isinstance(model, str) else None
    if eng is None:
        raise NotLoaded(model)
    return eng


def engines() -> list[Engine]:
    """Every loaded model's Engine, in load order (those still loading are left out)."""
    with _lock:
        return [e for e in _engines.values() if e is not None]


def reserve(model_id: str | None, path: Path) -> str:
    """Claim `model_id` (or one made from the file name) while the model loads; AlreadyLoaded
    when the id is taken."""
    with _lock:
        if model_id is not None and model_id in _engines:
            raise AlreadyLoaded(model_id)
        chosen = model_id or model_id_for(path, set(_engines))
        _engines[chosen] = None
        return chosen


def commit(model_id: str, engine: Engine) -> None:
    """The reserved id's model has loaded."""
    with _lock:
        _engines[model_id] = engine


def release(model_id: str) -> None:
    """Drop a reservation (the load failed) or a loaded model; no-op when absent."""
    with _lock:
        _engines.pop(model_id, None)


def least_recently_active_idle() -> Engine | None:
    """The idle model (nothing queued or running) whose loop was active longest ago."""
    idle = [e for e in engines() if e.phase == "idle" and e.queue_depth() == 0 and e.pending_len() == 0]
    return min(idle, key=lambda e: e.last_active) if idle else None
