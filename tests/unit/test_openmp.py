"""OpenMP's wait settings reach the environment before the extension loads, and a user's own win."""

import os
import subprocess
import sys

import pytest

SHOW = "import os, workbench; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"


def imported_with(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-c", SHOW], env={**base, **env}, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


@pytest.mark.parametrize("env, seen", [
    ({}, "ACTIVE 10000"),                                   # the workbench's (workbench/openmp.py)
    ({"GOMP_SPINCOUNT": "500"}, "None 500"),                # a user's own: untouched
    ({"OMP_WAIT_POLICY": "passive"}, "passive None"),
])
def test_openmp_waits_are_set_unless_the_environment_sets_them(env, seen):
    assert imported_with(**env) == seen


def test_the_settings_are_in_place_when_the_extension_loads():
    # libgomp reads them once, when it loads with workbench._native: seen at that import
    code = ("import os, sys\n"
            "seen = []\n"
            "def hook(event, args):\n"
            "    if event == 'import' and args[0] == 'workbench._native':\n"
            "        seen.append(os.environ.get('GOMP_SPINCOUNT'))\n"
            "sys.addaudithook(hook)\n"
            "import workbench\n"
            "print(seen[0])\n")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == "10000"
