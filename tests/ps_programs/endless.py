"""A parameter-server job that trains until it is stopped from outside (Ctrl-C).

Usage: ``endless.py [IGNORED]``: chief, 1 ps, the rest workers. The chief prints ``chief: training`` and
then schedules closures (10 ms each, an ``assign_add`` on the ps) forever, joining every 20.
"""

import time

import mpidist
from mpidist.experimental.coordinator import ClusterCoordinator

strategy = mpidist.experimental.ParameterServerStrategy(
    mpidist.cluster_resolver.MPIClusterResolver(num_ps=1))
coordinator = ClusterCoordinator(strategy)
with strategy.scope():
    w = mpidist.Variable(0.0)


@mpidist.function
def step():
    time.sleep(0.01)
    w.assign_add(1.0)
    return 1


print("chief: training", flush=True)
while True:
    for _ in range(20):
        coordinator.schedule(step)
    coordinator.join()
