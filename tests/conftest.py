"""Shared fixtures. Real-model tests use the default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture(scope="session")
def model_path() -> Path:
    from workbench.models import fetch_default_model

    return fetch_default_model(quiet=True)


@pytest.fixture(scope="session")
def model(model_path: Path):
    """One shared instance of the default model (4 sequences, default context)."""
    import workbench as wb

    mid = wb.load_model(model_path=str(model_path), model_id="shared-default")
    yield mid
    wb.unload(mid)


@pytest.fixture
def fresh_model(model_path: Path, request):
    """A private instance with load options from ``@pytest.mark.load(**opts)``."""
    import workbench as wb

    marker = request.node.get_closest_marker("load")
    opts = dict(marker.kwargs) if marker else {}
    mid = wb.load_model(model_path=str(model_path), **opts)
    yield mid
    if mid in {m["model_id"] for m in wb.list_models()}:
        wb.unload(mid)


@pytest.fixture(autouse=True)
def own_cache():
    """Each test starts from an empty cache of the default tiers: a test passing on rows an
    earlier test stored would hide what it claims to check (run alone, it would fail)."""
    import workbench as wb

    wb.wait_for_saves(30.0)
    wb.configure_cache([{"kind": "ram"}])
    yield


def require_tools() -> bool:
    return os.environ.get("WORKBENCH_REQUIRE_TOOLS") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "load(**opts): load options for the fresh_model fixture")
