"""Failures of a parameter-server job, injected with MPIDIST_PS_FAULTS on an in-process cluster
(spec §9.6, ps-design.md §4): a preempted worker's closure runs again elsewhere and its
iterators start over; a silent worker is declared dead after three missed heartbeats and its
closures run on the others; with no worker left join() raises UnavailableError; a parameter
server that stops answering is PSUnavailableError naming it, from every later call.

Intervals are small (heartbeats every 0.1-0.2 s, a 0.3 s request timeout) so each test takes
well under a second or two.
"""

import re
import threading
import time

import numpy as np
import pytest

import mpidist
from mpidist.errors import UnavailableError
from mpidist.experimental.coordinator import PSUnavailableError, RemoteValueStatus, worker_index
from ps_cluster import ps_job, ps_settings

pytestmark = pytest.mark.timeout(60)

Dataset = mpidist.data.Dataset
BARRIER = threading.Barrier(2, timeout=10)


@pytest.fixture
def barrier(monkeypatch):
    monkeypatch.setattr(f"{__name__}.BARRIER", threading.Barrier(2, timeout=10))


@mpidist.function
def next_and_count(iterator, runs):
    """The iterator's next element and the worker; counts every run on a parameter server."""
    runs.assign_add(1.0, read_value=False)
    return int(next(iterator)), worker_index()


@mpidist.function
def next_meeting_the_other_worker(iterator, runs):
    runs.assign_add(1.0, read_value=False)
    element = int(next(iterator))
    BARRIER.wait()
    return element, worker_index()


@mpidist.function
def count_on_both_workers(i, runs):
    runs.assign_add(1.0, read_value=False)
    BARRIER.wait()
    return i, worker_index()


@mpidist.function
def slow_count(i, runs, seconds):
    time.sleep(seconds)
    runs.assign_add(1.0, read_value=False)
    return i, worker_index()


# -- preemption ---------------------------------------------------------------------------------
def test_a_preempted_closure_runs_again_and_the_iterator_starts_over(monkeypatch):
    """One worker: closures 1-2 build its dataset and iterator, closure 3 is preempted after
    its body ran (it took element 0). The worker comes back with a new iterator, closure 3 runs
    again and takes element 0 again: the results are 0, 1, 2, ... and nothing is lost."""
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="closure:3:preempt=0.01")
    with ps_job(num_ps=1, num_workers=1) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        iterator = iter(coordinator.create_per_worker_dataset(lambda: Dataset.range(100)))
        results = [coordinator.schedule(next_and_count, args=(iterator, runs))
                   for _ in range(6)]
        coordinator.join()
        assert all(r.status is RemoteValueStatus.READY for r in results)
        assert [r.fetch() for r in results] == [(i, 0) for i in range(6)]
        assert float(runs.numpy()) == 7.0  # closure 3 ran twice (at-least-once)


def test_a_preempted_closure_runs_on_the_other_worker(monkeypatch, barrier):
    """Two workers, one closure in flight each. Closure 5 (after 2 datasets and 2 iterators)
    runs on worker 0 and is preempted; worker 0 rebuilds its resources while closure 5 runs
    again on worker 1. Then two closures run at once, one per worker: worker 0's iterator
    started over (element 0 again), worker 1's goes on (element 1)."""
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="closure:5:preempt=0.01",
                MPIDIST_PS_INFLIGHT_PER_WORKER="1")
    with ps_job(num_ps=1, num_workers=2) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        iterator = iter(coordinator.create_per_worker_dataset(lambda: Dataset.range(100)))
        coordinator.join()  # the resources are built: closure 5 goes to worker 0
        preempted = coordinator.schedule(next_and_count, args=(iterator, runs))
        assert preempted.fetch() == (0, 1)
        assert preempted.status is RemoteValueStatus.READY
        coordinator.join()  # worker 0's dataset and iterator are rebuilt
        pair = [coordinator.schedule(next_meeting_the_other_worker, args=(iterator, runs))
                for _ in range(2)]
        assert sorted(coordinator.fetch(pair)) == [(0, 0), (1, 1)]
        assert all(r.status is RemoteValueStatus.READY for r in pair)
        assert float(runs.numpy()) == 4.0  # closure 5 twice, then the pair


# -- a worker that stops answering -----------------------------------------------------------------
def test_a_silent_worker_is_declared_dead_and_its_closures_run_elsewhere(monkeypatch, barrier):
    """Worker 1 stops (no heartbeats, no results) when it gets its second closure; 0.6 s later
    (3 heartbeats of 0.2 s) the closure it held runs on worker 0. Every closure runs exactly
    once: the silent worker never ran the one it held."""
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="worker:1:after=1:hang",
                MPIDIST_PS_HEARTBEAT_SECONDS="0.2", MPIDIST_PS_INFLIGHT_PER_WORKER="1")
    with ps_job(num_ps=1, num_workers=2) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        both = [coordinator.schedule(count_on_both_workers, args=(i, runs)) for i in range(2)]
        assert sorted(coordinator.fetch(both)) == [(0, 0), (1, 1)]
        start = time.monotonic()
        results = [coordinator.schedule(slow_count, args=(i, runs, 0.01)) for i in range(2, 8)]
        coordinator.join()
        assert time.monotonic() - start >= 0.6  # the closure worker 1 held waited for the verdict
        assert all(r.status is RemoteValueStatus.READY for r in results)
        assert [r.fetch() for r in results] == [(i, 0) for i in range(2, 8)]
        assert float(runs.numpy()) == 8.0
        assert coordinator.schedule(slow_count, args=(8, runs, 0.0)).fetch() == (8, 0)


def test_when_every_worker_is_silent_join_raises_unavailable(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="worker:0:after=0:hang,worker:1:after=0:hang",
                MPIDIST_PS_HEARTBEAT_SECONDS="0.1")
    with ps_job(num_ps=1, num_workers=2) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        results = [coordinator.schedule(slow_count, args=(i, runs, 0.0)) for i in range(3)]
        pattern = (r"all 2 workers of the cluster are unavailable \(last: "
                   r"/job:worker/replica:0/task:[01] \(rank [23]\), no heartbeat for [0-9.]+ s\); "
                   r"scheduled functions cannot run. Restart the job.")
        with pytest.raises(UnavailableError) as info:
            coordinator.join()
        assert re.fullmatch(pattern, str(info.value))
        assert not isinstance(info.value, PSUnavailableError)
        for call in (coordinator.join, coordinator.done,
                     lambda: coordinator.schedule(slow_count, args=(9, runs, 0.0))):
            with pytest.raises(UnavailableError) as again:  # every later call: fatal
                call()
            assert again.value is info.value
        assert [r.status for r in results] == [RemoteValueStatus.ABORTED] * 3
        assert float(runs.numpy()) == 0.0


# -- a parameter server that stops answering --------------------------------------------------------
def test_a_silent_parameter_server_is_fatal_and_named(monkeypatch):
    """ps 1 stops answering after its first request (creating b); the workers' requests time
    out after MPIDIST_PS_TIMEOUT = 0.3 s; the chief raises PSUnavailableError naming the task
    and rank from join, and again from every later call. ps 0 still answers."""
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="ps:1:after=1:hang", MPIDIST_PS_TIMEOUT="0.3")
    with ps_job(num_ps=2, num_workers=2) as (strategy, coordinator):
        with strategy.scope():
            a = mpidist.Variable(1.0, name="a")   # ps 0
            b = mpidist.Variable(2.0, name="b")   # ps 1 (rank 2)
        assert b.device == "/job:ps/replica:0/task:1/device:CPU:0"

        @mpidist.function
        def step():
            a.assign_add(1.0, read_value=False)
            return float(b.assign_add(1.0))

        start = time.monotonic()
        results = [coordinator.schedule(step) for _ in range(3)]
        message = (
            "parameter server /job:ps/replica:0/task:1 (rank 2) did not answer within 0.3 s "
            "(updating variable 'b'). A parameter server that fails cannot be replaced: restart "
            "the job and restore the latest checkpoint (docs/ps.md, 'Failures'); "
            "MPIDIST_PS_TIMEOUT sets the limit.")
        with pytest.raises(PSUnavailableError) as info:
            coordinator.join()
        assert time.monotonic() - start < 5.0
        assert isinstance(info.value, UnavailableError)
        # The message, then the wait's report: what, on whom, since when.
        assert str(info.value).startswith(message), str(info.value)
        assert re.search(r"\[.*waited 0\.\d s for the reply to updating variable 'b' on "
                         r"parameter server /job:ps/replica:0/task:1 \(rank 2\) \(since "
                         r"\d\d:\d\d:\d\d\)", str(info.value)), str(info.value)
        for call in (coordinator.join, coordinator.done, lambda: coordinator.schedule(step)):
            with pytest.raises(PSUnavailableError) as again:
                call()
            assert str(again.value) == str(info.value)
        with pytest.raises(PSUnavailableError):
            results[0].fetch()
        assert 1.0 < float(a.numpy()) <= 4.0  # ps 0 still answers the chief
        with pytest.raises(UnavailableError, match=re.escape(
                "parameter server /job:ps/replica:0/task:1 (rank 2) did not answer within "
                "0.3 s (reading variable 'b')")):
            b.numpy()


def test_variables_of_a_job_that_was_shut_down_fail_at_once():
    with ps_job(num_ps=1, num_workers=1) as (strategy, _):
        with strategy.scope():
            w = mpidist.Variable(np.ones(2), name="w")
        np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])
    start = time.monotonic()
    with pytest.raises(UnavailableError) as info:
        w.numpy()
    assert str(info.value) == (
        "The parameter servers of this job were shut down (/job:chief/replica:0/task:0 "
        "(rank 0) stopped them): their variables can no longer be read or updated.")
    assert time.monotonic() - start < 1.0
