"""The rule of the unit tests and the scenarios (their conftests import this fixture): every
test starts and ends with no globally set strategy and no scope entered."""

import pytest

import mpidist


@pytest.fixture(autouse=True)
def _no_global_strategy():
    mpidist.experimental_set_strategy(None)
    assert not mpidist.has_strategy()
    yield
    mpidist.experimental_set_strategy(None)
    assert not mpidist.has_strategy()
