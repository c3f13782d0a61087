"""The replica-thread runner of MirroredStrategy: failures end every replica and say where,
and a replica stuck in the user's code ends the run by its deadline. An interrupted run (a real
SIGINT, in a Python process of its own) is the scenario
tests/scenarios/test_replica_threads_interrupted.py."""

import numpy as np
import pytest

import mpidist
from replicas import rid


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_error_names_the_replica_and_device_and_strategy_stays_usable(replicas):
    strategy = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])

    def step():
        if int(rid()) == replicas - 1:
            raise KeyError("boom")
        return mpidist.get_replica_context().merge_call(lambda s: 0)

    with pytest.raises(KeyError, match="boom") as info:
        strategy.run(step)
    assert any(f"replica {replicas - 1}" in note and f"CPU:{replicas - 1}" in note
               for note in info.value.__notes__)
    total = strategy.reduce("SUM", strategy.run(lambda: np.float64(rid() + 1)), axis=None)
    assert total == replicas * (replicas + 1) / 2


def test_error_in_merge_fn_unwinds_every_replica():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    after_merge = []

    def step():
        mpidist.get_replica_context().merge_call(lambda s: 1 / 0)
        after_merge.append(int(rid()))

    with pytest.raises(ZeroDivisionError):
        strategy.run(step)
    assert after_merge == []
    assert strategy.run(lambda: 5) == 5


def test_a_replica_that_never_reaches_merge_call_ends_the_run_by_deadline(monkeypatch):
    """Issue 22: the replicas parked at merge_call do not wait forever for one stuck in the
    user's code; the report names the stuck replica, and the strategy runs again afterwards."""
    import threading as _threading

    from mpidist import config as config_module
    from mpidist.config import Config
    from mpidist.errors import DeadlineExceededError

    monkeypatch.setattr(config_module, "_config", Config(wait_timeout=0.3))
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    release = _threading.Event()

    def fn():
        ctx = mpidist.get_replica_context()
        if ctx.replica_id_in_sync_group == 2:
            release.wait(10)
        return ctx.all_reduce("SUM", np.ones(2))

    try:
        with pytest.raises(DeadlineExceededError) as info:
            strategy.run(fn)
    finally:
        release.set()
    message = str(info.value)
    assert "replica 2 (" in message and "CPU:2" in message, message
    assert "replica 0" not in message and "replica 1" not in message, message
    assert "MPIDIST_WAIT_TIMEOUT" in message
    result = strategy.run(lambda: mpidist.get_replica_context().all_reduce("SUM", np.ones(2)))
    assert [np.asarray(v).tolist() for v in strategy.experimental_local_results(result)] == \
        [[3.0, 3.0]] * 3
