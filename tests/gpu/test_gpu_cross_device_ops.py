"""The CrossDeviceOps on real GPUs: fused CUDA kernels on CuPy arrays, NCCL and hierarchical
copies between local GPUs. Skipped where no GPU is visible (MPIDIST_TEST_GPU=1: fail)."""

import warnings

import numpy as np
import pytest

import mpidist
from mpidist import kernels
from mpidist.comm.nccl import nccl_module

from gpu_gate import need_gpus as _need_gpus


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_cuda_reduce_kernel_matches_cpu_twin(dtype, n):
    _need_gpus(1)
    import cupy

    rng = np.random.default_rng(n)
    host = [(rng.standard_normal(100_003) * 50).astype(dtype) for _ in range(n)]
    got = kernels.reduce_n([cupy.asarray(h) for h in host])
    np.testing.assert_array_equal(cupy.asnumpy(got), kernels.reduce_n(host))
    if np.dtype(dtype).kind == "f":
        mean = kernels.reduce_n([cupy.asarray(h) for h in host], divisor=n)
        np.testing.assert_array_equal(cupy.asnumpy(mean), kernels.reduce_n(host, divisor=n))


def test_cuda_pack_unpack_round_trip_and_cast():
    _need_gpus(1)
    import cupy

    rng = np.random.default_rng(0)
    host = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (0,), (5,), (1000,), ()]]
    dev = [cupy.asarray(h) for h in host]
    layout = kernels.FusionLayout.of(host)
    flat = kernels.pack(dev, layout=layout)
    np.testing.assert_array_equal(cupy.asnumpy(flat), kernels.pack(host))
    half = kernels.pack(dev, dtype=np.float16, layout=layout)
    np.testing.assert_array_equal(cupy.asnumpy(half), kernels.pack(host, dtype=np.float16))
    back = kernels.unpack(half, layout, dtype=np.float32)
    for b, h in zip(back, kernels.unpack(kernels.pack(host, dtype=np.float16), layout, dtype=np.float32)):
        np.testing.assert_array_equal(cupy.asnumpy(b), h)


@pytest.mark.parametrize("make_ops", [mpidist.ReductionToOneDevice, mpidist.HierarchicalCopyAllReduce,
                                      lambda: mpidist.HierarchicalCopyAllReduce(num_packs=0),
                                      mpidist.NcclAllReduce])
def test_gpu_ops_reduce_and_batch(make_ops):
    _need_gpus(1)
    ops = make_ops()
    n = mpidist.backend.num_gpus()
    if isinstance(ops, mpidist.NcclAllReduce) and nccl_module() is None and n > 1:
        # Without NCCL the op must say so clearly, not fail somewhere inside CuPy.
        s = mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(n)], cross_device_ops=ops)
        import cupy

        v = s.run(lambda: cupy.ones(4, cupy.float32))
        with pytest.raises(RuntimeError, match="NCCL cannot be used: .*HierarchicalCopyAllReduce"):
            s.reduce("SUM", v, axis=None)
        return
    s = mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(n)], cross_device_ops=ops)
    import cupy

    v = s.run(lambda: cupy.arange(4, dtype=cupy.float32) + mpidist.get_replica_context().replica_id_in_sync_group)
    total = np.arange(4) * n + n * (n - 1) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(cupy.asnumpy(s.reduce("SUM", v, axis=None)), total)
        out = s.extended.batch_reduce_to("MEAN", [(v, v), (v, v)])
    for m in out:
        for i, c in enumerate(s.experimental_local_results(m)):
            assert int(c.device.id) == i
            np.testing.assert_array_equal(cupy.asnumpy(c), total / n)


def test_copy_between_gpus_reads_the_finished_value_of_a_busy_stream():
    """Real CuPy, 2+ GPUs: a value produced by a long chain of kernels on a non-blocking stream
    of GPU 1, copied to GPU 0 at once, arrives complete (the copy waits on the producer's
    event), and overwriting the source right after the copy does not change what arrived."""
    _need_gpus(2)
    import cupy

    from mpidist.backend import copy_to_device
    from mpidist.core.devices import DeviceSpec

    n = 1 << 22
    with cupy.cuda.Device(1):
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.zeros(n, cupy.float32)
            for _ in range(200):  # long enough that an unordered copy would overtake it
                x += 1.0
            y = copy_to_device(x, DeviceSpec("GPU", 0))
            x.fill(-1.0)  # the source's next use, ordered after the copy
    assert int(y.device.id) == 0
    np.testing.assert_array_equal(cupy.asnumpy(y), np.full(n, 200.0, np.float32))


def test_hierarchical_copy_all_reduce_over_every_gpu_pair_rotation():
    """Real CuPy, 2+ GPUs: HierarchicalCopyAllReduce sums across all GPUs for every rotation of
    the main devices, each result on its own GPU."""
    _need_gpus(2)
    import cupy

    n = mpidist.backend.num_gpus()
    s = mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(n)],
                                 cross_device_ops=mpidist.HierarchicalCopyAllReduce(num_packs=n))
    ctx = mpidist.get_replica_context
    per_replica = s.run(lambda: cupy.full((1000, 3), float(ctx().replica_id_in_sync_group) + 1,
                                          dtype=cupy.float32))
    total = s.extended.reduce_to(mpidist.ReduceOp.SUM, per_replica, per_replica)
    for i, v in enumerate(s.experimental_local_results(total)):
        assert int(v.device.id) == i
        np.testing.assert_array_equal(cupy.asnumpy(v), np.full((1000, 3), n * (n + 1) / 2))
