"""``mpidist selftest --gpu`` run for real: the dry run without a GPU (report schema, every path
listed, under 30 s, says so at the top, exit 3), usage errors, the step runner on stand-in
steps that hang (killed with their children), ignore SIGTERM, or find the budget spent, and
tests/gpu/first_contact.sh. Each waits out a real timeout or launches the CLI, so they are
scenarios; the runner on quick steps is tests/unit/test_selftest.py."""

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from selftest_stand_ins import PY, fake_gpu_probe, no_gpu_env, result_line, stand_in_step

from mpidist.cli import selftest, selftest_env

ROOT = Path(__file__).resolve().parents[2]
STEP_NAMES = [s.name for s in selftest.STEPS]
ENV_KEYS = {"python", "executable", "platform", "packages", "gpus", "nvvm", "mpi", "jax",
            "components", "variables", "missing", "probe"}
STEP_KEYS = {"name", "title", "status", "seconds", "timeout_s", "command", "detail"}
REPORT_KEYS = {"schema", "suite", "mode", "gpu_found", "headline", "mpidist", "source",
               "started", "budget_s", "environment", "steps", "summary", "seconds", "exit_code"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("selftest") / "out" / "report.json"
    start = time.monotonic()
    proc = subprocess.run([PY, "-m", "mpidist", "selftest", "--gpu", "--report", str(path)],
                          env=no_gpu_env(), capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start, json.loads(path.read_text()), path


def test_dry_run_says_there_is_no_gpu_and_exits_3_within_30_s(dry_run):
    proc, seconds, report, path = dry_run
    assert proc.returncode == selftest.EXIT_NO_GPU == 3, proc.stdout + proc.stderr
    assert seconds < 30, seconds
    first = proc.stdout.splitlines()[0]
    assert first.startswith("mpidist selftest --gpu: NO GPU: dry run"), first
    assert "nothing ran on a GPU" in first
    assert f"report: {path}" in proc.stdout
    assert "exit 3 (no GPU: dry run)" in proc.stdout
    for name in STEP_NAMES:  # the table lists every path
        assert any(line.startswith(f"{name} ") and " skip " in line
                   for line in proc.stdout.splitlines()), name


def test_dry_run_report_schema(dry_run):
    _, _, report, _ = dry_run
    assert set(report) == REPORT_KEYS
    assert report["schema"] == selftest.SCHEMA and report["suite"] == "gpu"
    assert report["mode"] == "dry-run" and report["gpu_found"] is False
    assert report["headline"].startswith("NO GPU")
    assert report["exit_code"] == 3 and report["budget_s"] == selftest.BUDGET_S
    env = report["environment"]
    assert set(env) >= ENV_KEYS, sorted(ENV_KEYS - set(env))
    assert set(env["packages"]) == set(selftest_env.PACKAGES)
    assert env["packages"]["numpy"]["version"] == np.__version__
    assert env["gpus"]["count"] == 0 and env["gpus"]["reason"]
    assert env["probe"]["exit_code"] == 0 and "error" not in env["probe"]
    from mpidist.cli.gpu_components import COMPONENTS  # mpidist info's list, the same here

    assert [c["name"] for c in env["components"]] == list(COMPONENTS)
    for item in env["missing"]:
        assert set(item) == {"what", "detail", "fix"} and "pip install" in item["fix"]
    assert [s["name"] for s in report["steps"]] == STEP_NAMES
    for entry in report["steps"]:
        assert set(entry) == STEP_KEYS
        assert entry["status"] == "skip" and entry["seconds"] == 0.0
        assert entry["detail"]["reason"].startswith("no GPU (")
        assert "mpidist.cli.selftest_steps " + entry["name"] in entry["command"]
    assert report["summary"] == {"pass": 0, "fail": 0, "skip": len(STEP_NAMES)}


def test_usage_errors_exit_2():
    for argv in (["selftest"], ["selftest", "--gpu", "--steps", "nope"]):
        proc = subprocess.run([PY, "-m", "mpidist", *argv], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)


# -- the runner, on stand-in steps that wait out their timeout -------------------------------
def test_a_hanging_step_is_killed_with_its_children_and_fails_naming_its_timeout():
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "print('child', child.pid, flush=True)\n"
            "time.sleep(300)\n")
    start = time.monotonic()
    entry = selftest.run_step(stand_in_step(code), timeout=3.0)
    assert time.monotonic() - start < 20
    assert entry["status"] == "fail"
    assert entry["detail"]["error"].startswith("timed out after 3 s")
    assert 3.0 <= entry["seconds"] < 20
    child = int(entry["detail"]["output_tail"].split("child ")[1].split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the grandchild was in the step's process group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {child} survived the timeout")


def test_a_step_that_ignores_sigterm_is_killed_too():
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(300)\n")
    start = time.monotonic()
    entry = selftest.run_step(stand_in_step(code), timeout=2.0)
    assert entry["status"] == "fail" and time.monotonic() - start < 25
    assert "timed out after 2 s" in entry["detail"]["error"]


def test_the_budget_bounds_the_whole_run_and_unstarted_steps_fail():
    steps = [stand_in_step("import time; time.sleep(60)", timeout=100.0, name="slow"),
             stand_in_step(f"print({result_line('pass')!r})", name="never")]
    start = time.monotonic()
    report = selftest.run_selftest(steps, budget_s=8.0, probe=fake_gpu_probe)
    assert time.monotonic() - start < 30
    slow, never = report["steps"]
    assert slow["status"] == "fail" and slow["timeout_s"] <= 8.0
    assert never["status"] == "fail" and "budget was spent" in never["detail"]["error"]
    assert report["exit_code"] == selftest.EXIT_FAIL == 1


# -- tests/gpu/first_contact.sh ------------------------------------------------------------------
FIRST_CONTACT = ROOT / "tests" / "gpu" / "first_contact.sh"


def _make_wheel(folder, name="fc_probe", version="0.1"):
    """A tiny pure-Python wheel (module ``name``), as pip builds them."""
    import base64
    import hashlib
    import zipfile

    files = {f"{name}.py": "VALUE = 42\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text)}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def _first_contact(tmp_path, wheels, *args):
    env = {**no_gpu_env(), "PYTHON": PY, "MPIDIST_WHEELS": str(wheels), "TMPDIR": str(tmp_path)}
    report = tmp_path / "report.json"
    proc = subprocess.run(["bash", str(FIRST_CONTACT), "--report", str(report), *args],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    return proc, (json.loads(report.read_text()) if report.exists() else None)


def test_first_contact_runs_the_checkout_staged_and_installs_the_carried_wheels(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels)
    proc, report = _first_contact(tmp_path, wheels)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "first_contact: installed 1 wheel(s)" in proc.stderr and "fc_probe-0.1" in proc.stderr
    assert proc.stdout.startswith("mpidist selftest --gpu: NO GPU: dry run")
    # the checkout, made importable by links (kernels/ as mpidist/kernels), not an installed copy
    assert report["source"].startswith(str(tmp_path / "mpidist-first-contact."))
    assert report["source"].endswith("/src")
    assert not list(tmp_path.glob("mpidist-first-contact.*"))  # removed at exit


def test_first_contact_without_wheels_says_so_and_passes_arguments_on(tmp_path):
    proc, report = _first_contact(tmp_path, tmp_path / "none", "--steps", "mirrored,bench")
    assert proc.returncode == 3
    assert "no wheels in" in proc.stderr and "fetch_wheels.sh" in proc.stderr
    assert [s["name"] for s in report["steps"]] == ["mirrored", "bench"]
    proc, _ = _first_contact(tmp_path, tmp_path / "none", "--steps", "nope")
    assert proc.returncode == 2


def test_first_contact_loads_the_mpich_wheel_it_installed(tmp_path):
    wheels = ROOT / "wheels"
    if not list(wheels.glob("mpich-*.whl")):
        pytest.skip("wheels/ holds no mpich wheel (tests/gpu/fetch_wheels.sh fetches it)")
    proc, report = _first_contact(tmp_path, wheels)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    loaded = report["environment"]["mpi"]["loaded_from"]
    assert loaded.startswith(str(tmp_path / "mpidist-first-contact.")), loaded
