"""One real local Ray cluster for the directory: 2 replicas of the default model, 1 thread
each (2 CPUs), sharing a disk cache tier in a temporary directory; Ray restarts a killed
replica without limit (on a loaded machine a slow restart can use up a small budget).
Tests isolate their cache rows by cache_scope (the tenant), so they do not depend on each
other's rows."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest



@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster-tier")


@pytest.fixture(scope="session")
def cluster(model_path: Path, shared_root: Path):
    import workbench.cluster as wc

    c = wc.start(replicas=2, model=str(model_path), threads=1, n_ctx=2048, n_seq_max=2, max_restarts=-1,
                 cache_tiers=[{"kind": "disk", "root": str(shared_root)}])
    yield c
    c.shutdown()


_scopes = itertools.count()


@pytest.fixture
def scope() -> str:
    """A tenant of its own: no row of another test is visible under it."""
    return f"t{next(_scopes)}-{time.monotonic_ns()}"


def wait_all_up(cluster, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(m.refresh() == "up" for m in cluster.members):
            return
        time.sleep(0.5)
    raise AssertionError(f"replicas not back within {timeout_s} s: {cluster!r}")
