"""Execute the tutorial notebooks in place, storing the outputs that nbval compares.

    python tests/notebooks/run_notebooks.py [notebooks/NN-name.ipynb ...]   (default: all)
    make notebooks

Each notebook runs top to bottom in a fresh kernel of this Python environment (as
`pytest --nbval-current-env` does), in the notebooks/ directory, with
WORKBENCH_DISPLAY=text: live generations are stored as plain text, the view nbval compares
(JupyterLab shows widgets when you run the cells yourself). Prints each notebook's run time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from ipykernel.kernelspec import RESOURCES, get_kernel_dict
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "workbench-current-env"


class CurrentEnvSpecs(KernelSpecManager):
    """The ipykernel of this interpreter, whatever kernelspecs the user has installed."""

    def get_kernel_spec(self, kernel_name: str):  # type: ignore[no-untyped-def]
        if kernel_name == KERNEL:
            return self.kernel_spec_class(resource_dir=RESOURCES, **get_kernel_dict())
        return super().get_kernel_spec(kernel_name)


def coalesce_streams(outputs: list) -> list:
    """One stream output per run of consecutive writes (the text view writes per token)."""
    merged: list = []
    for out in outputs:
        if (out.output_type == "stream" and merged and merged[-1].output_type == "stream"
                and merged[-1].name == out.name):
            merged[-1].text += out.text
        else:
            merged.append(out)
    return merged


def run(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=CurrentEnvSpecs())
    client = NotebookClient(nb, km=km, timeout=600, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    client.execute()
    elapsed = time.monotonic() - start
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> int:
    os.environ["WORKBENCH_DISPLAY"] = "text"
    paths = [Path(a).resolve() for a in argv] or sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    for path in paths:
        print(f"{path.name}: {run(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
