"""A parameter-server job whose scheduled function never returns on one worker (issue 22): chief
+ 1 ps + 2 workers, run with a short ``MPIDIST_PS_CLOSURE_TIMEOUT``.

Closure i returns ``[i, worker_index()]``, except on worker 1, where the first closure it runs
never returns (``time.sleep`` for a day). ``join()`` raises DeadlineExceededError naming the
function and the worker; the chief prints ``DEADLINE <message>``, joins again (the others ran
on worker 0), prints ``REPORT {json}`` and ends its program: the job must end too, with exit
code 1 (a rank was abandoned), not wait for the stuck worker.
"""

import time

from _common import report, say

import mpidist
from mpidist.errors import DeadlineExceededError
from mpidist.experimental.coordinator import ClusterCoordinator, worker_index

strategy = mpidist.experimental.ParameterServerStrategy(
    mpidist.cluster_resolver.MPIClusterResolver(num_ps=1))
coordinator = ClusterCoordinator(strategy)


@mpidist.function
def work(i):
    if worker_index() == 1:
        time.sleep(86400)
    time.sleep(0.02)
    return [i, worker_index()]


results = [coordinator.schedule(work, args=(i,)) for i in range(1, 11)]
try:
    coordinator.join()
except DeadlineExceededError as err:
    say(f"DEADLINE {err}")
later = [coordinator.schedule(work, args=(i,)) for i in range(11, 15)]
coordinator.join()
report(later=[rv.fetch() for rv in later])
