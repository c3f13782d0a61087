"""Memory of large ``schedule`` arguments on the chief (issue 22, item 7): usage
``big_args.py [MIB] [CALLS]``: CALLS closures (default 12), each given its own MIB MiB array
(default 100), on chief + 1 ps + 2 workers. The chief prints ``RSS {json}``:
its resident memory (MiB) before scheduling, after scheduling, after ``join()`` and the peak.
Each argument should be released once it was sent and its closure finished, not kept until
many sends pile up."""

import json
import resource
import sys

import numpy as np
from _common import say

import mpidist
from mpidist.experimental.coordinator import ClusterCoordinator


MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 100
CALLS = int(sys.argv[2]) if len(sys.argv) > 2 else 12


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


strategy = mpidist.experimental.ParameterServerStrategy(
    mpidist.cluster_resolver.MPIClusterResolver(num_ps=1))
coordinator = ClusterCoordinator(strategy)


@mpidist.function
def total(x):
    return float(x[:1].sum())


before = rss_mib()
results = [coordinator.schedule(total, args=(np.ones(MIB * 2**20 // 8),)) for _ in range(CALLS)]
scheduled = rss_mib()
coordinator.join()
values = [rv.fetch() for rv in results]
after = rss_mib()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
say("RSS " + json.dumps({"before": round(before), "scheduled": round(scheduled),
                         "after_join": round(after), "peak": round(peak),
                         "results": values}))
