"""Errors inside a traced loss are explained (one wrapper in value_and_grad), and variables the
loss never uses, or reads directly instead of through ``params``, are warned about."""

import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.autodiff import TracedValueError, UnusedVariableWarning

autograd = pytest.importorskip("autograd")
jax = pytest.importorskip("jax")
import autograd.numpy as anp  # noqa: E402
import jax.numpy as jnp  # noqa: E402

BACKENDS = ("autograd", "jax")
XNP = {"autograd": anp, "jax": jnp}


def variables(n=2):
    return [mpidist.Variable(np.full(3, i + 1.0, np.float32), name=f"v{i}") for i in range(n)]


def _store_in_buffer(p, xp):
    buf = np.zeros(3, np.float32)
    buf[0] = p[0][0]
    return xp.sum(p[0]) + buf.sum()


def _write_in_place(p, xp):
    p[0][0] = 1.0
    return xp.sum(p[0])


def _iadd_buffer(p, xp):
    buf = np.zeros(3, np.float32)
    buf += p[0]
    return xp.sum(buf)


# (what the loss did, the loss, the backends it fails under, words the message must hold)
SLIPS = [
    ("float()", lambda p, xp: xp.sum(p[0]) * float(xp.sum(p[1])), BACKENDS,
     r"converted a traced value to a Python number"),
    ("int()", lambda p, xp: xp.sum(p[0]) * int(p[1][0]), BACKENDS,
     r"converted a traced value to a Python number"),
    ("item()", lambda p, xp: xp.sum(p[0]) + xp.sum(p[1]).item(), ("autograd",),
     r"converted a traced value to a Python number"),
    ("x[0] = ...", _write_in_place, BACKENDS, r"wrote into a traced value in place"),
    ("buf[i] = traced", _store_in_buffer, BACKENDS, r"stored a traced value in a NumPy array"),
    ("buf += traced", _iadd_buffer, ("autograd",), r"stored a traced value in a NumPy array"),
    ("np.tanh(traced)", lambda p, xp: xp.sum(np.tanh(np.asarray(p[0]))), ("jax",),
     r"turned a traced value into a NumPy array .*jax\.numpy"),
    ("jnp under autograd", lambda p, xp: jnp.sum(p[0]), ("autograd",),
     r"gave autograd's traced values to JAX .*backend='jax'"),
    (".at under autograd", lambda p, xp: xp.sum(p[0].at[0].set(1.0)), ("autograd",),
     r"gave autograd's traced values to JAX"),
    ("x.at[i] = v", lambda p, xp: (p[0].at.__setitem__(0, 1.0), xp.sum(p[0]))[1], ("jax",),
     r"assigned through x\.at\[\.\.\.\].*x\.at\[i\]\.set\(v\)"),
    (".numpy()", lambda p, xp: xp.sum(p[0].numpy()), BACKENDS,
     r"called \.numpy\(\) on a traced value.*params\[i\]"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("slip", SLIPS, ids=[s[0] for s in SLIPS])
def test_a_slip_inside_the_loss_is_explained_with_its_cause(slip, backend):
    name, loss, fails_under, words = slip
    if backend not in fails_under:
        pytest.skip(f"{name} is no error under {backend}")
    vs = variables()
    before = [v.numpy() for v in vs]
    with pytest.raises(TracedValueError, match=words) as info:
        mpidist.autodiff.value_and_grad(lambda p: loss(p, XNP[backend]), vs, backend=backend)
    message = str(info.value)
    # what a traced value is, the fix, the line of user code, and the library's own error
    assert f"value_and_grad(backend={backend!r})" in message
    assert "traced values" in message and "Fix:" in message
    assert re.search(r"at test_traced_errors\.py:\d+", message), message
    assert info.value.__cause__ is not None
    assert type(info.value.__cause__).__name__ in message
    # the explained error is still the TypeError / ValueError the library raised
    assert isinstance(info.value, type(info.value.__cause__)) or isinstance(
        info.value.__cause__, (TypeError, ValueError, AttributeError))
    assert all((v.numpy() == b).all() for v, b in zip(vs, before))


def test_python_control_flow_on_a_jitted_tracer_is_explained():
    vs = variables()

    def loss(p):
        return jnp.sum(p[0]) if jnp.sum(p[1]) > 0 else -jnp.sum(p[0])

    with pytest.raises(TracedValueError, match=r"as a Python bool .*jnp\.where"):
        mpidist.autodiff.value_and_grad(loss, vs, jit=True)


def test_float_under_jit_is_explained():
    vs = variables()
    with pytest.raises(TracedValueError, match="converted a traced value to a Python number"):
        mpidist.autodiff.value_and_grad(lambda p: jnp.sum(p[0]) * float(jnp.sum(p[1])), vs,
                                        jit=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tuple_without_has_aux_and_has_aux_without_a_pair(backend):
    xp = XNP[backend]
    vs = variables()
    with pytest.raises(ValueError, match=r"returned a tuple of 2 values.*has_aux=True"):
        mpidist.autodiff.value_and_grad(lambda p: (xp.sum(p[0]), xp.sum(p[1])), vs,
                                        backend=backend)
    with pytest.raises(ValueError, match=r"has_aux=True\): .*must return \(loss, aux\).*"
                                         r"without has_aux"):
        mpidist.autodiff.value_and_grad(lambda p: xp.sum(p[0]), vs, backend=backend,
                                        has_aux=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_users_own_bug_is_not_rewritten(backend):
    vs = variables()

    def loss(p):
        raise KeyError("my own bug")

    with pytest.raises(KeyError, match="my own bug"):
        mpidist.autodiff.value_and_grad(loss, vs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=12, deadline=None)
@given(used=st.lists(st.booleans(), min_size=1, max_size=4))
def test_exactly_the_unused_variables_are_named(backend, used):
    xp = XNP[backend]
    vs = variables(len(used))

    def loss(p):
        total = xp.sum(p[0]) * 0.0  # p[0] is used (times 0: a zero gradient, not unused)
        for i, u in enumerate(used):
            if u:
                total = total + xp.sum(p[i] ** 2)
        return total

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mpidist.autodiff.value_and_grad(loss, vs, backend=backend)
    mine = [w for w in caught if issubclass(w.category, UnusedVariableWarning)]
    unused = [v.name for i, v in enumerate(vs) if i and not used[i]]
    if not unused:
        assert not mine
        return
    assert len(mine) == 1
    listed = re.search(r"variable\(s\) (.+?): their", str(mine[0].message)).group(1)
    assert listed == ", ".join(repr(n) for n in unused)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dead_relu_has_a_zero_gradient_but_is_used(backend):
    xp = XNP[backend]
    w = mpidist.Variable(-np.ones(3, np.float32), name="dead")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedVariableWarning)
        _, g = mpidist.autodiff.value_and_grad(lambda p: xp.sum(xp.maximum(p, 0.0)), w,
                                               backend=backend)
    assert not g.any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("read", [lambda v: v.numpy(), lambda v: np.asarray(v),
                                  lambda v: v.read_value(), lambda v: v * 1.0],
                         ids=["numpy", "asarray", "read_value", "operator"])
def test_reading_the_variable_instead_of_params_is_named(backend, read):
    xp = XNP[backend]
    w, b = variables()

    def loss(params):
        # both used through params, and w read directly as well: its gradient misses 1
        return xp.sum(params[0] * 2.0) + xp.sum(params[1]) + xp.sum(read(w))

    with pytest.warns(UnusedVariableWarning, match=r"read variable\(s\) 'v0:0' directly .*"
                                                   r"params\[i\]"):
        mpidist.autodiff.value_and_grad(loss, [w, b], backend=backend)


def test_fit_names_a_variable_its_loss_never_used():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8,)).astype(np.float32)

    class Model:
        def __init__(self):
            self.w = mpidist.Variable(np.zeros(3, np.float32), name="w")
            self.unused = mpidist.Variable(np.zeros(2, np.float32), name="forgotten")
            self.trainable_variables = [self.w, self.unused]

        def loss(self, params, x, y):
            return (x @ params[0] - y) ** 2

    dataset = mpidist.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with pytest.warns(UnusedVariableWarning, match="forgotten"):
        mpidist.fit(Model(), dataset, optimizer=mpidist.optimizers.SGD(0.1), autodiff="autograd")


def test_fit_refuses_per_example_losses_broadcast_to_n_by_n():
    x = np.ones((4, 3), np.float32)
    y = np.ones(4, np.float32)

    class Model:
        def __init__(self):
            self.w = mpidist.Variable(np.zeros((3, 1), np.float32), name="w")
            self.trainable_variables = [self.w]

        def loss(self, params, x, y):
            return (x @ params[0] - y) ** 2  # (4, 1) - (4,) broadcasts to (4, 4)

    dataset = mpidist.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with pytest.raises(ValueError, match=r"shape \(4, 4\) for labels of shape \(4,\).*"
                                         r"predictions\[:, 0\]"):
        mpidist.fit(Model(), dataset, optimizer=mpidist.optimizers.SGD(0.1), autodiff="autograd")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_mpidist_error_inside_the_loss_keeps_its_own_message(backend):
    xp = XNP[backend]
    vs = variables()
    with pytest.raises(TypeError, match="global_batch_size must be an integer") as info:
        mpidist.autodiff.value_and_grad(
            lambda p: mpidist.nn.compute_average_loss(p[0] * xp.sum(p[1]), global_batch_size=1.5),
            vs, backend=backend)
    assert not isinstance(info.value, TracedValueError)
