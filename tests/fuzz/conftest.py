"""The fuzz worker (one per test session) and the figures it collects.

``WORKBENCH_FUZZ_EXAMPLES`` is the number of fuzz cases in the whole run, shared out over
the input families by weight (default 1,200: `make test`; `make fuzz` runs 12,000).
``WORKBENCH_FUZZ_SEED`` picks a hypothesis seed; unset, every run draws the same cases
(derandomized), so CI is reproducible. ``WORKBENCH_FUZZ_REPORT`` names a JSON file for the
figures; they are also printed at the end of the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .harness import Worker

_workers: list[Worker] = []


@pytest.fixture(scope="session")
def fuzz_worker():
    w = Worker()
    _workers.append(w)
    yield w
    w.stop()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001 - pytest's hook
    if not _workers:
        return
    report = _workers[0].summary()
    tr = terminalreporter
    tr.section("fuzz figures")
    tr.write_line(f"cases {report['cases']}  outcomes {report['outcomes']}  worker starts {report['worker_starts']}")
    for fam, f in report["families"].items():
        tr.write_line(f"  {fam:<18} {f['cases']:>6} cases {f['seconds']:>7.1f} s ({f['cpu_seconds']:.1f} s CPU)  "
                      + "  ".join(f"{k}={v}" for k, v in f.items()
                                  if k not in ("cases", "seconds", "cpu_seconds", "errors"))
                      + "  errors: " + ", ".join(f"{k} {v}" for k, v in list(f["errors"].items())[:6]))
    for v in report["findings"]:
        tr.write_line(f"  FOUND {v['kind']} in {v['family']}: {v['signal'] or v['error_type']}: {v['case']}")
    path = os.environ.get("WORKBENCH_FUZZ_REPORT")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1, default=str))
        tr.write_line(f"figures written to {path}")
