"""LoRA adapter set of the engine. A mixin of :class:`Engine`.

`llama_set_adapters_lora` changes every sequence of the context, so a change is only
requested here (any thread) and applied by the loop before its next admission, once the
requests admitted under the old set have ended: each request runs under one set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _native


@dataclass(slots=True, frozen=True)
class AdapterSlot:
    handle: int
    native: Any
    path: str
    sha256: str
    scale: float

    def info(self) -> dict[str, Any]:
        return {"adapter": self.handle, "scale": self.scale, "path": self.path, "sha256": self.sha256}


class AdapterOps:
    # --- LoRA adapters ---------------------------------------------------------------------
    def request_adapters(self, change: Callable[[list[AdapterSlot]], list[AdapterSlot]]) -> None:
        """Change the adapter set (any thread); it applies before the next admission."""
        with self._cv:
            current = self._adapter_target if self._adapter_target is not None else self.adapters
            self._adapter_target = change(list(current))
            self._cv.notify()

    def adapter_list(self) -> list[AdapterSlot]:
        with self._cv:
            return list(self._adapter_target if self._adapter_target is not None else self.adapters)

    def _apply_adapters(self) -> None:
        with self._cv:
            target, self._adapter_target = self._adapter_target or [], None
        live = [a for a in target if a.scale != 0.0]   # scale 0 is exactly the base model
        _native.set_adapters(self.ctx, [a.native for a in live], [a.scale for a in live])
        self.adapters = target
        if self.kvcache is not None:
            self.kvcache.set_adapters(tuple((a.sha256, a.scale) for a in live))
        for sess in self.sessions.idle_pinned():       # their live KV was computed under the old set
            self._free_session_seq(sess)
        self.counters["adapter_changes"] += 1
