"""fit/evaluate read a model's ``trainable_variables`` as a list of Variables: every wrong
shape of it is an error in the model's terms (issue 22), never one from inside the loop."""

import numpy as np
import pytest

import mpidist

X = np.random.default_rng(0).normal(size=(32, 3))
Y = X @ np.array([1.0, 2.0, 3.0])


def _model(kind):
    w = mpidist.Variable(np.zeros(3), name="w")

    def loss(self, params, x, y):
        return (x @ params[0] - y) ** 2

    members = {"loss": loss, "w": w}
    if kind == "method":
        members["trainable_variables"] = lambda self: [self.w]
    elif kind == "array":
        members["trainable_variables"] = property(lambda self: [np.zeros(3)])
    elif kind == "lone_variable":
        members["trainable_variables"] = property(lambda self: self.w)
    elif kind == "none":
        members["trainable_variables"] = property(lambda self: None)
    elif kind == "string":
        members["trainable_variables"] = property(lambda self: "w")
    elif kind == "number":
        members["trainable_variables"] = property(lambda self: 3)
    return type("Model", (), members)(), w


@pytest.mark.parametrize("kind, message", [
    ("method", r"Model.trainable_variables is a method.*@property"),
    ("array", r"Model.trainable_variables\[0\] is ndarray .*not an mpidist.Variable"),
    ("lone_variable", r"Model.trainable_variables must be a list of mpidist.Variable"),
    ("none", r"Model.trainable_variables must be a list of mpidist.Variable"),
    ("string", r"Model.trainable_variables must be a list of mpidist.Variable"),
    ("number", r"Model.trainable_variables must be a list of mpidist.Variable"),
])
@pytest.mark.parametrize("call", ["fit", "evaluate"])
def test_trainable_variables_of_the_wrong_kind(kind, message, call):
    model, w = _model(kind)
    ds = mpidist.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    with pytest.raises(TypeError, match=message):
        if call == "fit":
            mpidist.fit(model, ds, epochs=1, optimizer=mpidist.optimizers.SGD(0.1),
                        autodiff="autograd", verbose=0)
        else:
            mpidist.evaluate(model, ds, autodiff="autograd", verbose=0)
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))  # nothing was trained


def test_a_callback_class_instead_of_an_instance():
    model, _ = _model("ok")
    model.__class__.trainable_variables = property(lambda self: [self.w])
    ds = mpidist.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    with pytest.raises(TypeError, match=r"argument 'callbacks'.*pass an instance, BackupAndRestore"):
        mpidist.fit(model, ds, epochs=1, optimizer=mpidist.optimizers.SGD(0.1),
                    autodiff="autograd", verbose=0, callbacks=[mpidist.callbacks.BackupAndRestore])


def test_an_unbatched_dataset_is_named_as_the_cause():
    model, w = _model("ok")
    model.__class__.trainable_variables = property(lambda self: [self.w])
    ds = mpidist.data.Dataset.from_tensor_slices((X, Y))  # forgot .batch(...)
    with pytest.raises(ValueError, match=r"y is a single label .*dataset\.batch\(GLOBAL_BATCH_SIZE\)"):
        mpidist.fit(model, ds, epochs=1, optimizer=mpidist.optimizers.SGD(0.1),
                    autodiff="autograd", verbose=0)
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))
