"""pytest runs the tutorial notebooks with nbval (`--nbval --nbval-current-env`, set in
pyproject.toml's addopts): each notebook runs top to bottom in a fresh kernel of this
Python environment, and every cell's output is compared with the output stored in the
notebook, after the sanitizers of nbval_sanitize.cfg. Cells tagged `nbval-ignore-output`
run but are not compared (docs/notebooks.md says which and why).

Refresh the stored outputs after changing a notebook or the library: `make notebooks`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SANITIZE = HERE / "nbval_sanitize.cfg"
DISPLAY_ENV = "WORKBENCH_DISPLAY"  # workbench.notebook.widgets.DISPLAY_ENV (not imported: no model code here)


def _is_notebook_item(item: pytest.Item) -> bool:
    return item.path.suffix == ".ipynb" and HERE in item.path.resolve().parents


def pytest_configure(config: pytest.Config) -> None:
    # the sanitizers, unless --nbval-sanitize-with names others (absolute: pytest may run
    # from another directory)
    if getattr(config.option, "nbval_sanitize_with", "absent") is None:
        config.option.nbval_sanitize_with = str(SANITIZE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_notebook_item(item):
            item.add_marker(pytest.mark.notebooks)
            item.add_marker(pytest.mark.model)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """nbval starts a notebook's kernel while setting up its first cell; the kernel inherits
    this process's environment, and WORKBENCH_DISPLAY=text makes %%generate print plain
    text (the outputs stored in the notebooks) instead of a widget. Set only around that
    setup, so the other tests' kernels (tests/notebook/test_kernel.py) keep widgets."""
    if not _is_notebook_item(item):
        yield
        return
    old = os.environ.get(DISPLAY_ENV)
    os.environ[DISPLAY_ENV] = "text"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DISPLAY_ENV, None)
        else:
            os.environ[DISPLAY_ENV] = old
