"""``Optimizer.apply_mean_gradients`` (fit's update) across MPI ranks: the fused path, where the
loss totals ride in the head of the packed gradient buffer, gives the bits of the per-variable
path and of an in-process MirroredStrategy holding every replica of the job, in one collective
per step where totals and gradients share a dtype; the ranks may hold different numbers of
examples. Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py."""

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
SHAPES = [(3, 4), (5,), (), (2, 2, 2)]
STEPS = 4
# The reference is an in-process MirroredStrategy on every rank, which warns that it is alone.
pytestmark = pytest.mark.filterwarnings("ignore:MirroredStrategy runs within one process")


def mwms(local=1):
    resolver = MPIClusterResolver(local_devices=[f"/cpu:{i}" for i in range(local)])
    return mpidist.MultiWorkerMirroredStrategy(resolver)


def unfused(opt):
    cls = type(opt)
    opt.__class__ = type("Unfused" + cls.__name__, (cls,),
                         {"_update_step": lambda self, *a: cls._update_step(self, *a)})
    return opt


def train(strategy, make_opt, dtype, fused=True):
    rng = np.random.default_rng(7)  # the same draws on every rank
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        vs = [mpidist.Variable(rng.standard_normal(s).astype(dtype), name=f"v{i}")
              for i, s in enumerate(SHAPES)]
        opt = make_opt() if fused else unfused(make_opt())
    grads = [[[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(replicas)]
             for _ in range(STEPS)]
    totals = [[np.array([rng.random(), 1 + (r * 5 + k) % 4]) for r in range(replicas)]
              for k in range(STEPS)]
    guard = getattr(strategy.extended, "communicator", None)
    collectives, summed = [], []
    for k in range(STEPS):
        def step(k=k):
            r = int(mpidist.get_replica_context().replica_id_in_sync_group)
            return opt.apply_mean_gradients(zip(grads[k][r], vs), totals[k][r])
        before = guard.guard.seq if guard is not None else 0
        out = strategy.run(step)
        collectives.append((guard.guard.seq if guard is not None else 0) - before)
        summed.append(np.asarray(strategy.experimental_local_results(out)[0]))
    return [v.numpy() for v in vs], summed, collectives, np.sum(totals, axis=1)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_mean_across_ranks_matches_the_per_variable_path_and_mirrored(name, dtype):
    make = {"sgd": lambda: mpidist.optimizers.SGD(0.1),
            "momentum": lambda: mpidist.optimizers.SGD(0.1, momentum=0.9),
            "adam": lambda: mpidist.optimizers.Adam(0.01)}[name]
    got, summed, collectives, expected = train(mwms(), make, dtype)
    want, _, _, _ = train(mwms(), make, dtype, fused=False)
    ref, _, _, _ = train(mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(size)]), make,
                         dtype, fused=False)
    for a, b, c in zip(got, want, ref):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5 if dtype == np.float32 else 1e-12)
    for s, e in zip(summed, expected):
        np.testing.assert_allclose(s, e, rtol=1e-12)
    gathered = comm.allgather([v.tobytes() for v in got])
    assert all(g == gathered[0] for g in gathered)  # every rank holds the same model
    if size > 1:
        # After the first step (which creates the slots): one collective per step where the
        # totals share the gradients' dtype (float64), else one each.
        assert collectives[1:] == [1 if dtype == np.float64 else 2] * (STEPS - 1)


def test_fit_loss_is_the_mean_over_every_example_with_uneven_shares():
    strategy = mwms()
    with strategy.scope():
        w = mpidist.Variable(np.zeros(2), name="w")
        optimizer = mpidist.optimizers.SGD(0.5)

    class Model:
        trainable_variables = [w]

        def loss_and_gradients(self, x, y):
            losses = (x @ w.numpy() - y) ** 2  # per example
            grad = 2 * ((x @ w.numpy() - y)[:, None] * x).sum(axis=0)
            return losses, [grad]

    rows = 4 * size + 3  # the global batch does not split evenly
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((rows, 2)), rng.standard_normal(rows)
    data = mpidist.data.Dataset.from_tensor_slices((x, y)).batch(rows)
    history = mpidist.fit(Model(), data, epochs=1, optimizer=optimizer, strategy=strategy,
                          verbose=0)
    np.testing.assert_allclose(history.history["loss"][0], np.mean(y ** 2), rtol=1e-12)
    np.testing.assert_allclose(w.numpy(), -0.5 * 2 * (-(y[:, None] * x)).sum(axis=0) / rows,
                               rtol=1e-12)
