"""The fused step: arenas hold the variables as views, the fused kernels give the per-variable
NumPy code's exact bits, and every path around them (other lists, clipping, odd dtypes,
checkpoints) stays correct. The CUDA twins against the CPU twins under Numba's simulator (a
Python process of its own) are the scenario tests/scenarios/test_fused_apply_cudasim.py."""

import numpy as np
import pytest

import mpidist
from mpidist.kernels import optimizers as K
from mpidist.values.arena import Arena, can_share_storage


def _numpy_sgd(w, g, m, lr, mom, nesterov):
    t = w.dtype.type
    m_new = t(mom) * m - t(lr) * g
    return (w + (t(mom) * m_new - t(lr) * g) if nesterov else w + m_new), m_new


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_kernel_is_bit_identical_to_numpy(dtype, nesterov):
    rng = np.random.default_rng(3)
    w, g, m = (rng.standard_normal(1001).astype(dtype) for _ in range(3))
    expected_w, expected_m = _numpy_sgd(w, g, m, 0.01, 0.9, nesterov)
    t = np.dtype(dtype).type
    K.sgd_momentum_update(w, g, m, t(0.01), t(0.9), nesterov)
    assert np.array_equal(w, expected_w) and np.array_equal(m, expected_m)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_kernel_is_bit_identical_to_numpy(dtype, amsgrad):
    rng = np.random.default_rng(4)
    w, g, m = (rng.standard_normal(999).astype(dtype) for _ in range(3))
    v, vhat = (np.abs(rng.standard_normal(999)).astype(dtype) for _ in range(2))
    vhat[5] = np.nan  # np.maximum propagates NaN; so must the kernel
    t = np.dtype(dtype).type
    alpha = t(0.001 * np.sqrt(1 - 0.999 ** 3) / (1 - 0.9 ** 3))
    m2 = m + (g - m) * t(0.1)
    v2 = v + (g * g - v) * t(1 - 0.999)
    vmax = np.maximum(vhat, v2) if amsgrad else v2
    w2 = w - m2 * alpha / (np.sqrt(vmax) + t(1e-7))
    K.adam_update(w, g, m, v, vhat if amsgrad else None, alpha, t(0.1), t(1 - 0.999), t(1e-7))
    assert np.array_equal(m, m2) and np.array_equal(v, v2)
    assert np.array_equal(w, w2, equal_nan=True)
    if amsgrad:
        assert np.array_equal(vhat, vmax, equal_nan=True)


def test_kernels_refuse_mismatched_buffers():
    w = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="shape"):
        K.sgd_update(w, np.zeros(3, np.float32), np.float32(0.1))
    with pytest.raises(ValueError, match="float32/float64"):
        K.sgd_update(np.zeros(4, np.int64), np.zeros(4, np.int64), 1)


def test_arena_makes_variables_views_with_unchanged_behaviour():
    a = mpidist.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="a")
    b = mpidist.Variable(np.float32(7.0), name="b")
    assert can_share_storage([a, b])
    arena = Arena([a, b])
    assert a.storage_adopted and b.storage_adopted
    np.testing.assert_array_equal(arena.flat, [0, 1, 2, 3, 4, 5, 7])
    a.assign_add(np.ones((2, 3), np.float32), read_value=False)
    b.assign(np.float32(-1.0), read_value=False)
    np.testing.assert_array_equal(arena.flat, [1, 2, 3, 4, 5, 6, -1])
    arena.flat[0] = 42  # the owner writes: the variable sees it
    assert a.numpy()[0, 0] == 42 and float(b) == -1.0 and b.shape == ()
    assert not can_share_storage([a])  # already in a shared buffer
    with pytest.raises(ValueError, match="already lives"):
        a.adopt_storage(np.zeros((2, 3), np.float32))


def test_arena_refuses_odd_variables():
    assert not can_share_storage([mpidist.Variable(np.arange(3))])  # int64
    assert not can_share_storage([mpidist.Variable(np.zeros(3, np.float32)),
                                  mpidist.Variable(np.zeros(3, np.float64))])
    v = mpidist.Variable(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="shape"):
        v.adopt_storage(np.zeros(4, np.float32))


def _train(strategy, make_opt, steps, dtype=np.float32, vary=False):
    rng = np.random.default_rng(0)
    with strategy.scope():
        vs = [mpidist.Variable(rng.standard_normal(s).astype(dtype), name=f"v{i}")
              for i, s in enumerate([(3, 4), (5,), (), (2, 2, 2)])]
        opt = make_opt()
    grads = [[rng.standard_normal(np.shape(v.numpy())).astype(dtype) for v in vs]
             for _ in range(steps)]
    for k in range(steps):
        pairs = list(zip(grads[k], vs))
        if vary and k % 2:
            pairs = pairs[1:]  # another list: the per-variable path, on the same views
        strategy.run(lambda p=pairs: opt.apply_gradients(p))
    return [v.numpy() for v in vs], opt


def _reference(strategy, make_opt, steps, dtype=np.float32, vary=False):
    """The per-variable path: a subclass that overrides _update_step is never fused."""
    def make():
        opt = make_opt()
        cls = type(opt)
        unfused = type("Unfused" + cls.__name__, (cls,),
                       {"_update_step": lambda self, *a: cls._update_step(self, *a)})
        opt.__class__ = unfused
        return opt
    return _train(strategy, make, steps, dtype, vary)


OPTIMIZERS = {
    "sgd": lambda: mpidist.optimizers.SGD(0.1),
    "momentum": lambda: mpidist.optimizers.SGD(0.1, momentum=0.9),
    "nesterov": lambda: mpidist.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: mpidist.optimizers.Adam(0.01),
    "amsgrad": lambda: mpidist.optimizers.Adam(0.01, amsgrad=True),
    "clipvalue": lambda: mpidist.optimizers.Adam(0.01, clipvalue=0.5),
    "clipnorm": lambda: mpidist.optimizers.SGD(0.1, momentum=0.5, clipnorm=0.3),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("strategy", ["one_device", "mirrored1", "mirrored2", "default"])
@pytest.mark.parametrize("vary", [False, True])
def test_fused_steps_give_the_per_variable_bits(name, strategy, vary):
    make = OPTIMIZERS[name]
    chosen = {"one_device": lambda: mpidist.OneDeviceStrategy("/cpu:0"),
              "mirrored1": lambda: mpidist.MirroredStrategy(["/cpu:0"]),
              "mirrored2": lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
              "default": mpidist.get_strategy}[strategy]
    expected, _ = _reference(chosen(), make, 5, vary=vary)
    got, opt = _train(chosen(), make, 5, vary=vary)
    for a, b in zip(got, expected):
        assert np.array_equal(a, b)
    assert int(opt.iterations.numpy()) == 5
    if name not in ("clipnorm",):
        assert any(p is not None for p in opt._plans.values())  # the fused path ran


def test_int_variables_are_refused_before_any_update():
    """Issue 22: an integer variable would round every update away; the optimizer says so."""
    v = mpidist.Variable(np.array([10, 20]), name="i")
    opt = mpidist.optimizers.SGD(1.0)
    with pytest.raises(TypeError, match="variable 'i:0' has dtype int64"):
        opt.apply_gradients([(np.array([1, 2]), v)])
    np.testing.assert_array_equal(v.numpy(), [10, 20])
    assert not v.storage_adopted


def test_checkpoint_of_arena_variables_restores_into_a_fresh_model(tmp_path):
    got, opt = _train(mpidist.OneDeviceStrategy("/cpu:0"), OPTIMIZERS["adam"], 3)
    vs = list(opt._plans.values())[0].variables
    ckpt = mpidist.train.Checkpoint(optimizer=opt, **{f"v{i}": v for i, v in enumerate(vs)})
    path = ckpt.save(str(tmp_path / "c"))
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        fresh = [mpidist.Variable(np.zeros(np.shape(v.numpy()), np.float32)) for v in vs]
        opt2 = mpidist.optimizers.Adam(0.01)
    mpidist.train.Checkpoint(optimizer=opt2, **{f"v{i}": v for i, v in enumerate(fresh)}
                             ).restore(path)
    for a, b in zip(fresh, got):
        assert np.array_equal(a.numpy(), b)
    assert int(opt2.iterations.numpy()) == 3


# -- packing the gradients: every layout a gradient can have gives concatenate's bytes ------------
def _layout(data, shape, dtype):
    """A gradient of ``shape`` and ``dtype`` in one of the layouts users hand over."""
    from hypothesis import strategies as st

    size = int(np.prod(shape, dtype=np.int64))
    base = ((np.arange(size * 2) % 13 - 6) * 0.5).astype(dtype)
    kind = data.draw(st.sampled_from(["c", "fortran", "strided", "reversed", "view"]))
    if kind == "fortran":
        return np.asfortranarray(base[:size].reshape(shape))
    if kind == "strided":
        return base[::2].reshape(shape)
    if kind == "reversed":
        return base[::-1][:size].reshape(shape)
    if kind == "view":  # a view into a bigger buffer, as a flat-gradient function gives
        return base[size:].reshape(shape)
    return base[:size].reshape(shape).copy()


def test_packed_gradients_are_the_concatenated_values_whatever_their_layout():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mpidist.training.fused_apply import FusedPlan

    shapes = st.lists(st.lists(st.integers(0, 5), max_size=3).map(tuple), min_size=1,
                      max_size=40)

    @settings(max_examples=60, deadline=None)
    @given(shapes=shapes, arena_dtype=st.sampled_from([np.float32, np.float64]),
           grad_dtypes=st.data())
    def check(shapes, arena_dtype, grad_dtypes):
        variables = [mpidist.Variable(np.zeros(s, arena_dtype)) for s in shapes]
        plan = FusedPlan.build(variables, [{} for _ in variables], [])
        assert plan is not None
        grads = [_layout(grad_dtypes, s, grad_dtypes.draw(
                     st.sampled_from([arena_dtype, arena_dtype, np.float32, np.float64,
                                      np.int32])))
                 for s in shapes]
        exact = all(g.dtype == arena_dtype for g in grads)
        signature = (tuple(map(type, grads)), tuple(g.shape for g in grads),
                     tuple(g.dtype for g in grads))
        for _ in range(2):  # the second time the plan knows the signature
            plan.grads[0][...] = -1
            assert plan.pack(0, grads, exact_dtype=False, signature=signature)
            want = np.concatenate([g.ravel() for g in grads] + [np.zeros(0)]).astype(arena_dtype)
            assert np.array_equal(plan.grads[0], want)
        # A reduction runs in the gradients' own dtype: another dtype is refused, untouched.
        plan.grads[0][...] = -1
        assert plan.pack(0, grads, exact_dtype=True) is exact
        if not exact:
            assert (plan.grads[0] == -1).all()

    check()
