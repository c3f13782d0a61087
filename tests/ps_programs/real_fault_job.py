"""A parameter-server job in which one task really dies mid-training (the real-fault matrix,
tests/test_ps_real_faults.py).

Usage: ``real_fault_job.py VICTIM HOW [CLOSURES]``: chief + 1 ps + 2 workers (4 ranks). The
chief schedules CLOSURES closures (default 30); closure i sleeps 0.05 s, adds 1 to ``total`` on
the ps and returns ``[i, worker_index()]``. VICTIM dies by HOW (``SIGKILL``, ``SIGSEGV`` or
``exit3``), with nothing caught and no mpidist code told:

- ``worker``: worker task 1 (rank 3, on the second simulated node) dies in the first closure
  numbered 3 or more that it runs;
- ``ps``: the ps dies after 12 requests (``MPIDIST_PS_FAULTS=ps:0:after=12:die=HOW``);
- ``chief``: the chief dies after the first 5 closures ran, with 20 more scheduled;
- ``none``: nobody dies.

The chief prints ``REPORT {json}`` when it reaches the end (every result, ``total``).
"""

import os
import sys

VICTIM, HOW = sys.argv[1], sys.argv[2]
CLOSURES = int(sys.argv[3]) if len(sys.argv) > 3 else 30
if VICTIM == "ps":
    os.environ["MPIDIST_PS_FAULTS"] = f"ps:0:after=12:die={HOW}"

import time  # noqa: E402

from _common import report, say  # noqa: E402

import mpidist  # noqa: E402
from mpidist.experimental.coordinator import ClusterCoordinator, worker_index  # noqa: E402
from mpidist.ps.faults import die  # noqa: E402

strategy = mpidist.experimental.ParameterServerStrategy(
    mpidist.cluster_resolver.MPIClusterResolver(num_ps=1))
coordinator = ClusterCoordinator(strategy)
with strategy.scope():
    total = mpidist.Variable(0.0, name="total")


@mpidist.function
def work(i):
    if VICTIM == "worker" and worker_index() == 1 and i >= 3:
        die(HOW)
    time.sleep(0.05)
    total.assign_add(1.0)
    return [i, worker_index()]


first = [coordinator.schedule(work, args=(i,)) for i in range(1, 6)]
coordinator.join()
rest = [coordinator.schedule(work, args=(i,)) for i in range(6, CLOSURES + 1)]
if VICTIM == "chief":
    say("chief: dying")
    die(HOW)
coordinator.join()
report(results=[rv.fetch() for rv in first + rest], total=float(total.numpy()))
say("chief: reached the end")
