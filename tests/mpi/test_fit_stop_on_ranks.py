"""Keras's ``model.stop_training`` under MultiWorkerMirroredStrategy (run under mpiexec -n 1,
2, 4 by tests/test_mpi_launch.py): a callback that asks to stop on one rank only, at an
epoch's end, stops every rank after that same epoch (fit agrees once per epoch), with the
same weights everywhere."""

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from linear_model import linear_job

comm = MPI.COMM_WORLD
rank = comm.Get_rank()


class StopOnLastRank(mpidist.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1 and rank == comm.Get_size() - 1:
            self.model.stop_training = True


@pytest.mark.mpi
def test_a_stop_asked_on_one_rank_stops_every_rank_after_the_same_epoch():
    strategy = mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver())
    model, optimizer, ds = linear_job(strategy, 16, [1.0, -1.0])
    history = mpidist.fit(model, ds, epochs=6, optimizer=optimizer, strategy=strategy,
                          callbacks=[StopOnLastRank()], verbose=0)
    assert history.epoch == [0, 1]
    assert int(optimizer.iterations.numpy()) == 4
    weights = np.asarray(model.w.numpy())
    assert all(np.array_equal(w, weights) for w in comm.allgather(weights))
