"""What a parameter-server job does when a rank's process ends, or a thread of the chief is
stuck inside MPI, on an in-process cluster and on the one-rank MPI transport:

- a rank the transport reports gone (its process ended: the watch's socket closed) is failed
  by the chief at once, without waiting for missed heartbeats, and its closures run elsewhere;
  a ps reported gone is PSUnavailableError naming how it ended;
- a ps or worker whose chief is reported gone ends at once with a report naming how;
- a thread that waits for the MPI lock held by a thread stuck inside MPI gets a
  DeadlineExceededError naming the stuck call, its rank and for how long, never a hang;
- a failure of the chief's dispatcher thread is raised by join() as UnavailableError.

The real deaths (SIGKILL, os._exit, SIGSEGV of a chief, ps or worker) are
tests/test_ps_real_faults.py's; these check the chief's side of each rule in milliseconds.
"""

import re
import threading
import time

import pytest

import mpidist
from mpidist import config
from mpidist.errors import DeadlineExceededError, UnavailableError
from mpidist.experimental.coordinator import PSUnavailableError, worker_index
from mpidist.ps.liveness import ChiefGoneError, ChiefWatch
from mpidist.cluster_resolver import SimpleClusterResolver
from mpidist.ps.roles import resolve_roles
from mpidist.ps.transport import CTRL, LocalTransport, MPITransport
from ps_cluster import ps_job, ps_settings

pytestmark = pytest.mark.timeout(60)


@mpidist.function
def count(i, runs):
    runs.assign_add(1.0, read_value=False)
    return i, worker_index()


def report_gone(monkeypatch, ranks, how="its process (pid 4242 on node7) ended without leaving "
                                        "the job"):
    """Every simulated rank's transport reports ``ranks`` gone, as the watch's socket would."""
    monkeypatch.setattr(LocalTransport, "gone", lambda self: {rank: how for rank in ranks})


def test_a_worker_whose_process_ended_is_failed_at_once(monkeypatch):
    """Heartbeats every 30 s (three missed: 90 s): worker 1 (rank 3) reported gone is failed
    within the first dispatcher rounds, every closure runs on worker 0, and the chief names
    how the process ended."""
    ps_settings(monkeypatch, MPIDIST_PS_HEARTBEAT_SECONDS="30")
    with ps_job(num_ps=1, num_workers=2) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        report_gone(monkeypatch, [3])
        start = time.monotonic()
        results = [coordinator.schedule(count, args=(i, runs)) for i in range(8)]
        coordinator.join()
        assert time.monotonic() - start < 10
        assert [r.fetch() for r in results] == [(i, 0) for i in range(8)]
        assert float(runs.numpy()) == 8.0


def test_a_parameter_server_whose_process_ended_is_named(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_HEARTBEAT_SECONDS="30")
    with ps_job(num_ps=1, num_workers=1) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        report_gone(monkeypatch, [1], "its process (pid 77 on node2) ended without leaving the job")
        start = time.monotonic()
        coordinator.schedule(count, args=(0, runs))
        with pytest.raises(PSUnavailableError) as info:
            coordinator.join()
        assert time.monotonic() - start < 5  # not after three 30 s heartbeats
        assert str(info.value).startswith(
            "parameter server /job:ps/replica:0/task:0 (rank 1) is gone: its process (pid 77 on "
            "node2) ended without leaving the job. A parameter server that fails cannot be "
            "replaced"), str(info.value)
        assert info.value.ps_rank == 1
        with pytest.raises(PSUnavailableError) as again:  # every later call: fatal
            coordinator.schedule(count, args=(1, runs))
        assert str(again.value) == str(info.value)


@pytest.mark.parametrize("wait", ["check", "until"])
def test_a_rank_whose_chief_ended_leaves_at_once(wait):
    """The chief's silence limit is 30 s; its reported end is acted on at the next check."""
    roles = _roles_of_rank(2)
    watch = ChiefWatch(roles, lambda: {0: "its process (pid 9 on n0) ended without leaving "
                                          "the job"})
    start = time.monotonic()
    with pytest.raises(ChiefGoneError) as info:
        if wait == "check":
            watch.check()
        else:
            watch.until(lambda: False, "the chief's next closure")
    assert time.monotonic() - start < 1
    assert re.fullmatch(
        r"the chief /job:chief/replica:0/task:0 \(rank 0\) is gone: its process \(pid 9 on n0\) "
        r"ended without leaving the job, without shutting the job down\. Ending "
        r"/job:worker/replica:0/task:0 \(rank 2\) with exit code 1; restart the job and restore "
        r"the latest checkpoint\.", str(info.value)), str(info.value)


def test_a_message_already_there_is_taken_before_the_chiefs_end_counts():
    """A SHUTDOWN that came before the chief's process ended is obeyed, not an error."""
    watch = ChiefWatch(_roles_of_rank(2), lambda: {0: "its process ended"})
    watch.until(lambda: True, "the chief's SHUTDOWN")  # ready at once: no error


def _roles_of_rank(rank):
    spec = {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3"]}
    resolver = SimpleClusterResolver(mpidist.cluster_resolver.ClusterSpec(spec),
                                     task_type="worker", task_id=0)
    return resolve_roles(resolver, 3, rank)


def test_a_thread_stuck_inside_mpi_is_named_not_waited_for(monkeypatch):
    """One rank's MPI transport: a thread holds the MPI lock as a send that never returns
    would; another thread's receive waits MPIDIST_PS_TIMEOUT (0.3 s), then is told which call
    is stuck, on which rank, for how long."""
    monkeypatch.setenv("MPIDIST_PS_TIMEOUT", "0.3")
    monkeypatch.setattr(config, "_config", None)
    transport = MPITransport()
    inside, leave = threading.Event(), threading.Event()

    def stuck_send():
        transport._enter("MPI_Isend", 3)  # what a send to a dead rank does when MPI wedges
        inside.set()
        leave.wait(30)
        transport._lock.release()

    thread = threading.Thread(target=stuck_send, name="mpidist-chief-pulse")
    thread.start()
    try:
        assert inside.wait(10)
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError) as info:
            transport.try_recv(CTRL)
        waited = time.monotonic() - start
        assert 0.25 <= waited < 5, waited
        assert re.fullmatch(
            r"MainThread of rank 0 waited 0\.3 s to make an MPI call \(MPI_Improbe, rank -1\): "
            r"thread mpidist-chief-pulse has been inside MPI_Isend \(rank 3\) for 0\.[3-9]\d* s\. "
            r"The MPI library is wedged, most likely on a rank that died; this rank cannot go "
            r"on \(MPIDIST_PS_TIMEOUT is 0\.3 s\)\.", str(info.value)), str(info.value)
    finally:
        leave.set()
        thread.join(10)
    assert transport.try_recv(CTRL) is None  # the lock is free again: calls go through


def test_a_failure_of_the_dispatcher_thread_is_raised_by_join(monkeypatch):
    """The thread that moves closures fails (as it would on a wedged MPI lock): join() raises
    UnavailableError naming the failure at once, and every later call does too."""
    ps_settings(monkeypatch)
    with ps_job(num_ps=1, num_workers=1) as (strategy, coordinator):
        with strategy.scope():
            runs = mpidist.Variable(0.0, name="runs")
        original = LocalTransport.progress

        def progress(self):
            if threading.current_thread().name == "mpidist-ps-dispatcher":
                raise DeadlineExceededError("the MPI lock was held too long (a test)")
            original(self)

        monkeypatch.setattr(LocalTransport, "progress", progress)
        coordinator.schedule(count, args=(0, runs))
        with pytest.raises(UnavailableError) as info:
            coordinator.join()
        assert str(info.value) == (
            "the chief's dispatcher thread, which sends scheduled functions to the workers, "
            "failed: DeadlineExceededError: the MPI lock was held too long (a test)")
        with pytest.raises(UnavailableError) as again:
            coordinator.done()
        assert again.value is info.value
        monkeypatch.setattr(LocalTransport, "progress", original)  # let the job shut down
