"""Device buffers and MPI (issue 23, finding 5): whether the MPI library is CUDA-aware, found
out per library; a device buffer's stream waited for on the buffer's own GPU; the cross-worker
step of CollectiveAllReduce run on the buffer's GPU.

Tests of OUR logic with the recording stand-in for CuPy (tests/recording_cupy.py): nothing here
ran on a GPU. The staging and the blocking call across real ranks are in
tests/mpi/test_device_buffers_on_ranks.py.
"""

import numpy as np
import pytest

from mpidist.comm import communicator as communicator_mod
from mpidist.comm import cuda_aware
from mpidist.comm.cuda_aware import detect_cuda_awareness
from mpidist.ops.collective_all_reduce import CollectiveAllReduce
from mpidist.types import ReduceOp

from recording_cupy import stand_in  # noqa: F401 - the fixture

MPICH_WHEEL = """MPICH Version:      5.0.2
MPICH Release date: Fri Sep 25 20:45:26 UTC 2026
MPICH Device:       ch4:ucx ofi
MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
MPICH Custom Information:	https://pypi.org/p/mpich/5.0.2/
"""
MPICH_CUDA = MPICH_WHEEL.replace("--with-pm", "--with-cuda=/usr/local/cuda --with-pm")
OPEN_MPI = "Open MPI v5.0.6, package: Open MPI builder Distribution, ident: 5.0.6, repo rev: v5.0.6"
MVAPICH = "MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 22:00:00 EST 2022"
OMPI_INFO = "mca:mpi:base:param:mpi_built_with_cuda_support:value:{}\nother:line:value:x\n"


def no_query():
    return None


def no_ompi_info():
    return None


@pytest.mark.parametrize("library,environ,query,ompi_info,expected,how", [
    # the runtime's own answer wins over what the version string suggests
    (MPICH_WHEEL, {}, lambda: 0, no_ompi_info, False, "MPIX_Query_cuda_support() of the MPI library returned 0"),
    (MPICH_WHEEL, {}, lambda: 1, no_ompi_info, True, "returned 1"),
    (OPEN_MPI, {}, lambda: 1, lambda: OMPI_INFO.format("false"), True, "returned 1"),
    # no query: by library
    (MPICH_WHEEL, {}, no_query, no_ompi_info, False, "configured without CUDA"),
    (MPICH_CUDA, {}, no_query, no_ompi_info, None, "configured with CUDA"),
    (MPICH_CUDA, {"MPIR_CVAR_ENABLE_GPU": "0"}, no_query, no_ompi_info, False,
     "MPIR_CVAR_ENABLE_GPU=0"),
    (OPEN_MPI, {}, no_query, lambda: OMPI_INFO.format("true"), True,
     "mpi_built_with_cuda_support is true"),
    (OPEN_MPI, {}, no_query, lambda: OMPI_INFO.format("false"), False,
     "mpi_built_with_cuda_support is false"),
    (OPEN_MPI, {}, no_query, no_ompi_info, None, "ompi_info could not tell"),
    (MVAPICH, {"MV2_USE_CUDA": "1"}, no_query, no_ompi_info, True, "MV2_USE_CUDA is 1"),
    (MVAPICH, {}, no_query, no_ompi_info, False, "MV2_USE_CUDA is not 1"),
    ("Intel(R) MPI Library 2021.13 for Linux* OS", {}, no_query, no_ompi_info, None,
     "no way known"),
    ("", {}, no_query, no_ompi_info, None, "an unnamed MPI library"),
])
def test_detection_per_library(library, environ, query, ompi_info, expected, how):
    aware, said = detect_cuda_awareness(library, environ, query, ompi_info)
    assert aware is expected
    assert how in said, said


@pytest.mark.parametrize("override", [True, False])
def test_the_users_word_wins(override):
    def query():
        raise AssertionError("not asked: the user said")

    assert detect_cuda_awareness(MPICH_WHEEL, {}, query, no_ompi_info, override) == (
        override, f"MPIDIST_GPU_AWARE_MPI={int(override)} (set by the user)")


def test_this_mpich_wheel_says_it_is_not_cuda_aware(monkeypatch):
    # The real library of this test run: the query is found in it and answers 0.
    from mpi4py import MPI

    from mpidist import config

    if "MPICH" not in MPI.Get_library_version():
        pytest.skip("this run's MPI library is not MPICH")
    monkeypatch.delenv("MPIDIST_GPU_AWARE_MPI", raising=False)
    monkeypatch.setattr(config, "_config", None)  # read again, without the override
    cuda_aware.reset()
    try:
        assert cuda_aware.query_cuda_support() == 0
        aware, how = cuda_aware.cuda_aware_mpi()
        assert aware is False and "returned 0" in how
        assert "travel through host memory" in cuda_aware.describe((aware, how))
    finally:
        cuda_aware.reset()


def test_the_stream_synchronised_is_the_buffer_s_gpu_s(stand_in, monkeypatch):  # noqa: F811
    rec = stand_in.recording
    synced = []
    monkeypatch.setattr(rec, "host_sync", lambda stream, upto=None: synced.append(
        (stream.device_id, rec.current_device())))
    with stand_in.cuda.Device(1):
        buf = stand_in.zeros((4,), np.float32)
    assert rec.current_device() == 0  # the thread's device is another one
    communicator_mod._synchronize_stream(buf)
    assert synced == [(1, 1)]
    synced.clear()
    communicator_mod._synchronize_stream(np.zeros(4))  # host buffers: nothing to wait for
    assert synced == []


class RecordingComm:
    """A communicator that records the current device of each all-reduce (it sums nothing:
    one worker)."""

    rank, size = 0, 1

    def __init__(self, rec):
        self.rec = rec
        self.devices = []

    def all_reduce(self, buf, op="sum", timeout=None, send=None):
        self.devices.append(self.rec.current_device())
        return buf

    def all_reduce_packs(self, buf, bounds, op="sum", timeout=None):
        self.devices.append(self.rec.current_device())
        return buf


@pytest.mark.parametrize("reduce_op", [ReduceOp.SUM, ReduceOp.MEAN])
def test_the_cross_worker_step_runs_on_the_buffer_s_gpu(stand_in, reduce_op):  # noqa: F811
    rec = stand_in.recording
    comm = RecordingComm(rec)
    ops = CollectiveAllReduce(comm, num_replicas_in_sync=2)
    with stand_in.cuda.Device(1):
        reduced = stand_in.array(np.arange(6, dtype=np.float32))
    out = ops._across_workers(reduced, reduce_op, None)  # MEAN divides: a kernel on device 1
    assert comm.devices == [1]
    assert rec.current_device() == 0  # and the caller's device is as it was
    expected = np.arange(6, dtype=np.float32) / (2 if reduce_op is ReduceOp.MEAN else 1)
    np.testing.assert_array_equal(out.get(), expected)
