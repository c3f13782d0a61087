"""JAX autodiff given a batch of CuPy arrays (what GPU prefetch delivers), and JAX's GPU memory.

There is no GPU here. A CuPy array is stood in for by ``DeviceBatch``: not a NumPy array, no
``__array__`` (CuPy refuses implicit conversion to NumPy the same way), and a DLPack export,
which is all a CuPy array offers JAX. Before the fix these tests failed as they would on a GPU:
``jax.jit`` rejected the argument ("not a valid JAX type") and eager ``jax.numpy`` could not
convert it. This tests our conversion, not a GPU.
"""

import os
import sys
import types

import numpy as np
import pytest

import mpidist
from mpidist.training import autodiff

jax = pytest.importorskip("jax", reason="the jax extra is not installed")
jnp = pytest.importorskip("jax.numpy")

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
W0 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
B0 = np.array([0.5, -1.0], np.float32)


class DeviceBatch:
    """A cupy.ndarray stand-in: DLPack out, no implicit conversion to NumPy."""

    def __init__(self, array):
        self._array = np.ascontiguousarray(array)
        self.shape, self.dtype, self.ndim = self._array.shape, self._array.dtype, self._array.ndim

    def __dlpack__(self, stream=None, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")


@pytest.fixture
def cupy_stand_in(monkeypatch):
    module = types.ModuleType("cupy")
    module.ndarray = DeviceBatch
    module.from_dlpack = lambda x: DeviceBatch(np.from_dlpack(x))
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def loss_fn(params, x, y):
    w, b = params
    return jnp.sum((x @ w + b - y) ** 2) / 4


def expected(x, y):
    z = x.astype(np.float64) @ W0 + B0 - y
    return (z ** 2).sum() / 4, x.T.astype(np.float64) @ z / 2, z.sum(axis=0) / 2


# (jit takes positional arguments only: keywords are a documented error there)
@pytest.mark.parametrize("jit, as_keyword", [(False, False), (True, False), (False, True)])
def test_a_device_batch_reaches_jax_with_jit_on_and_off(cupy_stand_in, jit, as_keyword):
    y = np.full((4, 2), 0.25, np.float32)
    w, b = mpidist.Variable(W0.copy(), name="w"), mpidist.Variable(B0.copy(), name="b")
    xb, yb = DeviceBatch(X), DeviceBatch(y)
    if as_keyword:
        loss, (gw, gb) = mpidist.autodiff.value_and_grad(loss_fn, [w, b], xb, y=yb,
                                                         backend="jax", jit=jit)
    else:
        loss, (gw, gb) = mpidist.autodiff.value_and_grad(loss_fn, [w, b], xb, yb,
                                                         backend="jax", jit=jit)
    want_loss, want_gw, want_gb = expected(X, y)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, want_gb, rtol=1e-5, atol=1e-6)


def test_a_batch_nested_in_a_structure_is_converted_leaf_by_leaf(cupy_stand_in):
    w, b = mpidist.Variable(W0.copy(), name="w"), mpidist.Variable(B0.copy(), name="b")
    y = np.zeros((4, 2), np.float32)

    def nested(params, batch):
        return loss_fn(params, batch["x"], batch["targets"][0])

    loss, _ = mpidist.autodiff.value_and_grad(
        nested, [w, b], {"x": DeviceBatch(X), "targets": [DeviceBatch(y)]}, backend="jax")
    assert float(loss) == pytest.approx(expected(X, y)[0], rel=1e-5)


class LossOnlyModel:
    def __init__(self):
        self.w = mpidist.Variable(W0.copy(), name="w")
        self.b = mpidist.Variable(B0.copy(), name="b")
        self.trainable_variables = [self.w, self.b]

    def loss(self, params, x, y):
        w, b = params
        return jnp.sum((x @ w + b - y) ** 2, axis=1)


def test_fit_style_helpers_convert_the_batch(cupy_stand_in):
    model, y = LossOnlyModel(), np.ones((4, 2), np.float32)
    per_example, (gw, gb) = autodiff.model_loss_and_gradients(model, DeviceBatch(X),
                                                              DeviceBatch(y), backend="jax")
    z = X.astype(np.float64) @ W0 + B0 - y
    np.testing.assert_allclose(np.asarray(per_example), (z ** 2).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(gw, 2 * X.T @ z, rtol=1e-5, atol=1e-5)
    per_example, _ = autodiff.model_per_example_loss(model, DeviceBatch(X), DeviceBatch(y),
                                                     backend="jax")
    np.testing.assert_allclose(np.asarray(per_example), (z ** 2).sum(axis=1), rtol=1e-5)


def test_jax_is_told_not_to_preallocate_the_gpu_unless_the_user_chose(monkeypatch):
    for name in autodiff._JAX_MEMORY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    autodiff.jax_module()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
    autodiff.jax_module()
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    autodiff.jax_module()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
