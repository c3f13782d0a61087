"""mpidist.config: the one reader of MPIDIST_* variables; explicit values, strict booleans."""

import pytest

from mpidist.config import Config


def test_defaults_when_unset(monkeypatch):
    monkeypatch.delenv("MPIDIST_LOG", raising=False)
    monkeypatch.delenv("MPIDIST_GPU_AWARE_MPI", raising=False)
    for name in ("MPIDIST_CHECK_COLLECTIVES", "MPIDIST_STALL_SECONDS", "MPIDIST_SHM_MIN_BYTES",
                 "MPIDIST_ABORT_ON_EXCEPTION"):
        monkeypatch.delenv(name, raising=False)
    assert Config.from_env() == Config(log_level="", gpu_aware_mpi=False, check_collectives=True,
                                       stall_warning_seconds=60.0, shm_min_bytes=256 * 1024,
                                       abort_on_exception=True)


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


@pytest.mark.parametrize("raw,expected", [("0", 0), ("1048576", 1048576), ("off", None), ("never", None)])
def test_shm_threshold(monkeypatch, raw, expected):
    monkeypatch.setenv("MPIDIST_SHM_MIN_BYTES", raw)
    assert Config.from_env().shm_min_bytes == expected


@pytest.mark.parametrize("raw", ["-5", "lots", "1.5"])
def test_bad_number_warns_and_keeps_default(monkeypatch, raw):
    monkeypatch.setenv("MPIDIST_SHM_MIN_BYTES", raw)
    with pytest.warns(RuntimeWarning, match="MPIDIST_SHM_MIN_BYTES"):
        assert Config.from_env().shm_min_bytes == 256 * 1024


def test_stall_seconds(monkeypatch):
    monkeypatch.setenv("MPIDIST_STALL_SECONDS", "2.5")
    assert Config.from_env().stall_warning_seconds == 2.5
    monkeypatch.setenv("MPIDIST_STALL_SECONDS", "off")
    assert Config.from_env().stall_warning_seconds is None
