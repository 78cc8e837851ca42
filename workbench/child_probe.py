"""Verdicts of the child-process probes (models/probe.py: model files and adapters;
chat/probe.py: chat templates): what each probe already cleared, in this process and,
for a clean run, on this machine (an empty marker file under ``$WORKBENCH_HOME/<folder>``),
and what it refused and why (``<key>.refused`` beside them), so a refusal costs no second
probe either.
"""

from __future__ import annotations

import signal
import threading

from .models.default import workbench_home

_lock = threading.Lock()
_cleared: set[tuple[str, str]] = set()
_refused: dict[tuple[str, str], str] = {}


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


def refused(folder: str, key: str) -> str | None:
    """Why this process, or this machine, already refused (folder, key); None if it did not."""
    with _lock:
        if (folder, key) in _refused:
            return _refused[(folder, key)]
    try:
        why = (workbench_home() / folder / f"{key}.refused").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    with _lock:
        _refused[(folder, key)] = why
    return why


def refuse(folder: str, key: str, why: str, *, persist: bool) -> None:
    """Refuse (folder, key) from now on, for `why`; `persist` (a verdict not owed to this
    machine's load, such as a timeout or the OOM killer) remembers it on disk."""
    with _lock:
        _refused[(folder, key)] = why
    if not persist:
        return
    marker = workbench_home() / folder / f"{key}.refused"
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(why, encoding="utf-8")
    except OSError:
        pass


def signal_name(returncode: int) -> str:
    """The name of the signal a child's negative return code stands for."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
