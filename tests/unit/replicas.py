"""Helpers shared by the unit tests: strategies over virtual CPU devices and the replica id."""

import mpidist


def mirrored(n):
    """A fresh MirroredStrategy over ``n`` virtual CPU devices (the spec's ``S(n)``)."""
    return mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def rid():
    """The current replica's id (an int32 scalar; int 0 in the default replica context)."""
    return mpidist.get_replica_context().replica_id_in_sync_group
