"""TensorFlow names mpidist does not have (TF 1 names, renamed ones, Keras 2 aliases) raise
AttributeError with what to write instead, on every class of the family; other missing names
stay plain AttributeErrors, and hasattr / getattr with a default behave as Python says."""

import copy

import numpy as np
import pytest

import mpidist
from mpidist.core import tf_names
from mpidist.data import Dataset


def instances(family):
    if family == "Strategy":
        return [mpidist.get_strategy(), mpidist.OneDeviceStrategy("/cpu:0"),
                mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])]
    if family == "Optimizer":
        return [mpidist.optimizers.SGD(0.1), mpidist.optimizers.Adam(0.1)]
    if family == "Variable":
        with mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
            mirrored = mpidist.Variable(np.zeros(3))
        return [mpidist.Variable(1.0), mirrored]
    return [Dataset.range(4), Dataset.from_tensor_slices(np.ones((4, 2))).batch(2).repeat()]


CASES = [(family, name, hint) for family, table in tf_names._HINTS.items()
         for name, hint in table.items()]


@pytest.mark.parametrize("family,name,hint", CASES, ids=[f"{f}.{n}" for f, n, _ in CASES])
def test_a_tensorflow_name_gets_its_fix(family, name, hint):
    for obj in instances(family):
        with pytest.raises(AttributeError) as info:
            getattr(obj, name)
        assert str(info.value) == (f"{type(obj).__name__!r} object has no attribute "
                                   f"{name!r}: {hint}."), str(info.value)
        assert not hasattr(obj, name) and getattr(obj, name, "default") == "default"


@pytest.mark.parametrize("family", sorted(tf_names._HINTS))
def test_other_missing_names_stay_plain(family):
    for obj in instances(family):
        with pytest.raises(AttributeError) as info:
            _ = obj.surely_not_an_attribute
        assert str(info.value) == (f"{type(obj).__name__!r} object has no attribute "
                                   "'surely_not_an_attribute'")


def test_copies_and_pickles_are_unaffected():
    v = mpidist.Variable(np.arange(3.0))
    np.testing.assert_array_equal(copy.deepcopy(v).numpy(), [0.0, 1.0, 2.0])
    opt = mpidist.optimizers.SGD(0.25)
    assert copy.copy(opt).learning_rate == 0.25
