"""``python -m workbench.models fetch``: fetch and verify the default model; print its path."""

from __future__ import annotations

import sys

from . import fetch_default_model


def main(argv: list[str]) -> int:
    if argv[:1] not in (["fetch"], []):
        print("usage: python -m workbench.models [fetch]", file=sys.stderr)
        return 2
    print(fetch_default_model())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
