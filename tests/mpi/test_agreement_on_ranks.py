"""Ranks agree on what they must agree on (issue 22, item 6), across real MPI ranks: the
configuration of MultiWorkerMirroredStrategy, and the checkpoint a restore reads (its path and
a digest of its content). A difference is the same InvalidArgumentError on every rank, naming
which rank has what; where the ranks agree, nothing changes.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py (the differences
need two ranks or more and are skipped on one). Ranks that never arrive end the job, so that
case is launched on its own by tests/test_construction_agreement.py.
"""

import os
import re
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.errors import InvalidArgumentError
from mpidist.experimental import CommunicationOptions
from mpidist.train import Checkpoint, CheckpointManager

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
several = pytest.mark.skipif(size == 1, reason="a difference needs two ranks")


def mwms(**options):
    resolver = MPIClusterResolver(local_devices=["/cpu:0"])
    return mpidist.MultiWorkerMirroredStrategy(
        resolver, communication_options=CommunicationOptions(**options))


def names_every_rank(message, fact):
    """The error has a line for ``fact`` whose ``rank(s) ... has/have`` groups name every
    rank exactly once (the values differ, so there are two groups or more)."""
    line = next(line for line in message.splitlines() if line.strip().startswith(fact + ":"))
    groups = re.findall(r"ranks? ([\d, ]+?) ha(?:s|ve) ", line)
    named = [int(r) for group in groups for r in group.split(",")]
    return len(groups) >= 2 and sorted(named) == list(range(size))


def test_same_configuration_builds_and_sums():
    strategy = mwms(timeout_seconds=30)
    result = strategy.reduce("SUM", strategy.run(lambda: np.ones(2)), axis=None)
    np.testing.assert_allclose(result, np.full(2, float(size)))


@several
def test_communication_options_differing_by_rank_are_named_on_every_rank():
    with pytest.raises(InvalidArgumentError) as info:
        mwms(timeout_seconds=30 + rank % 2)
    message = str(info.value)
    assert "MultiWorkerMirroredStrategy" in message
    assert names_every_rank(message, "communication_options"), message
    # The gather completed: the ranks can go on together.
    strategy = mwms(timeout_seconds=30)
    assert strategy.num_replicas_in_sync == size


@several
def test_local_devices_of_another_kind_count_differ_by_rank():
    devices = ["/cpu:0"] if rank % 2 == 0 else ["/cpu:0", "/cpu:1"]
    with pytest.raises(InvalidArgumentError, match="local_devices"):
        mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=devices))


def test_device_indices_may_differ_by_rank():
    """``/cpu:<rank>`` (as ``/gpu:<local rank>`` is usual): the same kind and count agree."""
    strategy = mpidist.MultiWorkerMirroredStrategy(
        MPIClusterResolver(local_devices=[f"/cpu:{rank}"]))
    assert strategy.num_replicas_in_sync == size


# -- restore --------------------------------------------------------------------------------
def _model(strategy):
    with strategy.scope():
        return mpidist.Variable(np.zeros(3))


def _write(path, value):
    """This rank alone writes ``value`` as ``v`` (a variable of no strategy: no collective)."""
    return Checkpoint(v=mpidist.Variable(value)).write(path)


def test_restore_of_one_shared_checkpoint_agrees(shared_dir):
    strategy = mwms(timeout_seconds=30)
    v = _model(strategy)
    path = os.path.join(shared_dir, "ckpt-1")
    if rank == 0:
        _write(path, np.arange(3.0))
    comm.Barrier()
    Checkpoint(v=v).restore(path)
    np.testing.assert_allclose(v.numpy(), np.arange(3.0))


@several
@pytest.mark.parametrize("differ", ["path", "content"])
def test_restore_from_per_rank_files_is_an_error_on_every_rank(shared_dir, differ):
    strategy = mwms(timeout_seconds=30)
    v = _model(strategy)
    if differ == "path":  # one directory per rank, same numbers
        path = os.path.join(shared_dir, f"rank{rank}", "ckpt-1")
        os.makedirs(os.path.dirname(path))
        value = np.ones(3)
    else:  # one name on storage local to each rank: other numbers
        path = os.path.join(tempfile.gettempdir(), f"mpidist-agree-{os.getpid()}-ckpt")
        value = np.full(3, float(rank))
    _write(path, value)
    comm.Barrier()
    try:
        with pytest.raises(InvalidArgumentError) as info:
            Checkpoint(v=v).restore(path)
    finally:
        if differ == "content":
            os.remove(path)
    message = str(info.value)
    fact = "path" if differ == "path" else "content"
    assert names_every_rank(message, fact), message
    assert "Checkpoint.restore" in message
    np.testing.assert_allclose(v.numpy(), np.zeros(3))  # nothing was restored anywhere


@several
def test_restore_or_initialize_with_a_checkpoint_on_some_ranks_only(shared_dir):
    """Per-rank directories where only the chief has saved: the chief would restore and the
    others initialize. An error everywhere instead, naming each rank's latest checkpoint."""
    directory = os.path.join(shared_dir, f"rank{rank}")
    if rank == 0:  # a one-process save (no strategy across ranks), as an earlier run left it
        CheckpointManager(Checkpoint(v=mpidist.Variable(np.ones(3))), directory, 2).save()
    comm.Barrier()
    strategy = mwms(timeout_seconds=30)
    v = _model(strategy)
    manager = CheckpointManager(Checkpoint(v=v), directory, max_to_keep=2)
    assert (manager.latest_checkpoint is not None) == (rank == 0)
    with pytest.raises(InvalidArgumentError, match="restore_or_initialize") as info:
        manager.restore_or_initialize()
    assert names_every_rank(str(info.value), "path"), str(info.value)
    np.testing.assert_allclose(v.numpy(), np.zeros(3))
