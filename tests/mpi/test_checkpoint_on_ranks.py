"""mpidist.train.Checkpoint / CheckpointManager under MultiWorkerMirroredStrategy across real
MPI ranks: every rank saves (SyncOnRead reads are collective), only the chief writes, save
returns on every rank once the file is complete, every rank restores the same values.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py. The ranks share
one temporary directory (rank 0 creates it and broadcasts its path).
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist import VariableAggregation as Agg
from mpidist import VariableSynchronization as Sync
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.train import Checkpoint, CheckpointManager, latest_checkpoint
from mpidist.core import durable

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

LOCAL = [1, 2]


def mwms(local=1):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    return mpidist.MultiWorkerMirroredStrategy(resolver)


def rid():
    return int(mpidist.get_replica_context().replica_id_in_sync_group)


def comps(v):
    return [c.numpy().item() for c in v.values]


@pytest.fixture
def writes(monkeypatch):
    """The paths this rank wrote (through the module's atomic writer)."""
    written = []

    def spy(operation, path):  # every save publishes its file with one rename
        if operation == "rename":
            written.append(os.path.basename(path))

    with durable.inject(spy):
        yield written


def make_vars(strategy):
    with strategy.scope():
        return {
            "sum": mpidist.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.SUM),
            "mean": mpidist.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.MEAN),
            "first": mpidist.Variable(0.0, synchronization=Sync.ON_READ,
                                      aggregation=Agg.ONLY_FIRST_REPLICA),
            "w": mpidist.Variable(np.zeros(3)),
        }


def fill(strategy, variables):
    """Global replica r holds r + 1 in every SyncOnRead variable; w is [1, 2, 3] everywhere."""
    def step():
        r = rid()
        for key in ("sum", "mean", "first"):
            variables[key].assign(float(r + 1), read_value=False)

    strategy.run(step)
    with strategy.scope():
        variables["w"].assign(np.array([1.0, 2.0, 3.0]), read_value=False)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_only_chief_writes_and_every_rank_restores(shared_dir, writes, local):
    s = mwms(local)
    n = s.num_replicas_in_sync
    saved = make_vars(s)
    fill(s, saved)
    path = Checkpoint(model=saved).save(os.path.join(shared_dir, "ck"))
    assert path == os.path.join(shared_dir, "ck-1")
    # Only the chief wrote, and the file is complete on every rank as soon as save returns.
    assert writes == (["ck-1", "checkpoint"] if rank == 0 else [])
    assert comm.allgather(len(writes)) == [2] + [0] * (size - 1)
    assert latest_checkpoint(shared_dir) == path
    total = n * (n + 1) / 2
    with np.load(path, allow_pickle=False) as z:
        assert len(z.files) == 6  # manifest, 4 variables, save_counter

    fresh = make_vars(s)
    Checkpoint(model=fresh).restore(path).assert_consumed()
    assert comps(fresh["sum"]) == pytest.approx([total / n] * local)
    assert comps(fresh["mean"]) == pytest.approx([total / n] * local)
    assert comps(fresh["first"]) == [1.0] * local  # global replica 0's value, on every rank
    assert [c.numpy().tolist() for c in fresh["w"].values] == [[1.0, 2.0, 3.0]] * local
    with s.scope():
        assert float(fresh["sum"].read_value()) == pytest.approx(total)  # collective read

    plain = {k: mpidist.Variable(np.zeros_like(v.values[0].numpy())) for k, v in saved.items()}
    Checkpoint(model=plain).restore(path).assert_consumed()
    assert [plain[k].numpy().item() for k in ("sum", "mean", "first")] == \
        pytest.approx([total, total / n, 1.0])
    everyone = comm.allgather([plain[k].numpy().tolist() for k in sorted(plain)])
    assert all(e == everyone[0] for e in everyone)


@pytest.mark.mpi
@pytest.mark.parametrize("local", LOCAL)
def test_manager_keeps_the_last_k_on_every_rank(shared_dir, writes, local):
    s = mwms(local)
    variables = make_vars(s)
    ck = Checkpoint(model=variables)
    mgr = CheckpointManager(ck, shared_dir, max_to_keep=2)
    for step in range(4):
        fill(s, variables)
        with s.scope():
            variables["w"].assign(np.full(3, float(step)), read_value=False)
        mgr.save()
        # The sweep and the state file are done on every rank's return, with no extra barrier.
        kept = [f"ckpt-{i}" for i in range(max(1, step), step + 2)]
        assert sorted(f for f in os.listdir(shared_dir) if f.startswith("ckpt")) == kept
        assert latest_checkpoint(shared_dir) == os.path.join(shared_dir, f"ckpt-{step + 1}")
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-3", "ckpt-4"]
    assert comm.allgather(mgr.checkpoints) == [mgr.checkpoints] * size
    if rank != 0:
        assert writes == []

    # A restarted job: new objects, the same directory.
    again = make_vars(s)
    ck2 = Checkpoint(model=again)
    mgr2 = CheckpointManager(ck2, shared_dir, max_to_keep=2)
    assert mgr2.restore_or_initialize() == os.path.join(shared_dir, "ckpt-4")
    assert [c.numpy().tolist() for c in again["w"].values] == [[3.0] * 3] * local
    assert mgr2.save() == os.path.join(shared_dir, "ckpt-5")
    assert sorted(f for f in os.listdir(shared_dir) if f.startswith("ckpt")) == ["ckpt-4", "ckpt-5"]


@pytest.mark.mpi
def test_a_failed_write_on_the_chief_raises_on_every_rank(shared_dir, monkeypatch):
    s = mwms(1)
    variables = make_vars(s)
    fill(s, variables)
    ck = Checkpoint(model=variables)
    def no_space(operation, path):
        if rank == 0 and operation == "write":
            raise OSError(28, "No space left on device")

    expected = (OSError, "No space left") if rank == 0 else \
        (RuntimeError, "failed on rank 0: OSError: .*No space left on device")
    with durable.inject(no_space), pytest.raises(expected[0], match=expected[1]):
        ck.save(os.path.join(shared_dir, "ck"))
    assert int(ck.save_counter.numpy()) == 0
    comm.Barrier()
    assert os.listdir(shared_dir) == []
    # The job goes on: the next save works everywhere.
    assert ck.save(os.path.join(shared_dir, "ck")) == os.path.join(shared_dir, "ck-1")


@pytest.mark.mpi
def test_none_aggregation_raises_on_every_rank(shared_dir):
    s = mwms(1)
    with s.scope():
        v = mpidist.Variable(0.0, synchronization=Sync.ON_READ, aggregation=Agg.NONE)
    with pytest.raises(ValueError, match="Could not convert"):
        Checkpoint(v=v).save(os.path.join(shared_dir, "ck"))
    comm.Barrier()
    assert os.listdir(shared_dir) == []
