"""``mpidist.experimental``: TF's ``tf.distribute.experimental`` names."""

from mpidist.comm.options import (
    CollectiveCommunication,
    CollectiveHints,
    CommunicationImplementation,
    CommunicationOptions,
)
from mpidist.experimental import coordinator, partitioners
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.ps.strategy import ParameterServerStrategy
from mpidist.ps.variables import cache_variable_reads, read_variables
from mpidist.strategies.central_storage import CentralStorageStrategy

__all__ = ["CentralStorageStrategy", "CollectiveCommunication", "CollectiveHints",
           "CommunicationImplementation", "CommunicationOptions", "ParameterServerStrategy",
           "ShardedVariable", "cache_variable_reads", "coordinator", "partitioners",
           "read_variables"]
