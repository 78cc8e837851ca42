"""Start-up hook of `make sanitize` (docs/reliability.md, "Compiler warnings and sanitizers").

tests/sanitize/run.sh puts this directory on PYTHONPATH, so every Python process of the run (pytest,
the fuzz worker, the crash test's writers, the probes' children: they all inherit the
environment) imports it at start-up, after site-packages' .pth files. It puts a finder in
front of the editable install's: ``workbench._native`` is then loaded from
``$WORKBENCH_SANITIZE_NATIVE`` (the ASan + UBSan build in build/sanitize), every other
module as usual. The editable install and its extension in .venv are left untouched.
(A sitecustomize of the interpreter's own would be shadowed for the run; .venv's Python has
none.)
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_NATIVE = os.environ.get("WORKBENCH_SANITIZE_NATIVE", "")


class _SanitizedNative:
    """A meta path finder for exactly one module name."""

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "workbench._native":
            return None
        return importlib.util.spec_from_file_location(fullname, _NATIVE)


if _NATIVE:
    if not os.path.isfile(_NATIVE):
        raise ImportError(f"WORKBENCH_SANITIZE_NATIVE={_NATIVE!r} is not a file (run `make sanitize`)")
    sys.meta_path.insert(0, _SanitizedNative())
