"""Waiting for a condition in tests: poll it until it holds or a deadline passes, never sleep
a fixed time and hope (the machine may be loaded)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """True as soon as `cond()` is truthy; after `timeout` seconds, `cond()`'s last answer."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())
