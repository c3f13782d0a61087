"""MPIClusterResolver: the ranks of MPI_COMM_WORLD are the workers (the default of
MultiWorkerMirroredStrategy).

Once MPI is running it is the truth: rank, size, node-local rank and hosts come from the
communicator (``Split_type(COMM_TYPE_SHARED)`` and the processor names), not from launcher
variables, so the resolver works the same under mpiexec, mpirun and srun.
"""


import os

from mpidist.backend import num_gpus
from mpidist.cluster_resolver.base import ClusterResolver, format_master_url
from mpidist.cluster_resolver.cluster_spec import ClusterSpec
from mpidist.comm.communicator import world_communicator
from mpidist.core.devices import parse_device
from mpidist.logs import get_logger

__all__ = ["MPIClusterResolver"]

log = get_logger("mpidist.cluster_resolver")

ALL_GPUS = "all_gpus"


class MPIClusterResolver(ClusterResolver):
    """Workers are MPI ranks; rank 0 is the chief (worker 0, as there is no chief job).

    Creating the resolver starts MPI (collectively, on every rank).

    Args:
        local_devices: This worker's replica devices. None (the default): one GPU per rank,
            ``/gpu:<node-local rank % visible GPUs>``, when GPUs are visible, else ``/cpu:0``.
            ``"all_gpus"``: every visible GPU is a replica of this rank. A list of device
            strings (e.g. ``["/cpu:0", "/cpu:1"]`` for two CPU replicas per rank) is used as given.
        port_base: First port of the nominal addresses in ``cluster_spec()`` (MPI does not use
            them; they keep TF-style tools that print a cluster working).
        rpc_layer: Protocol named by ``master()``, None for none.
    """

    def __init__(self, local_devices=None, port_base=8888, rpc_layer=None):
        if local_devices is not None and local_devices != ALL_GPUS:
            if isinstance(local_devices, str):
                local_devices = [local_devices]
            local_devices = [str(parse_device(d)) for d in local_devices]
            if not local_devices:
                raise ValueError("local_devices must name at least one device, e.g. ['/cpu:0'].")
        self._requested = local_devices
        self._port_base = int(port_base)
        self._rpc_layer = rpc_layer
        self._comm = world_communicator()
        self._task_type = "worker"
        self._task_id = self._comm.rank

    @property
    def communicator(self):
        return self._comm

    @property
    def local_rank(self):
        """This rank's index among the ranks of its node."""
        return self._comm.local_rank

    @property
    def local_size(self):
        return self._comm.local_size

    @property
    def num_nodes(self):
        return self._comm.num_nodes

    def cluster_spec(self):
        """``{"worker": ["host:port", ...]}`` in rank order (ports count up per node)."""
        per_host = {}
        addresses = []
        for host in self._comm.hosts:
            k = per_host.get(host, 0)
            per_host[host] = k + 1
            addresses.append(f"{host}:{self._port_base + k}")
        return ClusterSpec({"worker": addresses})

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        if self._comm.size <= 1 and task_type is None:
            return ""
        task_id = self._task_id if task_id is None else task_id
        address = self.cluster_spec().task_address("worker", task_id)
        return format_master_url(address, rpc_layer or self._rpc_layer)

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        gpus = sum(1 for d in self.local_devices() if parse_device(d).is_gpu)
        return {"GPU": gpus} if gpus else {}

    def local_devices(self):
        """This worker's replica devices as device strings (see ``local_devices`` above)."""
        if self._requested is not None and self._requested != ALL_GPUS:
            return list(self._requested)
        visible = num_gpus()
        if visible == 0:
            return ["/cpu:0"]
        if self._requested == ALL_GPUS:
            return [f"/gpu:{i}" for i in range(visible)]
        narrowed = visible == 1 and os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() != ""
        if self._comm.local_size > visible and not narrowed:
            # (With one visible GPU named in CUDA_VISIBLE_DEVICES each rank was most likely given
            # its own by the launcher, e.g. Slurm's --gpus-per-task; `mpidist info` checks.)
            log.warning(
                "%d ranks on this node share %d visible GPU(s): ranks will share GPUs. Start one "
                "rank per GPU, or pass MPIClusterResolver(local_devices=...).",
                self._comm.local_size, visible)
        return [f"/gpu:{self._comm.local_rank % visible}"]
