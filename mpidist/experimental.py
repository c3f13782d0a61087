"""``mpidist.experimental``: TF's ``tf.distribute.experimental`` names."""

from mpidist.comm.options import (
    CollectiveCommunication,
    CollectiveHints,
    CommunicationImplementation,
    CommunicationOptions,
)

__all__ = ["CollectiveCommunication", "CollectiveHints", "CommunicationImplementation",
           "CommunicationOptions"]
