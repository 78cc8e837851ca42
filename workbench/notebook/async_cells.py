"""Foreground `%%generate` / `%%chat` cells that await, so that the kernel handles the
widget's Cancel click while the generation streams.

ipykernel dispatches comm messages (a widget's click) while a cell *awaits* (from 7.4 on,
the version this was checked against), never while a cell blocks. A cell magic cannot
await, so where the kernel does this, `install` adds an input transformer that rewrites a
cell starting with `%%generate` or `%%chat` into an awaited call of
`WorkbenchMagics.run_cell_async` (same arguments, same Result, same errors). Elsewhere
(terminal IPython, an older ipykernel) cells stay blocking and the widget shows its Cancel
button disabled, with the hint to use the kernel's Interrupt or `--background`.
"""

from __future__ import annotations

import re
from typing import Any

MIN_IPYKERNEL = (7, 4)
_MAGIC_CALL = re.compile(r"^get_ipython\(\)\.run_cell_magic\('(generate|chat)', ")
_ASYNC_CALL = "await get_ipython().magics_manager.registry['WorkbenchMagics'].run_cell_async('{name}', "


def supported(shell: Any) -> bool:
    """Whether `shell` runs in an ipykernel that handles widget messages while a cell awaits."""
    if getattr(shell, "kernel", None) is None:
        return False
    try:
        import ipykernel
    except ImportError:
        return False
    return tuple(ipykernel.version_info[:2]) >= MIN_IPYKERNEL


def rewrite(lines: list[str]) -> list[str]:
    """The input transformer: a transformed `%%generate` / `%%chat` cell, awaited."""
    if lines:
        m = _MAGIC_CALL.match(lines[0])
        if m is not None:
            return [_ASYNC_CALL.format(name=m.group(1)) + lines[0][m.end():], *lines[1:]]
    return lines


def install(shell: Any) -> bool:
    """Add the transformer where it helps; True when foreground cells will await."""
    if not supported(shell):
        return False
    if rewrite not in shell.input_transformers_post:
        shell.input_transformers_post.append(rewrite)
    return True


def uninstall(shell: Any) -> None:
    while rewrite in shell.input_transformers_post:
        shell.input_transformers_post.remove(rewrite)
