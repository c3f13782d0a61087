"""NCCL across ranks only where every rank drives its own GPU (issue 23, finding 3), decided
alike on every rank of a real MPI job, through MultiWorkerMirroredStrategy's construction.

The ranks are CPU-only: each claims a GPU replica (``/gpu:0``, a device name, nothing runs on
it), NCCL "loads" (a stand-in), and its GPU's identity comes from a seam (``gpu_identity`` of
the strategy's module) that the test sets per rank. No test here creates an NCCL communicator
or claims that a GPU ran: the NCCL group is a recording stand-in.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""

import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.errors import InvalidArgumentError
from mpidist.experimental import CommunicationImplementation, CommunicationOptions
from mpidist.strategies import multi_worker_mirrored as mwm

rank = MPI.COMM_WORLD.Get_rank()
size = MPI.COMM_WORLD.Get_size()
several = pytest.mark.skipif(size == 1, reason="sharing a GPU needs two ranks")


class StandInNcclGroup:
    """Where the strategy would create its NCCL communicator: records that it did."""

    created = []

    def __init__(self, communicator, device_index):
        StandInNcclGroup.created.append(device_index)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Every rank has one GPU replica and NCCL; returns a setter of this rank's GPU identity
    and the strategy's info log lines."""
    StandInNcclGroup.created.clear()
    lines = []
    monkeypatch.setattr(mwm, "nccl_module", lambda: object())
    monkeypatch.setattr(mwm, "RankNcclGroup", StandInNcclGroup)
    monkeypatch.setattr(mwm.log, "info", lambda fmt, *args: lines.append(fmt % args))

    def set_identity(name):
        monkeypatch.setattr(mwm, "gpu_identity", lambda index, node: ("", name))

    return set_identity, lines


def strategy(implementation):
    return mpidist.MultiWorkerMirroredStrategy(
        MPIClusterResolver(local_devices=["/gpu:0"]),
        CommunicationOptions(implementation=implementation, timeout_seconds=60))


def test_own_gpus_take_nccl_under_auto(fake_gpus):
    set_identity, lines = fake_gpus
    set_identity(f"GPU-{rank}")
    strategy(CommunicationImplementation.AUTO)
    assert StandInNcclGroup.created == ([0] if size > 1 else [])  # one rank: nothing crosses


@several
def test_shared_gpus_fall_back_to_mpi_under_auto_with_one_line_saying_why(fake_gpus):
    set_identity, lines = fake_gpus
    set_identity(f"GPU-{rank // 2}")  # ranks 0 and 1 share one, 2 and 3 another
    s = strategy(CommunicationImplementation.AUTO)
    assert StandInNcclGroup.created == []
    why = [line for line in lines if "not NCCL" in line]
    assert len(why) == 1 and "ranks 0, 1 share GPU-0" in why[0], lines
    assert s.num_replicas_in_sync == size


@several
def test_shared_gpus_with_nccl_requested_raise_on_every_rank(fake_gpus):
    set_identity, _ = fake_gpus
    set_identity(f"GPU-{rank // 2}")
    with pytest.raises(InvalidArgumentError) as err:
        strategy(CommunicationImplementation.NCCL)
    message = str(err.value)
    assert "ranks 0, 1 share GPU-0" in message
    assert "CommunicationImplementation.RING" in message and "CUDA_VISIBLE_DEVICES" in message
    assert StandInNcclGroup.created == []
    # Every rank raised the same error and none waits: the job goes on together.
    assert MPI.COMM_WORLD.allgather(message) == [message] * size


@several
def test_one_rank_sharing_is_enough_to_refuse(fake_gpus):
    set_identity, lines = fake_gpus
    set_identity("GPU-last" if rank >= size - 2 else f"GPU-{rank}")
    strategy(CommunicationImplementation.AUTO)
    assert StandInNcclGroup.created == []
    assert any(f"ranks {size - 2}, {size - 1} share GPU-last" in line for line in lines), lines
