"""The notebook layer: IPython magics, live widgets, pandas views, plots.

    %load_ext workbench            # or %load_ext workbench.notebook
    %wb load default
    %%generate --max-tokens 32 --as r
    Tell me about {topic}

    from workbench.notebook import views, plots

The eviction lab is its own package, `workbench.lab` (no IPython needed); `lab` and
`traces` are reachable from here too. Modules are imported on first use, so
`import workbench.notebook` needs neither pandas, matplotlib nor ipywidgets.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Result", "lab", "load_ipython_extension", "magics", "plot_miss_ratio_curves", "plots", "replay",
           "traces", "unload_ipython_extension", "views", "widgets"]

_MODULES = {"async_cells", "commands", "magics", "plots", "results", "views", "widgets"}
_ELSEWHERE = {"lab": "workbench.lab", "traces": "workbench.lab.traces"}
_NAMES = {"Result": "workbench.notebook.results", "replay": "workbench.lab",
          "plot_miss_ratio_curves": "workbench.lab"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _ELSEWHERE:
        return importlib.import_module(_ELSEWHERE[name])
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext workbench.notebook`: register %wb, %%generate and %%chat."""
    from workbench.notebook import async_cells
    from workbench.notebook.magics import WorkbenchMagics

    ipython.register_magics(WorkbenchMagics(ipython))
    async_cells.install(ipython)  # in a kernel that can: foreground cells await, Cancel acts


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the magics again (`%unload_ext`)."""
    from workbench.notebook import async_cells
    from workbench.notebook.magics import WorkbenchMagics

    async_cells.uninstall(ipython)
    registry = ipython.magics_manager.registry
    magics = ipython.magics_manager.magics
    for kind, names in (("line", WorkbenchMagics.line_names), ("cell", WorkbenchMagics.cell_names)):
        for name in names:
            magics[kind].pop(name, None)
    registry.pop("WorkbenchMagics", None)
