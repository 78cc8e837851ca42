"""The engine's LoRA adapter set.

`llama_set_adapters_lora` changes every sequence of the context, so a change is only
requested here (any thread) and applied by the loop before its next admission, once the
requests admitted under the old set have ended: each request runs under one set.

State: the applied set and the requested one (None: no change waiting), both guarded by
the engine's lock.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _native
from .prefix_cache import EngineCache
from .seq_pool import SeqPool


@dataclass(slots=True, frozen=True)
class AdapterSlot:
    handle: int
    native: Any
    path: str
    sha256: str
    scale: float

    def info(self) -> dict[str, Any]:
        return {"adapter": self.handle, "scale": self.scale, "path": self.path, "sha256": self.sha256}


class AdapterSet:
    def __init__(self, pool: SeqPool, kvcache: EngineCache | None, counters: collections.Counter[str],
                 lock: threading.Condition) -> None:
        self._pool = pool
        self._kvcache = kvcache
        self._counters = counters
        self._lock = lock
        self.applied: list[AdapterSlot] = []
        self._target: list[AdapterSlot] | None = None

    # --- any thread -------------------------------------------------------------------------
    def request(self, change: Callable[[list[AdapterSlot]], list[AdapterSlot]]) -> None:
        """Change the adapter set; it applies before the next admission."""
        with self._lock:
            current = self._target if self._target is not None else self.applied
            self._target = change(list(current))
            self._lock.notify()

    def listed(self) -> list[AdapterSlot]:
        """The set as requested (what runs once the change applies)."""
        with self._lock:
            return list(self._target if self._target is not None else self.applied)

    @property
    def change_waiting(self) -> bool:
        return self._target is not None

    # --- the loop thread --------------------------------------------------------------------
    def apply(self) -> None:
        """Apply the requested set. Idle sessions' live KV was computed under the old set:
        their sequences are released (their next turn re-prefills or restores)."""
        with self._lock:
            target, self._target = self._target or [], None
        self.applied = target
        live = self._set_native()
        if self._kvcache is not None:
            self._kvcache.set_adapters(tuple((a.sha256, a.scale) for a in live))
        self._pool.release_idle_sessions()
        self._counters["adapter_changes"] += 1

    def _set_native(self) -> list[AdapterSlot]:
        """Hand the applied set to the (possibly new) context; scale 0 is exactly the base model."""
        live = [a for a in self.applied if a.scale != 0.0]
        _native.set_adapters(self._pool.ctx, [a.native for a in live], [a.scale for a in live])
        return live

    def reapply(self) -> None:
        """The context was recreated: it runs under the applied set again."""
        self._set_native()
