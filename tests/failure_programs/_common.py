"""Shared set-up of the failure programs: the strategy, this rank and the world size.

The programs run as scripts (``python tests/failure_programs/NAME.py ...``) under mpiexec, so
this file is imported by its bare name from the script's own folder.
"""

import sys
import time

import numpy as np

import mpidist


def make_strategy(timeout_seconds=None, local_devices=None):
    """``(strategy, rank, size)`` of a MultiWorkerMirroredStrategy over MPI_COMM_WORLD."""
    options = mpidist.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    resolver = mpidist.cluster_resolver.MPIClusterResolver(local_devices=local_devices)
    strategy = mpidist.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                   communication_options=options)
    comm = resolver.communicator
    return strategy, comm.rank, comm.size


def train_step(strategy, length=3, dtype=np.float64):
    """One ordinary step: every replica returns ones; the sum crosses all ranks."""
    return strategy.reduce("SUM", strategy.run(lambda: np.ones(length, dtype=dtype)), axis=None)


def say(text):
    """Write one line in one call, so that lines of different ranks sharing the launcher's
    pipe do not interleave."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def now():
    return time.monotonic()


def arg(index, default):
    """The ``index``-th command-line argument as a float, or ``default``."""
    return float(sys.argv[index]) if len(sys.argv) > index else default
