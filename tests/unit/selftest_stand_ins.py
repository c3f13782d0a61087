"""Stand-ins for the selftest's runner, shared by tests/unit/test_selftest.py (the runner on
quick steps) and tests/scenarios/test_selftest_runs.py (steps that hang or spend the budget,
the dry run, first_contact.sh): stand-in steps are commands of our own, so a hang becomes a
failure with its timeout, never a hang of the selftest."""

import json
import os
import sys

from mpidist.cli.selftest import Step
from mpidist.cli.selftest_steps import MARKER

PY = sys.executable


def no_gpu_env():
    """This environment with no GPU visible and no CUDA simulator."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a GPU machine runs this test as a dry run too
    return env


def stand_in_step(code, timeout=30.0, ranks=1, name="stand-in"):
    """A selftest step running the Python ``code``."""
    return Step(name, "a stand-in step", timeout, ranks=ranks, command=(PY, "-c", code))


def result_line(status, **detail):
    """The line a step prints for its rank's result."""
    return MARKER + json.dumps({"status": status, "detail": detail})


def fake_gpu_probe():
    """An environment probe that finds one GPU, so the steps run instead of a dry run."""
    return {"gpus": {"count": 1, "names": ["stand-in GPU"]}, "probe": {"seconds": 0.0}}
