"""How ggml's OpenMP threads wait: libgomp is given its settings as the extension loads.

ggml's CPU backend is built with OpenMP here (GGML_OPENMP): the threads of one decode meet
at a barrier after each step of the graph, and libgomp's threads spin there before they
sleep on a futex. libgomp's defaults hurt this process in two ways (docs/benchmarks.md, "A
busy machine and several decoding threads"):

* When unset, a thread spins up to 300,000 times (milliseconds). With the cores free that
  costs nothing; on a machine whose cores other work holds, a spinning thread keeps the core
  its partner needs to reach the barrier: a decode on 2 threads beside two CPU burners ran
  2-20x slower than on 1.
* Every thread that has run a decode (each loaded model's loop thread, a caller's thread)
  owns an OpenMP team; once the teams' threads outnumber the cores, libgomp throttles every
  barrier to 100 spins, and each decode of the process ran at about 0.5x while two models
  were loaded.

OMP_WAIT_POLICY=ACTIVE with GOMP_SPINCOUNT=10,000 (tens of microseconds) keeps a quiet
machine's speed, stops most of the loss on a busy one, and makes the throttled count 1,000
spins, which keeps full speed with several teams. libgomp reads them once, when it loads,
which is when ``workbench._native`` loads: this module loads it with them in the
environment and then puts the environment back, so child processes and other OpenMP
runtimes loaded later (Intel's reads OMP_WAIT_POLICY=ACTIVE as "spin forever") never see
them. Nothing is set when the environment sets either (a user's own choice wins); a process
that loaded libgomp before importing workbench keeps what it had.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

POLICY_ENV, SPIN_ENV = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
SETTINGS = {POLICY_ENV: "ACTIVE", SPIN_ENV: "10000"}


@contextmanager
def wait_settings() -> Iterator[None]:
    """SETTINGS in the environment for the block, unless it sets OMP_WAIT_POLICY or
    GOMP_SPINCOUNT; removed again after it."""
    if any(k in os.environ for k in SETTINGS):
        yield
        return
    os.environ.update(SETTINGS)
    try:
        yield
    finally:
        for k in SETTINGS:
            os.environ.pop(k, None)


with wait_settings():
    importlib.import_module("workbench._native")   # libgomp loads (and reads them) with it
