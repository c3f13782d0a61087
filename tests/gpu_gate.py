"""The one GPU gate of the test suite: a test that needs GPUs skips, naming what it found,
where none are visible; with MPIDIST_TEST_GPU=1 (a GPU machine) the missing GPU is a failure."""

import os

import pytest

from mpidist.backend import cupy_backend, num_gpus

REQUIRE_GPU = os.environ.get("MPIDIST_TEST_GPU", "0") == "1"


def need_gpus(count):
    have = num_gpus()
    if have >= count:
        return
    reason = f"needs {count} GPU(s), found {have} ({cupy_backend.unavailable_reason()})"
    if REQUIRE_GPU:
        pytest.fail(reason)
    pytest.skip(reason)
