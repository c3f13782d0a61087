"""The CUDA twins of mpidist.kernels (Numba cuda.jit) under Numba's CUDA simulator, against the
CPU twins on the same data.

The simulator must be switched on before Numba is imported, and this pytest process may
already have Numba loaded for real, so the checks (tests/unit/cudasim_checks.py) run once in a
subprocess with NUMBA_ENABLE_CUDASIM=1 and report each check by name; every check is one test
here. The same checks (mpidist.kernels.bitwise_checks) run on a GPU in the ``gpu``-marked test.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudasim_checks

SCRIPT = Path(cudasim_checks.__file__)  # tests/unit/cudasim_checks.py
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


def test_without_the_simulator_the_checks_need_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode == 2:  # no GPU here: says so, and how to use the simulator
        assert "no CUDA GPU" in proc.stderr and "NUMBA_ENABLE_CUDASIM=1" in proc.stderr
    else:  # a GPU: the checks ran on it (test_kernels_on_a_gpu reports them one by one)
        assert proc.returncode == 0 and cudasim_checks.MARKER in proc.stdout, proc.stderr[-3000:]


@pytest.mark.gpu
def test_kernels_bitwise_on_a_gpu():
    """The same checks on hardware, where NVVM's and ptxas's work shows (FMA, conversions)."""
    from gpu_gate import need_gpus

    need_gpus(1)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith(cudasim_checks.MARKER)][-1]
    results = json.loads(line[len(cudasim_checks.MARKER):])
    failed = {k: (r["max_ulp"], r["detail"][-400:]) for k, r in results.items() if not r["ok"]}
    assert not failed, f"{len(failed)} checks not bit-identical on the GPU (max ulp, detail): {failed}"


def test_every_check_reported(report):
    assert sorted(report) == sorted(cudasim_checks.check_names())
    assert len(report) > 60


@pytest.mark.parametrize("name", cudasim_checks.check_names())
def test_cudasim(report, name):
    result = report[name]
    assert result["ok"], f"{name} failed in the simulator (max ulp {result['max_ulp']}):\n{result['detail']}"
