"""The public names of workbench.cache import from the package itself."""

from __future__ import annotations

import importlib


def test_public_api_is_exported() -> None:
    cache = importlib.import_module("workbench.cache")
    missing = [name for name in cache.__all__ if not hasattr(cache, name)]
    assert not missing
    assert cache.PrefixCache.__module__ == "workbench.cache.interface"
    assert not hasattr(cache, "TieredCache")  # one storage (issue 26)
