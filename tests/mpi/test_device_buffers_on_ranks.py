"""Device buffers through the communicator across real MPI ranks (issue 23, finding 5), with the
recording stand-in for CuPy (tests/recording_cupy.py): its arrays export
``__cuda_array_interface__`` over host memory, so MPI can move them here, and every stream
wait and host copy is logged with its device. Nothing here ran on a GPU.

- This MPI library (the mpich wheel) is not CUDA-aware: device buffers travel through host
  memory, and MPI never sees a device buffer.
- Where MPI is CUDA-aware (said here by the test), the buffer goes to MPI as it is, after the
  stream of the buffer's own GPU is waited for, by the blocking call (never a non-blocking
  collective on device memory); with collective checks off it is staged instead.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import numpy as np
import pytest
from mpi4py import MPI

from mpidist.comm import cuda_aware
from mpidist.comm.communicator import world_communicator

from recording_cupy import install

rank = MPI.COMM_WORLD.Get_rank()
size = MPI.COMM_WORLD.Get_size()
total = size * (size + 1) / 2  # the sum of rank + 1 over the ranks


class RecordingComm:
    """The communicator's MPI communicator, recording each call with the memory of the arrays
    it was handed: ``("Allreduce", {"device"})``."""

    def __init__(self, comm):
        self._comm = comm
        self.calls = []

    def __getattr__(self, name):
        target = getattr(self._comm, name)
        if not callable(target) or not name[0].isupper():
            return target

        def call(*args, **kwargs):
            self.calls.append((name, {"device" if hasattr(a, "__cuda_array_interface__")
                                      else "host" for a in args if hasattr(a, "dtype")}))
            return target(*args, **kwargs)
        return call


@pytest.fixture
def setup(monkeypatch):
    """``(stand-in cupy, communicator, MPI calls, stream synchronisations as (stream's device,
    current device))``; the thread's current device stays 0, the buffers live on device 1."""
    from mpidist.backend import cupy_backend

    cupy = install(monkeypatch, num_devices=2)
    comm = world_communicator()
    recording = RecordingComm(comm._comm)
    monkeypatch.setattr(comm, "_comm", recording)
    monkeypatch.setattr(comm, "_gpu_aware", comm._gpu_aware)  # restored after the test
    rec = cupy.recording
    synced = []
    sync = rec.host_sync

    def host_sync(stream, upto=None):
        synced.append((stream.device_id, rec.current_device()))
        sync(stream, upto)

    monkeypatch.setattr(rec, "host_sync", host_sync)
    yield cupy, comm, recording.calls, synced
    cupy_backend.reset()


def on_device_1(cupy, values):
    with cupy.cuda.Device(1):
        return cupy.array(values)


def test_this_mpi_is_not_cuda_aware_so_device_buffers_are_staged(setup):
    cupy, comm, calls, synced = setup
    cuda_aware.reset()
    comm._gpu_aware = None  # found out again, from this library
    buf = on_device_1(cupy, np.full(5, rank + 1.0))
    comm.all_reduce(buf)
    np.testing.assert_array_equal(buf.get(), np.full(5, total))
    assert buf.device.id == 1
    if size > 1:
        assert comm._gpu_aware is False
        data = [(name, memory) for name, memory in calls if memory]
        assert data and all(memory == {"host"} for _, memory in data), calls


def test_staged_send_leaves_send_and_fills_buf(setup):
    cupy, comm, calls, synced = setup
    comm._gpu_aware = False
    send = on_device_1(cupy, np.full(3, rank + 1.0))
    buf = on_device_1(cupy, np.zeros(3))
    comm.all_reduce(buf, send=send)
    np.testing.assert_array_equal(buf.get(), np.full(3, total))
    np.testing.assert_array_equal(send.get(), np.full(3, rank + 1.0))


@pytest.mark.skipif(size == 1, reason="one rank hands nothing to MPI")
def test_cuda_aware_mpi_gets_the_device_buffer_after_its_own_gpu_s_stream(setup, monkeypatch):
    cupy, comm, calls, synced = setup
    comm._gpu_aware = True
    monkeypatch.setattr(comm, "check_collectives", True)
    buf = on_device_1(cupy, np.full(4, rank + 1.0))
    comm.all_reduce(buf)
    np.testing.assert_array_equal(buf.get(), np.full(4, total))
    # the device buffer itself, by the blocking call: never Iallreduce on device memory
    assert [c for c in calls if c[1]] == [("Allreduce", {"device"})], calls
    assert synced[0] == (1, 1), synced  # device 1's stream, waited for under device 1


@pytest.mark.skipif(size == 1, reason="one rank hands nothing to MPI")
def test_cuda_aware_broadcast_and_packs_wait_for_the_buffer_s_gpu(setup, monkeypatch):
    cupy, comm, calls, synced = setup
    comm._gpu_aware = True
    monkeypatch.setattr(comm, "check_collectives", True)
    b = on_device_1(cupy, np.full(3, float(rank)))
    comm.broadcast(b, root=0)
    np.testing.assert_array_equal(b.get(), np.zeros(3))
    assert synced[0] == (1, 1), synced
    synced.clear()
    flat = on_device_1(cupy, np.full(6, rank + 1.0))
    comm.all_reduce_packs(flat, [(0, 2), (2, 6)])
    np.testing.assert_array_equal(flat.get(), np.full(6, total))
    assert synced[0] == (1, 1), synced
    assert [c for c in calls if c[1]] == [("Bcast", {"device"})] + [("Allreduce", {"device"})] * 2


@pytest.mark.skipif(size == 1, reason="one rank hands nothing to MPI")
def test_unchecked_collectives_stage_device_buffers_even_with_cuda_aware_mpi(setup, monkeypatch):
    # Without the agreement a collective runs non-blocking, which no MPI promises on device
    # memory: the buffer travels through the host.
    cupy, comm, calls, synced = setup
    comm._gpu_aware = True
    monkeypatch.setattr(comm, "check_collectives", False)
    buf = on_device_1(cupy, np.full(4, rank + 1.0))
    comm.all_reduce(buf)
    np.testing.assert_array_equal(buf.get(), np.full(4, total))
    data = [(name, memory) for name, memory in calls if memory]
    assert data and all(memory == {"host"} for _, memory in data), calls
    assert comm.guard.check_collectives is False
