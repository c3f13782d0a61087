"""``mpidist selftest --gpu``: every GPU path of mpidist run once on one GPU, each step in a
process of its own under its own timeout, the whole within a budget (8 minutes), and one JSON
report: the environment, then each step's status (pass / fail / skip), seconds and detail.

The steps are ``mpidist.cli.selftest_steps``; the environment is ``selftest_env``. A step
that hangs is killed (its whole process group, mpiexec's ranks included) at its timeout and
reported as a failure naming it; a step that crashes is a failure with the end of its output.
Without a GPU the command is a dry run: the environment is probed, every step is reported
``skip`` with the reason, and the report says at its top that no GPU was found.

Exit status: 0 every step passed (or was skipped for a missing library), 1 a step failed,
3 no GPU (dry run: nothing ran on a GPU); 2 is a usage error, as for every ``mpidist`` command.
The report format is docs/testing.md's "The first-contact report".
"""

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpidist.cli import selftest_env
from mpidist.cli.selftest_steps import MARKER

__all__ = ["Step", "STEPS", "BUDGET_S", "ENV_TIMEOUT_S", "EXIT_PASS", "EXIT_FAIL", "EXIT_NO_GPU",
           "DEFAULT_REPORT", "SCHEMA", "run_step", "probe_environment", "run_selftest",
           "render", "step_command"]

EXIT_PASS, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 3
BUDGET_S = 480.0  # the whole selftest, steps and probe: 8 minutes
ENV_TIMEOUT_S = 90.0
MIN_STEP_S = 5.0  # a step is not started with less of the budget left
DEFAULT_REPORT = "mpidist-selftest-gpu.json"
SCHEMA = 1
OUTPUT_TAIL = 4000  # characters of a failed step's output kept in the report

Report = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One path: ``name`` (a function of ``selftest_steps``), what it checks, its timeout, how
    many ranks run it (under mpiexec when more than one), extra environment variables, and
    optionally the exact command (stand-in steps in the tests)."""

    name: str
    title: str
    timeout_s: float
    ranks: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] | None = None


STEPS: tuple[Step, ...] = (
    Step("kernels", "Numba kernels bit for bit against NumPy (ulp differences)", 150),
    Step("mirrored", "MirroredStrategy on one GPU: a step with all_reduce vs NumPy", 60),
    Step("nccl", "NcclAllReduce on one device, every dtype", 60),
    Step("mwms_2_ranks", "MultiWorkerMirroredStrategy, 2 ranks sharing the GPU (mpiexec -n 2)",
         90, ranks=2, env={"MPIDIST_LOG": "info"}),
    Step("prefetch", "GPU prefetch: experimental_distribute_dataset to the device", 60),
    Step("optimizers", "fused SGD / momentum / Adam on GPU variables vs CPU, bit for bit", 90),
    Step("autodiff_jax", "JAX autodiff with a CuPy batch, jit off and on", 90),
    Step("checkpoint", "checkpoint of GPU variables: save, restore, compare", 60),
    Step("bench", "mpidist bench gpu --quick: all-reduce beside raw NCCL and a copy", 90),
)
# The stand-in (CPU rehearsal) runs the kernels under Numba's simulator.
STAND_IN_ENV = {"kernels": {"NUMBA_ENABLE_CUDASIM": "1"}}


def _mpiexec() -> str | None:
    """mpiexec beside this Python (a venv's, from the mpich wheel), else on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def step_command(step: Step, stand_in: str | None = None) -> list[str] | None:
    """The command that runs ``step`` (None: a multi-rank step and no mpiexec)."""
    if step.command is not None:
        return list(step.command)
    command = [sys.executable, "-m", "mpidist.cli.selftest_steps", step.name]
    if stand_in:
        command += ["--stand-in", stand_in]
    if step.ranks > 1:
        mpiexec = _mpiexec()
        if mpiexec is None:
            return None
        command = [mpiexec, "-n", str(step.ranks), *command]
    return command


def _source_root() -> str:
    import mpidist  # noqa: PLC0415

    return str(Path(mpidist.__file__).parent.parent)


def step_environment(step: Step, stand_in: str | None = None,
                     base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a step runs with: this process's, mpidist's folder importable, JAX told
    not to take 75% of the GPU, the simulator only for the stand-in's kernels."""
    env = dict(os.environ if base is None else base)
    root = _source_root()
    if root not in {os.path.abspath(p) for p in sys.path if p}:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if stand_in:
        env.update(STAND_IN_ENV.get(step.name, {}))
    # Open MPI refuses root without these (the GPU machines run commands as root).
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.update(step.env)
    return env


def _results(output: str) -> list[dict[str, Any]]:
    """Every result object printed after MARKER (the ranks' lines may run together)."""
    decoder = json.JSONDecoder()
    found = []
    for chunk in output.split(MARKER)[1:]:
        try:
            value, _ = decoder.raw_decode(chunk)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("status") in ("pass", "fail", "skip"):
            found.append(value)
    return found


def _run_bounded(command: Sequence[str], env: Mapping[str, str], cwd: str,
                 timeout: float) -> tuple[int | None, str, float]:
    """``(exit code or None when killed at the timeout, output, seconds)``. The command runs
    in a session of its own, so a timeout ends it with everything it started."""
    start = time.monotonic()
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", cwd=cwd, env=dict(env),
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - start
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            out, _ = proc.communicate(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            out = ""
    return None, out or "", time.monotonic() - start


def _tail(text: str) -> str:
    return text[-OUTPUT_TAIL:]


def run_step(step: Step, timeout: float, stand_in: str | None = None,
             cwd: str | None = None) -> Report:
    """One step's report entry: ``{"name", "title", "status", "seconds", "timeout_s",
    "command", "detail"}``."""
    entry: Report = {"name": step.name, "title": step.title, "status": "fail", "seconds": 0.0,
                     "timeout_s": round(timeout, 1), "command": None, "detail": {}}
    command = step_command(step, stand_in)
    if command is None:
        entry.update(status="skip", detail={
            "reason": "no mpiexec beside this Python or on PATH: pip install 'mpidist[mpi]'"})
        return entry
    entry["command"] = " ".join(command)
    with tempfile.TemporaryDirectory(prefix=f"mpidist-selftest-{step.name}-") as folder:
        code, output, seconds = _run_bounded(command, step_environment(step, stand_in),
                                             cwd or folder, timeout)
    entry["seconds"] = round(seconds, 2)
    results = _results(output)
    if code is None:
        entry["detail"] = {"error": f"timed out after {timeout:g} s (killed with everything it "
                                    f"started); {len(results)} of {step.ranks} rank result(s) "
                                    "had arrived", "output_tail": _tail(output)}
        return entry
    if len(results) < step.ranks:
        entry["detail"] = {"error": f"exited with code {code} after {len(results)} of "
                                    f"{step.ranks} rank result(s)", "output_tail": _tail(output)}
        return entry
    statuses = {r["status"] for r in results}
    details = [r.get("detail", {}) for r in results]
    entry["detail"] = details[0] if step.ranks == 1 else {"ranks": details}
    if statuses == {"skip"}:
        entry["status"] = "skip"
        if step.ranks > 1:
            entry["detail"] = details[0]
    elif statuses == {"pass"} and code == 0:
        entry["status"] = "pass"
    else:
        entry["status"] = "fail"
        if statuses == {"pass"}:
            entry["detail"] = {"error": f"every result passed but the command exited with {code}",
                               "results": entry["detail"], "output_tail": _tail(output)}
        elif "fail" not in statuses:
            entry["detail"] = {"error": "ranks disagreed: " + ", ".join(sorted(statuses)),
                               "results": entry["detail"]}
    return entry


def probe_environment(timeout: float = ENV_TIMEOUT_S) -> Report:
    """The environment section (``selftest_env.collect`` in a process of its own), with
    ``probe``: how the probe went."""
    command = [sys.executable, "-m", "mpidist.cli.selftest_env"]
    env = step_environment(Step("environment", "", timeout))
    with tempfile.TemporaryDirectory(prefix="mpidist-selftest-env-") as folder:
        code, output, seconds = _run_bounded(command, env, folder, timeout)
    probe: Report = {"seconds": round(seconds, 2), "exit_code": code}
    facts: Report = {}
    for line in output.splitlines():
        if line.startswith(selftest_env.MARKER):
            facts = json.loads(line[len(selftest_env.MARKER):])
    if code is None:
        probe["error"] = f"timed out after {timeout:g} s"
    elif not facts:
        probe["error"] = f"exited with code {code} without facts"
    if "error" in probe:
        probe["output_tail"] = _tail(output)
    return {**facts, "probe": probe}


def _gpu_state(env: Report) -> tuple[bool, str]:
    """``(found, why)``: found unless the probe ran and counted no GPU."""
    gpus = env.get("gpus")
    if not isinstance(gpus, dict) or "count" not in gpus:
        error = (gpus or {}).get("error") if isinstance(gpus, dict) else None
        return True, f"the probe could not count the GPUs ({error or env['probe'].get('error')})"
    if gpus["count"] < 1:
        return False, str(gpus.get("reason") or "no GPU is visible")
    return True, f"{gpus['count']} GPU(s): " + "; ".join(gpus.get("names", []))


def run_selftest(steps: Sequence[Step] = STEPS, budget_s: float = BUDGET_S,
                 stand_in: str | None = None,
                 on_step: Callable[[Report], None] | None = None,
                 probe: Callable[[], Report] = probe_environment) -> Report:
    """The whole report (see the module); ``on_step`` sees each step's entry as it ends."""
    from mpidist import __version__  # noqa: PLC0415

    start = time.monotonic()
    env = probe()
    found, why = _gpu_state(env)
    if stand_in:
        mode = "stand-in"
        headline = (f"STAND-IN: a rehearsal with NumPy on the CPU (kernels in Numba's "
                    f"simulator); nothing ran on a GPU. GPUs here: {why}")
    elif found:
        mode, headline = "gpu", f"GPU: {why}"
    else:
        mode = "dry-run"
        headline = f"NO GPU: dry run, every step skipped, nothing ran on a GPU ({why})"
    report: Report = {
        "schema": SCHEMA, "suite": "gpu", "mode": mode, "gpu_found": found,
        "headline": headline, "mpidist": __version__, "source": _source_root(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget_s, "environment": env, "steps": [],
    }
    for step in steps:
        left = budget_s - (time.monotonic() - start)
        if mode == "dry-run":
            command = step_command(step)
            entry: Report = {"name": step.name, "title": step.title, "status": "skip",
                             "seconds": 0.0, "timeout_s": step.timeout_s,
                             "command": " ".join(command) if command else None,
                             "detail": {"reason": f"no GPU ({why})"}}
        elif left < MIN_STEP_S:
            entry = {"name": step.name, "title": step.title, "status": "fail", "seconds": 0.0,
                     "timeout_s": 0.0, "command": None,
                     "detail": {"error": f"not started: the selftest's {budget_s:g} s budget "
                                         "was spent by the steps before it"}}
        else:
            entry = run_step(step, min(step.timeout_s, left), stand_in)
        report["steps"].append(entry)
        if on_step is not None:
            on_step(entry)
    counts = {s: sum(1 for e in report["steps"] if e["status"] == s)
              for s in ("pass", "fail", "skip")}
    report["summary"] = counts
    report["seconds"] = round(time.monotonic() - start, 2)
    report["exit_code"] = EXIT_FAIL if counts["fail"] else \
        EXIT_NO_GPU if mode == "dry-run" else EXIT_PASS
    return report


# -- the printed table -------------------------------------------------------------------------
_AWARE = {True: "yes", False: "no", None: "unknown"}


def _version(env: Report, key: str) -> str:
    return str(env.get("packages", {}).get(key, {}).get("version") or "-")


def environment_lines(env: Report) -> list[str]:
    """The environment in a few lines."""
    gpus, mpi, jax, nvvm = (env.get(k, {}) for k in ("gpus", "mpi", "jax", "nvvm"))
    nccl: Report = next((c for c in env.get("components", []) if c.get("name") == "nccl"), {})
    lines = [
        f"python {env.get('python', '?')}, numpy {_version(env, 'numpy')}, cupy "
        f"{_version(env, 'cupy')}, numba {_version(env, 'numba')}, numba-cuda "
        f"{_version(env, 'numba-cuda')} (NVVM "
        f"{nvvm.get('version') if nvvm.get('found') else 'not found'})",
        f"GPUs {gpus.get('count', '?')}{''.join(' ' + n for n in gpus.get('names', []))}, "
        f"driver CUDA "
        f"{gpus.get('driver_cuda', '-')}, runtime CUDA {gpus.get('runtime_cuda', '-')}, "
        f"NCCL {nccl.get('version') or '-'}",
        f"mpi4py {_version(env, 'mpi4py')} ({mpi.get('library', mpi.get('error', '?'))}), "
        f"CUDA-aware MPI: {_AWARE.get(mpi.get('cuda_aware'), 'unknown')}",
        f"jax {jax.get('version', _version(env, 'jax'))} (backend "
        f"{jax.get('backend', jax.get('error', '-'))}), autograd {_version(env, 'autograd')}",
    ]
    lines += [f"missing: {m['what']}: {m['fix']}" for m in env.get("missing", [])]
    if env.get("probe", {}).get("error"):
        lines.append(f"environment probe: {env['probe']['error']}")
    return lines


def _short(entry: Report) -> str:
    detail = entry.get("detail") or {}
    text = detail.get("error") or detail.get("reason")
    if text is None:
        ulps = detail.get("ulp_differences")
        text = ", ".join(f"{k}={v}" for k, v in detail.items()
                         if isinstance(v, int | float | str) and k != "traceback")
        if ulps:
            text += f"; ulp differences: {ulps}"
    return str(text).splitlines()[0][:160] if text else ""


def step_line(entry: Report) -> str:
    """One line of the table."""
    return (f"{entry['name']:<14} {entry['status']:<5} {entry['seconds']:>7.1f} "
            f"{_short(entry)}")


def render(report: Report, report_path: str | None = None) -> str:
    """The short table printed after the run."""
    lines = [f"mpidist selftest --gpu: {report['headline']}"]
    lines += ["  " + line for line in environment_lines(report["environment"])]
    lines.append(f"{'step':<14} {'status':<5} {'seconds':>7} detail")
    lines += [step_line(e) for e in report["steps"]]
    s = report["summary"]
    meaning = {EXIT_PASS: "every step passed or was skipped", EXIT_FAIL: "a step failed",
               EXIT_NO_GPU: "no GPU: dry run"}[report["exit_code"]]
    lines.append(f"{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped in "
                 f"{report['seconds']:.1f} s; exit {report['exit_code']} ({meaning})")
    if report_path:
        lines.append(f"report: {report_path}")
    return "\n".join(lines)


def write_report(report: Report, path: str) -> str:
    """Write the JSON report (the folder is created); returns its absolute path."""
    target = Path(path).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return str(target)
