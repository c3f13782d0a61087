"""Deferred restoration: values restored before their variables exist go into them when they
are created (a fresh optimizer's slots, attributes and metrics attached later), under every
strategy, bit for bit, and the status returned by restore() says what is still pending.

``S(N)`` is a MirroredStrategy over N virtual CPU devices.
"""

import numpy as np
import pytest

import mpidist
from mpidist.optimizers import SGD, Adam
from mpidist.train import Checkpoint
from replicas import mirrored as S

RNG = np.random.default_rng(7)
X = RNG.standard_normal((24, 3))
Y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * RNG.standard_normal(24)


class Model:
    """A trackable model: its variables by name (attributes may be added later)."""

    def __init__(self, **variables):
        self.vars = dict(variables)

    def _checkpoint_dependencies(self):
        return dict(self.vars)


def copies(v):
    """Every copy of a variable, as arrays."""
    if isinstance(v, mpidist.DistributedValues):
        return [c.numpy() for c in v.values]
    return [v.numpy()]


def value(v):
    """The one value of ``v``; its copies must be bit-identical."""
    found = copies(v)
    for other in found[1:]:
        np.testing.assert_array_equal(other, found[0])
    return found[0]


def make(strategy, optimizer):
    with strategy.scope():
        w = mpidist.Variable(np.zeros(3), name="w")
        b = mpidist.Variable(np.zeros(()), name="b")
        opt = optimizer()
    return Model(w=w, b=b), opt


def train(strategy, model, opt, epochs):
    """Least squares, 3 batches of 8 an epoch, gradients summed over the replicas."""
    w, b = model.vars["w"], model.vars["b"]
    data = strategy.experimental_distribute_dataset(
        mpidist.data.Dataset.from_tensor_slices((X, Y)).batch(8))

    def step(xb, yb):
        err = xb @ w.read_value() + b.read_value() - yb
        opt.apply_gradients([(2 * xb.T @ err / 8, w), (2 * np.sum(err) / 8, b)])

    for _ in range(epochs):
        for xb, yb in data:
            strategy.run(step, args=(xb, yb))


OPTIMIZERS = {
    "momentum": lambda: SGD(0.05, momentum=0.9),
    "nesterov": lambda: SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: Adam(0.05),
    "amsgrad": lambda: Adam(0.05, amsgrad=True),
}
SLOTS = {"momentum": ("momentum",), "nesterov": ("momentum",), "adam": ("m", "v"),
         "amsgrad": ("m", "v", "vhat")}
STRATEGIES = {
    "default": lambda: mpidist.get_strategy(),
    "one_device": lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    "mirrored2": lambda: S(2),
    "mirrored3": lambda: S(3),
    "mirrored4": lambda: S(4),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_resume_into_a_fresh_optimizer_is_bit_exact(tmp_path, strategy, optimizer):
    """N steps, save, restore into a fresh model and optimizer (no slots yet), M more steps:
    exactly the weights, slots and step count of N + M uninterrupted steps."""
    s = STRATEGIES[strategy]()
    make_opt = OPTIMIZERS[optimizer]
    model, opt = make(s, make_opt)
    train(s, model, opt, epochs=4)

    model1, opt1 = make(s, make_opt)
    train(s, model1, opt1, epochs=2)
    path = Checkpoint(model=model1, optimizer=opt1).save(str(tmp_path / "ck"))

    model2, opt2 = make(s, make_opt)
    status = Checkpoint(model=model2, optimizer=opt2).restore(path)
    slot_keys = [f"optimizer/slots/{i}/{name}" for i in range(2) for name in SLOTS[optimizer]]
    assert sorted(status.unused) == sorted(slot_keys)  # waiting for the slots
    assert int(value(opt2.iterations)) == 6  # restored at once
    with pytest.raises(AssertionError, match="no variable has taken yet: 'optimizer/slots/0/"):
        status.assert_consumed()
    train(s, model2, opt2, epochs=2)
    status.assert_consumed()
    assert status.unused == () and set(slot_keys) <= set(status.restored)

    for key in ("w", "b"):
        np.testing.assert_array_equal(value(model2.vars[key]), value(model.vars[key]))
        for name in SLOTS[optimizer]:
            np.testing.assert_array_equal(value(opt2.get_slot(model2.vars[key], name)),
                                          value(opt.get_slot(model.vars[key], name)))
    assert int(value(opt2.iterations)) == int(value(opt.iterations)) == 12


@pytest.mark.parametrize("target", ["default", "mirrored2", "mirrored3"])
def test_slots_restored_by_build_under_another_strategy(tmp_path, target):
    """Saved under Mirrored(2), restored under another strategy: build() creates the slots
    with the saved values in every copy."""
    s = S(2)
    model, opt = make(s, lambda: Adam(0.05, amsgrad=True))
    train(s, model, opt, epochs=1)
    path = Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ck"))

    t = STRATEGIES[target]()
    model2, opt2 = make(t, lambda: Adam(0.05, amsgrad=True))
    status = Checkpoint(model=model2, optimizer=opt2).restore(path)
    opt2.build([model2.vars["w"], model2.vars["b"]])
    status.assert_consumed()
    for key in ("w", "b"):
        for name in ("m", "v", "vhat"):
            saved = value(opt.get_slot(model.vars[key], name))
            assert np.any(saved != 0)
            for copy in copies(opt2.get_slot(model2.vars[key], name)):
                np.testing.assert_array_equal(copy, saved)


def test_a_dropped_checkpoint_object_still_restores_slots(tmp_path):
    """The TF idiom ``Checkpoint(...).restore(path)`` without keeping either object."""
    model, opt = make(mpidist.get_strategy(), lambda: SGD(0.05, momentum=0.9))
    train(mpidist.get_strategy(), model, opt, epochs=1)
    path = Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ck"))
    model2, opt2 = make(mpidist.get_strategy(), lambda: SGD(0.05, momentum=0.9))
    Checkpoint(model=model2, optimizer=opt2).restore(path)
    opt2.build([model2.vars["w"]])
    np.testing.assert_array_equal(opt2.get_slot(model2.vars["w"], "momentum").numpy(),
                                  opt.get_slot(model.vars["w"], "momentum").numpy())


def test_attribute_assigned_later_gets_its_value(tmp_path):
    path = Checkpoint(model=Model(w=mpidist.Variable([1.0, 2.0]),
                                  head=mpidist.Variable([[3.0]]))).save(str(tmp_path / "ck"))
    model = Model(w=mpidist.Variable([0.0, 0.0]))
    status = Checkpoint(model=model).restore(path)
    assert status.restored == ("model/w", "save_counter") and status.unused == ("model/head",)
    model.vars["head"] = mpidist.Variable([[0.0]])
    status.run_restore_ops()
    assert model.vars["head"].numpy().tolist() == [[3.0]]
    assert status.unused == () and status.restored[-1] == "model/head"
    status.assert_consumed()


def test_status_assertion_is_a_restore_point(tmp_path):
    path = Checkpoint(model=Model(a=mpidist.Variable(5.0))).save(str(tmp_path / "ck"))
    model = Model()
    status = Checkpoint(model=model).restore(path)
    with pytest.raises(AssertionError, match=r"no variable has taken yet: 'model/a'"):
        status.assert_consumed()
    model.vars["a"] = mpidist.Variable(0.0)
    assert status.assert_consumed() is status
    assert float(model.vars["a"].numpy()) == 5.0


def test_save_is_a_restore_point(tmp_path):
    """A variable attached after restore() takes its value before the next save reads it."""
    path = Checkpoint(model=Model(a=mpidist.Variable(5.0))).save(str(tmp_path / "ck"))
    model = Model()
    ck = Checkpoint(model=model)
    ck.restore(path)
    model.vars["a"] = mpidist.Variable(0.0)
    again = ck.save(str(tmp_path / "again"))
    assert float(model.vars["a"].numpy()) == 5.0
    fresh = Model(a=mpidist.Variable(0.0))
    Checkpoint(model=fresh).restore(again).assert_consumed()
    assert float(fresh.vars["a"].numpy()) == 5.0


@pytest.mark.parametrize("n", [1, 2, 3])
def test_metric_attached_later_restores_its_totals(tmp_path, n):
    s = S(n)
    with s.scope():
        m = mpidist.metrics.Mean()
    s.run(lambda: m.update_state(np.array([1.0, 2.0, 6.0])))
    saved_result = float(m.result())
    metrics = [m]
    path = Checkpoint(metrics=metrics).save(str(tmp_path / "ck"))
    assert saved_result == 3.0

    later = []
    status = Checkpoint(metrics=later).restore(path)
    assert sorted(status.unused) == ["metrics/0/count", "metrics/0/total"]
    with s.scope():
        later.append(mpidist.metrics.Mean())
    status.assert_consumed()
    assert float(later[0].result()) == saved_result
    with s.scope():
        assert float(later[0].count.read_value()) == 3.0 * n  # every replica saw 3 values


def test_slot_of_another_shape_raises_and_keeps_the_variable(tmp_path):
    w = mpidist.Variable(np.zeros(3), name="w")
    opt = SGD(0.1, momentum=0.9)
    opt.apply_gradients([(np.ones(3), w)])
    path = Checkpoint(optimizer=opt).save(str(tmp_path / "ck"))

    w4 = mpidist.Variable(np.ones(4), name="w4")
    opt2 = SGD(0.1, momentum=0.9)
    status = Checkpoint(optimizer=opt2).restore(path)
    with pytest.raises(ValueError) as err:
        opt2.apply_gradients([(np.ones(4), w4)])
    message = str(err.value)
    for part in ("'optimizer/slots/0/momentum'", "into variable 'w4:0/momentum:0'", "created after restore()",
                 "holds shape (3,) dtype float64", "variable has shape (4,) dtype float64",
                 "create it with the saved shape and dtype"):
        assert part in message, message
    # The slot keeps the value it was created with; the update did not run.
    assert opt2.get_slot(w4, "momentum").numpy().tolist() == [0.0] * 4
    assert w4.numpy().tolist() == [1.0] * 4 and int(opt2.iterations.numpy()) == 1
    with pytest.raises(AssertionError, match=r"did not fit the variables created for them: "
                                             r"'optimizer/slots/0/momentum': saved shape \(3,\)"):
        status.assert_consumed()
    opt2.apply_gradients([(np.ones(4), w4)])  # the value is not tried again
    np.testing.assert_allclose(w4.numpy(), [0.9] * 4)


def test_a_newer_restore_replaces_the_pending_values(tmp_path):
    def saved_with(g):
        w = mpidist.Variable(np.zeros(2))
        opt = SGD(1.0, momentum=0.5)
        opt.apply_gradients([(np.full(2, g), w)])
        return Checkpoint(optimizer=opt).save(str(tmp_path / f"g{g}"))

    first, second = saved_with(1.0), saved_with(3.0)
    opt = SGD(1.0, momentum=0.5)
    old = Checkpoint(optimizer=opt).restore(first)
    Checkpoint(optimizer=opt).restore(second)  # another Checkpoint object, same optimizer
    w = mpidist.Variable(np.zeros(2))
    opt.build([w])
    assert opt.get_slot(w, "momentum").numpy().tolist() == [-3.0, -3.0]
    assert old.unused == ("optimizer/slots/0/momentum",)  # the older restore took nothing


def test_restored_variable_takes_one_value_only(tmp_path):
    """A variable met under two keys takes the value of the first, at restore or later."""
    path = Checkpoint(a=mpidist.Variable(1.0), b=mpidist.Variable(2.0)).save(str(tmp_path / "c"))
    v = mpidist.Variable(0.0)
    box = Model()
    status = Checkpoint(a=v, b=box).restore(path)
    box.vars["again"] = v
    status.run_restore_ops()
    assert float(v.numpy()) == 1.0
