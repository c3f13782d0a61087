"""The CUDA twins of mpidist.kernels (Numba cuda.jit) under Numba's CUDA simulator, against the
CPU twins on the same data.

The simulator must be switched on before Numba is imported, and this pytest process may
already have Numba loaded for real, so the checks (tests/unit/cudasim_checks.py) run once in a
subprocess with NUMBA_ENABLE_CUDASIM=1 and report each check by name; every check is one test
here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudasim_checks

SCRIPT = Path(__file__).with_name("cudasim_checks.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith(cudasim_checks.MARKER)]
    assert len(lines) == 1, f"no report line in:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[0][len(cudasim_checks.MARKER):])


def test_checks_refuse_to_run_without_the_simulator():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "NUMBA_ENABLE_CUDASIM=1" in proc.stderr


def test_every_check_reported(report):
    assert sorted(report) == sorted(cudasim_checks.check_names())
    assert len(report) > 60


@pytest.mark.parametrize("name", cudasim_checks.check_names())
def test_cudasim(report, name):
    result = report[name]
    assert result["ok"], f"{name} failed in the simulator:\n{result['detail']}"
