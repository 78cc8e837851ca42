"""`make demo` runs `python -m workbench.demo`: it must run through and show what it claims."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.model


def test_demo_runs_and_the_warm_reply_equals_the_cold_one(model_path):
    out = subprocess.run([sys.executable, "-m", "workbench.demo"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for step in ("1. a cold completion", "3. a request cancelled", "4. a long prompt", "5. four streams",
                 "6. a chat turn"):
        assert step in text
    assert "finish=cancelled" in text and "warm: exact" in text
    assert "same reply token for token: True" in text
    assert "'role': 'assistant'" in text
