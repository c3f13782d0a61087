"""Ranks agree on the layout a resolver describes, before a job that has no collective
communicator starts (parameter servers: every rank must see the same chief, ps and worker
tasks, or a rank would serve as a ps that the others take for a worker, and wait forever).

The layout is the number of tasks of each job. Addresses are nominal over MPI, and the
resolvers may differ by rank (TF's Server idiom: the chief an MPIClusterResolver, the servers
a ClusterSpec). The check itself is ``mpidist.comm.config_agreement``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpidist.cluster_resolver.cluster_spec import normalize_cluster_spec
from mpidist.comm.config_agreement import agree_across_world

if TYPE_CHECKING:
    from mpidist.cluster_resolver.base import ClusterResolver

__all__ = ["agree_on_cluster", "layout_facts"]

_FIX = ("Every rank must describe the same cluster: the same jobs with the same numbers of "
        "tasks (TF_CONFIG's cluster, num_ps/jobs, the Server's ClusterSpec); only the task "
        "differs. Read them from one place, not per rank.")


def layout_facts(resolver: ClusterResolver) -> dict[str, dict[str, int]]:
    """``{"tasks per job": {job: count}}`` of ``resolver``'s cluster (empty for none)."""
    given = resolver.cluster_spec()
    spec = normalize_cluster_spec(given) if given else None
    return {"tasks per job": {job: spec.num_tasks(job) for job in spec.jobs} if spec else {}}


def agree_on_cluster(what: str, resolver: ClusterResolver) -> list[dict[str, Any]]:
    """Every rank's ``layout_facts(resolver)`` must be equal: InvalidArgumentError on every
    rank naming which rank has what; DeadlineExceededError naming the ranks that never arrive
    within ``MPIDIST_CONSTRUCTION_TIMEOUT``. Nothing to do in a one-rank job."""
    return agree_across_world(what, layout_facts(resolver), _FIX)
