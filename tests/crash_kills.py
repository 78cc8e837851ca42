"""Helpers of the SIGKILL tests (tests/unit/test_cache_crash.py with the cache alone,
tests/integration/test_crash_engine.py with the real engine): start a writer child, let it
run for a random moment, kill it with SIGKILL, reap it; then look for what a kill can leave.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """The environment of a child that imports workbench from this checkout."""
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def kill_at_random(script: str, args: Sequence[str], rng: random.Random, max_delay_s: float,
                   min_delay_s: float = 0.0) -> int:
    """Run `python -c script *args`, wait for it to print `ready`, sleep a random moment,
    SIGKILL it and reap it (so its pid is gone and its tmp files count as orphans). Returns
    its exit status (-9 unless it had died on its own, which the caller should treat as a
    failure)."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], env=child_env(), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline().strip()
    if line != b"ready":
        child.kill()
        child.wait()
        raise AssertionError(f"the writer did not start: {line!r} {child.stderr.read()[-3000:]!r}")
    time_s = rng.uniform(min_delay_s, max_delay_s)
    try:
        child.wait(time_s)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
        child.wait()
    child.stdout.close()
    child.stderr.close()
    return child.returncode


def tmp_files(*roots: Path) -> list[str]:
    """Publish tmp files (`<key>.tmp.<pid>.<random>`) under the given tier directories."""
    return [name for root in roots if root.is_dir() for name in os.listdir(root) if ".tmp." in name]
