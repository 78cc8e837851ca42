"""A plot returned by a cell shows as a picture without `%matplotlib inline` (the figure's own
`_repr_png_`), in IPython and in a real Jupyter kernel; with the inline backend active, its
formatter draws the figure as before, once; a user's own figures are left as they were."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pandas as pd
import pytest
from matplotlib.figure import Figure as MatplotlibFigure

from workbench.notebook import plots

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
REPLAY = pd.DataFrame({"policy": ["lru", "lru", "lfu", "lfu"], "size_bytes": [1 << 20, 2 << 20] * 2,
                       "miss_ratio": [0.3, 0.2, 0.25, 0.1]})


@pytest.fixture
def shell() -> Iterator[Any]:
    """The InteractiveShell singleton (no extension loaded) with no display formatter
    registered for matplotlib's Figure, as before `%matplotlib inline`; restored after."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    saved = {mime: f.type_printers.pop(MatplotlibFigure, None)
             for mime, f in shell.display_formatter.formatters.items()}
    yield shell
    for mime, printer in saved.items():
        if printer is not None:
            shell.display_formatter.formatters[mime].for_type(MatplotlibFigure, printer)
        else:
            shell.display_formatter.formatters[mime].type_printers.pop(MatplotlibFigure, None)


def test_a_returned_plot_is_a_png_without_matplotlib_inline(shell: Any) -> None:
    shell.user_ns["nbtest_replay"] = REPLAY
    result = shell.run_cell("from workbench import lab\nlab.plot_miss_ratio_curves(nbtest_replay)")
    assert result.success, result.error_in_exec
    fig = result.result
    assert isinstance(fig, MatplotlibFigure)
    data, _ = shell.display_formatter.format(fig)
    assert base64.b64decode(data["image/png"]).startswith(PNG)
    assert data["text/plain"] == "<Figure size 700x400 with 1 Axes>"  # matplotlib's repr, as stored in notebooks
    for plot in (plots.eviction_timeline(pd.DataFrame({"policy": ["a", "b", "c"], "size_bytes": 1, "request": 1,
                                                          "evictions": 0, "hits": 0})),
                 plots.strategy_latencies(pd.DataFrame({"strategy": ["s"], "kind": ["long"], "ttft_s": [0.1],
                                                        "itl_s": [0.01]}))):
        assert base64.b64decode(shell.display_formatter.format(plot)[0]["image/png"]).startswith(PNG)
    del shell.user_ns["nbtest_replay"]


def test_nothing_global_changes(shell: Any) -> None:
    fig = plots.miss_ratio_curves(REPLAY)
    assert "image/png" in shell.display_formatter.format(fig)[0]
    # a user's own figure, and an empty one, stay text: no formatter was registered, no backend set
    assert set(shell.display_formatter.format(MatplotlibFigure())[0]) == {"text/plain"}
    assert all(MatplotlibFigure not in f.type_printers for f in shell.display_formatter.formatters.values())
    from workbench.notebook.figure import Figure

    assert set(shell.display_formatter.format(Figure())[0]) == {"text/plain"}


def test_the_inline_backends_formatter_wins_when_active(shell: Any) -> None:
    """With `%matplotlib inline` (its formatters registered for Figure), a plot is drawn by
    them, as the tutorials' stored outputs were: one image, the inline backend's bytes."""
    from IPython.core.pylabtools import select_figure_formats

    select_figure_formats(shell, {"png"})  # what %matplotlib inline does to the formatters
    fig = plots.miss_ratio_curves(REPLAY)
    data, _ = shell.display_formatter.format(fig)
    printer = shell.display_formatter.formatters["image/png"].lookup(fig)
    assert data["image/png"] == printer(fig)
    assert set(data) == {"text/plain", "image/png"}


def test_in_a_kernel_without_and_with_matplotlib_inline() -> None:
    cells = [
        "from workbench import lab\nimport pandas as pd\n"
        f"df = pd.DataFrame({REPLAY.to_dict(orient='list')!r})\nlab.plot_miss_ratio_curves(df)",
        # the case the plots meet: no pyplot, so the kernel's inline backend never registered its formatter
        "from matplotlib.figure import Figure\nplain = Figure()\nplain.add_subplot().plot([1, 2])\nplain",
        "%matplotlib inline\nlab.plot_miss_ratio_curves(df)",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    assert set(nb.cells[1].outputs[0]["data"]) == {"text/plain"}  # a plain Figure: text
    for cell in (nb.cells[0], nb.cells[2]):
        assert [o.output_type for o in cell.outputs] == ["execute_result"], cell.outputs  # one picture each
        assert base64.b64decode(cell.outputs[0]["data"]["image/png"]).startswith(PNG)
        assert cell.outputs[0]["data"]["text/plain"] == "<Figure size 700x400 with 1 Axes>"
    # pyplot's own figures are the inline backend's, once
    assert [o.output_type for o in nb.cells[3].outputs] == ["display_data"]
