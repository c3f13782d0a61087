"""mpidist.config: the one reader of MPIDIST_* variables; explicit values, strict booleans."""

import pytest

from mpidist.config import Config


def test_defaults_when_unset(monkeypatch):
    monkeypatch.delenv("MPIDIST_LOG", raising=False)
    monkeypatch.delenv("MPIDIST_GPU_AWARE_MPI", raising=False)
    assert Config.from_env() == Config(log_level="", gpu_aware_mpi=False)


@pytest.mark.parametrize("raw,expected", [("1", True), ("TRUE", True), ("on", True), ("yes", True),
                                          ("0", False), ("false", False), ("off", False), ("", False)])
def test_boolean_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("MPIDIST_GPU_AWARE_MPI", raw)
    assert Config.from_env().gpu_aware_mpi is expected


def test_bad_boolean_warns_and_keeps_default(monkeypatch):
    monkeypatch.setenv("MPIDIST_GPU_AWARE_MPI", "maybe")
    with pytest.warns(RuntimeWarning, match="MPIDIST_GPU_AWARE_MPI='maybe' is not a boolean"):
        assert Config.from_env().gpu_aware_mpi is False


def test_log_level_is_normalised(monkeypatch):
    monkeypatch.setenv("MPIDIST_LOG", " DEBUG ")
    assert Config.from_env().log_level == "debug"


def test_config_is_immutable():
    with pytest.raises(AttributeError):
        Config().log_level = "info"
