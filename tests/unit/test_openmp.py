"""OpenMP's wait settings are in the environment when the extension (and libgomp) loads, and
only then; a user's own win."""

import os
import subprocess
import sys

import pytest

# what the environment held when workbench._native was imported, and after `import workbench`
SHOW = ("import os, sys\n"
        "keys = ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'workbench._native':\n"
        "        seen.append([os.environ.get(k) for k in keys])\n"
        "sys.addaudithook(hook)\n"
        "import workbench\n"
        "print(seen[0], [os.environ.get(k) for k in keys])\n")


def imported_with(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-c", SHOW], env={**base, **env}, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


@pytest.mark.parametrize("env, seen", [
    ({}, "['ACTIVE', '10000'] [None, None]"),              # set for the load, then taken back
    ({"GOMP_SPINCOUNT": "500"}, "[None, '500'] [None, '500']"),           # a user's own: untouched
    ({"OMP_WAIT_POLICY": "passive"}, "['passive', None] ['passive', None]"),
])
def test_openmp_waits_are_set_while_the_extension_loads_unless_the_environment_sets_them(env, seen):
    assert imported_with(**env) == seen


def test_libgomp_itself_took_them():
    # libgomp's own account of its settings (omp_display_env, OpenMP 5.0), from the process
    # that imported workbench: the library the extension loaded, as it reads them
    code = ("import ctypes, workbench\n"
            "if any('libgomp' in line for line in open('/proc/self/maps')):\n"
            "    ctypes.CDLL('libgomp.so.1').omp_display_env(1)\n"
            "else:\n"
            "    print('no libgomp')\n")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, check=True,
                         timeout=120)
    if out.stdout.strip() == "no libgomp":
        pytest.skip("this build's CPU backend does not use OpenMP (GGML_OPENMP off)")
    shown = out.stderr
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in shown and "GOMP_SPINCOUNT = '10000'" in shown
