"""mpidist.autodiff.value_and_grad inside strategy.run under MultiWorkerMirroredStrategy: each
rank differentiates its shard's share of the global mean loss, apply_gradients sums the shares,
and every rank ends with the weights OneDeviceStrategy reaches on the whole global batch.
Size-agnostic: run under mpiexec -n 1, 2 and 4 by tests/test_mpi_launch.py."""

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.cluster_resolver import MPIClusterResolver

anp = pytest.importorskip("autograd.numpy", reason="the autograd extra is not installed")
jnp = pytest.importorskip("jax.numpy", reason="the jax extra is not installed")

comm = MPI.COMM_WORLD
GLOBAL_BATCH = 16
STEPS = 4


@pytest.fixture(scope="module")
def strategy():
    return mpidist.MultiWorkerMirroredStrategy(MPIClusterResolver(local_devices=["/cpu:0"]))


def data(dtype):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 5)).astype(dtype)
    y = (x @ np.arange(1, 6, dtype=dtype) + 0.5).astype(dtype)
    return x, y


def train(strategy, backend, dtype):
    with strategy.scope():
        w = mpidist.Variable(np.zeros(5, dtype), name="w")
        b = mpidist.Variable(np.zeros((), dtype), name="b")
        optimizer = mpidist.optimizers.SGD(0.05)
    dist = strategy.experimental_distribute_dataset(
        mpidist.data.Dataset.from_tensor_slices(data(dtype)).batch(GLOBAL_BATCH))

    def loss_fn(params, x, y):
        w, b = params
        per_example = (x @ w + b - y) ** 2
        return mpidist.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)

    def step(x, y):
        loss, grads = mpidist.autodiff.value_and_grad(loss_fn, [w, b], x, y, backend=backend)
        optimizer.apply_gradients(zip(grads, [w, b]))
        return loss

    losses = [float(strategy.reduce("SUM", strategy.run(step, args=(x, y)), axis=None))
              for x, y in dist]
    return losses, w.numpy(), b.numpy()


@pytest.mark.parametrize("backend, dtype, rtol", [("autograd", np.float64, 1e-12),
                                                  ("jax", np.float32, 1e-5)])
def test_every_rank_reaches_the_one_device_weights(strategy, backend, dtype, rtol):
    losses, w, b = train(strategy, backend, dtype)
    want_losses, want_w, want_b = train(mpidist.OneDeviceStrategy("/cpu:0"), backend, dtype)
    np.testing.assert_allclose(losses, want_losses, rtol=rtol * 10)
    np.testing.assert_allclose(w, want_w, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(b, want_b, rtol=rtol, atol=rtol)
    assert w.dtype == dtype and losses[-1] < losses[0]
    # Every rank holds the same weights.
    gathered = comm.allgather(np.concatenate([w, np.atleast_1d(b)]))
    for other in gathered[1:]:
        np.testing.assert_array_equal(other, gathered[0])
