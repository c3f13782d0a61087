"""MultiWorkerMirroredStrategy with GPU replicas, in one rank (MPI starts as a singleton):
host staging of device buffers through the communicator, the default GPU binding, and GPU
values reduced and gathered like host ones. Skipped where no GPU is visible
(MPIDIST_TEST_GPU=1: fail). The multi-rank GPU paths run under mpiexec on a GPU machine with
`mpiexec -n 2 python -m pytest tests/gpu/test_gpu_multi_worker.py --with-mpi`."""

import numpy as np
import pytest

import mpidist
from mpidist.backend import num_gpus
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.comm.cuda_aware import cuda_aware_mpi
from mpidist.errors import InvalidArgumentError
from mpidist.experimental import CommunicationImplementation, CommunicationOptions

from gpu_gate import need_gpus as _need_gpus


def test_default_binding_is_one_gpu_per_rank():
    _need_gpus(1)
    resolver = MPIClusterResolver()
    index = resolver.local_rank % num_gpus()
    assert resolver.local_devices() == [f"/gpu:{index}"]
    assert resolver.num_accelerators() == {"GPU": 1}
    s = mpidist.MultiWorkerMirroredStrategy(resolver)
    assert s.extended.worker_devices == (
        f"/job:worker/replica:0/task:{resolver.task_id}/device:GPU:{index}",)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
def test_gpu_values_reduce_across_workers(dtype):
    _need_gpus(1)
    import cupy

    s = mpidist.MultiWorkerMirroredStrategy()
    size = s.extended.communicator.size
    values = s.run(lambda: cupy.full((1000,), 1 + int(mpidist.get_replica_context()
                                                         .replica_id_in_sync_group), dtype=dtype))
    total = s.reduce("SUM", values, axis=None)
    n = s.num_replicas_in_sync
    np.testing.assert_array_equal(cupy.asnumpy(total) if hasattr(total, "get") else total,
                                  np.full(1000, n * (n + 1) // 2, dtype=dtype))
    assert n == size


def test_gpu_all_reduce_in_replica_context_and_gather():
    _need_gpus(1)
    import cupy

    s = mpidist.MultiWorkerMirroredStrategy()

    def step():
        ctx = mpidist.get_replica_context()
        x = cupy.arange(4, dtype=cupy.float32) * (int(ctx.replica_id_in_sync_group) + 1)
        return ctx.all_reduce("MEAN", x)

    out = s.experimental_local_results(s.run(step))[0]
    n = s.num_replicas_in_sync
    np.testing.assert_allclose(cupy.asnumpy(out), np.arange(4) * (n + 1) / 2)
    gathered = s.gather(s.run(lambda: cupy.ones((2, 3))), axis=0)
    assert np.asarray(cupy.asnumpy(gathered) if hasattr(gathered, "get") else gathered).shape == (2 * n, 3)


def test_communicator_stages_device_buffers_through_the_host():
    _need_gpus(1)
    import cupy

    from mpidist.comm.communicator import world_communicator

    comm = world_communicator()
    buf = cupy.full(10, comm.rank + 1.0)
    comm.all_reduce(buf)
    np.testing.assert_array_equal(cupy.asnumpy(buf), np.full(10, comm.size * (comm.size + 1) / 2))
    b = cupy.full(3, float(comm.rank))
    comm.broadcast(b, root=0)
    np.testing.assert_array_equal(cupy.asnumpy(b), np.zeros(3))


def test_ranks_sharing_a_gpu_cross_through_mpi_under_auto():
    # On one GPU, `mpiexec -n 2` puts both ranks on it: NCCL would fail (duplicate GPU), so AUTO
    # takes MPI on every rank, and the values still add up.
    _need_gpus(1)
    import cupy

    s = mpidist.MultiWorkerMirroredStrategy()
    comm = s.extended.communicator
    ops = s.extended._cross_device_ops
    if comm.size > 1 and comm.local_size > num_gpus():
        assert not ops.nccl_across_ranks
    total = s.reduce("SUM", s.run(lambda: cupy.ones(8, dtype=cupy.float32)), axis=None)
    np.testing.assert_array_equal(cupy.asnumpy(total) if hasattr(total, "get") else total,
                                  np.full(8, s.num_replicas_in_sync, np.float32))


def test_nccl_requested_on_a_shared_gpu_is_refused_on_every_rank():
    _need_gpus(1)
    comm = mpidist.MultiWorkerMirroredStrategy().extended.communicator
    if comm.size == 1 or comm.local_size <= num_gpus():
        pytest.skip("needs more ranks on this node than GPUs")
    with pytest.raises(InvalidArgumentError, match="share"):
        mpidist.MultiWorkerMirroredStrategy(communication_options=CommunicationOptions(
            implementation=CommunicationImplementation.NCCL))


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "int16", "int8"])
def test_dtypes_without_a_plain_nccl_type_reduce_across_workers(dtype):
    _need_gpus(1)
    import cupy

    s = mpidist.MultiWorkerMirroredStrategy()
    n = s.num_replicas_in_sync
    values = s.run(lambda: (cupy.arange(6) + 1j * cupy.arange(6) if "complex" in dtype
                            else cupy.arange(6)).astype(dtype))
    total = s.reduce("SUM", values, axis=None)
    expected = (np.arange(6) + 1j * np.arange(6) if "complex" in dtype else np.arange(6))
    np.testing.assert_array_equal(cupy.asnumpy(total) if hasattr(total, "get") else total,
                                  (expected * n).astype(dtype))


def test_device_buffer_on_another_gpu_than_the_current_one():
    # The stream waited for and the host copies are the buffer's GPU's (finding 5).
    _need_gpus(2)
    import cupy

    from mpidist.comm.communicator import world_communicator

    comm = world_communicator()
    print("CUDA-aware MPI:", cuda_aware_mpi())
    with cupy.cuda.Device(1):
        buf = cupy.full(10, comm.rank + 1.0)
    with cupy.cuda.Device(0):
        comm.all_reduce(buf)
    assert buf.device.id == 1
    np.testing.assert_array_equal(cupy.asnumpy(buf), np.full(10, comm.size * (comm.size + 1) / 2))
