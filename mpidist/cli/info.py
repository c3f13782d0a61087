"""``mpidist info``: the job as mpidist sees it, and the launch problems it can detect.

Every rank collects its own facts (host, ranks, device, GPUs, threads, library versions);
rank 0 gathers them, looks for problems with ``find_problems`` (a pure function of the
gathered facts) and prints one report. A launch that MPI does not see as one job (N singleton
ranks) is reported, not raised: each process then prints its own report naming the problem.
"""

import importlib.metadata
import logging
import os
import platform
import socket
import sys
from collections.abc import Iterable, Mapping
from typing import Any, cast

from mpidist.backend import cupy_backend
from mpidist.backend.threads import threads_per_rank
from mpidist.cli.gpu_components import gpu_components
from mpidist.comm.cuda_aware import cuda_aware_mpi
from mpidist.comm.mpi import check_launch, mpi_module
from mpidist.config import get_config
from mpidist.launcher_env import launcher_variables

__all__ = ["collect", "find_problems", "library_facts", "rank_facts", "render_report",
           "gpu_facts", "gpu_identity", "THREAD_LEVELS"]

THREAD_LEVELS = ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")
_AWARE = {True: "yes", False: "no", None: "unknown"}

_ONE_RANK_PER_GPU = (
    "start at most one rank per GPU on each node (mpiexec -n <GPUs per node> per node, or srun "
    "--ntasks-per-node=<GPUs> --gpus-per-task=1 --gpu-bind=none), or give each rank its own "
    "devices with MPIClusterResolver(local_devices=[...]). NCCL refuses two ranks on one GPU "
    "('Duplicate GPU detected'); with MPS, sharing is deliberate and this can be ignored."
)


def _version(dist: str | Iterable[str], module: str | None = None) -> str | None:
    """Installed version of the distribution ``dist``, without importing it (None if absent)."""
    for name in (dist,) if isinstance(dist, str) else dist:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    mod = sys.modules.get(module or "")
    return getattr(mod, "__version__", None)


def _cupy_version() -> str | None:
    mod = sys.modules.get("cupy")
    if mod is not None:
        return getattr(mod, "__version__", None)
    return _version(("cupy", "cupy-cuda12x", "cupy-cuda11x", "cupy-cuda13x", "cupy-rocm-5-0"))


def library_facts(mpi: Any) -> dict[str, Any]:
    """Facts about the libraries of this process (the same on every rank of a sane job)."""
    import mpi4py  # noqa: PLC0415

    import mpidist  # noqa: PLC0415 - the api layer's version string

    vendor, vendor_version = mpi.get_vendor()
    standard = mpi.Get_version()
    provided = mpi.Query_thread()
    library = mpi.Get_library_version().strip()
    config = get_config()
    cupy_version = _cupy_version()
    if cupy_version:
        from mpidist.comm import nccl  # noqa: PLC0415 - loads CuPy when present

        nccl_version, nccl_reason = nccl.nccl_version(), nccl.nccl_unavailable_reason()
    else:
        nccl_version, nccl_reason = None, "CuPy is not installed"
    cuda_aware, cuda_aware_how = cuda_aware_mpi()
    return {
        "mpidist": getattr(mpidist, "__version__", None),
        "python": platform.python_version(),
        "mpi4py": mpi4py.__version__,
        "numpy": _version("numpy", "numpy"),
        "numba": _version("numba", "numba"),
        "cupy": cupy_version,
        "nccl": nccl_version,
        "nccl_status": nccl_reason,
        "threadpoolctl": _version("threadpoolctl", "threadpoolctl"),
        "mpi": {
            "vendor": f"{vendor} {'.'.join(map(str, vendor_version))}",
            "library": " ".join(library.splitlines()[0].split()) if library else "",
            "library_version": library,
            "standard": f"{standard[0]}.{standard[1]}",
            "thread_level": _thread_name(mpi, provided),
            "thread_level_requested": str(getattr(mpi4py.rc, "thread_level", "")).upper(),
        },
        "gpu_components": gpu_components(),
        # True / False / None (cannot be told: device buffers are staged), and how it was found
        "gpu_aware_mpi": {"enabled": cuda_aware, "source": cuda_aware_how},
        "config": {
            "shm_min_bytes": config.shm_min_bytes,
            "check_collectives": config.check_collectives,
            "cpu_threads": config.cpu_threads,
            "abort_on_exception": config.abort_on_exception,
        },
    }


def _thread_name(mpi: Any, level: int) -> str:
    for name in THREAD_LEVELS:
        if getattr(mpi, f"THREAD_{name}", None) == level:
            return name
    return str(level)


def gpu_facts() -> tuple[list[dict[str, Any]], str | None]:
    """``(gpus, reason)``: one dict per visible GPU (index, name, uuid, pci, memory) and why
    there are none when the list is empty."""
    cupy = cupy_backend.get_cupy()
    if cupy is None:
        return [], cupy_backend.unavailable_reason()
    count = cupy_backend.gpu_count()
    if count == 0:
        return [], cupy_backend.unavailable_reason()
    gpus = []
    for index in range(count):
        entry: dict[str, Any] = {"index": index}
        try:
            props = cupy.cuda.runtime.getDeviceProperties(index)
        except Exception as exc:  # noqa: BLE001 - a device that cannot be queried is still listed
            entry["error"] = f"{type(exc).__name__}: {exc}"
            gpus.append(entry)
            continue
        name = props.get("name", b"")
        entry["name"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        uuid = props.get("uuid")
        if isinstance(uuid, (bytes, bytearray)) and len(uuid) == 16:
            h = uuid.hex()
            entry["uuid"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        if "pciBusID" in props:
            entry["pci_bus_id"] = (f"{props.get('pciDomainID', 0):04x}:{props['pciBusID']:02x}:"
                                   f"{props.get('pciDeviceID', 0):02x}.0")
        if "totalGlobalMem" in props:
            entry["memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
        gpus.append(entry)
    return gpus, None


def _blas_threads() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info  # noqa: PLC0415
    except ImportError:
        return []
    return [{"library": p.get("internal_api"), "api": p.get("user_api"),
             "threads": p.get("num_threads"), "version": p.get("version")}
            for p in threadpool_info()]


def _default_device(launch_ok: bool, local_rank: int, visible: int) -> str:
    """The device mpidist's default MPIClusterResolver() gives this rank."""
    if launch_ok:
        from mpidist.cluster_resolver import MPIClusterResolver  # noqa: PLC0415

        resolver_log = logging.getLogger("mpidist.cluster_resolver")
        level = resolver_log.level
        resolver_log.setLevel(logging.ERROR)  # its shared-GPU warning is a problem listed below
        try:
            return MPIClusterResolver().local_devices()[0]
        finally:
            resolver_log.setLevel(level)
    # A singleton rank is alone on its node: the resolver's rule gives local rank 0.
    return f"/gpu:{local_rank % visible}" if visible else "/cpu:0"


def rank_facts(comm: Any, launch_error: str | None,
               environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This rank's facts, given its Communicator and the launch check's error (or None)."""
    environ = os.environ if environ is None else environ
    gpus, gpu_reason = gpu_facts()
    device = _default_device(launch_error is None, comm.local_rank, len(gpus))
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "rank": comm.rank,
        "size": comm.size,
        "host": comm.hosts[comm.rank] if comm.hosts else socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": comm.local_rank,
        "local_size": comm.local_size,
        "node_index": comm.node_index,
        "nodes": comm.num_nodes,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "blas": _blas_threads(),
        "cpu_threads_cap": threads_per_rank(comm.local_size, get_config().cpu_threads, environ),
        "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus,
        "gpu_status": gpu_reason,
        "device": device,
        "launcher": launcher_variables(environ),
        "launch_error": launch_error,
    }


def gpu_identity(facts: dict[str, Any]) -> str | None:
    """What names the physical GPU of a rank's default device, or None for a CPU device:
    its UUID when known, else its entry in CUDA_VISIBLE_DEVICES, else its index."""
    device = facts.get("device") or ""
    if not device.startswith("/gpu:"):
        return None
    index = int(device.split(":")[1])
    gpus = facts.get("gpus") or []
    if index < len(gpus) and gpus[index].get("uuid"):
        return cast(str, gpus[index]["uuid"])
    visible = facts.get("cuda_visible_devices")
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index < len(entries):
            return f"CUDA_VISIBLE_DEVICES entry {entries[index]}"
    return f"GPU {index}"


def _problem(kind: str, severity: str, ranks: Iterable[int], message: str, fix: str
             ) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "ranks": sorted(ranks), "message": message,
            "fix": fix}


def find_problems(ranks: list[dict[str, Any]],
                  libraries: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The problems visible in the gathered per-rank facts (``rank_facts`` dicts, rank order).

    Each is ``{"kind", "severity" ("error" or "warning"), "ranks", "message", "fix"}``:
    ``singleton-ranks`` / ``launch-mismatch`` (the launcher and MPI disagree about the job
    size), ``shared-gpu`` (two ranks of one node default to the same GPU), ``oversubscribed``
    (more ranks on a node than it has cores) and ``version-mismatch`` (ranks run different
    library versions; ``libraries`` is then the per-rank list of ``library_facts``).
    """
    problems = []
    for facts in ranks:
        error = facts.get("launch_error")
        if not error:
            continue
        message, _, fix = error.partition(" Fix: ")
        if not fix:
            message, _, fix = error.partition(". Launch with ")
            fix = "Launch with " + fix if fix else "launch with the MPI that mpi4py was built with"
            message += "."
        kind = "singleton-ranks" if facts.get("size") == 1 else "launch-mismatch"
        problems.append(_problem(kind, "error", [facts["rank"]], message, fix))

    by_gpu: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for facts in ranks:
        identity = gpu_identity(facts)
        if identity is not None:
            by_gpu.setdefault((facts.get("host"), identity), []).append(facts)
    for (host, identity), sharing in sorted(by_gpu.items(), key=lambda kv: kv[1][0]["rank"]):
        if len(sharing) > 1:
            ranks_on = [f["rank"] for f in sharing]
            devices = ", ".join(f"rank {f['rank']} {f['device']}" for f in sharing)
            problems.append(_problem(
                "shared-gpu", "error", ranks_on,
                f"ranks {ranks_on} on {host} all default to the same GPU ({identity}; {devices}).",
                _ONE_RANK_PER_GPU))

    by_node: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for facts in ranks:
        by_node.setdefault((facts.get("node_index"), facts.get("host")), []).append(facts)
    for (_, host), on_node in sorted(by_node.items(), key=lambda kv: kv[1][0]["rank"]):
        cores = max((f.get("cpu_count") or 0) for f in on_node)
        if cores and len(on_node) > cores:
            problems.append(_problem(
                "oversubscribed", "warning", [f["rank"] for f in on_node],
                f"{len(on_node)} ranks run on {host}, which has {cores} cores: ranks that "
                "busy-poll in MPI collectives take turns on the cores (small collectives are "
                "several times slower).",
                f"start at most {cores} ranks on this node (fewer ranks per node, or more "
                "nodes); fine for tests, not for timing."))

    if libraries:
        keys = ("mpidist", "mpi4py", "numpy", "numba", "cupy", "nccl")
        differing = [k for k in keys if len({lib.get(k) for lib in libraries}) > 1]
        if len({lib["mpi"]["library"] for lib in libraries}) > 1:
            differing.append("MPI library")
        if differing:
            problems.append(_problem(
                "version-mismatch", "warning", list(range(len(libraries))),
                f"ranks run different versions of: {', '.join(differing)}.",
                "install the same environment on every node (one virtual environment on a "
                "shared file system, or the same container image)."))
    return problems


def collect() -> dict[str, Any] | None:
    """Run on every rank: ``report`` dict on rank 0, None elsewhere.

    The report is ``{"ranks", "nodes", "library", "per_rank", "problems"}``.
    """
    mpi = mpi_module()
    world = mpi.COMM_WORLD
    try:
        check_launch(world.Get_size())
        launch_error = None
    except RuntimeError as err:
        launch_error = str(err)
    if launch_error is None:
        from mpidist.comm.communicator import world_communicator  # noqa: PLC0415

        comm = world_communicator()
    else:  # MPI sees one job of this size; describe it (passing the comm skips the check)
        from mpidist.comm.communicator import Communicator  # noqa: PLC0415

        comm = Communicator(world)
    mine = rank_facts(comm, launch_error)
    library = library_facts(mpi)
    gathered = comm.all_gather_object((mine, library))
    if comm.rank != 0:
        return None
    per_rank = [facts for facts, _ in gathered]
    libraries = [lib for _, lib in gathered]
    return {
        "ranks": comm.size,
        "nodes": comm.num_nodes,
        "hosts": sorted({f["host"] for f in per_rank}),
        "library": library,
        "per_rank": per_rank,
        "problems": find_problems(per_rank, libraries),
    }


def _device_text(facts: dict[str, Any]) -> str:
    device: str = facts["device"]
    identity = gpu_identity(facts)
    if identity is None:
        return device
    gpus = facts.get("gpus") or []
    index = int(device.split(":")[1])
    name = gpus[index].get("name", "") if index < len(gpus) else ""
    bus = gpus[index].get("pci_bus_id", "") if index < len(gpus) else ""
    return " ".join(x for x in (device, name, bus) if x)


def _blas_text(facts: dict[str, Any]) -> str:
    pools = facts.get("blas") or []
    now = ", ".join(f"{p['library']} {p['threads']}" for p in pools) or "none loaded"
    cap = facts.get("cpu_threads_cap")
    return now + (f" (MWMS caps to {cap})" if cap is not None else "")


def render_report(report: dict[str, Any]) -> str:
    """The human-readable ``mpidist info`` report."""
    lib = report["library"]
    mpi = lib["mpi"]
    lines = [
        f"mpidist {lib['mpidist']}: {report['ranks']} rank(s) on {report['nodes']} node(s) "
        f"({', '.join(report['hosts'])})",
        "",
        f"MPI library     {mpi['library']}",
        f"MPI             {mpi['vendor']}, MPI standard {mpi['standard']}, thread level "
        f"{mpi['thread_level']} (requested {mpi['thread_level_requested']})",
        f"GPU-aware MPI   {_AWARE[lib['gpu_aware_mpi']['enabled']]} "
        f"({lib['gpu_aware_mpi']['source']}; device buffers "
        + ("go straight to MPI)" if lib["gpu_aware_mpi"]["enabled"]
           else "are staged through host memory)"),
        f"Versions        python {lib['python']}, mpi4py {lib['mpi4py']}, numpy {lib['numpy']}, "
        f"numba {lib['numba'] or 'not installed'}, cupy {lib['cupy'] or 'not installed'}",
        f"NCCL            {lib['nccl'] or 'not available'}"
        + ("" if lib["nccl"] and lib["nccl"] != "unknown" else f" ({lib['nccl_status']})"),
        *_component_lines(lib.get("gpu_components") or []),
        f"Collectives     checks {'on' if lib['config']['check_collectives'] else 'off'}, "
        "shared-memory all-reduce from "
        + (_bytes(shm) if (shm := lib["config"]["shm_min_bytes"]) is not None else "never"),
        "",
    ]
    header = ("rank", "node", "host", "local", "device", "GPUs", "CUDA_VISIBLE_DEVICES", "cores",
              "BLAS threads")
    rows = []
    for f in report["per_rank"]:
        gpus = len(f.get("gpus") or [])
        cores = str(f.get("cpu_count"))
        if f.get("cpu_affinity") is not None and f["cpu_affinity"] != f.get("cpu_count"):
            cores += f" (bound to {f['cpu_affinity']})"
        rows.append((str(f["rank"]), str(f["node_index"]), f["host"],
                     f"{f['local_rank']}/{f['local_size']}", _device_text(f), str(gpus),
                     f.get("cuda_visible_devices") or "(unset)", cores, _blas_text(f)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    first = report["per_rank"][0]
    if not first.get("gpus"):
        lines.append(f"(no GPU: {first.get('gpu_status')})")
    launcher = first.get("launcher") or {}
    lines.append("Launcher (rank 0): " + (", ".join(f"{k}={v}" for k, v in launcher.items())
                                          or "none (started without a launcher)"))
    lines.append("")
    problems = report["problems"]
    if not problems:
        lines.append("Problems: none")
    else:
        lines.append(f"Problems ({len(problems)}):")
        for p in problems:
            lines.append(f"  {p['severity'].upper()} [{p['kind']}] ranks {p['ranks']}: "
                         f"{p['message']}")
            lines.append(f"    fix: {p['fix']}")
    return "\n".join(lines)


def _component_lines(components: list[dict[str, Any]]) -> list[str]:
    """One line per GPU component: status, version, detail, and the fix of what is missing."""
    lines = []
    for i, c in enumerate(components):
        label = "GPU stack" if i == 0 else ""
        text = f"{c['name']} {c['version']}" if c["version"] else c["name"]
        text += f": {c['status']}" + (f" ({c['detail']})" if c["detail"] else "")
        if c["fix"]:
            text += f"; fix: {c['fix']}"
        lines.append(f"{label:<15} {text}")
    return lines


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
