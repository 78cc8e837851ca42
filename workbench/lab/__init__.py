"""The eviction lab: request traces, a payload-free simulation built from the cache's own
classes (the chunk model by default: chunksim.py; whole rows: simcache.py), and replays
that compare eviction policies at several byte budgets.

    from workbench import lab
    from workbench.lab import traces
    df = lab.replay(traces.multi_turn_chats(10_000), sizes=["1GiB", "4GiB", "16GiB"])
    lab.plot_miss_ratio_curves(df)

Importable without IPython or ipywidgets: replays need numpy only, the DataFrames pandas,
the plots matplotlib (imported on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DEFAULT_BYTES_PER_TOKEN", "belady", "by_budget", "chunkrank", "chunks", "chunksim", "default_sizes",
           "experiment", "load", "load_sweep", "load_test", "LoadResult", "measure", "native", "plan",
           "plot_miss_ratio_curves", "record", "recording", "replay", "SAVE_KINDS", "simcache", "sweep", "SweepResult",
           "traces"]

_MODULES = {"belady", "chunkrank", "chunks", "chunksim", "experiment", "load", "native", "plan", "recording",
            "simcache", "sweep", "traces"}
_NAMES = {"replay", "by_budget", "measure", "plot_miss_ratio_curves", "default_sizes", "DEFAULT_POLICIES",
          "DEFAULT_BYTES_PER_TOKEN", "SAVE_KINDS"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.experiment"), name)
    if name in ("load_test", "LoadResult"):  # open-loop load tests (load.py)
        return getattr(importlib.import_module(f"{__name__}.load"), name)
    if name in ("load_sweep", "SweepResult"):  # one load against several settings or systems (sweep.py)
        return getattr(importlib.import_module(f"{__name__}.sweep"), name)
    if name == "record":  # lab.record(): a notebook's served requests as a trace (recording.py; a
        # module named record would shadow this function once imported)
        return importlib.import_module(f"{__name__}.recording").record
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
