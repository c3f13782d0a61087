"""Cluster resolvers (TF's ``tf.distribute.cluster_resolver``): who the other tasks are.

``TFConfigClusterResolver`` reads ``$TF_CONFIG``, ``SlurmClusterResolver`` a Slurm step (or
mpirun inside one), ``SimpleClusterResolver`` holds what it is given. Importing this package
loads no MPI, CUDA or Numba.
"""

from mpidist.cluster_resolver.base import ClusterResolver, SimpleClusterResolver
from mpidist.cluster_resolver.cluster_spec import ClusterSpec
from mpidist.cluster_resolver.hostlist import expand_hostlist, expand_tasks_per_node
from mpidist.cluster_resolver.slurm import SlurmClusterResolver
from mpidist.cluster_resolver.tfconfig import TFConfigClusterResolver

__all__ = [
    "ClusterSpec",
    "ClusterResolver",
    "SimpleClusterResolver",
    "TFConfigClusterResolver",
    "SlurmClusterResolver",
    "expand_hostlist",
    "expand_tasks_per_node",
]

from mpidist.cluster_resolver.mpi import MPIClusterResolver  # noqa: F401 - in __all__ below; starts MPI only when created

__all__.append("MPIClusterResolver")
