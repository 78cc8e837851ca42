"""The extension in a real Jupyter kernel (ipykernel + nbclient, test dependencies): widgets
are chosen and displayed with a text/plain twin, usage errors stay one line."""

from __future__ import annotations

from pathlib import Path

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]


def test_generate_in_a_kernel_shows_a_widget(model_path: Path) -> None:
    cells = [
        "%load_ext workbench",
        f"%wb load {model_path} --id nbtest-kernel --n-ctx 512",
        "%%generate --max-tokens 6 --as r\nThe sky is",
        "print(r.finish_reason, r.stats.generated_tokens)",
        "%%generate --temperature -1\nHi",
        "%wb unload nbtest-kernel",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, timeout=300, allow_errors=True, resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    gen = nb.cells[2].outputs
    views = [o for o in gen if o.output_type == "display_data"]
    assert len(views) == 1, gen  # displayed once; later changes are trait updates
    data = views[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "[cold]" in data["text/plain"]  # a fresh kernel, a RAM-only cache, a 4-token prompt
    printed = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert printed.split()[0] in ("stop", "length")
    err = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert "UsageError: option 'temperature'" in err
