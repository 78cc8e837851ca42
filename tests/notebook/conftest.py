"""Fixtures of the notebook tests: an IPython shell with the extension loaded (text mode:
these tests run without a Jupyter frontend, as nbval and a terminal would)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The InteractiveShell singleton with `%load_ext workbench` and fresh magics state."""
    from IPython.core.interactiveshell import InteractiveShell

    from workbench.notebook import widgets

    monkeypatch.setenv(widgets.DISPLAY_ENV, "text")
    shell = InteractiveShell.instance()
    for name in ("workbench", "workbench.notebook"):
        if name in shell.extension_manager.loaded:
            shell.extension_manager.unload_extension(name)
    result = shell.run_cell("%load_ext workbench")
    assert result.success, result.error_in_exec
    yield shell
    for name in ("workbench", "workbench.notebook"):
        if name in shell.extension_manager.loaded:
            shell.extension_manager.unload_extension(name)
    for name in list(shell.user_ns):
        if name.startswith("nbtest_") or name == "_wb":
            del shell.user_ns[name]


def run(shell: Any, cell: str) -> Any:
    """run_cell, returning the ExecutionResult (errors are in error_in_exec)."""
    return shell.run_cell(cell)


def magics_of(shell: Any) -> Any:
    from workbench.notebook.magics import WorkbenchMagics

    return next(m for m in shell.magics_manager.registry.values() if isinstance(m, WorkbenchMagics))
