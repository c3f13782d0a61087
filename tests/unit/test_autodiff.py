"""mpidist.autodiff.value_and_grad with autograd and JAX, the loss helpers and metrics on traced
values, fit / evaluate with a model that defines only its loss, and the mistakes (docs/autodiff.md).

Expected numbers are worked out by hand from the loss formulas, not taken from a backend."""

import re
import sys

import numpy as np
import pytest

import mpidist

autograd = pytest.importorskip("autograd", reason="the autograd extra is not installed")
anp = pytest.importorskip("autograd.numpy")
jax = pytest.importorskip("jax", reason="the jax extra is not installed")
jnp = pytest.importorskip("jax.numpy")

X = np.arange(12, dtype=np.float32).reshape(4, 3)
W0 = np.ones((3, 2), np.float32)
B0 = np.array([0.5, -1.0], np.float32)
BACKENDS = {"autograd": anp, "jax": jnp}


def strategies():
    return {"default": mpidist.get_strategy(),
            "one-device": mpidist.OneDeviceStrategy("/cpu:0"),
            "mirrored": mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])}


def make_variables(strategy):
    with strategy.scope():
        return (mpidist.Variable(W0.copy(), name="w"), mpidist.Variable(B0.copy(), name="b"))


def squared_loss(xp):
    def loss_fn(params, x):
        w, b = params
        return xp.sum((x @ w + b) ** 2) / 4
    return loss_fn


def expected_loss_and_grads(x=X, w=W0, b=B0):
    z = x.astype(np.float64) @ w + b
    return (z ** 2).sum() / 4, x.T.astype(np.float64) @ z / 2, z.sum(axis=0) / 2


def local(strategy, value):
    return strategy.experimental_local_results(value)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kind", ["default", "one-device", "mirrored"])
def test_loss_and_gradients_match_the_formula_under_every_strategy(backend, kind):
    strategy = strategies()[kind]
    w, b = make_variables(strategy)
    fn = squared_loss(BACKENDS[backend])
    loss, grads = strategy.run(lambda: mpidist.autodiff.value_and_grad(
        fn, [w, b], X, backend=backend))
    want_loss, want_w, want_b = expected_loss_and_grads()
    for replica_loss, replica_grads in zip(local(strategy, loss), zip(*map(
            lambda g: local(strategy, g), grads))):
        assert replica_loss.shape == () and replica_loss.dtype == np.float32
        np.testing.assert_allclose(replica_loss, want_loss, rtol=1e-6)
        gw, gb = replica_grads
        assert type(gw) is np.ndarray and gw.dtype == np.float32 and gw.shape == (3, 2)
        np.testing.assert_allclose(gw, want_w, rtol=1e-6)
        np.testing.assert_allclose(gb, want_b, rtol=1e-6)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_structures_follow_the_variables(backend):
    xp = BACKENDS[backend]
    w, b = make_variables(mpidist.get_strategy())
    loss, g = mpidist.autodiff.value_and_grad(lambda p: xp.sum(p ** 2), w, backend=backend)
    assert float(loss) == 6.0 and type(g) is np.ndarray
    np.testing.assert_array_equal(g, 2 * W0)
    _, grads = mpidist.autodiff.value_and_grad(lambda p: xp.sum(p[0]) + xp.sum(p[1] ** 2),
                                               (w, b), backend=backend)
    assert type(grads) is tuple and len(grads) == 2
    np.testing.assert_array_equal(grads[1], 2 * B0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_aux_comes_back_as_plain_arrays(backend):
    xp = BACKENDS[backend]
    w, b = make_variables(mpidist.get_strategy())

    def fn(params, x):
        logits = x @ params[0] + params[1]
        return xp.sum(logits), {"logits": logits, "scaled": [2 * logits]}

    (loss, aux), grads = mpidist.autodiff.value_and_grad(fn, [w, b], X, has_aux=True,
                                                         backend=backend)
    want = X @ W0 + B0
    assert type(aux["logits"]) is np.ndarray and type(aux["scaled"][0]) is np.ndarray
    np.testing.assert_allclose(aux["logits"], want)
    np.testing.assert_allclose(aux["scaled"][0], 2 * want)
    np.testing.assert_allclose(grads[1], [4.0, 4.0])
    np.testing.assert_allclose(loss, want.sum())


def test_the_default_backend_is_autograd_for_host_arrays(monkeypatch):
    w, _ = make_variables(mpidist.get_strategy())
    seen = []
    loss, _ = mpidist.autodiff.value_and_grad(
        lambda p: (seen.append(type(p).__module__), anp.sum(p))[1], w)
    assert seen == ["autograd.numpy.numpy_boxes"] and float(loss) == 6.0


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_compute_average_loss_and_regularization_on_traced_values(backend):
    xp = BACKENDS[backend]
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    w, _ = make_variables(strategy)
    weights = np.array([1, 0, 1, 1], np.float32)

    def fn(p, x):
        per_example = xp.sum(x @ p, axis=1)  # d/dp of example i: x_i in every column
        return (mpidist.nn.compute_average_loss(per_example, sample_weight=weights,
                                                global_batch_size=8)
                + mpidist.nn.scale_regularization_loss(xp.sum(p ** 2)))

    loss, grad = strategy.run(lambda: mpidist.autodiff.value_and_grad(fn, w, X,
                                                                       backend=backend))
    per_example = (X @ W0).sum(axis=1)
    want_loss = (per_example * weights).sum() / 8 + (W0 ** 2).sum() / 2
    want_grad = np.repeat(((X * weights[:, None]).sum(axis=0) / 8)[:, None], 2, axis=1) + W0
    for value, g in zip(local(strategy, loss), local(strategy, grad)):
        np.testing.assert_allclose(value, want_loss, rtol=1e-6)
        np.testing.assert_allclose(g, want_grad, rtol=1e-6)


def test_a_metric_reads_autograd_traced_values():
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    w, b = make_variables(strategy)
    with strategy.scope():
        mean = mpidist.metrics.Mean()

    def step():
        def fn(p, x):
            per_example = anp.sum(x @ p, axis=1)
            mean.update_state(per_example)
            return anp.sum(per_example)
        return mpidist.autodiff.value_and_grad(fn, w, X)

    strategy.run(step)
    assert float(mean.result()) == pytest.approx((X @ W0).sum(axis=1).mean())


def test_a_metric_given_a_jax_tracer_says_to_use_aux():
    w, _ = make_variables(mpidist.get_strategy())
    mean = mpidist.metrics.Mean()

    def fn(p):
        mean.update_state(p)
        return jnp.sum(p)

    with pytest.raises(TypeError, match=r"Metric 'mean'\.update_state got a value traced by "
                       r"jax .*has_aux=True"):
        mpidist.autodiff.value_and_grad(fn, w, backend="jax")
    assert float(mean.result()) == 0.0  # nothing was added


# -- fit / evaluate with a model that defines only its loss ----------------------------------------
class SoftmaxModel:
    """Linear softmax classifier; ``hand_written`` adds the backward pass by hand."""

    def __init__(self, hand_written=False):
        rng = np.random.default_rng(3)
        self.w = mpidist.Variable(rng.normal(0, 0.3, (4, 3)), name="w")
        self.b = mpidist.Variable(np.zeros(3), name="b")
        if hand_written:
            self.loss_and_gradients = self._loss_and_gradients

    @property
    def trainable_variables(self):
        return [self.w, self.b]

    def loss(self, params, x, y):
        w, b = params
        z = anp.dot(x, w) + b
        z = z - anp.max(z, axis=1, keepdims=True)
        log_p = z - anp.log(anp.sum(anp.exp(z), axis=1, keepdims=True))
        return -log_p[anp.arange(len(y)), y], z

    def _loss_and_gradients(self, x, y):
        w, b = self.w.read_value(), self.b.read_value()
        z = x @ w + b
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        per_example = -np.log(p[np.arange(len(y)), y])
        d = p.copy()
        d[np.arange(len(y)), y] -= 1
        return per_example, [x.T @ d, d.sum(axis=0)], z


def train(strategy, hand_written, autodiff=None):
    rng = np.random.default_rng(0)
    x, y = rng.random((96, 4)), rng.integers(0, 3, 96)
    data = mpidist.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with strategy.scope():
        model = SoftmaxModel(hand_written)
        optimizer = mpidist.optimizers.SGD(0.5, momentum=0.9)
        accuracy = mpidist.metrics.SparseCategoricalAccuracy()
    history = mpidist.fit(model, data, epochs=2, optimizer=optimizer, metrics=[accuracy],
                          verbose=0, autodiff=autodiff)
    logs = mpidist.evaluate(model, data, metrics=[accuracy], autodiff=autodiff)
    return [v.numpy() for v in model.trainable_variables], history.history, logs


@pytest.mark.parametrize("kind", ["one-device", "mirrored"])
def test_fit_differentiates_a_model_that_defines_only_its_loss(kind):
    weights, history, logs = train(strategies()[kind], hand_written=False, autodiff="autograd")
    want_weights, want_history, want_logs = train(mpidist.OneDeviceStrategy("/cpu:0"),
                                                  hand_written=True)
    for got, want in zip(weights, want_weights):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-10)
    assert logs["loss"] == pytest.approx(want_logs["loss"], rel=1e-10)
    assert logs["sparse_categorical_accuracy"] == want_logs["sparse_categorical_accuracy"]


def test_fit_rejects_an_unknown_backend_and_a_model_without_a_loss():
    with pytest.raises(ValueError, match=r"fit: autodiff must be one of \('autograd', 'jax'\)"):
        train(mpidist.get_strategy(), hand_written=False, autodiff="torch")

    class NoLoss:
        trainable_variables = []

    with pytest.raises(TypeError, match=r"lacks \['loss_and_gradients'\].*loss\(params, x, y\)"):
        mpidist.fit(NoLoss(), [], optimizer=mpidist.optimizers.SGD(0.1), verbose=0)


def test_fit_says_when_model_loss_is_not_per_example():
    class Scalar(SoftmaxModel):
        def loss(self, params, x, y):
            return anp.sum(super().loss(params, x, y)[0])

    with pytest.raises(ValueError, match=r"model\.loss\(params, x, y\) must return the "
                       r"per-example losses"):
        mpidist.fit(Scalar(), mpidist.data.Dataset.from_tensor_slices(
            (np.ones((4, 4)), np.zeros(4, np.int64))).batch(4),
            optimizer=mpidist.optimizers.SGD(0.1), verbose=0)


# -- mistakes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_loss_that_is_not_a_scalar(backend):
    w, _ = make_variables(mpidist.get_strategy())
    with pytest.raises(ValueError, match=re.escape(
            f"the loss function must return a real scalar, got a value of shape (3, 2) "
            f"({backend}); reduce it first")):
        mpidist.autodiff.value_and_grad(lambda p: p * 2, w, backend=backend)


def test_bad_arguments_name_the_value_and_the_fix():
    w, _ = make_variables(mpidist.get_strategy())
    with pytest.raises(TypeError, match="fn must be callable"):
        mpidist.autodiff.value_and_grad("loss", [w])
    with pytest.raises(ValueError, match="variables is empty"):
        mpidist.autodiff.value_and_grad(anp.sum, [])
    with pytest.raises(TypeError, match=r"variables\[1\] is .*not an mpidist\.Variable"):
        mpidist.autodiff.value_and_grad(anp.sum, [w, np.ones(3)])
    with pytest.raises(TypeError, match="must be a Variable or a list / tuple"):
        mpidist.autodiff.value_and_grad(anp.sum, {"w": w})
    with pytest.raises(ValueError, match=r"backend must be one of \('autograd', 'jax'\) or "
                       r"None, got 'torch'"):
        mpidist.autodiff.value_and_grad(anp.sum, w, backend="torch")


def test_a_variable_of_another_strategy():
    mirrored = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    w, _ = make_variables(mirrored)
    other = mpidist.OneDeviceStrategy("/cpu:0")
    with pytest.raises(ValueError, match=r"variable 'w(:0)?' belongs to MirroredStrategy at 0x[0-9a-f]+ but this step "
                       r"runs under OneDeviceStrategy at 0x"):
        other.run(lambda: mpidist.autodiff.value_and_grad(anp.sum, w))


def test_a_backend_that_is_not_installed_names_the_extra(monkeypatch):
    w, _ = make_variables(mpidist.get_strategy())
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax now raises ImportError
    with pytest.raises(ImportError, match=re.escape("pip install 'mpidist[jax]'")):
        mpidist.autodiff.value_and_grad(jnp.sum, w, backend="jax")


def test_jax_refuses_to_compute_float64_variables_in_float32():
    if jax.config.read("jax_enable_x64"):
        pytest.skip("64-bit JAX is on in this process")
    w = mpidist.Variable(np.ones(3), name="w64")
    with pytest.raises(ValueError, match=r"float64 but JAX computes in float32 .*jax_enable_x64"):
        mpidist.autodiff.value_and_grad(jnp.sum, w, backend="jax")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_traced_value_leaking_into_a_variable_or_the_optimizer(backend):
    xp = BACKENDS[backend]
    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    w, b = make_variables(strategy)
    with strategy.scope():
        optimizer = mpidist.optimizers.SGD(0.1)
    leaked = []

    def assigns(p):
        b.assign(p[0])
        return xp.sum(p)

    with pytest.raises(TypeError, match=rf"Assigning to variable 'b(:0)?' got a value traced by "
                       rf"{backend}"):
        strategy.run(lambda: mpidist.autodiff.value_and_grad(assigns, b, backend=backend))
    np.testing.assert_array_equal(b.numpy(), B0)  # unchanged

    def keeps(p):
        leaked.append(p * 1)
        return xp.sum(p)

    strategy.run(lambda: mpidist.autodiff.value_and_grad(keeps, b, backend=backend))
    with pytest.raises(TypeError, match=r"apply_gradients \(pair 0, variable 'b(:0)?'\) got a value "
                       rf"traced by {backend}.*value_and_grad returns"):
        strategy.run(lambda: optimizer.apply_gradients([(leaked[0], b)]))
    np.testing.assert_array_equal(b.numpy(), B0)
    assert int(optimizer.iterations.numpy()) == 0


def test_a_jitted_jax_loss_function_and_an_unused_variable():
    w, b = make_variables(mpidist.get_strategy())

    @jax.jit
    def fn(params, x):
        return mpidist.nn.compute_average_loss((x @ params[0]) ** 2, global_batch_size=4)

    with pytest.warns(mpidist.autodiff.UnusedVariableWarning, match=r"variable\(s\) 'b"):
        loss, (gw, gb) = mpidist.autodiff.value_and_grad(fn, [w, b], X, backend="jax")
    z = X.astype(np.float64) @ W0
    np.testing.assert_allclose(loss, (z ** 2).sum() / 4, rtol=1e-6)
    np.testing.assert_allclose(gw, X.T @ z / 2, rtol=1e-6)
    # b does not enter the loss: its gradient is zeros of its shape and dtype (not None).
    assert gb.dtype == np.float32 and gb.shape == (2,) and not gb.any()
    with pytest.warns(mpidist.autodiff.UnusedVariableWarning, match=r"variable\(s\) 'b"):
        _, (_, gb) = mpidist.autodiff.value_and_grad(lambda p, x: anp.sum(x @ p[0]), [w, b], X)
    assert gb.dtype == np.float32 and gb.shape == (2,) and not gb.any()


def test_jit_compiles_once_and_gives_the_same_values():
    w, b = make_variables(mpidist.get_strategy())
    traces = []

    def fn(params, x):
        traces.append(1)  # a Python side effect: runs only while JAX traces
        w_, b_ = params
        return jnp.sum((x @ w_ + b_) ** 2) / 4, x @ w_ + b_

    for _ in range(3):
        (loss, logits), (gw, gb) = mpidist.autodiff.value_and_grad(fn, [w, b], X, has_aux=True,
                                                                   jit=True)
    assert len(traces) == 1  # compiled once, reused
    want_loss, want_w, want_b = expected_loss_and_grads()
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(gw, want_w, rtol=1e-6)
    np.testing.assert_allclose(gb, want_b, rtol=1e-6)
    assert type(logits) is np.ndarray and gw.dtype == np.float32
    with pytest.raises(ValueError, match=r"jit=True\) compiles with JAX; backend='autograd'"):
        mpidist.autodiff.value_and_grad(fn, [w, b], X, backend="autograd", jit=True)
    with pytest.raises(ValueError, match=r"keyword arguments \['x'\] cannot be traced"):
        mpidist.autodiff.value_and_grad(fn, [w, b], x=X, jit=True)
    with pytest.raises(ValueError, match=r"must return a real scalar, got a value of shape "
                       r"\(4, 2\) \(jax\)"):
        mpidist.autodiff.value_and_grad(lambda p, x: x @ p, w, X, jit=True)


def test_fit_names_a_variable_whose_hand_written_gradient_is_none():
    class NoneGradient(SoftmaxModel):
        def _loss_and_gradients(self, x, y):
            per_example, (gw, _), z = super()._loss_and_gradients(x, y)
            return per_example, [gw, None], z

    strategy = mpidist.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = NoneGradient(hand_written=True)
        optimizer = mpidist.optimizers.SGD(0.1)
    before = [v.numpy() for v in model.trainable_variables]
    data = mpidist.data.Dataset.from_tensor_slices(
        (np.ones((4, 4)), np.zeros(4, np.int64))).batch(4)
    with pytest.raises(ValueError, match=r"None as the gradient of variable 'b(:0)?' \(position "
                       r"1\).*return zeros"):
        mpidist.fit(model, data, optimizer=optimizer, verbose=0)
    for got, want in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(got.numpy(), want)
    assert int(optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("jit", [False, True])
def test_jax_results_are_writable_numpy_arrays(jit):
    """In-place gradient code (clipping, scaling) must work on what value_and_grad returns."""
    w, _ = make_variables(mpidist.get_strategy())
    (loss, aux), g = mpidist.autodiff.value_and_grad(
        lambda p, x: (jnp.sum(x @ p), x @ p), w, X, backend="jax", has_aux=True, jit=jit)
    for value in (loss, aux, g):
        assert type(value) is np.ndarray and value.flags.writeable
    np.clip(g, -1.0, 1.0, out=g)
    assert g.max() == 1.0


@pytest.mark.parametrize("jit", [False, True])
def test_numpy_functions_on_a_jax_tracer_say_to_use_jax_numpy(jit):
    w, _ = make_variables(mpidist.get_strategy())
    with pytest.raises(TypeError, match=r"turned a traced value into a NumPy array .*jax\.numpy"):
        mpidist.autodiff.value_and_grad(lambda p: np.sum(np.tanh(p)), w, backend="jax", jit=jit)


def test_autograd_differentiates_numpy_ufuncs_on_its_boxes():
    """autograd boxes take part in NumPy's dispatch: np.tanh / np.sum differentiate too."""
    w, _ = make_variables(mpidist.get_strategy())
    loss, g = mpidist.autodiff.value_and_grad(lambda p: np.sum(np.tanh(p)), w, backend="autograd")
    np.testing.assert_allclose(loss, 6 * np.tanh(1.0), rtol=1e-6)
    np.testing.assert_allclose(g, np.full((3, 2), 1 - np.tanh(1.0) ** 2), rtol=1e-6)


@pytest.mark.parametrize("backend, jit", [("autograd", False), ("jax", False), ("jax", True)])
def test_has_aux_needs_a_pair(backend, jit):
    w, _ = make_variables(mpidist.get_strategy())
    xp = BACKENDS[backend]
    with pytest.raises(ValueError, match=r"has_aux=True\): the loss function must return "
                       r"\(loss, aux\), got"):
        mpidist.autodiff.value_and_grad(lambda p: xp.sum(p), w, backend=backend, has_aux=True,
                                        jit=jit)
