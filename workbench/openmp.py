"""How ggml's OpenMP threads wait: set before the extension loads.

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
  barrier to 100 spins, and each decode of the process ran at about 0.6x while two models
  were loaded.

OMP_WAIT_POLICY=ACTIVE with GOMP_SPINCOUNT=10,000 (tens of microseconds) keeps a quiet
machine's speed, stops most of the loss on a busy one, and makes the throttled count 1,000
spins, which keeps full speed with several teams. Both are set only when the environment
sets neither: a user's own choice wins. libgomp reads them once, when it loads, so a process
that loaded libgomp before importing workbench keeps what it had; child processes inherit
them (llama.cpp's programs the benches start run under the same settings).
"""

from __future__ import annotations

import os

POLICY_ENV, SPIN_ENV = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
SETTINGS = {POLICY_ENV: "ACTIVE", SPIN_ENV: "10000"}


def set_wait_defaults() -> None:
    """SETTINGS into the environment unless it sets OMP_WAIT_POLICY or GOMP_SPINCOUNT."""
    if not any(k in os.environ for k in SETTINGS):
        os.environ.update(SETTINGS)


set_wait_defaults()
