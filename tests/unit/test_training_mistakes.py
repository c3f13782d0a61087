"""First-hour mistakes of TF users, each answered as TF answers it or refused with the value and
the fix, before anything changes:

1. callables checked against their role when handed over (``core.signatures.CallShapes``): a
   learning rate ``f()`` or ``f(step)``, minimize's ``loss`` and ``var_list``;
2. ``Optimizer.minimize(loss, var_list, tape=None)``;
3. the variables of ``value_and_grad`` / ``minimize`` vetted (floating point) before tracing;
4. TF's sliced assignment, ``v[0].assign(1.0)``, through the variable's own ``assign``.
"""

import functools
import inspect
import pickle
import re
import warnings
from collections.abc import Callable
from typing import Annotated

import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, basic_indices

import mpidist
from mpidist.core.signatures import CallShapes, accepts, check_callable
from mpidist.optimizers import SGD, Adam
from mpidist.training.optimizers import LEARNING_RATE, LOSS, VAR_LIST

from replicas import mirrored, rid

FEW = settings(max_examples=40, deadline=None, database=None)


# -- 1. callables checked against their role --------------------------------------------------
def _function(n_required, n_default, positional_only, varargs, kw_required, kw_default, varkw,
              method=False):
    """A function (or, with ``method``, a class whose ``__call__`` is it) of that signature,
    returning 0.1."""
    params = [f"p{i}" for i in range(n_required)] + [f"d{i}=0" for i in range(n_default)]
    params = ["self"] * method + params
    cut = min(positional_only + method, len(params))
    if positional_only and cut:
        params.insert(cut, "/")
    if varargs:
        params.append("*args")
    elif kw_required or kw_default:
        params.append("*")
    params += [f"k{i}" for i in range(kw_required)] + [f"kd{i}=0" for i in range(kw_default)]
    if varkw:
        params.append("**kw")
    namespace = {}
    exec(f"def f({', '.join(params)}):\n    return 0.1\n", namespace)  # source built above
    if method:
        return type("Schedule", (), {"__call__": namespace["f"]})()
    return namespace["f"]


signatures = st.builds(_function, st.integers(0, 3), st.integers(0, 2), st.integers(0, 3),
                       st.booleans(), st.integers(0, 1), st.integers(0, 1), st.booleans(),
                       st.booleans())


def _calls_that_work(fn, counts):
    """The first of ``counts`` (numbers of positional arguments) that ``fn`` accepts when
    actually called, else None: what the signature check must predict."""
    for n in counts:
        try:
            fn(*[0] * n)
        except TypeError:
            continue
        return n
    return None


@FEW
@given(fn=signatures)
def test_a_role_predicts_from_the_signature_the_call_that_works(fn):
    for role in (LEARNING_RATE, LOSS, VAR_LIST):
        assert role.arity(fn) == _calls_that_work(fn, list(role.calls))
    wrapped = functools.partial(fn)
    assert LEARNING_RATE.arity(wrapped) == _calls_that_work(fn, [0, 1])


@FEW
@given(fn=signatures)
def test_a_learning_rate_that_fits_no_call_is_refused_at_construction(fn):
    if LEARNING_RATE.arity(fn) is not None:
        SGD(fn)  # accepted: f() or f(step)
        return
    text = re.escape(str(inspect.signature(fn)))
    with pytest.raises(TypeError, match=r"^SGD: argument 'learning_rate' got .*it accepts a "
                       r"number, or a learning-rate schedule: a callable called as f\(\) .* or "
                       rf"f\(step\) .*Fix: its signature {text} (needs|takes) .*lambda: 0\.1"):
        SGD(fn)


def test_a_zero_argument_learning_rate_is_called_with_nothing_at_every_step():
    calls = []

    def rate():
        calls.append(1)
        return 0.1

    w = mpidist.Variable(1.0)
    opt = SGD(rate)
    for _ in range(3):
        before = len(calls)
        opt.apply_gradients([(np.float64(1.0), w)])
        assert len(calls) > before  # read at every update, called with no argument
    assert float(w) == pytest.approx(0.7, abs=1e-15)


class _Decay:
    """A Keras LearningRateSchedule's shape: ``__call__(self, step)``."""

    def __call__(self, step):
        return 0.1 / (1 + step)


@pytest.mark.parametrize("schedule", [
    lambda step: 0.1 / (1 + step), _Decay(), functools.partial(lambda a, step: a / (1 + step), 0.1),
    lambda step, name=None: 0.1 / (1 + step)], ids=["lambda", "object", "partial", "default"])
def test_a_schedule_of_one_argument_gets_the_step(schedule):
    w = mpidist.Variable(1.0)
    opt = SGD(schedule)
    opt.apply_gradients([(np.float64(1.0), w)])  # lr(0) = 0.1
    opt.apply_gradients([(np.float64(1.0), w)])  # lr(1) = 0.05
    assert float(w) == pytest.approx(0.85, abs=1e-15)


def test_a_builtin_without_a_signature_is_taken_as_a_schedule():
    assert LEARNING_RATE.arity(min) == 1  # the unknown shape: f(step), mpidist's schedule
    assert LEARNING_RATE.arity(np.exp) == 1


def test_a_class_is_no_learning_rate_and_the_fix_says_instance():
    with pytest.raises(TypeError, match=r"got the class _Decay \(a class, not an instance\).*"
                                        r"Fix: pass an instance, _Decay\(\.\.\.\)"):
        Adam(_Decay)


def test_setting_the_learning_rate_is_checked_and_a_refusal_keeps_the_old_one():
    opt = SGD(0.1)
    with pytest.raises(TypeError, match=r"SGD: argument 'learning_rate' .*signature \(a, b\) "
                                        r"needs 2 positional argument\(s\)"):
        opt.learning_rate = lambda a, b: 0.1
    assert opt.learning_rate == 0.1
    with pytest.raises(ValueError, match="learning_rate must be a finite number >= 0, got -1.0"):
        opt.learning_rate = -1.0
    assert opt.learning_rate == 0.1
    opt.learning_rate = lambda: 0.5
    assert opt.hyperparameters()["learning_rate"] == 0.5


@pytest.mark.parametrize("make,argument", [
    (lambda: SGD(0.1, momentum=lambda: 0.9), "momentum"),
    (lambda: Adam(beta_1=lambda: 0.9), "beta_1"),
    (lambda: Adam(epsilon=lambda: 1e-7), "epsilon"),
    (lambda: SGD(0.1, clipnorm=lambda: 1.0), "clipnorm")])
def test_a_callable_for_a_number_only_hyperparameter_is_named(make, argument):
    with pytest.raises(TypeError, match=rf"argument '{argument}' got the function .*<lambda>; "
                       r"it accepts a number \(of the optimizer's hyperparameters only "
                       rf"learning_rate takes a callable\)\. Fix: pass its value, e.g. {argument}="):
        make()


def test_accepts_and_check_callable_give_the_same_message():
    role = CallShapes("a callback", {1: "f(event)"}, example="lambda event: None")

    @accepts(fn=Annotated[Callable, role])
    def register(fn):
        return fn

    def bad(a, b):
        return None

    register(lambda event: None)
    with pytest.raises(TypeError) as from_accepts:
        register(bad)
    where = "test_accepts_and_check_callable_give_the_same_message.register"
    with pytest.raises(TypeError) as direct:
        check_callable(bad, role, where, "fn")
    assert str(from_accepts.value) == str(direct.value)
    assert str(direct.value) == (
        f"{where}: argument 'fn' got the function "
        "test_accepts_and_check_callable_give_the_same_message.<locals>.bad; it accepts a "
        "callback: a callable called as f(event). Fix: its signature (a, b) needs 2 positional "
        "argument(s), and a callback is called with 1: write it as e.g. lambda event: None.")
    with pytest.raises(TypeError, match="got int 3; it accepts a callback"):
        register(3)


# -- 2. minimize ---------------------------------------------------------------------------------
def _quadratic():
    """w = [1, 2], loss = sum((w - 3)^2): gradient 2(w - 3) = [-4, -2]."""
    return mpidist.Variable(np.array([1.0, 2.0]), name="w")


@pytest.mark.parametrize("form", ["loss()", "loss(params)", "var_list()", "one variable"])
def test_one_sgd_minimize_step_is_the_hand_computed_update(form):
    w = _quadratic()
    opt = SGD(0.1)
    if form == "loss(params)":
        result = opt.minimize(lambda params: ((params[0] - 3.0) ** 2).sum(), [w])
    elif form == "var_list()":
        result = opt.minimize(lambda: ((w - 3.0) ** 2).sum(), lambda: [w])
    elif form == "one variable":
        result = opt.minimize(lambda: ((w - 3.0) ** 2).sum(), w)
    else:
        result = opt.minimize(lambda: ((w - 3.0) ** 2).sum(), [w])
    np.testing.assert_allclose(w.numpy(), [1.4, 2.2], rtol=0, atol=1e-15)  # w - 0.1 * [-4, -2]
    assert result is opt.iterations and int(result) == 1


def test_minimize_is_apply_gradients_of_the_loss_gradient():
    """Adam, several steps, a loss that reads the variables through operators (a traced value
    on the left too: ``h + b``), indexing, value() and autograd.numpy functions: the same
    weights as apply_gradients of the hand-written gradient."""
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    y = np.array([1.0, -2.0, 0.0])
    w, twin = (mpidist.Variable(np.array([0.3, -0.2])) for _ in range(2))
    b, twin_b = mpidist.Variable(0.1), mpidist.Variable(0.1)
    opt, ref = Adam(0.05), Adam(0.05)
    for _ in range(4):
        opt.minimize(lambda: anp.sum((anp.dot(x, w) + b - y) ** 2) + w[0] ** 2
                     + 0.1 * anp.sum(anp.tanh(w.value()) * w), [w, b])
        t = twin.numpy()
        r = x @ t + twin_b.numpy() - y
        grad_w = 2 * x.T @ r + np.array([2 * t[0], 0.0]) + 0.1 * (
            np.tanh(t) + t * (1 - np.tanh(t) ** 2))
        ref.apply_gradients([(grad_w, twin), (np.asarray(2 * r.sum()), twin_b)])
    np.testing.assert_allclose(w.numpy(), twin.numpy(), rtol=1e-13)
    np.testing.assert_allclose(b.numpy(), twin_b.numpy(), rtol=1e-13)
    assert int(opt.iterations) == 4


def test_minimize_inside_strategy_run_sums_the_replicas_gradients():
    s = mirrored(2)
    with s.scope():
        w = _quadratic()
        opt = SGD(0.1)

    def step():
        target = 3.0 + rid()  # replica 0: 3, replica 1: 4
        return opt.minimize(lambda: ((w - target) ** 2).sum(), [w])

    s.run(step)
    # gradients [-4, -2] + [-6, -4] = [-10, -6]: w = [1, 2] + 0.1 * [10, 6]
    for copy in w.values:
        np.testing.assert_allclose(copy.numpy(), [2.0, 2.6], rtol=0, atol=1e-15)
    assert int(opt.iterations) == 1


def test_minimize_under_one_device_runs_as_apply_gradients_does():
    s = mpidist.OneDeviceStrategy("/cpu:0")
    with s.scope():
        w = _quadratic()
        opt = SGD(0.1)
    s.run(lambda: opt.minimize(lambda: ((w - 3.0) ** 2).sum(), [w]))
    np.testing.assert_allclose(w.numpy(), [1.4, 2.2], rtol=0, atol=1e-15)


@pytest.mark.parametrize("strategy", [lambda: mpidist.OneDeviceStrategy("/cpu:0"),
                                      lambda: mirrored(2)], ids=["one_device", "mirrored"])
def test_minimize_in_cross_replica_context_raises_before_the_loss_runs(strategy):
    s = strategy()
    calls = []
    with s.scope():
        w = _quadratic()
        opt = SGD(0.1)
        with pytest.raises(RuntimeError, match=r"`minimize\(\) cannot be called in "
                                               r"cross-replica context. Use "
                                               r"`mpidist.Strategy.run`"):
            opt.minimize(lambda: calls.append(1) or ((w - 3.0) ** 2).sum(), [w])
    assert calls == [] and int(opt.iterations) == 0
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])


def _unchanged(w, opt):
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    assert int(opt.iterations) == 0
    with pytest.raises(ValueError, match="has no slots"):
        opt.get_slot(w, "momentum")


@pytest.mark.parametrize("loss", [np.float64(2.0), 5.0, np.array(1.0)],
                         ids=["numpy scalar", "float", "0-d array"])
def test_a_loss_computed_beforehand_is_tf_s_value_error(loss):
    w = _quadratic()
    opt = SGD(0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"^SGD.minimize: `tape` is required when a `Tensor` "
                                         r"loss is passed \(TF's error\): argument 'loss' got "
                                         r".*Pass the computation instead, a callable: "
                                         r"loss=lambda: <the expression>"):
        opt.minimize(loss, [w])
    _unchanged(w, opt)


@pytest.mark.parametrize("call,error,message", [
    (lambda o, w: o.minimize(lambda a, b: 0.0, [w]), TypeError,
     r"SGD.minimize: argument 'loss' got .*it accepts the loss minimize differentiates: a "
     r"callable called as loss\(\) .* or loss\(params\) .*signature \(a, b\) needs 2"),
    (lambda o, w: o.minimize(lambda: (w ** 2).sum(), lambda model: [w]), TypeError,
     r"argument 'var_list' got .*a var_list callable: a callable called as var_list\(\)\. "
     r"Fix: its signature \(model\) needs 1 positional argument\(s\)"),
    (lambda o, w: o.minimize(lambda: (w ** 2).sum(), [w], tape=object()), ValueError,
     r"SGD.minimize: argument 'tape' got .*mpidist has no GradientTape"),
    (lambda o, w: o.minimize(lambda: anp.sum(np.asarray(w)), [w]), TypeError,
     r"SGD.minimize: the loss read variable 'w:0' as a constant \(np.asarray\(w\), a plain "
     r"NumPy function of w .*Use w itself .* or w.value\(\) there"),
    (lambda o, w: o.minimize(lambda: np.sum(w) * anp.sum(w), [w]), TypeError,
     r"the loss read variable 'w:0' as a constant"),
    (lambda o, w: o.minimize(lambda: float(w[0]) * anp.sum(w), [w]), TypeError,
     r"the loss function converted a traced value to a Python number"),
    (lambda o, w: o.minimize(lambda: w.numpy().sum() * (w ** 2).sum(), [w]), TypeError,
     r"the loss read variable 'w:0' as a constant"),
    (lambda o, w: o.minimize(lambda: 0.0 * (w ** 2).sum() + 1.0, [w, "w"]), TypeError,
     r"argument 'var_list' got list"),
])
def test_minimize_mistakes_are_named_and_change_nothing(call, error, message):
    w = _quadratic()
    opt = SGD(0.1, momentum=0.9)
    with pytest.raises(error, match=message):
        call(opt, w)
    _unchanged(w, opt)


def test_a_variable_the_loss_does_not_use_gets_no_update_as_tf():
    """TF's tape gives it None, and apply_gradients skips it: with momentum, a zero gradient
    would still move it."""
    w, u = _quadratic(), mpidist.Variable(np.array(5.0), name="unused")
    opt = SGD(0.1, momentum=0.9)
    opt.minimize(lambda: ((w - 3.0) ** 2).sum() + (u - 1.0) ** 2, [w, u])  # u moves: 5 -> 4.2
    assert float(u) == pytest.approx(4.2, abs=1e-15)
    with pytest.warns(mpidist.autodiff.UnusedVariableWarning,
                      match=r"SGD.minimize: the loss does not depend on variable\(s\) "
                            r"'unused:0': they get no gradient and are not updated"):
        opt.minimize(lambda: ((w - 3.0) ** 2).sum(), [w, u])
    assert float(u) == pytest.approx(4.2, abs=1e-15)  # momentum would have moved it
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.minimize(lambda: (w ** 2).sum() * 0.0 + 1.0, [u])


# -- 3. the variables differentiated are vetted --------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
def test_an_integer_or_boolean_variable_is_named_before_tracing(dtype):
    w = mpidist.Variable(np.ones(2), name="w")
    bad = mpidist.Variable(np.ones(2, dtype=dtype), name="step")
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=rf"^value_and_grad: variables\[1\] variable 'step:0' "
                       rf"has dtype {name}, and gradients exist for floating-point variables "
                       r"only. Create it with a float dtype .*or leave it out of the variables "
                       r"differentiated"):
        mpidist.autodiff.value_and_grad(lambda p: (p[0] ** 2).sum(), [w, bad])
    with pytest.raises(TypeError, match=rf"^value_and_grad: variable 'step:0' has dtype {name}"):
        mpidist.autodiff.value_and_grad(lambda p: p.sum(), bad)
    opt = SGD(0.1)
    with pytest.raises(TypeError, match=rf"^SGD.minimize: var_list\[1\] variable 'step:0' has "
                                        rf"dtype {name}"):
        opt.minimize(lambda: (w ** 2).sum(), [w, bad])
    assert int(opt.iterations) == 0


@FEW
@given(dtypes=st.lists(st.sampled_from(["float16", "float32", "float64", "int8", "int64",
                                        "uint16", "bool"]), min_size=1, max_size=5))
def test_value_and_grad_refuses_exactly_the_non_floating_variables(dtypes):
    variables = [mpidist.Variable(np.ones(2, dtype=d), name=f"v{i}") for i, d in enumerate(dtypes)]
    bad = [i for i, d in enumerate(dtypes) if np.dtype(d).kind != "f"]

    def loss(params):
        return sum(anp.sum(p) for p in params)

    if not bad:
        _, grads = mpidist.autodiff.value_and_grad(loss, variables)
        assert [g.dtype for g in grads] == [np.dtype(d) for d in dtypes]
        return
    with pytest.raises(TypeError, match=rf"variables\[{bad[0]}\] variable 'v{bad[0]}:0' has "
                                        rf"dtype {dtypes[bad[0]]}"):
        mpidist.autodiff.value_and_grad(loss, variables)


def test_an_unused_float_variable_still_gets_a_zero_gradient_from_value_and_grad():
    """value_and_grad's own answer for an unconnected variable is unchanged (zeros + warning);
    minimize turns it into TF's None."""
    w, u = _quadratic(), mpidist.Variable(1.0, name="u2")
    with pytest.warns(mpidist.autodiff.UnusedVariableWarning, match=r"'u2:0'"):
        _, grads = mpidist.autodiff.value_and_grad(lambda p: (p[0] ** 2).sum(), [w, u])
    assert float(grads[1]) == 0.0


# -- 4. sliced assignment ------------------------------------------------------------------------
def test_tf_s_sliced_assignment_on_a_variable():
    v = mpidist.Variable(np.arange(5.0), name="v")
    v[0].assign(10.0)
    v[1:3].assign([7.0, 8.0])
    v[3].assign_add(0.5)
    v[-1].assign_sub(1.0)
    np.testing.assert_array_equal(v.numpy(), [10.0, 7.0, 8.0, 3.5, 3.0])
    m = mpidist.Variable(np.zeros((2, 3)), name="m")
    m[0].assign([1.0, 2.0, 3.0])
    m[:, 2].assign_add([1.0, 1.0])
    m[..., 0].assign([5.0, 6.0])
    m[m.numpy() == 0].assign([9.0])
    np.testing.assert_array_equal(m.numpy(), [[5.0, 2.0, 4.0], [6.0, 9.0, 1.0]])
    out = m[1, 1].assign(0.0)
    np.testing.assert_array_equal(out, m.numpy())  # the variable's new value, as assign


def test_a_part_is_the_plain_value_everywhere_else():
    v = mpidist.Variable(np.arange(4.0), name="v")
    s, a = v[1], v[1:3]
    assert isinstance(s, np.float64) and isinstance(s, float) and s == 1.0 and hash(s) == hash(1.0)
    assert repr(s) == "np.float64(1.0)" and repr(a) == "array([1., 2.])"
    assert np.asarray(s).dtype == np.float64 and np.array([s, s]).dtype == np.float64
    assert type(s * 2) is np.float64
    assert isinstance(a, np.ndarray)
    for result in (a * 2, a + a, np.concatenate([a, a]), np.sqrt(a), a[::-1] + 0):
        assert type(result) is np.ndarray
    assert type(a.sum()) is np.float64
    assert type(pickle.loads(pickle.dumps(s))) is np.float64
    assert type(pickle.loads(pickle.dumps(a))) is np.ndarray
    assert type(pickle.loads(pickle.dumps(a, protocol=5))) is np.ndarray
    i = mpidist.Variable(np.arange(3, dtype=np.int32))
    assert repr(i[2]) == "np.int32(2)" and list(range(10))[i[2]] == 2
    flags = mpidist.Variable(np.array([True, False]))
    flags[1].assign(True)  # np.bool_ has no subclass instances: a 0-d array part
    assert bool(flags[1]) and flags.numpy().tolist() == [True, True]


@pytest.mark.parametrize("call,error,message", [
    (lambda v: v[0:2].assign([1.0, 2.0, 3.0]), ValueError,
     r"Cannot assign a value of shape \(3,\) to part \[0:2\] of variable 'v:0' of shape "
     r"\(2,\): the shapes must match exactly"),
    (lambda v: v[1].assign("x"), TypeError, r"Cannot assign 'x' .*to part \[1\] of variable"),
    (lambda v: v[0:2].reshape(2, 1).assign(1.0), AttributeError,
     r"'SlicedArray' object cannot assign: it was computed from v\[index\] of a variable"),
    (lambda v: v[::2].copy().assign_add(1.0), AttributeError, r"cannot assign_add"),
    (lambda v: v[0:2].assign(mpidist.PerReplica([np.ones(2), np.ones(2)])), ValueError,
     r"PerReplica"),
])
def test_sliced_assignment_mistakes_write_nothing(call, error, message):
    v = mpidist.Variable(np.arange(4.0), name="v")
    with pytest.raises(error, match=message):
        call(v)
    np.testing.assert_array_equal(v.numpy(), np.arange(4.0))


def test_a_float_into_an_integer_part_is_refused_as_assign_refuses_it():
    i = mpidist.Variable(np.arange(3), name="i")
    with pytest.raises(TypeError, match=r"Cannot assign a value of dtype float64 to part \[0\] "
                                        r"of variable 'i:0' of dtype int64; cast it first"):
        i[0].assign(1.5)
    i[0].assign(7)
    assert i.numpy().tolist() == [7, 1, 2]


@FEW
@given(data=st.data(), shape=array_shapes(min_dims=0, max_dims=3, max_side=4))
def test_sliced_assignment_is_numpy_s_indexed_assignment(data, shape):
    key = data.draw(basic_indices(shape))
    start = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    part_shape = np.shape(start[key])
    value = data.draw(st.integers(-5, 5)).__float__() + np.zeros(part_shape)
    for kind in ("assign", "assign_add", "assign_sub"):
        v = mpidist.Variable(start, name="v")
        expected = start.copy()
        if kind == "assign":
            expected[key] = value
        elif kind == "assign_add":
            expected[key] += value
        else:
            expected[key] -= value
        getattr(v[key], kind)(value)
        np.testing.assert_array_equal(v.numpy(), expected)


def test_sliced_assignment_on_mirrored_variables_follows_assign_s_rules():
    s = mirrored(2)
    with s.scope():
        m = mpidist.Variable(np.zeros(3), name="m")  # aggregation NONE
        mean = mpidist.Variable(np.zeros(3), name="mean",
                                aggregation=mpidist.VariableAggregation.MEAN)
        first = mpidist.Variable(np.zeros(3), name="first",
                                 aggregation=mpidist.VariableAggregation.ONLY_FIRST_REPLICA)
    m[1].assign(5.0)  # cross-replica: every copy
    assert [c.numpy().tolist() for c in m.values] == [[0, 5, 0], [0, 5, 0]]

    def step():
        r = float(rid())
        m[0].assign(r + 1.0)  # NONE: each replica its own copy
        mean[2].assign_add(r + 1.0)  # MEAN of the changes: 1.5 on both
        first[0:2].assign([r + 1.0, r + 2.0])  # replica 0's value on both
        return 0

    s.run(step)
    assert [c.numpy().tolist() for c in m.values] == [[1, 5, 0], [2, 5, 0]]
    assert [c.numpy().tolist() for c in mean.values] == [[0, 0, 1.5], [0, 0, 1.5]]
    assert [c.numpy().tolist() for c in first.values] == [[1, 2, 0], [1, 2, 0]]


def test_a_part_assign_that_would_combine_whole_values_is_refused_inside_run():
    s = mirrored(2)
    with s.scope():
        total = mpidist.Variable(np.arange(3.0), name="total",
                                 aggregation=mpidist.VariableAggregation.SUM)

    def step():
        with pytest.raises(ValueError, match=r"v\[0\].assign\(\.\.\.\) of variable 'total:0' "
                                             r"inside strategy.run: its aggregation SUM .*"
                                             r"outside \[0\] would be summed too.*"
                                             r"v\[0\].assign_add\(delta\)"):
            total[0].assign(1.0)
        total[0].assign_add(1.0)  # the changes are summed: +2
        return 0

    s.run(step)
    assert [c.numpy().tolist() for c in total.values] == [[2, 1, 2], [2, 1, 2]]
    total[1].assign(9.0)  # cross-replica: allowed, every copy
    assert [c.numpy().tolist() for c in total.values] == [[2, 9, 2], [2, 9, 2]]


def test_a_part_of_a_sync_on_read_sum_variable_keeps_the_rest_of_the_sum():
    s = mirrored(2)
    with s.scope():
        counts = mpidist.Variable(np.zeros(3), name="counts",
                                  synchronization=mpidist.VariableSynchronization.ON_READ,
                                  aggregation=mpidist.VariableAggregation.SUM)
    s.run(lambda: counts.assign_add(np.array([1.0, 2.0, 3.0])))
    counts[0].assign(10.0)  # cross-replica: the read (sum) has the part replaced
    np.testing.assert_array_equal(counts.numpy(), [10.0, 4.0, 6.0])


def test_indexing_inside_minimize_s_loss_is_differentiated():
    w = _quadratic()
    SGD(0.1).minimize(lambda: (w[0] - 3.0) ** 2, [w])  # gradient [-4, 0]
    np.testing.assert_allclose(w.numpy(), [1.4, 2.0], rtol=0, atol=1e-15)
