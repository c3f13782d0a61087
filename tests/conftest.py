"""Shared test configuration.

Plain ``pytest`` runs the unit tests and, through tests/test_mpi_launch.py, every file in
tests/mpi/ under ``mpiexec -n N``. The files in tests/mpi/ are collected only by those
launches (they run with ``--with-mpi``).

The slow scenarios (multi-second end-to-end runs, subprocess launches, compile checks, long
generated sweeps) live in tests/scenarios/ and carry the ``scenario`` marker by their folder:
plain ``pytest`` runs them, ``pytest tests/unit`` (the fast subset) leaves them out, and
``pytest -m scenario`` runs them alone.

GPU tests carry the ``gpu`` marker by mechanism, so ``pytest -m gpu`` selects them all: every
test in tests/gpu/, and every test that reaches the GPU gate (``need_gpus``) through its own
body, a helper of its module or a fixture of its module (found by reading the module's source).
A test that reaches the gate some other way is caught when it runs: the gate fails a test
without the marker (tests/gpu_gate.py), on machines without a GPU too.
"""

import ast
import functools
import json
import os
from pathlib import Path

import pytest

import gpu_gate

TESTS = Path(__file__).parent
MPI_DIR = TESTS / "mpi"
GPU_DIR = TESTS / "gpu"
SCENARIO_DIR = TESTS / "scenarios"
GATE = "need_gpus"


@functools.cache
def gate_reachers(path):
    """Names of the functions in the module at ``path`` that reach the GPU gate: those calling
    ``need_gpus`` (or a name it was imported as), and, to a fixed point, those calling or taking
    as a fixture argument a function that does."""
    try:
        source = Path(path).read_text()
    except (OSError, ValueError):
        return frozenset()
    if GATE not in source:  # no call and no import of the gate: skip parsing (most modules)
        return frozenset({GATE})
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    reaching = {GATE}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            reaching |= {a.asname for a in node.names if a.name == GATE and a.asname}
    uses = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = {n.func.id for n in ast.walk(node)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            names |= {a.arg for a in node.args.args}  # fixtures are requested by name
            uses.setdefault(node.name, set()).update(names)
    grew = True
    while grew:
        grew = False
        for name, names in uses.items():
            if name not in reaching and names & reaching:
                reaching.add(name)
                grew = True
    return frozenset(reaching)


def needs_gpu(item):
    """Whether ``item`` is a GPU test: in tests/gpu/, or reaching the gate (``gate_reachers``)."""
    path = Path(str(item.path))
    if path.is_relative_to(GPU_DIR):
        return True
    function = getattr(item, "function", None)
    if function is None:
        return False
    reaching = gate_reachers(str(path))
    return function.__name__ in reaching or bool(set(item.fixturenames) & reaching)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.path)).is_relative_to(SCENARIO_DIR):
            item.add_marker(pytest.mark.scenario)
        if item.get_closest_marker("gpu") is None and needs_gpu(item):
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The gate sees the test it runs in (setup, call and teardown), to check its marker."""
    gpu_gate.CURRENT_TEST[0] = item
    try:
        yield
    finally:
        gpu_gate.CURRENT_TEST[0] = None


def pytest_ignore_collect(collection_path, config):
    if Path(collection_path).is_relative_to(MPI_DIR) and not config.getoption("--with-mpi", False):
        return True
    return None


def pytest_sessionfinish(session, exitstatus):
    """Under an MPI launch, leave this rank's outcome where the launcher looks for it."""
    results_dir = os.environ.get("MPIDIST_TEST_RESULTS_DIR")
    if not results_dir or not session.config.getoption("--with-mpi", False):
        return
    from mpi4py import MPI  # only under an MPI launch

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    counts = {key: len(reporter.stats.get(key, [])) for key in ("passed", "failed", "error", "skipped")}
    counts["exitstatus"] = int(exitstatus)
    path = Path(results_dir) / f"rank-{MPI.COMM_WORLD.Get_rank()}.json"
    path.write_text(json.dumps(counts))


def pytest_report_header(config):
    lines = []
    if config.getoption("--with-mpi", False):
        from mpi4py import MPI  # only under an MPI launch

        comm = MPI.COMM_WORLD
        lines.append(f"MPI vendor: {MPI.get_vendor()}, rank {comm.Get_rank()} of {comm.Get_size()}")
    lines.append(f"MPIDIST_TEST_GPU={os.environ.get('MPIDIST_TEST_GPU', '0')}")
    return lines
