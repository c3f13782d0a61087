"""Communicator: buffer collectives across MPI ranks that never hang silently.

Every collective goes through one path:

1. the rank records on the progress board that it entered collective #seq;
2. unless checks are off, the ranks agree on a fingerprint of the call (sequence number,
   operation, dtype, shape, reduce op, root) with one 16-byte all-reduce; a disagreement
   raises the same clear InvalidArgumentError on every rank before any data moves;
3. the data moves as buffers (never pickled) through a non-blocking MPI collective, or the
   shared-memory path for large all-reduces inside a node, polled against a deadline: past
   ``timeout`` it raises DeadlineExceededError naming the ranks that never arrived.

After a timeout the communicator is broken (an MPI request is left pending): further calls
raise UnavailableError, and at exit the rank aborts the job so that no peer waits forever.
"""

import atexit
import os
import threading
import time
import zlib

import numpy as np

from mpidist.comm.board import ProgressBoard
from mpidist.comm.mpi import check_launch, install_abort_on_exception, mpi_module, abort_job
from mpidist.comm.rank_state import RankStateWriter
from mpidist.comm.shared_memory import SharedMemoryAllReduce
from mpidist.comm.timeline import Timeline
from mpidist.config import get_config
from mpidist.core.user_calls import current_calls, describe_calls
from mpidist.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError
from mpidist.kernels.arrays import is_device_array
from mpidist.logs import get_logger, set_rank

__all__ = ["Communicator", "CollectiveCall", "world_communicator"]

log = get_logger("mpidist.comm")

_REDUCE_OPS = ("sum", "max", "min", "prod")
_CRC_CACHE = {}
_world = None
_world_lock = threading.Lock()


class CollectiveCall:
    """What one rank asked for: the operation, the fields that every rank must agree on, and
    the chain of the user's public calls that issued it (``core.user_calls``), whose names and
    arguments (the user's reduce op, axis, ...) are agreed on too."""

    __slots__ = ("operation", "fields", "calls")

    def __init__(self, operation, **fields):
        self.operation = operation
        self.fields = tuple(fields.items())
        self.calls = current_calls()

    def describe(self):
        inner = ", ".join(f"{k}={_show(v)}" for k, v in self.fields)
        text = f"{self.operation}({inner})"
        if self.operation == "finalize":
            return text + " at the end of the program"
        return f"{text} in {describe_calls(self.calls)}" if self.calls else text

    @classmethod
    def from_parts(cls, operation, fields, calls):
        """A call as another rank described it (``operation``, ``fields``, ``calls``)."""
        call = cls(operation, **dict(fields))
        call.calls = calls
        return call

    def fingerprint(self, seq):
        key = (self.operation, self.fields, self.calls)
        crc = _CRC_CACHE.get(key)
        if crc is None:
            if len(_CRC_CACHE) > 4096:  # a program has a few fixed collectives; bound anyway
                _CRC_CACHE.clear()
            crc = _CRC_CACHE[key] = zlib.crc32(repr(key).encode())
        return (seq << 32) | crc


def _dtype_name(dtype, _names={}):  # noqa: B006 - a deliberate process-wide cache
    """``dtype.name``, cached: NumPy builds the name string on every access (~1 us)."""
    name = _names.get(dtype)
    if name is None:
        name = _names[dtype] = dtype.name
    return name


def _show(value):
    if isinstance(value, tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def world_communicator():
    """The process-wide Communicator over MPI_COMM_WORLD (created on first use, collectively)."""
    global _world
    with _world_lock:
        if _world is None:
            _world = Communicator()
        return _world


class Communicator:
    """Collectives over an MPI communicator, with topology, checks and deadlines.

    Creating one is collective over ``comm`` (it is duplicated, so mpidist's traffic never
    matches the application's own MPI calls).

    Args:
        comm: An ``mpi4py.MPI.Comm``; COMM_WORLD when None.

    Attributes:
        shm_min_bytes: SUM all-reduces of at least this many bytes take the shared-memory
            path (hierarchical across nodes): the measured crossover for this topology
            (``MPIDIST_SHM_MIN_BYTES_ONE_NODE`` / ``_ACROSS_NODES``), None for never.
        allreduce_algorithm: ``"auto"`` (by size, as above), ``"mpi"`` (always the MPI
            library's Allreduce) or ``"shm"`` (always shared memory where available); for
            benchmarks and tests.
        thread_level: ``MPI.Query_thread()``, the thread level MPI provides.
    """

    def __init__(self, comm=None):
        mpi = mpi_module()
        self._mpi = mpi
        self._mpi_ops = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN, "prod": mpi.PROD}
        base = mpi.COMM_WORLD if comm is None else comm
        if comm is None:
            check_launch(base.Get_size())
        self._comm = base.Dup()
        self._control = base.Dup()  # board exchange after a timeout, off the data path
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self._node = self._comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = self._node.Get_rank()
        self.local_size = self._node.Get_size()
        node_ranks = self._node.allgather(self.rank)
        self._node_ranks = frozenset(node_ranks)
        # Below MULTIPLE, only the thread inside the collective may call MPI (the watchdog
        # then reports from this node's board alone).
        self.thread_level = mpi.Query_thread()
        self._threads_may_overlap = self.thread_level >= mpi.THREAD_MULTIPLE
        hosts_and_sizes = self._comm.allgather((mpi.Get_processor_name(), self.local_size,
                                                min(node_ranks)))
        self.hosts = [h for h, _, _ in hosts_and_sizes]
        leaders = sorted({leader for _, _, leader in hosts_and_sizes})
        self.node_index = leaders.index(min(node_ranks))
        self.num_nodes = len(leaders)
        self._board = ProgressBoard(mpi, self._node, node_ranks)
        uniform = len({s for _, s, _ in hosts_and_sizes}) == 1
        self._cross = self._comm.Split(self.local_rank, self.rank) \
            if self.num_nodes > 1 and uniform else None
        self._shm = SharedMemoryAllReduce(mpi, self._node, self._cross) \
            if uniform and self.local_size > 1 else None
        self._seq = 0
        self._broken = None
        self._watchdog_thread = None
        self._lock = threading.RLock()
        self._fp_send = np.zeros(2, dtype=np.int64)
        self._fp_recv = np.zeros(2, dtype=np.int64)
        config = get_config()
        self._rank_state = RankStateWriter.attach(config.rank_state_path, self.rank, self.size)
        self.check_collectives = config.check_collectives
        self.shm_min_bytes = _shm_threshold(config, self.num_nodes)
        self.allreduce_algorithm = "auto"
        self._gpu_aware = config.gpu_aware_mpi
        self._stall_seconds = config.stall_warning_seconds
        self._timeline = Timeline(config.timeline_path, self.rank, self.size, self.hosts) \
            if config.timeline_path else None
        set_rank(self.rank, self.size)
        self._debug = log.isEnabledFor(10)  # logging.DEBUG: a line per collective
        log.info("communicator ready: rank %d of %d on %s (node %d of %d, local rank %d of %d); "
                 "shared-memory all-reduce %s; collective checks %s", self.rank, self.size,
                 self.hosts[self.rank], self.node_index, self.num_nodes, self.local_rank,
                 self.local_size, "on" if self._shm is not None else "off",
                 "on" if self.check_collectives else "off")
        if self.size > 1:
            install_abort_on_exception()
        atexit.register(self._at_exit)

    # -- public collectives -------------------------------------------------------------
    def all_reduce(self, buf, op="sum", timeout=None, send=None):
        """Reduce ``buf`` (a C-contiguous host or GPU array) over all ranks, in place; or, with
        ``send`` (same shape and dtype), reduce ``send`` into ``buf`` and leave ``send`` as is."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {_REDUCE_OPS}, got {op!r}.")
        if is_device_array(buf) and not self._gpu_aware:
            return self._via_host(buf, lambda host: self.all_reduce(host, op, timeout), send)
        call = CollectiveCall("all_reduce", op=op, dtype=_dtype_name(buf.dtype), shape=buf.shape)
        with self._collective(call, timeout) as wait:
            if self.size == 1:
                if send is not None:
                    buf[...] = send
                return buf
            _synchronize_stream(buf)
            self._reduce_data(buf, op, wait, send)
        return buf

    def all_reduce_packs(self, buf, bounds, op="sum", timeout=None):
        """Reduce the packs ``buf[lo:hi]`` for ``(lo, hi)`` in ``bounds`` (a 1-D C-contiguous
        host or GPU array) over all ranks, in place: one data collective per pack (each takes
        the algorithm its size calls for), under one fingerprint agreement on all of them."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {_REDUCE_OPS}, got {op!r}.")
        bounds = tuple(bounds)
        if len(bounds) == 1:
            lo, hi = bounds[0]
            self.all_reduce(buf[lo:hi], op, timeout)
            return buf
        if is_device_array(buf) and not self._gpu_aware:
            return self._via_host(buf, lambda host: self.all_reduce_packs(host, bounds, op,
                                                                          timeout))
        # The pack sizes are agreed too: every rank's data collectives then match one by one.
        call = CollectiveCall("all_reduce", op=op, dtype=_dtype_name(buf.dtype), shape=buf.shape,
                              packs=tuple(hi - lo for lo, hi in bounds))
        with self._collective(call, timeout) as wait:
            if self.size > 1:
                _synchronize_stream(buf)
                for lo, hi in bounds:
                    self._reduce_data(buf[lo:hi], op, wait, None)
        return buf

    def broadcast(self, buf, root=0, timeout=None):
        """Copy ``buf`` of rank ``root`` into ``buf`` of every rank, in place."""
        if is_device_array(buf) and not self._gpu_aware:
            return self._via_host(buf, lambda host: self.broadcast(host, root, timeout))
        call = CollectiveCall("broadcast", root=root, dtype=_dtype_name(buf.dtype), shape=buf.shape)
        with self._collective(call, timeout) as wait:
            if self.size > 1:
                _synchronize_stream(buf)
                wait.blocking(lambda: self._comm.Bcast(buf, root=root),
                              lambda: self._comm.Ibcast(buf, root=root), "broadcast")
        return buf

    def all_gather(self, array, timeout=None):
        """Concatenate every rank's ``array`` along axis 0, in rank order (host arrays).

        The leading dimension may differ between ranks; the rest of the shape and the dtype
        may not.
        """
        array = np.ascontiguousarray(array)
        if array.ndim == 0:
            raise ValueError("all_gather needs arrays with at least one dimension, got a scalar.")
        call = CollectiveCall("all_gather", dtype=_dtype_name(array.dtype), trailing_shape=array.shape[1:])
        with self._collective(call, timeout) as wait:
            if self.size == 1:
                return array.copy()
            out, _, _ = self._allgatherv(array.reshape(-1), wait)
        rows = out.size // max(1, int(np.prod(array.shape[1:], dtype=np.int64)))
        return out.reshape((rows,) + array.shape[1:])

    def all_gather_object(self, obj, timeout=None):
        """Every rank's picklable ``obj``, in rank order (for small metadata only)."""
        import pickle  # noqa: PLC0415 - only metadata takes this path

        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        # Checked like every collective: unchecked, it could pair with another rank's
        # fingerprint exchange and fail inside MPI instead of raising a mismatch.
        with self._collective(CollectiveCall("all_gather_object"), timeout):
            gathered = self._gather_bytes(payload, timeout)
        return [pickle.loads(part.tobytes()) for part in gathered]

    def barrier(self, timeout=None):
        with self._collective(CollectiveCall("barrier"), timeout) as wait:
            if self.size > 1:
                wait(self._comm.Ibarrier(), "barrier")

    # -- the one path every collective takes --------------------------------------------
    def _reduce_data(self, buf, op, wait, send):
        """The data phase of an all-reduce: shared memory (hierarchical across nodes) from the
        size this topology's crossover says, else the MPI library's Allreduce."""
        if op == "sum" and self._use_shared_memory(buf):
            self._shm.all_reduce(buf, wait, send)
            return
        source = self._mpi.IN_PLACE if send is None else send
        mpi_op = self._mpi_ops[op]
        wait.blocking(lambda: self._comm.Allreduce(source, buf, mpi_op),
                      lambda: self._comm.Iallreduce(source, buf, mpi_op), "all-reduce")

    def _collective(self, call, timeout):
        return _CollectiveScope(self, call, timeout)

    def _gather_bytes(self, payload, timeout):
        wait = self._waiter(CollectiveCall("all_gather_object"), timeout)
        if self.size == 1:
            return [payload]
        out, counts, displs = self._allgatherv(payload, wait)
        return [out[d:d + c] for d, c in zip(displs, counts)]

    def _allgatherv(self, flat, wait):
        """Every rank's 1-D ``flat`` (sizes may differ) concatenated in rank order:
        ``(result, counts, displacements)``."""
        counts = np.zeros(self.size, dtype=np.int64)
        wait(self._comm.Iallgather(np.array([flat.size], dtype=np.int64), counts),
             "all-gather of sizes")
        out = np.empty(int(counts.sum()), dtype=flat.dtype)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        wait(self._comm.Iallgatherv(flat, [out, (counts.tolist(), displs.tolist())]), "all-gather")
        return out, counts, displs

    @staticmethod
    def _via_host(buf, collective, send=None):
        """Without GPU-aware MPI a device buffer travels through a host copy (``get`` waits
        for the stream), and the result is copied back."""
        host = (buf if send is None else send).get()
        collective(host)
        buf.set(host)
        return buf

    def _agree(self, call, wait):
        fp = call.fingerprint(self._seq)
        self._fp_send[0], self._fp_send[1] = fp, -fp
        wait(self._comm.Iallreduce(self._fp_send, self._fp_recv, self._mpi.MAX),
             "fingerprint agreement")
        if self._fp_recv[0] != -self._fp_recv[1]:
            self._mismatch(call, wait)

    def _mismatch(self, call, wait):
        # Every rank saw the disagreement (MAX and -MAX differ for all), so all gather this.
        import pickle  # noqa: PLC0415

        mine = (self._seq, call.operation, call.fields, call.calls)
        parts = [pickle.loads(p.tobytes()) for p in
                 self._gather_bytes(np.frombuffer(pickle.dumps(mine), dtype=np.uint8), None)]
        groups = {}
        for rank, part in enumerate(parts):
            groups.setdefault(part, []).append(rank)
        lines = [f"ranks {_ranks(r)} are at collective #{seq} "
                 f"{CollectiveCall.from_parts(op, fields, calls).describe()}"
                 for (seq, op, fields, calls), r in groups.items()]
        differing = _differing_fields(list(groups))
        raise InvalidArgumentError(
            f"Ranks issued different collectives (seen on rank {self.rank}): " + "; ".join(lines)
            + (f". They differ in: {', '.join(differing)}" if differing else "")
            + ". " + _collective_advice(list(groups))
        )

    def _waiter(self, call, timeout):
        return _Waiter(self, call, timeout)

    def _timed_out(self, call, what, timeout):
        report = self._missing_report(call, grace=min(2.0, timeout))
        self._broken = (f"collective #{self._seq} {call.describe()} timed out on rank "
                        f"{self.rank}")
        raise DeadlineExceededError(
            f"Collective has timed out during execution: collective #{self._seq} "
            f"{call.describe()} ({what}) did not complete within {timeout:g} s on rank "
            f"{self.rank}. {report} The job cannot continue: this rank ends the job when it "
            "exits (set a larger CommunicationOptions(timeout_seconds=...) if a rank is just slow)."
        )

    def _stall_report(self, call, what, waited):
        return (f"rank {self.rank} has waited {waited:.0f} s in collective #{self._seq} "
                f"{call.describe()} ({what}). {self._missing_report(call, grace=0.5)}")

    def _missing_report(self, call, grace, other_thread=False):
        ask = self.num_nodes > 1 and (self._threads_may_overlap or not other_thread)
        known = self._board.exchange(self._control, self.size, grace) if ask \
            else self._board.snapshot()
        missing, details = [], []
        for rank in range(self.size):
            progress = known.get(rank)
            if progress is None and not ask and rank not in self._node_ranks:
                details.append(f"rank {rank} (on {self.hosts[rank]}) is on another node, not "
                               "asked: the MPI thread level is below MULTIPLE")
            elif progress is None:
                missing.append(rank)
                details.append(f"rank {rank} (on {self.hosts[rank]}) is not waiting in any collective")
            elif progress.entered < self._seq:
                missing.append(rank)
                state = "finished it" if progress.completed >= progress.entered else "is still in it"
                last = (f"last entered collective #{progress.entered} ({progress.operation}) and "
                        f"{state}") if progress.entered else "has not entered any collective"
                details.append(f"rank {rank} {last}")
            elif progress.entered > self._seq:
                details.append(f"rank {rank} is already at collective #{progress.entered} "
                               f"({progress.operation})")
            elif progress.operation != call.operation:
                # Same number, another operation: only possible with the checks off.
                missing.append(rank)
                details.append(f"rank {rank} is at collective #{progress.entered} as "
                               f"{progress.operation}, not {call.operation}")
        if missing:
            return f"Ranks that never arrived: {_ranks(missing)} ({'; '.join(details)})."
        extra = f" ({'; '.join(details)})" if details else ""
        return ("Every rank entered it, so a peer stopped responding inside the collective "
                f"(a crashed process or a network failure){extra}.")

    def _watchdog(self):
        if self._watchdog_thread is None:
            self._watchdog_thread = _Watchdog(self)
            self._watchdog_thread.start()
        return self._watchdog_thread

    @property
    def has_shared_memory(self):
        """Whether this communicator has the shared-memory (hierarchical) all-reduce path."""
        return self._shm is not None

    def _use_shared_memory(self, buf):
        if self._shm is None or is_device_array(buf) or not self._shm.supports(buf):
            return False
        algorithm = self.allreduce_algorithm
        if algorithm != "auto":
            return algorithm == "shm"
        return self.shm_min_bytes is not None and buf.nbytes >= self.shm_min_bytes

    def _check_usable(self):
        if self._broken is not None:
            raise UnavailableError(
                f"mpidist's communicator was aborted by an earlier failure ({self._broken}) and "
                "cannot run more collectives; restart the job (from a checkpoint)."
            )

    def _at_exit(self):
        if self._broken is not None:
            abort_job(f"ending the job because {self._broken}.")
        if self._mpi.Is_finalized():
            return
        if self._timeline is not None:
            self._timeline.flush()
        if self.size == 1:
            self._merge_timeline()
            self._free()
            return
        # Ranks that ran a different number of collectives meet here instead of leaving a
        # peer waiting forever in one the others never entered.
        try:
            with self._collective(CollectiveCall("finalize"), None):
                pass
        except InvalidArgumentError as err:
            abort_job(f"at exit: {err}")
        self._merge_timeline()  # every rank has flushed its part: they all reached finalize
        self._free()

    def _merge_timeline(self):
        if self._timeline is not None and self.rank == 0:
            self._timeline.merge()

    def _free(self):
        """Release windows and communicators before MPI_Finalize, which fails on some
        fabrics (OFI: "fabricclose failed ... busy") while they are still allocated."""
        if self._shm is not None:
            self._shm.free()
        self._board.free()
        for comm in (self._cross, self._node, self._control, self._comm):
            if comm is not None:
                comm.Free()
        self._broken = "the communicator was freed at exit"


class _Waiter:
    """Completes the MPI calls of one collective, against its deadline.

    ``wait(request, what)`` polls a non-blocking request; past the deadline it raises
    DeadlineExceededError naming the missing ranks, and without a deadline it logs them once
    the wait has stalled for ``MPIDIST_STALL_SECONDS``. ``blocking(...)`` runs the blocking
    form once every rank has agreed to be in this collective (the MPI library's blocking
    algorithms are faster than its non-blocking ones for large buffers); a watchdog thread
    then ends the job if the call outlives the deadline, since a blocking call cannot be
    interrupted.
    """

    __slots__ = ("_comm", "_call", "_timeout", "agreed")

    def __init__(self, comm, call, timeout):
        self._comm = comm
        self._call = call
        self._timeout = timeout
        self.agreed = False

    def __call__(self, request, what):
        if request.Test():
            return
        comm, timeout = self._comm, self._timeout
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        stall = comm._stall_seconds
        warn_at = None if stall is None or deadline is not None else start + stall
        spins = 0
        while not request.Test():
            spins += 1
            if spins & 63:
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                comm._timed_out(self._call, what, timeout)
            if warn_at is not None and now >= warn_at:
                log.warning("%s", comm._stall_report(self._call, what, now - start))
                warn_at = None
            # More ranks than cores: give the core to the peer we wait for (a rank that spins
            # through its time slice made every 4-rank collective on 2 cores cost ~1 ms).
            os.sched_yield()

    def blocking(self, call_blocking, start_nonblocking, what):
        if not self.agreed:
            self(start_nonblocking(), what)
            return
        if self._timeout is None:
            call_blocking()
            return
        watchdog = self._comm._watchdog()
        watchdog.watch(time.monotonic() + self._timeout, self._call, what, self._timeout)
        try:
            call_blocking()
        finally:
            watchdog.clear()


class _Watchdog(threading.Thread):
    """Ends the job when a blocking collective outlives its deadline (checked every 50 ms)."""

    def __init__(self, comm):
        super().__init__(name="mpidist-collective-watchdog", daemon=True)
        self._comm = comm
        self._watched = None

    def watch(self, deadline, call, what, timeout):
        self._watched = (deadline, call, what, timeout)

    def clear(self):
        self._watched = None

    def run(self):
        while True:
            time.sleep(0.05)
            watched = self._watched
            if watched is not None and time.monotonic() >= watched[0]:
                _, call, what, timeout = watched
                comm = self._comm
                abort_job(
                    f"DeadlineExceededError: Collective has timed out during execution: "
                    f"collective #{comm._seq} {call.describe()} ({what}) did not complete within "
                    f"{timeout:g} s on rank {comm.rank}, after every rank had entered it. "
                    f"{comm._missing_report(call, grace=0.5, other_thread=True)} Ending the job.")


class _CollectiveScope:
    """``with comm._collective(call, timeout) as wait:`` — board, agreement, completion."""

    __slots__ = ("_comm", "_call", "_timeout", "_check", "_wait", "_start", "_agreed")

    def __init__(self, comm, call, timeout, check=True):
        self._comm = comm
        self._call = call
        self._timeout = timeout
        self._check = check

    def __enter__(self):
        comm = self._comm
        comm._lock.acquire()
        try:
            comm._check_usable()
            comm._seq += 1
            comm._board.enter(comm._seq, self._call.operation)
            if comm._rank_state is not None:  # for the guard's report if this rank dies
                comm._rank_state.enter(comm._seq, self._call)
            self._wait = comm._waiter(self._call, self._timeout)
            self._start = time.time_ns() if comm._timeline is not None or comm._debug else 0
            if self._check and comm.check_collectives and comm.size > 1:
                comm._agree(self._call, self._wait)
                self._wait.agreed = True
            self._agreed = time.time_ns() if comm._timeline is not None else 0
        except BaseException:
            comm._lock.release()
            raise
        return self._wait

    def __exit__(self, exc_type, exc, tb):
        comm = self._comm
        if exc_type is None:
            comm._board.complete(comm._seq)
            if comm._rank_state is not None:
                comm._rank_state.complete(comm._seq)
            if comm._timeline is not None:
                # Without the agreement the whole collective counts as waiting.
                agreed = self._agreed if self._wait.agreed else time.time_ns()
                comm._timeline.record(comm._seq, self._call, self._start, agreed, time.time_ns())
            if comm._debug:
                log.debug("collective #%d %s: %.1f us", comm._seq, self._call.describe(),
                          (time.time_ns() - self._start) / 1000)
        comm._lock.release()
        return False


def _shm_threshold(config, num_nodes):
    """The size from which SUM all-reduces take the shared-memory path on this topology: the
    measured crossover against the MPI library's Allreduce (docs/multi_worker.md), never below
    ``MPIDIST_SHM_MIN_BYTES``; None when either is off."""
    crossover = config.shm_min_bytes_across_nodes if num_nodes > 1 \
        else config.shm_min_bytes_one_node
    if config.shm_min_bytes is None or crossover is None:
        return None
    return max(config.shm_min_bytes, crossover)


def _synchronize_stream(buf):
    """GPU-aware MPI reads device memory directly: finish the work that writes it first."""
    if is_device_array(buf):
        import cupy  # noqa: PLC0415 - only with GPU arrays

        cupy.cuda.get_current_stream().synchronize()


def _ranks(ranks):
    return "[" + ", ".join(str(r) for r in ranks) + "]"


def _differing_fields(entries):
    """What differs between the groups ``(seq, op, fields, calls)``, in the user's terms first:
    the public calls and their arguments, then the collective's own fields."""
    names = []
    chains = {tuple(name for name, _ in e[3]) for e in entries}
    if len(chains) > 1:
        shown = {" > ".join(name for name, _ in e[3])
                 or ("the end of the program" if e[1] == "finalize" else "no public call")
                 for e in entries}
        names.append("the public call (" + " vs ".join(sorted(shown)) + ")")
    else:
        for depth, name in enumerate(next(iter(chains))):
            args = [dict(e[3][depth][1]) for e in entries]
            for key in sorted({k for a in args for k in a}):
                if len({repr(a.get(key)) for a in args}) > 1:
                    names.append(f"{name}'s argument {key}")
    if len({e[0] for e in entries}) > 1:
        names.append("sequence number")
    if len({e[1] for e in entries}) > 1:
        names.append("operation")
        return names  # different operations: their fields are not comparable
    keys = {k for e in entries for k, _ in e[2]}
    for key in sorted(keys):
        if len({dict(e[2]).get(key) for e in entries}) > 1:
            names.append(key)
    return names


def _collective_advice(entries):
    """The fix, naming the user's collective calls where the collectives came from them."""
    public = sorted({name for e in entries for name, _ in e[3][:1]})
    rule = ("Every rank must issue the same collectives in the same order, with the same "
            "shapes, dtypes and reduce ops (run the same program on every rank, and give every "
            "rank a batch at every step).")
    if not public:
        return rule
    which = " and ".join(public)
    verb = "is a collective call" if len(public) == 1 else "are collective calls"
    return (f"{which} {verb} under MultiWorkerMirroredStrategy: every rank must make it, in the "
            "same order, with the same arguments and the same shapes and dtypes (a call made on "
            "some ranks only, e.g. under `if rank == 0:`, leaves the others at a different "
            "collective; see 'Collective calls' in docs/multi_worker.md).")
