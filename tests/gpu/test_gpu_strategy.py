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


def test_arenas_and_fused_plan_live_on_each_replicas_gpu():
    """Real CuPy, 2+ GPUs: each replica's arenas (parameters, slots, gradients) are allocated on
    the GPU of the variables they adopt, whatever device is current, and packing a replica's
    gradients runs there (tests/unit/test_gpu_placement.py checks the same logic without one)."""
    _need_gpus(2)
    import cupy

    from mpidist.training.fused_apply import FusedPlan

    n = num_gpus()
    strategy = mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(n)])
    with strategy.scope():
        w = mpidist.Variable(np.arange(5, dtype=np.float32))
        m = mpidist.Variable(np.zeros(5, np.float32))
    with cupy.cuda.Device(0):
        plan = FusedPlan.build([w], [{"m": m}], ["m"])
        assert plan is not None
        for i in range(n):
            assert int(plan.params[i].device.id) == i
            assert int(plan.grads[i].device.id) == i
            assert [int(s.device.id) for s in plan.slots[i]] == [i]
            with cupy.cuda.Device(i):
                grad = cupy.full(5, float(i), cupy.float32)
            assert plan.pack(i, [grad], exact_dtype=True)
            np.testing.assert_array_equal(cupy.asnumpy(plan.grads[i]), np.full(5, float(i)))
    for c in strategy.experimental_local_results(w):
        np.testing.assert_array_equal(c.numpy(), np.arange(5, dtype=np.float32))
