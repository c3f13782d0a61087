"""Saves across MPI ranks (run under mpiexec -n 1, 2, 4 by tests/test_mpi_launch.py):

- every rank saving one dataset to one shared path: no error on any rank (no raw OSError),
  and the path then holds one whole copy;
- a BackupAndRestore directory owned by another live run: fit fails on every rank, naming
  the owner's Slurm job, and touches nothing; once the owner is gone the run takes over.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.data import Dataset
from linear_model import linear_job

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()


@pytest.mark.mpi
def test_every_rank_saving_one_path_publishes_a_whole_dataset(shared_dir):
    path = os.path.join(shared_dir, "ds")
    for _ in range(3):
        comm.Barrier()  # all at once: the case where renames used to collide
        Dataset.range(200).save(path)
    comm.Barrier()
    assert sorted(int(v) for v in Dataset.load(path).as_numpy_iterator()) == list(range(200))


def fit_with_backup(backup_dir):
    strategy = mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver())
    model, optimizer, ds = linear_job(strategy, 32, [1.0, -2.0])
    mpidist.fit(model, ds, epochs=2, optimizer=optimizer, strategy=strategy, verbose=0,
                callbacks=[mpidist.callbacks.BackupAndRestore(backup_dir, save_freq=2)])
    return np.asarray(model.w.numpy())


OWNER = """
import os, sys, time
os.environ["SLURM_JOB_ID"] = "999"
from mpidist.training.backup_owner import claim
claim(sys.argv[1])
print("claimed", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.mark.mpi
def test_a_backup_directory_of_a_live_run_is_refused_on_every_rank(shared_dir):
    backup_dir = os.path.join(shared_dir, "backup")
    owner = None
    if rank == 0:  # another run, alive, owns the directory
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
        owner = subprocess.Popen([sys.executable, "-c", OWNER, backup_dir], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert owner.stdout.readline().strip() == "claimed"
    comm.Barrier()
    with pytest.raises(RuntimeError, match=r"the backup directory .* is in use by another live "
                                           r"run: Slurm job 999 on host"):
        fit_with_backup(backup_dir)
    comm.Barrier()
    if rank == 0:
        assert sorted(os.listdir(backup_dir)) == ["owner.json", "owner.lock"]
        owner.stdin.close()
        owner.wait(timeout=30)
        deadline = time.monotonic() + 10
        while owner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    comm.Barrier()
    weights = fit_with_backup(backup_dir)  # the owner is gone: this run takes over
    assert np.isfinite(weights).all() and not os.path.exists(backup_dir)
    assert all(np.array_equal(w, weights) for w in comm.allgather(weights))
