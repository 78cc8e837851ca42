"""Verdicts of the child-process probes (models/probe.py: model files and adapters;
chat/probe.py: chat templates): what each probe already cleared, in this process and,
for a clean run, on this machine (an empty marker file under ``$WORKBENCH_HOME/<folder>``).
"""

from __future__ import annotations

import signal
import threading

from .models.default import workbench_home

_lock = threading.Lock()
_cleared: set[tuple[str, str]] = set()


def cleared(folder: str, key: str) -> bool:
    """Has this process, or this machine, already let (folder, key) through?"""
    with _lock:
        if (folder, key) in _cleared:
            return True
    if (workbench_home() / folder / key).exists():
        with _lock:
            _cleared.add((folder, key))
        return True
    return False


def clear(folder: str, key: str, *, persist: bool) -> None:
    """Let (folder, key) through from now on; `persist` (a clean run) remembers it on disk."""
    with _lock:
        _cleared.add((folder, key))
    if persist:
        marker = workbench_home() / folder / key
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass


def signal_name(returncode: int) -> str:
    """The name of the signal a child's negative return code stands for."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
