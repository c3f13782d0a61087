"""The one GPU gate of the test suite: a test that needs GPUs skips, naming what it found,
where none are visible; with MPIDIST_TEST_GPU=1 (a GPU machine) the missing GPU is a failure.

A test that calls the gate must carry the ``gpu`` marker (tests/conftest.py adds it to the
tests it can see reaching the gate), so that ``pytest -m gpu`` on a GPU node runs every GPU
test: the gate fails an unmarked test before anything else, on machines without a GPU too."""

import os

import pytest

from mpidist.backend import cupy_backend, num_gpus

REQUIRE_GPU = os.environ.get("MPIDIST_TEST_GPU", "0") == "1"
CURRENT_TEST = [None]  # the pytest item running now (set by tests/conftest.py)


def _check_marked(count):
    item = CURRENT_TEST[0]
    if item is not None and item.get_closest_marker("gpu") is None:
        pytest.fail(f"{item.nodeid} calls need_gpus({count}) but is not marked gpu, so "
                    "`pytest -m gpu` on a GPU node would leave it out: add "
                    "@pytest.mark.gpu to it (tests/conftest.py marks the tests that reach the "
                    "gate through their module's own functions and fixtures)", pytrace=False)


def need_gpus(count):
    _check_marked(count)
    have = num_gpus()
    if have >= count:
        return
    reason = f"needs {count} GPU(s), found {have} ({cupy_backend.unavailable_reason()})"
    if REQUIRE_GPU:
        pytest.fail(reason)
    pytest.skip(reason)
