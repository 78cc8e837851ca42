"""Memory pressure: watch memory, free cache bytes first, then (opt-in) an idle model.

Off by default. :func:`start_pressure_monitor` starts a poller thread over one or more
sources (system memory through psutil, GPU memory through nvidia-smi when present, or a
user callback). When a source's used fraction passes ``high``, the poller evicts enough
bytes from the prefix cache's top tier to bring it back to ``target`` (rows are demoted
to slower tiers, not lost, when there are any); if that was not enough and
``unload_models`` is set, it asks the evictor to unload one idle model (at most one per
poll). The default evictor picks the least recently active idle model.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import InvalidOption


@dataclass(slots=True, frozen=True)
class Reading:
    used_bytes: int
    total_bytes: int

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


class PressureSource(Protocol):
    name: str

    def read(self) -> Reading | None: ...


class SystemMemory:
    """RAM as psutil sees it (used = total - available)."""

    name = "system"

    def read(self) -> Reading:
        import psutil

        vm = psutil.virtual_memory()
        return Reading(vm.total - vm.available, vm.total)


class GpuMemory:
    """The sum over GPUs that nvidia-smi reports; None when there is no nvidia-smi/GPU."""

    name = "gpu"

    def read(self) -> Reading | None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        try:
            out = subprocess.run([exe, "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        used = total = 0
        for line in out.strip().splitlines():
            u, t = (int(x.strip()) for x in line.split(","))
            used, total = used + u * 2**20, total + t * 2**20
        return Reading(used, total) if total else None


class CallbackSource:
    """A user function returning (used_bytes, total_bytes) or None."""

    def __init__(self, fn: Callable[[], tuple[int, int] | None], name: str = "callback") -> None:
        self.fn, self.name = fn, name

    def read(self) -> Reading | None:
        got = self.fn()
        return None if got is None else Reading(int(got[0]), int(got[1]))


def default_evictor() -> str | None:
    """Unload the least recently active idle model; its id, or None if none is idle."""
    from . import api

    with api._lock:
        idle = [e for e in api._engines.values()
                if e is not None and e.phase == "idle" and not e.pending and not e.active]
    if not idle:
        return None
    victim = min(idle, key=lambda e: e.last_active)
    api.unload(victim.model_id)
    return victim.model_id


class PressureMonitor:
    def __init__(self, sources: list[Any], interval_s: float, high: float, target: float,
                 unload_models: bool, evictor: Callable[[], str | None] | None) -> None:
        self.sources = sources
        self.interval_s, self.high, self.target = interval_s, high, target
        self.unload_models = unload_models
        self.evictor = evictor or default_evictor
        self.last: dict[str, Reading | None] = {}
        self.stats = {"polls": 0, "pressure_events": 0, "cache_bytes_evicted": 0, "models_unloaded": 0}
        self.last_model_unloaded: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-pressure", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def poll(self) -> None:
        """One look at every source; act on the worst one over ``high``."""
        from .engine import prefix_cache

        self.stats["polls"] += 1
        worst: Reading | None = None
        for src in self.sources:
            try:
                r = src.read()
            except Exception:  # a broken source must not kill the poller
                r = None
            self.last[src.name] = r
            if r is not None and r.fraction > self.high and (worst is None or r.fraction > worst.fraction):
                worst = r
        if worst is None:
            return
        self.stats["pressure_events"] += 1
        need = int(worst.used_bytes - self.target * worst.total_bytes)
        freed = prefix_cache.shared_cache().evict_bytes(need) if need > 0 else 0
        self.stats["cache_bytes_evicted"] += freed
        if freed < need and self.unload_models:
            victim = self.evictor()
            if victim is not None:
                self.stats["models_unloaded"] += 1
                self.last_model_unloaded = victim


_monitor: PressureMonitor | None = None
_SOURCES = {"system": SystemMemory, "gpu": GpuMemory}


def start_pressure_monitor(sources: list[Any] | None = None, interval_s: float = 5.0, high: float = 0.9,
                           target: float = 0.8, unload_models: bool = False,
                           evictor: Callable[[], str | None] | None = None) -> None:
    """Start (or restart) the poller. ``sources``: names ('system', 'gpu'), source objects,
    or callables returning (used_bytes, total_bytes); default: system, plus gpu if present."""
    global _monitor
    if not 0 < target <= high <= 1:
        raise InvalidOption("high/target", (high, target), "0 < target <= high <= 1")
    if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or interval_s <= 0:
        raise InvalidOption("interval_s", interval_s, "a positive number of seconds")
    built = []
    for s in sources if sources is not None else ["system"] + (["gpu"] if shutil.which("nvidia-smi") else []):
        if isinstance(s, str):
            if s not in _SOURCES:
                raise InvalidOption("sources", s, "'system', 'gpu', a source object or a callable")
            built.append(_SOURCES[s]())
        elif hasattr(s, "read") and hasattr(s, "name"):
            built.append(s)
        elif callable(s):
            built.append(CallbackSource(s))
        else:
            raise InvalidOption("sources", s, "'system', 'gpu', a source object or a callable")
    stop_pressure_monitor()
    _monitor = PressureMonitor(built, float(interval_s), high, target, unload_models, evictor)
    _monitor.start()


def stop_pressure_monitor() -> None:
    global _monitor
    if _monitor is not None:
        _monitor.stop()
        _monitor = None


def pressure() -> dict[str, Any]:
    """What the poller sees now: per source used/total/fraction, thresholds and its stats."""
    m = _monitor
    if m is None:
        return {"running": False}
    return {
        "running": True, "high": m.high, "target": m.target, "unload_models": m.unload_models,
        "sources": {name: None if r is None else {"used_bytes": r.used_bytes, "total_bytes": r.total_bytes,
                                                  "fraction": r.fraction}
                    for name, r in m.last.items()},
        **m.stats, "last_model_unloaded": m.last_model_unloaded,
    }


def pressure_sources() -> list[str]:
    """Names of the sources the running poller reads (empty when it is off)."""
    return [s.name for s in _monitor.sources] if _monitor is not None else []
