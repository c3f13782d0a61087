"""The per-rank guard (``python -m mpidist.guard``) runs beside every rank of a job: it loads
the standard library and mpidist.launch only, not NumPy nor the rest of mpidist (which took
43 MB and half a second per rank)."""

import subprocess
import sys


def imported_by_the_guard():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpidist.guard", "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:")}


def test_the_guard_loads_neither_numpy_nor_the_library():
    names = imported_by_the_guard()
    assert "mpidist.launch.guard" in names  # the measurement sees the guard's imports
    heavy = sorted(n for n in names if n.split(".")[0] in {"numpy", "mpi4py", "jax", "keras"}
                   or n.startswith(("mpidist.strategies", "mpidist.training", "mpidist.data",
                                    "mpidist.values", "mpidist.ops")))
    assert heavy == [], heavy


def test_importing_mpidist_still_loads_the_api():
    done = subprocess.run([sys.executable, "-c", "import mpidist; print(mpidist.fit.__name__, "
                           "mpidist.MultiWorkerMirroredStrategy.__name__)"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["fit", "MultiWorkerMirroredStrategy"], done.stderr
