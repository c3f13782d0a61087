"""MirroredStrategy and variables on real GPUs through CuPy.

Skipped where no GPU is visible; with MPIDIST_TEST_GPU=1 a missing GPU is a failure instead.
"""

import os

import numpy as np
import pytest

import mpidist
from mpidist.backend import cupy_backend, num_gpus

REQUIRE_GPU = os.environ.get("MPIDIST_TEST_GPU", "0") == "1"


def _need_gpus(count):
    have = num_gpus()
    if have >= count:
        return
    reason = f"needs {count} GPU(s), found {have} ({cupy_backend.unavailable_reason()})"
    if REQUIRE_GPU:
        pytest.fail(reason)
    pytest.skip(reason)


def _gpu_strategy():
    _need_gpus(1)
    return mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(num_gpus())])


def test_default_devices_are_all_gpus():
    _need_gpus(1)
    strategy = mpidist.MirroredStrategy()
    assert strategy.num_replicas_in_sync == num_gpus()
    assert all("GPU" in d for d in strategy.extended.worker_devices)


def test_run_places_each_replica_on_its_gpu():
    strategy = _gpu_strategy()
    import cupy

    def fn():
        rid = int(mpidist.get_replica_context().replica_id_in_sync_group)
        x = cupy.full((4,), rid + 1.0)
        return x, cupy.cuda.Device().id

    values, device_ids = strategy.run(fn)
    locals_ = strategy.experimental_local_results(values)
    assert [int(v.device.id) for v in locals_] == list(range(num_gpus()))
    assert list(strategy.experimental_local_results(device_ids)) == list(range(num_gpus()))
    total = strategy.reduce("SUM", values, axis=None)
    n = num_gpus()
    np.testing.assert_array_equal(np.asarray(mpidist.backend.as_array(total)), np.full(4, n * (n + 1) / 2))


def test_mirrored_variable_components_live_on_their_gpus():
    strategy = _gpu_strategy()
    import cupy

    with strategy.scope():
        v = mpidist.Variable(np.ones(3, np.float32), aggregation=mpidist.VariableAggregation.MEAN)
    components = strategy.experimental_local_results(v)
    assert [int(c._value.device.id) for c in components] == list(range(num_gpus()))

    def step():
        rid = int(mpidist.get_replica_context().replica_id_in_sync_group)
        v.assign_add(cupy.full((3,), float(rid), dtype=cupy.float32))

    strategy.run(step)
    n = num_gpus()
    for c in components:
        np.testing.assert_allclose(c.numpy(), np.full(3, 1.0 + (n - 1) / 2, np.float32))
