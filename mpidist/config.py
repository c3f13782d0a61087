"""Runtime configuration: the one place that reads ``MPIDIST_*`` environment variables.

Precedence everywhere is: explicit argument > environment variable > default.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["Config", "get_config"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    warnings.warn(
        f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off. "
        f"Using the default {default}.",
        RuntimeWarning,
        stacklevel=3,
    )
    return default


def _env_number(name: str, default: Any, kind: Callable[[str], Any] = float, off: Any = None) -> Any:
    """A non-negative number from ``name``; ``off`` (e.g. None) for ``off``/``never``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("off", "never", "none"):
        return off
    try:
        number = kind(value)
    except ValueError:
        number = -1
    if number < 0:
        warnings.warn(
            f"{name}={raw!r} is not a non-negative {kind.__name__} (or 'off'). Using the default "
            f"{default}.",
            RuntimeWarning,
            stacklevel=3,
        )
        return default
    return number


def _env_deadline(name: str, default: float) -> float:
    """A finite positive number of seconds from ``name``. A deadline can be raised, never
    turned off: ``off``, ``inf`` and the like warn and keep the default."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        number = float(raw.strip())
    except ValueError:
        number = float("nan")
    if not (number > 0 and number != float("inf")):
        warnings.warn(
            f"{name}={raw!r} is not a finite positive number of seconds. mpidist never waits "
            f"without a deadline: give a larger number to wait longer. Using the default "
            f"{default:g} s.",
            RuntimeWarning,
            stacklevel=3,
        )
        return default
    return number


def _env_threads(name: str) -> int | str | None:
    """``auto`` (default), ``off`` (None) or a positive thread count."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    # A count, None for off, or the default "auto" where the value is not a count.
    number: int | str | None = _env_number(name, "auto", kind=int, off=None)
    if number == 0:
        warnings.warn(f"{name}=0 is not a thread count; using 'auto'.", RuntimeWarning, stacklevel=3)
        return "auto"
    return number


_THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


def _env_thread_level(name: str, default: str | None) -> str | None:
    """One of mpi4py's thread level names, or None for ``default`` (mpi4py's own)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw == "default":
        return None
    if raw in _THREAD_LEVELS:
        return raw
    warnings.warn(f"{name}={raw!r} is not one of {', '.join(_THREAD_LEVELS)} or 'default'. "
                  f"Using {default!r}.", RuntimeWarning, stacklevel=3)
    return default


def _env_ps_pickle(name: str) -> str:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "by_value", "by_name"):
        return raw or "by_value"
    warnings.warn(f"{name}={raw!r} is not 'by_value' or 'by_name'. Using 'by_value'.",
                  RuntimeWarning, stacklevel=3)
    return "by_value"


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings read once from the environment.

    Attributes:
        log_level: ``MPIDIST_LOG`` (``""`` = silent, ``info``, ``debug``).
        gpu_aware_mpi: ``MPIDIST_GPU_AWARE_MPI``: whether the MPI library reads GPU memory (1) or
            not (0), overriding what mpidist finds out (``comm.cuda_aware``); unset: found out.
        check_collectives: ``MPIDIST_CHECK_COLLECTIVES``: ranks agree on a fingerprint of
            each collective (sequence number, operation, dtype, shape) before moving data.
        stall_warning_seconds: ``MPIDIST_STALL_SECONDS``: a collective without a timeout that
            has waited this long logs which ranks are missing (None: never).
        shm_min_bytes: ``MPIDIST_SHM_MIN_BYTES``: all-reduces of at least this many bytes
            between ranks of one node use the shared-memory path (None: never).
        abort_on_exception: ``MPIDIST_ABORT_ON_EXCEPTION``: an uncaught exception on any rank
            of a multi-rank job ends the whole job (MPI_Abort) after printing its traceback.
        cpu_threads: ``MPIDIST_CPU_THREADS``: the BLAS / OpenMP threads each rank of a
            multi-worker job may use. ``"auto"`` (default): the cores the rank is bound to, or
            the node's cores shared out among its ranks, unless OMP_NUM_THREADS,
            OPENBLAS_NUM_THREADS or MKL_NUM_THREADS is set; an int: that many; None
            (``off``): leave the thread pools alone.
        timeline_path: ``MPIDIST_TIMELINE``: write a Chrome trace of every collective on every
            rank to this path at exit (None: off).
        rank_state_path: ``MPIDIST_RANK_STATE``: the file in which the communicator records
            the last collective this rank entered, for ``mpidist.guard``'s report when the rank
            dies (set by the guard; None: off).
        full_tracebacks: ``MPIDIST_FULL_TRACEBACKS``: the report of an uncaught exception on
            a rank shows mpidist's own frames too (default: the user's frames and the public
            call they made, with the library's frames counted but hidden).
        shm_min_bytes_one_node: ``MPIDIST_SHM_MIN_BYTES_ONE_NODE``: on a one-node job, the
            size from which the shared-memory all-reduce beats the MPI library's (measured:
            docs/multi_worker.md); never below ``shm_min_bytes``. None (``off``): never.
        shm_min_bytes_across_nodes: ``MPIDIST_SHM_MIN_BYTES_ACROSS_NODES``: the same for a
            job on several nodes (shared memory inside each node, MPI between them).
        mpi_thread_level: ``MPIDIST_MPI_THREAD_LEVEL``: the MPI thread level that mpidist
            asks for when it starts MPI: ``single``, ``funneled``, ``serialized`` (default)
            or ``multiple``; a higher level chosen by the program (``mpi4py.rc``) wins.
            None (``default``): leave mpi4py's own default (``multiple``).
        num_ps: ``MPIDIST_NUM_PS``: the parameter-server ranks a ParameterServerStrategy job
            has when its resolver does not say (default 1; docs/ps.md).
        ps_timeout: ``MPIDIST_PS_TIMEOUT``: seconds a request to a parameter server may wait
            for its answer before the server counts as failed (default 60).
        ps_connect_timeout: ``MPIDIST_PS_CONNECT_TIMEOUT``: seconds the chief waits for every
            rank of a parameter-server job to report in at start (default 300).
        ps_heartbeat_seconds: ``MPIDIST_PS_HEARTBEAT_SECONDS``: how often a worker tells the
            chief it is alive; three silent intervals mark it failed (default 2).
        ps_inflight_per_worker: ``MPIDIST_PS_INFLIGHT_PER_WORKER``: closures the coordinator
            keeps in flight on each worker (default 2).
        ps_poll_max_sleep: ``MPIDIST_PS_POLL_MAX_SLEEP``: the longest sleep, in seconds, of
            an idle parameter-server or worker loop between polls (default 0.001).
        ps_poll_spin_seconds: ``MPIDIST_PS_POLL_SPIN_SECONDS``: how long an idle server or
            worker loop keeps polling (yielding the core) after its last message before it
            starts to sleep (default 0.002; a request takes microseconds, a sleep at least 50 µs;
            waits for a reply poll at least 20 ms).
        ps_faults: ``MPIDIST_PS_FAULTS``: faults to inject in a parameter-server job, for
            tests (docs/ps.md, "Fault injection"); "" for none.
        ps_pickle: ``MPIDIST_PS_PICKLE``: ``by_value`` (default) lets scheduled functions
            that cannot be imported on workers travel by value (cloudpickle); ``by_name``
            refuses them.
        ps_closure_timeout: ``MPIDIST_PS_CLOSURE_TIMEOUT``: seconds a scheduled function may
            run on a worker before it fails with DeadlineExceededError naming the function and
            the worker (default 1800; docs/ps.md, "Deadlines").
        ps_coordinator_timeout: ``MPIDIST_PS_COORDINATOR_TIMEOUT``: seconds a ps or worker
            rank goes on without hearing from the chief (which sends a heartbeat every
            ``ps_heartbeat_seconds``) before it decides the chief is gone and ends (default 30).
        collective_timeout: ``MPIDIST_COLLECTIVE_TIMEOUT``: seconds a collective across ranks
            may take when its CommunicationOptions give no ``timeout_seconds`` (default 600,
            NCCL's watchdog default in torch.distributed); then DeadlineExceededError names
            the ranks that never arrived. Finite: a deadline can be raised, not turned off.
        wait_timeout: ``MPIDIST_WAIT_TIMEOUT``: seconds any other wait inside one process may
            last without progress (replica threads at merge_call, a thread's exit, the
            coordinator's join and fetch; default 600).
        construction_timeout: ``MPIDIST_CONSTRUCTION_TIMEOUT``: seconds the ranks of a job
            wait for each other when a strategy is built and agree on its configuration
            (default 300).
        peer_watch: ``MPIDIST_PEER_WATCH``: a collective job watches for dead ranks (one TCP
            connection from each rank to rank 0; docs/launching.md) and ends the job within
            seconds of a death (default on); off, a death is noticed at the collective deadline.
        set_variables: The ``MPIDIST_*`` names present in the environment (so a report can
            say whether a setting came from the user or is the default).
    """

    log_level: str = ""
    gpu_aware_mpi: bool = False
    check_collectives: bool = True
    stall_warning_seconds: float = 60.0
    shm_min_bytes: int = 256 * 1024
    abort_on_exception: bool = True
    cpu_threads: int | str | None = "auto"
    timeline_path: str | None = None
    rank_state_path: str | None = None
    full_tracebacks: bool = False
    shm_min_bytes_one_node: int = 32 << 20
    shm_min_bytes_across_nodes: int = 512 << 10
    mpi_thread_level: str | None = "serialized"
    num_ps: int = 1
    ps_timeout: float = 60.0
    ps_connect_timeout: float = 300.0
    ps_heartbeat_seconds: float = 2.0
    ps_inflight_per_worker: int = 2
    ps_poll_max_sleep: float = 0.001
    ps_poll_spin_seconds: float = 0.002
    ps_faults: str = ""
    ps_pickle: str = "by_value"
    ps_closure_timeout: float = 1800.0
    ps_coordinator_timeout: float = 30.0
    collective_timeout: float = 600.0
    wait_timeout: float = 600.0
    construction_timeout: float = 300.0
    peer_watch: bool = True
    set_variables: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            set_variables=frozenset(k for k in os.environ if k.startswith("MPIDIST_")),
            log_level=os.environ.get("MPIDIST_LOG", "").strip().lower(),
            gpu_aware_mpi=_env_bool("MPIDIST_GPU_AWARE_MPI", False),
            check_collectives=_env_bool("MPIDIST_CHECK_COLLECTIVES", True),
            stall_warning_seconds=_env_number("MPIDIST_STALL_SECONDS", 60.0),
            shm_min_bytes=_env_number("MPIDIST_SHM_MIN_BYTES", 256 * 1024, kind=int),
            abort_on_exception=_env_bool("MPIDIST_ABORT_ON_EXCEPTION", True),
            cpu_threads=_env_threads("MPIDIST_CPU_THREADS"),
            timeline_path=os.environ.get("MPIDIST_TIMELINE", "").strip() or None,
            rank_state_path=os.environ.get("MPIDIST_RANK_STATE", "").strip() or None,
            full_tracebacks=_env_bool("MPIDIST_FULL_TRACEBACKS", False),
            shm_min_bytes_one_node=_env_number("MPIDIST_SHM_MIN_BYTES_ONE_NODE", 32 << 20,
                                               kind=int),
            shm_min_bytes_across_nodes=_env_number("MPIDIST_SHM_MIN_BYTES_ACROSS_NODES",
                                                   512 << 10, kind=int),
            mpi_thread_level=_env_thread_level("MPIDIST_MPI_THREAD_LEVEL", "serialized"),
            num_ps=_env_number("MPIDIST_NUM_PS", 1, kind=int),
            ps_timeout=_env_deadline("MPIDIST_PS_TIMEOUT", 60.0),
            ps_connect_timeout=_env_deadline("MPIDIST_PS_CONNECT_TIMEOUT", 300.0),
            ps_heartbeat_seconds=_env_number("MPIDIST_PS_HEARTBEAT_SECONDS", 2.0),
            ps_inflight_per_worker=max(1, _env_number("MPIDIST_PS_INFLIGHT_PER_WORKER", 2,
                                                      kind=int)),
            ps_poll_max_sleep=_env_number("MPIDIST_PS_POLL_MAX_SLEEP", 0.001),
            ps_poll_spin_seconds=_env_number("MPIDIST_PS_POLL_SPIN_SECONDS", 0.002),
            ps_faults=os.environ.get("MPIDIST_PS_FAULTS", "").strip(),
            ps_pickle=_env_ps_pickle("MPIDIST_PS_PICKLE"),
            ps_closure_timeout=_env_deadline("MPIDIST_PS_CLOSURE_TIMEOUT", 1800.0),
            ps_coordinator_timeout=_env_deadline("MPIDIST_PS_COORDINATOR_TIMEOUT", 30.0),
            collective_timeout=_env_deadline("MPIDIST_COLLECTIVE_TIMEOUT", 600.0),
            wait_timeout=_env_deadline("MPIDIST_WAIT_TIMEOUT", 600.0),
            construction_timeout=_env_deadline("MPIDIST_CONSTRUCTION_TIMEOUT", 300.0),
            peer_watch=_env_bool("MPIDIST_PEER_WATCH", True),
        )


_config: Config | None = None


def get_config() -> Config:
    """The process-wide Config, read from the environment on first use."""
    global _config
    if _config is None:
        _config = Config.from_env()
    return _config
