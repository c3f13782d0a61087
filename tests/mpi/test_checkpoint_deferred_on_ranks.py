"""Deferred restoration under MultiWorkerMirroredStrategy across real MPI ranks: training N
steps, saving, restoring into a fresh model and optimizer (no slots yet) and training M more
gives exactly the weights of N + M uninterrupted steps, with every copy on every rank equal.

Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py.
"""


import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver
from mpidist.optimizers import SGD, Adam
from mpidist.train import Checkpoint

comm = MPI.COMM_WORLD
rank = comm.Get_rank()

RNG = np.random.default_rng(3)
X = RNG.standard_normal((48, 3))
Y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * RNG.standard_normal(48)

OPTIMIZERS = {
    "momentum": (lambda: SGD(0.05, momentum=0.9), ("momentum",)),
    "adam": (lambda: Adam(0.05), ("m", "v")),
    "amsgrad": (lambda: Adam(0.05, amsgrad=True), ("m", "v", "vhat")),
}


class Model:
    def __init__(self, **variables):
        self.vars = dict(variables)

    def _checkpoint_dependencies(self):
        return dict(self.vars)


def mwms(local):
    return mpidist.MultiWorkerMirroredStrategy(
        MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)]))


def make(strategy, make_opt):
    with strategy.scope():
        model = Model(w=mpidist.Variable(np.zeros(3)), b=mpidist.Variable(np.zeros(())))
        return model, make_opt()


def train(strategy, model, opt, epochs):
    w, b = model.vars["w"], model.vars["b"]
    data = strategy.experimental_distribute_dataset(
        mpidist.data.Dataset.from_tensor_slices((X, Y)).batch(16))

    def step(xb, yb):
        err = xb @ w.read_value() + b.read_value() - yb
        opt.apply_gradients([(2 * xb.T @ err / 16, w), (2 * np.sum(err) / 16, b)])

    for _ in range(epochs):
        for xb, yb in data:
            strategy.run(step, args=(xb, yb))


def everywhere(v):
    """Every copy of ``v`` on every rank, as lists."""
    return [c for part in comm.allgather([c.numpy().tolist() for c in v.values]) for c in part]


@pytest.mark.mpi
@pytest.mark.parametrize("local", [1, 2])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_resume_into_a_fresh_optimizer_is_bit_exact(shared_dir, optimizer, local):
    s = mwms(local)
    make_opt, slot_names = OPTIMIZERS[optimizer]
    model, opt = make(s, make_opt)
    train(s, model, opt, epochs=2)

    model1, opt1 = make(s, make_opt)
    train(s, model1, opt1, epochs=1)
    path = Checkpoint(model=model1, optimizer=opt1).save(f"{shared_dir}/ck")

    model2, opt2 = make(s, make_opt)
    status = Checkpoint(model=model2, optimizer=opt2).restore(path)
    assert len(status.unused) == 2 * len(slot_names)
    train(s, model2, opt2, epochs=1)
    status.assert_consumed()

    for key in ("w", "b"):
        got = everywhere(model2.vars[key])
        assert got == everywhere(model.vars[key])  # exact, on every copy of every rank
        assert all(c == got[0] for c in got)
        for name in slot_names:
            assert everywhere(opt2.get_slot(model2.vars[key], name)) == \
                everywhere(opt.get_slot(model.vars[key], name))
    assert everywhere(opt2.iterations) == everywhere(opt.iterations)
