"""MirroredStrategy and variables on real GPUs through CuPy.

Skipped where no GPU is visible; with MPIDIST_TEST_GPU=1 a missing GPU is a failure instead.
"""

import numpy as np

import mpidist
from mpidist.backend import num_gpus

from gpu_gate import need_gpus as _need_gpus


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
    assert [int(c.storage.device.id) for c in components] == list(range(num_gpus()))

    def step():
        rid = int(mpidist.get_replica_context().replica_id_in_sync_group)
        v.assign_add(cupy.full((3,), float(rid), dtype=cupy.float32))

    strategy.run(step)
    n = num_gpus()
    for c in components:
        np.testing.assert_allclose(c.numpy(), np.full(3, 1.0 + (n - 1) / 2, np.float32))
