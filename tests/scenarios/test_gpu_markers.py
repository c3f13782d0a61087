"""Every GPU test carries the ``gpu`` marker, so ``pytest -m gpu`` on a GPU node runs them all
(issue 23, finding 8: no test carried it and ``-m gpu`` selected nothing).

The mechanism (tests/conftest.py, tests/gpu_gate.py) is run end to end on a small generated
suite in a temporary folder holding copies of both files: which tests ``-m gpu`` selects, and
that a test reaching the gate in a way the source reading cannot see fails, not skips. Then the
real suite: ``-m gpu`` selects every test of tests/gpu/ and every test calling the gate.
"""

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

SUITE = '''
import pytest

import helper_module
from gpu_gate import need_gpus as gate


def _helper():
    gate(1)


def _outer():
    _helper()


@pytest.fixture
def on_gpu():
    _outer()


def test_direct():
    gate(1)


def test_through_helpers():
    _outer()


def test_through_fixture(on_gpu):
    pass


def test_cpu_only():
    assert "need_gpus" in "the gate is need_gpus(1)"


def test_reaches_the_gate_unseen():
    helper_module.reach()


@pytest.mark.gpu
def test_reaches_the_gate_unseen_but_marked():
    helper_module.reach()


class TestInAClass:
    def test_method(self):
        _helper()
'''

HELPER = '''
from gpu_gate import need_gpus


def reach():
    need_gpus(1)
'''


def _pytest(folder, *args, env_gpu="0"):
    import os

    env = {**os.environ, "MPIDIST_TEST_GPU": env_gpu, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--rootdir", str(folder), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def suite(tmp_path):
    for name in ("conftest.py", "gpu_gate.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_generated.py").write_text(SUITE)
    (tmp_path / "helper_module.py").write_text(HELPER)
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "test_in_gpu_folder.py").write_text("def test_anything():\n    pass\n")
    return tmp_path


def _selected(proc):
    return sorted(line.split("::", 1)[1] if "::" in line else line
                  for line in proc.stdout.splitlines() if "::" in line)


def test_marker_selects_the_gate_reaching_tests_and_the_gpu_folder(suite):
    proc = _pytest(suite, "-m", "gpu", "--collect-only", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _selected(proc) == sorted([
        "TestInAClass::test_method", "test_anything", "test_direct", "test_through_fixture",
        "test_through_helpers", "test_reaches_the_gate_unseen_but_marked"])
    proc = _pytest(suite, "-m", "not gpu", "--collect-only", "-q")
    assert _selected(proc) == ["test_cpu_only", "test_reaches_the_gate_unseen"]


def test_an_unmarked_test_reaching_the_gate_fails_and_the_marked_ones_skip(suite):
    proc = _pytest(suite, "-q", "-rA", "test_generated.py")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    failed = re.findall(r"^FAILED (\S+)", out, re.MULTILINE)
    assert failed == ["test_generated.py::test_reaches_the_gate_unseen"], out
    assert "calls need_gpus(1) but is not marked gpu" in out
    assert "add @pytest.mark.gpu" in out
    assert "5 skipped" in out and "1 passed" in out, out


def test_the_gate_fails_a_missing_gpu_where_one_is_required(suite):
    proc = _pytest(suite, "-q", "-rA", "-m", "gpu", "test_generated.py", env_gpu="1")
    assert proc.returncode == 1
    # the fixture fails in its setup: an error
    assert "4 failed" in proc.stdout and "1 error" in proc.stdout, proc.stdout
    assert "needs 1 GPU(s), found 0" in proc.stdout


def _collected(*args):
    # -P: the checkout (the working directory) stays off sys.path, so an installed mpidist is
    # the one imported where the tests run against an installed copy (.ci/run's second stage).
    proc = subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider",
                           "--collect-only", "-q", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


GATE_CALL = re.compile(r"^\s*(?:_?need_gpus)\((?:\d+|slurm)\)", re.MULTILINE)


def test_the_real_suite_marks_every_gpu_test():
    """``-m gpu`` selects every test of tests/gpu/ and, in the other files calling a GPU gate,
    at least every test function whose own body calls it (a lower bound read independently of
    the conftest's rule, which also follows helpers and fixtures)."""
    callers = sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py")
                     if "need_gpus(" in p.read_text() and "gpu" not in p.parent.name)
    assert "tests/unit/test_metrics.py" in callers and "tests/slurm/test_slurm_jobs.py" in callers
    gpu_folder = _collected("tests/gpu")
    assert len(gpu_folder) >= 30
    selected = _collected("-m", "gpu", "tests/gpu", *callers)
    assert gpu_folder <= selected, sorted(gpu_folder - selected)
    for path in callers:
        source = (ROOT / path).read_text()
        direct = set()
        for chunk in re.split(r"\n(?=def |class |@)", source):
            match = re.match(r"def (test_\w+)", chunk)
            if match and GATE_CALL.search(textwrap.dedent(chunk.split("\n", 1)[1])):
                direct.add(match.group(1))
        marked = {line.split("::")[-1].split("[")[0] for line in selected if line.startswith(path)}
        assert direct <= marked, (path, sorted(direct - marked))
    # test_metrics' GPU tests reach the gate through a helper (_cupy_or_skip): found too.
    assert any("test_metrics.py::test_cupy_inputs" in line for line in selected)
