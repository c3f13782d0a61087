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


@pytest.mark.parametrize("raw, expected", [(None, "auto"), ("auto", "auto"), ("off", None),
                                           ("3", 3), ("0", "auto"), ("x", "auto")])
def test_cpu_threads(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("MPIDIST_CPU_THREADS", raising=False)
    else:
        monkeypatch.setenv("MPIDIST_CPU_THREADS", raw)
    if raw in ("0", "x"):
        with pytest.warns(RuntimeWarning, match="MPIDIST_CPU_THREADS"):
            assert Config.from_env().cpu_threads == expected
    else:
        assert Config.from_env().cpu_threads == expected


def test_threads_per_rank(monkeypatch):
    from mpidist.backend.threads import threads_per_rank

    cores = 8
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    assert threads_per_rank(4, "auto", environ={}) == 2
    assert threads_per_rank(3, "auto", environ={}) == 2
    assert threads_per_rank(16, "auto", environ={}) == 1
    assert threads_per_rank(1, "auto", environ={}) is None  # a lone rank keeps every core
    assert threads_per_rank(4, "auto", environ={"OMP_NUM_THREADS": "4"}) is None  # the user chose
    assert threads_per_rank(4, 3, environ={"OMP_NUM_THREADS": "4"}) == 3
    assert threads_per_rank(4, None, environ={}) is None
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2})  # bound by the launcher
    assert threads_per_rank(4, "auto", environ={}) == 3


def test_timeline_path(monkeypatch):
    monkeypatch.delenv("MPIDIST_TIMELINE", raising=False)
    assert Config.from_env().timeline_path is None
    monkeypatch.setenv("MPIDIST_TIMELINE", " /tmp/job.json ")
    assert Config.from_env().timeline_path == "/tmp/job.json"


def test_straggler_summary():
    from mpidist.comm.timeline import summarize

    # (seq, op, call, bytes, start, agreed, end) per rank: rank 2 arrives last twice, rank 0 once.
    per_rank = {
        0: [(1, "a", "", 0, 0, 50, 60), (2, "a", "", 0, 100, 130, 140), (3, "a", "", 0, 200, 200, 210)],
        1: [(1, "a", "", 0, 10, 50, 60), (2, "a", "", 0, 105, 130, 140), (3, "a", "", 0, 190, 200, 210)],
        2: [(1, "a", "", 0, 45, 50, 60), (2, "a", "", 0, 128, 130, 140), (3, "a", "", 0, 195, 200, 210)],
    }
    counts, waited_for, compared = summarize(per_rank)
    assert compared == 3
    assert counts == {2: 2, 0: 1}
    assert waited_for == {2: (45 + 35) + (28 + 23), 0: 10 + 5}
