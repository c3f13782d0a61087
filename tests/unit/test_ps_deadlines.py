"""Deadlines and the end of a parameter-server job, on an in-process cluster (issue 22, items
1 and 7; docs/ps.md, "Deadlines"):

- a scheduled function that never returns fails after MPIDIST_PS_CLOSURE_TIMEOUT with
  DeadlineExceededError naming the function and the worker; join() raises it once, the other
  closures run on the other worker, the stuck worker gets no more work and the job is told it
  lost a rank;
- schedule() after coordinator.shutdown() is a clear RuntimeError (not a RemoteValue that never
  resolves); the shutdown warning counts the functions running, not only the queued ones;
- cache_variable_reads(): one read per variable in the scope, the scope's own writes read
  again, other writers unseen until the scope ends;
- local_devices given to the resolver is refused, not ignored;
- a ps or worker that stops hearing from the chief ends with a report naming it (ChiefWatch);
- join() waits while closures keep finishing, past MPIDIST_WAIT_TIMEOUT (its deadline restarts
  at each one), and a stuck join is reported.
"""

import logging
import re
import time

import numpy as np
import pytest

import mpidist
from mpidist.cluster_resolver.base import SimpleClusterResolver
from mpidist.errors import DeadlineExceededError
from mpidist.experimental import cache_variable_reads
from mpidist.experimental.coordinator import worker_index
from mpidist.ps.client import PSClient
from mpidist.ps.faults import Faults
from mpidist.ps.liveness import ChiefGoneError, ChiefWatch
from mpidist.ps.local import InProcessCluster
from mpidist.ps.roles import ClusterRoles
from mpidist.ps.runtime import INPROCESS
from mpidist.ps.wire import Op
from ps_cluster import ClusterCoordinator, ParameterServerStrategy, ps_job, ps_settings

pytestmark = pytest.mark.timeout(60)

STUCK_SECONDS = 1.5  # three times the deadline; finite, so the in-process thread ends


@mpidist.function
def stuck_on_worker_one(i):
    """Stuck (for STUCK_SECONDS) on worker 1; quick on worker 0."""
    if worker_index() == 1:
        time.sleep(STUCK_SECONDS)
    return i, worker_index()


@mpidist.function
def quick(i):
    return i


@mpidist.function
def slow(seconds):
    time.sleep(seconds)
    return seconds


# -- a closure that never returns -----------------------------------------------------------------
def test_a_closure_past_its_deadline_fails_naming_the_function_and_the_worker(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_CLOSURE_TIMEOUT="0.5", MPIDIST_PS_HEARTBEAT_SECONDS="0.1")
    with InProcessCluster(num_ps=1, num_workers=2) as cluster:
        strategy = ParameterServerStrategy(cluster.resolver)
        coordinator = ClusterCoordinator(strategy)
        start = time.monotonic()
        results = [coordinator.schedule(stuck_on_worker_one, args=(i,)) for i in range(8)]
        with pytest.raises(DeadlineExceededError) as info:
            coordinator.join()
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert 0.5 <= elapsed < 5.0, elapsed
        assert re.search(r"The scheduled function 'stuck_on_worker_one' \(closure \d+\) did not "
                         r"return: .*waited 0\.\d s for the scheduled function "
                         r"'stuck_on_worker_one' \(closure \d+\) to return on "
                         r"/job:worker/replica:0/task:1 \(rank 3\) \(since \d\d:\d\d:\d\d\)",
                         message), message
        assert "MPIDIST_PS_CLOSURE_TIMEOUT" in message and "abandoned" in message, message
        coordinator.join()  # raised once (TF's rule); the rest ran on worker 0
        outcomes = []
        for rv in results:  # TF's rule: the error cancelled what was still queued
            try:
                outcomes.append(rv.fetch())
            except DeadlineExceededError:
                outcomes.append("deadline")
            except mpidist.errors.CancelledError:
                outcomes.append("cancelled")
        assert outcomes.count("deadline") == 1, outcomes
        assert all(o[1] == 0 for o in outcomes if isinstance(o, tuple)), outcomes
        assert coordinator.lost == {3: re.sub(r"\s+", " ", coordinator.lost[3])}
        assert "MPIDIST_PS_CLOSURE_TIMEOUT" in coordinator.lost[3]
        # No more work goes to the abandoned worker.
        later = [coordinator.schedule(stuck_on_worker_one, args=(i,)) for i in range(4)]
        coordinator.join()
        assert [rv.fetch()[1] for rv in later] == [0, 0, 0, 0]


def test_the_closure_deadline_is_finite_by_default_and_cannot_be_turned_off(monkeypatch):
    config = ps_settings(monkeypatch, MPIDIST_PS_CLOSURE_TIMEOUT="1e400")  # inf: refused
    assert config.ps_closure_timeout == 1800.0
    assert ps_settings(monkeypatch, MPIDIST_PS_CLOSURE_TIMEOUT="7").ps_closure_timeout == 7.0


# -- after shutdown ---------------------------------------------------------------------------------
def test_schedule_after_shutdown_is_a_clear_error():
    with ps_job(num_ps=1, num_workers=1) as (_, coordinator):
        assert coordinator.schedule(quick, args=(1,)).fetch() == 1
        coordinator.shutdown()
        for call in (lambda: coordinator.schedule(quick, args=(2,)),
                     lambda: coordinator.create_per_worker_dataset(
                         lambda: mpidist.data.Dataset.range(3))):
            with pytest.raises(RuntimeError, match=re.escape(
                    "ClusterCoordinator.schedule: the coordinator was shut down")):
                call()
        coordinator.join()  # nothing queued: returns at once


def test_the_shutdown_warning_counts_running_functions_too(caplog):
    with ps_job(num_ps=1, num_workers=2) as (_, coordinator):
        results = [coordinator.schedule(slow, args=(0.3,)) for _ in range(6)]
        time.sleep(0.1)  # the dispatcher sends 4 (2 per worker); none ends within 0.3 s
        with caplog.at_level(logging.WARNING, logger="mpidist.ps"):
            coordinator.shutdown(timeout=5.0)
    found = [r.getMessage() for r in caplog.records
             if "had not finished when the coordinator shut down" in r.getMessage()]
    assert len(found) == 1, caplog.text
    total, queued, running = map(int, re.match(
        r"(\d+) scheduled functions had not finished when the coordinator shut down: (\d+) "
        r"queued are cancelled, (\d+) running", found[0]).groups())
    assert total == queued + running == 6 and running >= 1, found[0]
    statuses = []
    for rv in results:
        try:
            statuses.append(rv.fetch())
        except mpidist.errors.CancelledError:
            statuses.append("cancelled")
    assert statuses.count("cancelled") == queued and statuses.count(0.3) == running, statuses


# -- cache_variable_reads ---------------------------------------------------------------------------
@pytest.fixture
def reads(monkeypatch):
    """Counts READ requests (per variable name) made through any PSClient."""
    counted: dict[str, int] = {}
    original = PSClient.request

    def request(self, ps_rank, op, var_id, *args, **kwargs):
        if op == Op.READ:
            what = kwargs.get("what", "")
            counted[what] = counted.get(what, 0) + 1
        return original(self, ps_rank, op, var_id, *args, **kwargs)

    monkeypatch.setattr(PSClient, "request", request)
    return counted


@mpidist.function
def bump(variable):
    variable.assign_add(np.ones(2), read_value=False)


@mpidist.function
def read_three_times(w):
    with cache_variable_reads():
        values = [w.numpy() for _ in range(3)]
    return [v.tolist() for v in values]


def test_cache_variable_reads_reads_each_variable_once_per_scope(reads):
    with ps_job(num_ps=1, num_workers=1) as (strategy, coordinator):
        with strategy.scope():
            w = mpidist.Variable(np.zeros(2), name="w")
        with cache_variable_reads():
            first = w.numpy()
            first += 100  # a caller's change of its copy does not reach the cache
            coordinator.schedule(bump, args=(w,))
            coordinator.join()
            assert w.numpy().tolist() == [0.0, 0.0]      # cached: the worker's write unseen
            assert reads == {"reading variable 'w'": 1}
            w.assign_add(np.full(2, 5.0))                 # this thread's own write: read again
            assert w.numpy().tolist() == [6.0, 6.0]
            assert np.asarray(w).tolist() == [6.0, 6.0]
            assert reads == {"reading variable 'w'": 2}
            with cache_variable_reads():                  # nested: the same cache
                assert w.numpy().tolist() == [6.0, 6.0]
            assert w.numpy().tolist() == [6.0, 6.0]
            assert reads == {"reading variable 'w'": 2}
        assert w.numpy().tolist() == [6.0, 6.0]           # outside: every read goes out
        assert w.numpy().tolist() == [6.0, 6.0]
        assert reads == {"reading variable 'w'": 4}
        # In a scheduled function on a worker: one read for three.
        reads.clear()
        assert coordinator.schedule(read_three_times, args=(w,)).fetch() == [[6.0, 6.0]] * 3
        assert reads == {"reading variable 'w'": 1}


def test_cache_variable_reads_with_read_variables_and_sharded_variables(reads):
    partitioner = mpidist.experimental.partitioners.FixedShardsPartitioner(2)
    with ps_job(num_ps=2, num_workers=1, partitioner=partitioner) as (strategy, _):
        with strategy.scope():
            table = mpidist.Variable(np.arange(8.0).reshape(4, 2), name="table")
            b = mpidist.Variable(1.0, name="b")
        with cache_variable_reads():
            got = mpidist.experimental.read_variables([table, b])
            assert [g.tolist() for g in got] == [np.arange(8.0).reshape(4, 2).tolist(), 1.0]
            assert table.numpy().tolist() == np.arange(8.0).reshape(4, 2).tolist()
            assert float(b.numpy()) == 1.0
        assert reads == {}  # READ_MANY filled the cache; no single read was needed


# -- local_devices ---------------------------------------------------------------------------------
class _ResolverWithDevices(SimpleClusterResolver):
    def __init__(self, spec, devices):
        super().__init__(spec, task_type="chief", task_id=0, rpc_layer=INPROCESS)
        self._devices = devices

    @property
    def requested_local_devices(self):
        return self._devices


@pytest.mark.parametrize("devices", [["/cpu:0", "/cpu:1"], ["/gpu:0"], "all_gpus", ["/cpu:1"]])
def test_local_devices_other_than_the_one_cpu_are_refused(devices):
    with InProcessCluster(num_ps=1, num_workers=1) as cluster:
        with pytest.raises(ValueError, match=re.escape(
                f"ParameterServerStrategy runs one replica per worker, on its CPU; the cluster "
                f"resolver was given local_devices={devices!r}, which this strategy cannot "
                "honour")):
            ParameterServerStrategy(_ResolverWithDevices(cluster.spec, devices))
        strategy = ParameterServerStrategy(_ResolverWithDevices(cluster.spec, ["/cpu:0"]))
        assert strategy.extended.worker_devices == ("/device:CPU:0",)


# -- the chief's silence ------------------------------------------------------------------------------
def test_a_rank_that_stops_hearing_from_the_chief_reports_it(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_COORDINATOR_TIMEOUT="0.3", MPIDIST_PS_HEARTBEAT_SECONDS="0.05")
    watch = ChiefWatch(ClusterRoles.from_counts(num_ps=1, num_workers=2, rank=3))
    watch.check()
    now = time.monotonic()
    watch.heard(now - 0.5)
    with pytest.raises(ChiefGoneError, match=re.escape(
            "the chief /job:chief/replica:0/task:0 (rank 0) is gone: "
            "/job:worker/replica:0/task:1 (rank 3) has not heard from it for 0.5 s")):
        watch.check(now)
    heard = []
    start = time.monotonic()
    with pytest.raises(ChiefGoneError, match="MPIDIST_PS_COORDINATOR_TIMEOUT is 0.3 s"):
        watch.heard()
        watch.until(lambda: bool(heard), "something")
    assert 0.3 <= time.monotonic() - start < 3.0


def test_in_process_tasks_end_when_their_chief_is_silent(monkeypatch):
    """No strategy is made (no chief, no heartbeat): the ps and worker threads end by
    themselves with ChiefGoneError instead of polling forever."""
    ps_settings(monkeypatch, MPIDIST_PS_COORDINATOR_TIMEOUT="0.3", MPIDIST_PS_HEARTBEAT_SECONDS="0.05")
    cluster = InProcessCluster(num_ps=1, num_workers=1)
    deadline = time.monotonic() + 10
    while len(cluster.errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(cluster.errors) == 2 and all(isinstance(e, ChiefGoneError) for e in cluster.errors), \
        cluster.errors
    assert {re.search(r"(/job:\w+)", str(e)).group(1) for e in cluster.errors} == {"/job:chief"}
    cluster.shutdown(timeout=1.0)  # the threads have ended: nothing left to stop


# -- join measures progress -------------------------------------------------------------------------
def test_join_waits_while_closures_keep_finishing(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_WAIT_TIMEOUT="0.4", MPIDIST_PS_CLOSURE_TIMEOUT="0.3",
                MPIDIST_PS_HEARTBEAT_SECONDS="0.02")
    with ps_job(num_ps=1, num_workers=1) as (_, coordinator):
        start = time.monotonic()
        results = [coordinator.schedule(slow, args=(0.1,)) for _ in range(12)]
        coordinator.join()  # 1.2 s in all, longer than the 0.4 s deadline: each end restarts it
        assert time.monotonic() - start >= 1.0
        assert [rv.fetch() for rv in results] == [0.1] * 12


def test_faults_parse_real_deaths(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="ps:0:after=12:die=SIGSEGV,worker:1:die=exit3")
    ps, worker = Faults.from_config().faults
    assert (ps.target, ps.index, ps.action, ps.after, ps.how) == ("ps", 0, "die", 12, "SIGSEGV")
    assert (worker.target, worker.action, worker.after, worker.how) == ("worker", "die", 0, "exit3")


def test_faults_refuse_an_unknown_death(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="ps:0:after=1:die=SIGTERM")
    with pytest.raises(ValueError, match="die=SIGKILL"):
        Faults.from_config()
