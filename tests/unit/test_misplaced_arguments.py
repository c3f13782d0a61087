"""Arguments in the wrong place are named with the fix, never silently dropped:

- every ``Dataset`` method that takes ``name`` (TF's name of the operation) refuses anything
  but a str or None, so that a second data argument, ``from_tensor_slices(x, y)``, is an error
  instead of a dataset of ``x`` alone (checked for every such method, found by introspection);
- an optimizer given an argument of older Keras or TF (``lr``, ``decay``) or a misspelt one
  names it, its replacement where there is one, and the arguments it takes.
"""

import inspect

import numpy as np
import pytest

import mpidist
from mpidist.data import Dataset

X, Y = np.arange(3.0), np.zeros(3)


def methods_taking_name():
    found = []
    for attr, value in vars(Dataset).items():
        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if not attr.startswith("_") and inspect.isfunction(fn) \
                and "name" in inspect.signature(fn).parameters:
            found.append(attr)
    return found


def test_the_common_methods_are_among_them():
    assert {"from_tensor_slices", "from_tensors", "range", "batch", "map", "shuffle", "take",
            "skip", "repeat", "shard", "prefetch"} <= set(methods_taking_name())


@pytest.mark.parametrize("method", methods_taking_name())
@pytest.mark.parametrize("bad", [7, np.ones(2), ("a",)], ids=["int", "array", "tuple"])
def test_a_name_that_is_not_a_string_is_refused(method, bad):
    owner = Dataset if isinstance(vars(Dataset)[method], staticmethod) else Dataset.range(4)
    with pytest.raises(TypeError, match=rf"^Dataset\.{method}: argument 'name' got .*; it is "
                                        r"the operation's name, a str or None, not data\."):
        getattr(owner, method)(name=bad)


def test_a_second_array_given_to_from_tensor_slices_is_named_with_the_fix():
    with pytest.raises(TypeError) as info:
        Dataset.from_tensor_slices(X, Y)
    assert str(info.value) == (
        "Dataset.from_tensor_slices: argument 'name' got array([0., 0., 0.]); it is the "
        "operation's name, a str or None, not data. Several arrays go in one tuple: "
        "Dataset.from_tensor_slices((x, y)).")
    pairs = list(Dataset.from_tensor_slices((X, Y), name="pairs").as_numpy_iterator())
    assert [(float(a), float(b)) for a, b in pairs] == [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0)]


def test_names_that_are_strings_and_keyword_only_names_still_work():
    assert list(Dataset.range(1, 10, 3, name="r").as_numpy_iterator()) == [1, 4, 7]
    assert list(Dataset.range(5).batch(2, False, name="b").take(1, "t").as_numpy_iterator()
                )[0].tolist() == [0, 1]


@pytest.mark.parametrize("cls", ["SGD", "Adam"])
@pytest.mark.parametrize("kwargs,fix", [
    ({"lr": 0.1}, "(`lr` is `learning_rate` now)"),
    ({"decay": 1e-4}, "(`decay` is a schedule (learning_rate=lambda step: lr0 / (1 + decay * "
                      "step)) now)"),
    ({"learnig_rate": 0.1}, ""),
])
def test_an_optimizer_argument_it_does_not_take_is_named(cls, kwargs, fix):
    optimizer = getattr(mpidist.optimizers, cls)
    with pytest.raises(TypeError) as info:
        optimizer(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{cls}() got unexpected keyword argument(s) {sorted(kwargs)}"
                              + (f" {fix}" if fix else "") + ". It takes: learning_rate, ")
    assert message.endswith(", name, clipnorm, clipvalue, global_clipnorm.")
    assert optimizer(learning_rate=0.1, clipnorm=1.0).clipnorm == 1.0
