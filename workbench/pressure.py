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

import math
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import InvalidOption
from .options import check_bool, check_number


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

    def read(self) -> Any:
        return self.fn()


def as_reading(got: Any) -> Reading | None:
    """What a source returned, as a Reading: a Reading, a (used_bytes, total_bytes) pair of
    finite non-negative numbers, or None (nothing to report). Anything else raises TypeError."""
    if got is None or isinstance(got, Reading):
        return got
    if isinstance(got, (tuple, list)) and len(got) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in got):
        return Reading(int(got[0]), int(got[1]))
    raise TypeError(f"a source must return a Reading, (used_bytes, total_bytes) or None; got {got!r}")


def default_evictor() -> str | None:
    """Unload the least recently active idle model; its id, or None if none is idle."""
    from . import api, registry

    victim = registry.least_recently_active_idle()
    if victim is None:
        return None
    api.unload(victim.model_id)
    return victim.model_id


STOP_TIMEOUT_S = 2.0


class PressureMonitor:
    """The poller thread. A failing source or evictor is recorded (``errors``,
    ``last_error``) and the poller goes on; stop() never waits long for a slow source."""

    def __init__(self, sources: list[Any], interval_s: float, high: float, target: float,
                 unload_models: bool, evictor: Callable[[], str | None] | None) -> None:
        self.sources = sources
        self.interval_s, self.high, self.target = interval_s, high, target
        self.unload_models = unload_models
        self.evictor = evictor or default_evictor
        self.last: dict[str, Reading | None] = {}
        self.stats = {"polls": 0, "pressure_events": 0, "cache_bytes_evicted": 0, "models_unloaded": 0,
                      "errors": 0}
        self.last_model_unloaded: str | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-pressure", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Ask the poller to end; wait at most ``timeout`` s (not at all from the poller's own
        thread, e.g. an evictor). True if it has ended; a poller stuck in a source ends
        when the source returns, without acting on what it read."""
        self._stop.set()
        if threading.current_thread() is self._thread:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - recorded; the poller must outlive its callbacks
                self._record("poll", e)
            self._stop.wait(self.interval_s)

    def _record(self, where: str, e: BaseException) -> None:
        self.stats["errors"] += 1
        self.last_error = f"{where}: {type(e).__name__}: {e}"[:500]

    def _read(self, src: Any) -> Reading | None:
        try:
            return as_reading(src.read())
        except Exception as e:  # noqa: BLE001 - a broken source must not kill the poller
            self._record(f"source {getattr(src, 'name', '?')!r}", e)
            return None

    def poll(self) -> None:
        """One look at every source; act on the worst one over ``high``."""
        from .cache.shared import shared_cache

        self.stats["polls"] += 1
        worst: Reading | None = None
        for src in self.sources:
            r = self._read(src)
            self.last[src.name] = r
            if r is not None and r.fraction > self.high and (worst is None or r.fraction > worst.fraction):
                worst = r
        if worst is None or self._stop.is_set():   # stopped while a source was slow: act on nothing
            return
        self.stats["pressure_events"] += 1
        need = int(worst.used_bytes - self.target * worst.total_bytes)
        freed = self._free_memory(shared_cache(), need) if need > 0 else 0
        self.stats["cache_bytes_evicted"] += freed
        if freed < need and self.unload_models:
            self._unload_one()

    @staticmethod
    def _free_memory(cache: Any, need: int) -> int:
        """Free ``need`` bytes of the top tier (memory): named, since chunk storage's
        evict_bytes defaults to its last tier (where chunks leave the cache)."""
        tiers = cache.list_tiers()
        return cache.evict_bytes(need, tiers[0]["name"]) if tiers else 0

    def _unload_one(self) -> None:
        try:
            victim = self.evictor()
        except Exception as e:  # noqa: BLE001 - recorded, shown by pressure()
            self._record("evictor", e)
            return
        if victim is not None:
            self.stats["models_unloaded"] += 1
            self.last_model_unloaded = str(victim)


_monitor: PressureMonitor | None = None
_SOURCES = {"system": SystemMemory, "gpu": GpuMemory}


_lock = threading.Lock()


def start_pressure_monitor(sources: list[Any] | None = None, interval_s: float = 5.0, high: float = 0.9,
                           target: float = 0.8, unload_models: bool = False,
                           evictor: Callable[[], str | None] | None = None) -> None:
    """Start (or restart) the poller. ``sources``: names ('system', 'gpu'), source objects,
    or callables returning (used_bytes, total_bytes); default: system, plus gpu if present."""
    global _monitor
    high = check_number("high", high, 0.0, 1.0)
    target = check_number("target", target, 0.0, 1.0)
    if not 0 < target <= high:
        raise InvalidOption("high/target", (high, target), "0 < target <= high <= 1")
    interval = check_number("interval_s", interval_s, 0.001, 86400.0, what="a number of seconds")
    check_bool("unload_models", unload_models)
    if evictor is not None and not callable(evictor):
        raise InvalidOption("evictor", evictor, "a callable returning the unloaded model's id (or None), or None")
    built = _sources(sources)
    stop_pressure_monitor()
    monitor = PressureMonitor(built, interval, high, target, unload_models, evictor)
    with _lock:
        _monitor = monitor
    monitor.start()


def _sources(sources: Any) -> list[Any]:
    if sources is not None and (isinstance(sources, (str, bytes)) or not isinstance(sources, (list, tuple))):
        raise InvalidOption("sources", sources, "a list of sources")
    built = []
    for s in sources if sources is not None else ["system"] + (["gpu"] if shutil.which("nvidia-smi") else []):
        if isinstance(s, str) and s in _SOURCES:
            built.append(_SOURCES[s]())
        elif not isinstance(s, str) and hasattr(s, "read") and hasattr(s, "name"):
            built.append(s)
        elif not isinstance(s, str) and callable(s):
            built.append(CallbackSource(s))
        else:
            raise InvalidOption("sources", s, "'system', 'gpu', a source object or a callable")
    return built


def stop_pressure_monitor(timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the poller; waits at most ``timeout_s`` for it to end (a poll in progress, a slow
    source) and returns whether it has. Safe to call from an evictor or a source."""
    global _monitor
    timeout = check_number("timeout_s", timeout_s, 0.0, 3600.0, what="a number of seconds")
    with _lock:
        m, _monitor = _monitor, None
    return True if m is None else m.stop(timeout)


def pressure() -> dict[str, Any]:
    """What the poller sees now: per source used/total/fraction, thresholds, its stats and
    errors (a failing source or evictor: ``errors`` counts them, ``last_error`` says the
    latest)."""
    m = _monitor
    if m is None:
        return {"running": False}
    return {
        "running": m.running, "high": m.high, "target": m.target, "unload_models": m.unload_models,
        "sources": {name: None if r is None else {"used_bytes": r.used_bytes, "total_bytes": r.total_bytes,
                                                  "fraction": r.fraction}
                    for name, r in list(m.last.items())},
        **m.stats, "last_model_unloaded": m.last_model_unloaded, "last_error": m.last_error,
    }


def pressure_sources() -> list[str]:
    """Names of the sources the running poller reads (empty when it is off)."""
    m = _monitor
    return [s.name for s in m.sources] if m is not None else []
