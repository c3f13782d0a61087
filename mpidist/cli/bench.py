"""``mpidist bench allreduce`` and ``mpidist bench batch``: mpidist's all-reduce beside raw
mpi4py ``Allreduce`` in the same job, nccl-tests style.

Method (the same for every case): each rank fills its buffers with a known pattern and the
results of every implementation are checked against the exact expected values before timing
(and again after); any wrong value on any rank fails the run on every rank. A case's call
count is agreed by all ranks (calibrated on raw MPI to last ``min_time``, or ``--iters``).
One sample is: barrier, ``calls`` calls, the slowest rank's elapsed time / calls. The
implementations alternate within each round (order flipped every round), and the reported
time is the median of the rounds.

algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce (nccl-tests' convention, which
makes busbw comparable with link bandwidth whatever the rank count; it is 0 on one rank).
"""

# wait-ok-file: the raw mpi4py calls here are the baselines being measured (and their timers'
# barriers); bounding them would change what is measured. The timed public path is mpidist's.

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mpidist.cli.info import library_facts
from mpidist.comm.mpi import mpi_module

if TYPE_CHECKING:
    from mpidist.comm.communicator import Communicator

__all__ = ["DTYPES", "OPS", "QUICK_SIZES", "DEFAULT_SIZES", "parse_size", "parse_sizes",
           "human_size", "bus_factor", "pattern", "expected", "Timer", "run_allreduce",
           "run_batch", "allreduce_header", "allreduce_line", "allreduce_summary", "batch_table",
           "to_csv", "CheckFailed", "Job", "Row"]

Job = dict[str, Any]  # the job's facts, as the reports' "job" object holds them
Row = dict[str, Any]  # one timed case of one implementation, as a "rows" entry holds it

DTYPES = ("float32", "float64", "int32", "int64")
OPS = ("sum", "max", "min", "prod")
DEFAULT_SIZES = "8:64M"
QUICK_SIZES = "8,4K,256K"
_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20,
          "MIB": 2**20, "G": 2**30, "GB": 2**30, "GIB": 2**30}
IMPL_MPIDIST = "mpidist"
IMPL_RAW = "raw"
IMPL_LABELS = {IMPL_MPIDIST: "mpidist Communicator.all_reduce",
               IMPL_RAW: "raw mpi4py comm.Allreduce"}


class CheckFailed(RuntimeError):
    """Results were wrong on some rank (every rank raises it; ``detail`` is this rank's)."""

    def __init__(self, message: str, detail: str | None = None, bad_ranks: Sequence[int] = ()):
        super().__init__(message)
        self.detail = detail
        self.bad_ranks = list(bad_ranks)


# -- sizes ----------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"4K"`` -> 4096 (binary units: K, M, G, optional B / iB suffix)."""
    raw = text.strip().upper()
    digits = raw.rstrip("KMGIB")
    unit = raw[len(digits):]
    if not digits or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; use bytes with an optional K, M or G suffix "
                         "(binary: 4K = 4096), e.g. 8, 4K, 64M.")
    try:
        value = float(digits) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 8, 4K, 64M).") from None
    if value != int(value) or value < 1:
        raise ValueError(f"{text!r} is not a whole, positive number of bytes.")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """``"4K:64M"`` (x2 steps), ``"4K:64M:4"`` (x4 steps) or ``"8,4K,1M"`` -> sorted bytes."""
    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"{text!r}: a range is MIN:MAX or MIN:MAX:FACTOR, e.g. 4K:64M.")
        low, high = parse_size(parts[0]), parse_size(parts[1])
        factor = 2 if len(parts) == 2 else int(parts[2]) if parts[2].strip().isdigit() else 0
        if factor < 2:
            raise ValueError(f"{text!r}: the step factor must be an integer >= 2.")
        if high < low:
            raise ValueError(f"{text!r}: MAX is smaller than MIN.")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= factor
        return sizes
    sizes = sorted({parse_size(p) for p in text.split(",") if p.strip()})
    if not sizes:
        raise ValueError("no sizes given (e.g. --sizes 4K:64M or --sizes 8,4K,1M).")
    return sizes


def human_size(nbytes: int) -> str:
    """8 -> "8B", 4096 -> "4K", 3 * 2**20 -> "3M" (binary units, as nccl-tests' sizes)."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def bus_factor(n: int) -> float:
    """busbw / algbw of an all-reduce on ``n`` ranks (nccl-tests: 2(n-1)/n)."""
    return 2.0 * (n - 1) / n


# -- data and checks ------------------------------------------------------------------------
def pattern(rank: int, count: int, dtype: str, op: str) -> np.ndarray:
    """The values rank ``rank`` sends: small integers whose reductions are exact in any order
    (``prod`` uses 1 and 2 only, so products are exact powers of two)."""
    i = np.arange(count)
    if op == "prod":
        return np.where(i % (rank % 5 + 2) == 0, 2, 1).astype(dtype)
    return ((rank % 5) + (i % 7)).astype(dtype)


def expected(size: int, count: int, dtype: str, op: str) -> np.ndarray:
    """What every rank must hold after reducing ``pattern`` over ``size`` ranks."""
    period = 420  # the patterns repeat every lcm(7, 2, 3, 4, 5, 6) elements
    table = np.stack([pattern(r, period, dtype, op) for r in range(size)])
    reduce = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    with np.errstate(over="ignore"):
        one = reduce.reduce(table, axis=0, dtype=np.dtype(dtype))
    return np.resize(one, count)


def _first_wrong(got: np.ndarray, want: np.ndarray) -> str | None:
    wrong = np.flatnonzero(got != want)
    if wrong.size == 0:
        return None
    i = int(wrong[0])
    return f"{wrong.size} of {got.size} values wrong, first at index {i}: got {got[i].item()!r}, " \
           f"expected {want[i].item()!r}"


def agree_on_check(control: Any, local_failure: str | None, what: str) -> None:
    """Every rank learns whether ``what`` was right on all ranks; raise CheckFailed if not."""
    failures = control.allgather(local_failure)
    bad = [r for r, f in enumerate(failures) if f]
    if bad:
        detail = "; ".join(f"rank {r}: {failures[r]}" for r in bad)
        raise CheckFailed(f"wrong results from {what} on rank(s) {bad}: {detail}",
                          detail=local_failure, bad_ranks=bad)


# -- timing ---------------------------------------------------------------------------------
class Timer:
    """Agreed call counts and slowest-rank times over the control communicator."""

    def __init__(self, control: Any, mpi: Any, iters: int | None = None,
                 min_time: float | None = 0.02, warmup: int = 5, rounds: int = 5):
        self.control = control
        self.max_op = mpi.MAX
        self.iters = iters
        self.min_time = min_time
        self.warmup = warmup
        self.rounds = rounds

    def _slowest(self, seconds: float) -> float:
        return cast(float, self.control.allreduce(seconds, op=self.max_op))

    def sample(self, fn: Callable[..., object], calls: int) -> float:
        """Seconds per call on the slowest rank (all ranks start together)."""
        self.control.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return self._slowest(time.perf_counter() - start) / calls

    def calls_for(self, fn: Callable[..., object]) -> int:
        """The call count every rank uses for this case: ``iters``, or enough calls of ``fn``
        to last ``min_time`` (found by growing trial runs, agreed through the slowest rank)."""
        if self.iters:
            return self.iters
        calls = 1
        while True:
            per_call = self.sample(fn, calls)
            elapsed = per_call * calls
            # min_time is set whenever iters is not (timing.settings_from).
            if elapsed >= self.min_time / 4 or calls >= 1 << 20:  # type: ignore[operator]
                return max(1, min(1 << 22, math.ceil(
                    self.min_time / max(per_call, 1e-9))))  # type: ignore[operator]
            calls *= 4

    def compare(self, cases: Mapping[str, Callable[..., object]],
                calibrate_with: str) -> dict[str, dict[str, Any]]:
        """``{name: {"calls", "median", "min", "max", "samples"}}`` (seconds per call) for the
        ``cases`` ({name: fn}), interleaved over the rounds with the order flipped each round."""
        for fn in cases.values():
            for _ in range(self.warmup):
                fn()
        calls = self.calls_for(cases[calibrate_with])
        samples: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for r in range(self.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                samples[name].append(self.sample(cases[name], calls))
        return {name: {"calls": calls, "median": statistics.median(s), "min": min(s),
                       "max": max(s), "samples": s} for name, s in samples.items()}


# -- job facts for the reports --------------------------------------------------------------
def job_facts(comm: Any, mpi: Any) -> Job:
    """What the reports say about the job: ranks, nodes, hosts, MPI and library versions."""
    lib = library_facts(mpi)
    return {
        "ranks": comm.size,
        "nodes": comm.num_nodes,
        "ranks_per_node": comm.local_size if comm.num_nodes == 1 else None,
        "hosts": sorted(set(comm.hosts)),
        "mpi_library": lib["mpi"]["library"],
        "mpi_vendor": lib["mpi"]["vendor"],
        "mpi_thread_level": lib["mpi"]["thread_level"],
        "mpidist": lib["mpidist"],
        "mpi4py": lib["mpi4py"],
        "numpy": lib["numpy"],
        "shm_min_bytes": comm.shm_min_bytes,
        "check_collectives": comm.check_collectives,
    }


def _row(nbytes: int, count: int, dtype: str, op: str, impl: str, stats: Mapping[str, Any],
         n: int, raw_time: float | None = None) -> Row:
    t = stats["median"]
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    return {
        "size_bytes": nbytes, "count": count, "dtype": dtype, "op": op, "impl": impl,
        "calls": stats["calls"],
        "time_us": t * 1e6, "time_min_us": stats["min"] * 1e6, "time_max_us": stats["max"] * 1e6,
        "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(n),
        "ratio_to_raw": (t / raw_time) if raw_time else 1.0,
    }


# -- bench allreduce ------------------------------------------------------------------------
def run_allreduce(sizes: Sequence[int], ops: Sequence[str], dtype: str, timer: Timer,
                  on_row: Callable[[Job, Row, Row], None] | None = None) -> tuple[Job, list[Row]]:
    """Sweep ``sizes`` x ``ops``; returns ``(job, rows)`` on every rank (rows: two per case,
    raw then mpidist). ``on_row(job, raw_row, mpidist_row)`` is called as each case finishes."""
    from mpidist.comm.communicator import world_communicator  # noqa: PLC0415 - starts MPI

    mpi = mpi_module()
    comm = world_communicator()
    raw_comm = mpi.COMM_WORLD.Dup()  # raw MPI gets its own communicator, as mpidist does
    mpi_ops = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN, "prod": mpi.PROD}
    itemsize = np.dtype(dtype).itemsize
    rows = []
    try:
        job = job_facts(comm, mpi)
        for nbytes in sizes:
            count = nbytes // itemsize
            for op in ops:
                send = pattern(comm.rank, count, dtype, op)
                want = expected(comm.size, count, dtype, op)
                out_raw = np.zeros_like(send)
                out_ours = np.zeros_like(send)
                mop = mpi_ops[op]
                cases = {
                    IMPL_RAW: lambda s=send, o=out_raw, m=mop: raw_comm.Allreduce(s, o, m),
                    IMPL_MPIDIST: lambda s=send, o=out_ours, p=op: comm.all_reduce(o, p, send=s),
                }
                what = f"all-reduce {op} of {count} {dtype} ({human_size(nbytes)})"
                _check(cases, {IMPL_RAW: out_raw, IMPL_MPIDIST: out_ours}, send, want,
                       timer.control, what)
                stats = timer.compare(cases, calibrate_with=IMPL_RAW)
                _check({}, {IMPL_RAW: out_raw, IMPL_MPIDIST: out_ours}, send, want,
                       timer.control, what + " after timing")
                raw_row = _row(nbytes, count, dtype, op, IMPL_RAW, stats[IMPL_RAW], comm.size)
                our_row = _row(nbytes, count, dtype, op, IMPL_MPIDIST, stats[IMPL_MPIDIST],
                               comm.size, raw_time=stats[IMPL_RAW]["median"])
                rows += [raw_row, our_row]
                if on_row is not None:
                    on_row(job, raw_row, our_row)
    finally:
        raw_comm.Free()
    return job, rows


def _check(cases: Mapping[str, Callable[[], object]], outputs: Mapping[str, np.ndarray],
           send: np.ndarray, want: np.ndarray, control: Any, what: str) -> None:
    """Run each case once (outputs zeroed first), compare every output with ``want`` and
    agree across ranks; also checks that the send buffer was left as it was."""
    original = send.copy()
    failure = None
    for name, fn in cases.items():
        outputs[name][...] = 0
        fn()
    for name, out in outputs.items():
        wrong = _first_wrong(out, want)
        if wrong and failure is None:
            failure = f"{IMPL_LABELS.get(name, name)}: {wrong}"
    if failure is None and not np.array_equal(send, original):
        failure = "the send buffer was modified"
    agree_on_check(control, failure, what)


# -- bench batch ----------------------------------------------------------------------------
BATCH_RAW_PACKED = "raw pre-packed"
BATCH_RAW_CONCAT = "raw concat+split"
BATCH_RAW_SEPARATE = "raw per-tensor"
BATCH_MPIDIST = "mpidist batch_reduce_to"


def run_batch(tensors: int, tensor_size: int, dtype: str,
              timer: Timer) -> tuple[Job, list[Row]]:
    """Many small tensors: MultiWorkerMirroredStrategy's ``batch_reduce_to`` (one host replica
    per rank, the packed path) against raw mpi4py: one Allreduce of a pre-packed buffer, a
    concatenate + one Allreduce + split, and one Allreduce per tensor. ``(job, rows)``."""
    import mpidist  # noqa: PLC0415 - the strategy layer
    from mpidist.cluster_resolver import MPIClusterResolver  # noqa: PLC0415

    mpi = mpi_module()
    # Host buffers on every rank, whatever GPUs exist: the raw baselines are host MPI calls.
    strategy = mpidist.MultiWorkerMirroredStrategy(
        cluster_resolver=MPIClusterResolver(local_devices=["/cpu:0"]))
    # A MultiWorkerMirroredStrategy always has its communicator (the base type says "or None").
    comm: Communicator = strategy.extended.communicator  # type: ignore[assignment]
    raw_comm = mpi.COMM_WORLD.Dup()
    rows: list[Row] = []
    try:
        job = job_facts(comm, mpi)
        arrays = [pattern(comm.rank + t, tensor_size, dtype, "sum") for t in range(tensors)]
        wants = [_batch_expected(comm.size, t, tensor_size, dtype) for t in range(tensors)]
        # misc: mypy cannot match a lambda with a bound default to Callable[[ValueContext], Any].
        values = [strategy.experimental_distribute_values_from_function(
                      lambda ctx, a=a: a)  # type: ignore[misc]
                  for a in arrays]
        pairs = [(v, "/cpu:0") for v in values]
        packed = np.concatenate(arrays)
        packed_out = np.zeros_like(packed)
        separate_out = [np.zeros_like(a) for a in arrays]
        split_out = [np.zeros_like(a) for a in arrays]
        bounds = np.cumsum([0] + [a.size for a in arrays])

        def separate() -> None:
            for a, o in zip(arrays, separate_out):
                raw_comm.Allreduce(a, o, mpi.SUM)

        def concat_split() -> None:
            flat = np.concatenate(arrays)
            raw_comm.Allreduce(mpi.IN_PLACE, flat, mpi.SUM)
            for t, o in enumerate(split_out):
                o[...] = flat[bounds[t]:bounds[t + 1]]

        ours: dict[str, list[Any]] = {}

        def batch() -> None:
            ours["out"] = strategy.extended.batch_reduce_to("SUM", pairs)

        cases = {
            BATCH_RAW_PACKED: lambda: raw_comm.Allreduce(packed, packed_out, mpi.SUM),
            BATCH_RAW_CONCAT: concat_split,
            BATCH_RAW_SEPARATE: separate,
            BATCH_MPIDIST: batch,
        }

        def check(what: str) -> None:
            failure = None
            got = {BATCH_RAW_PACKED: np.split(packed_out, bounds[1:-1]),
                   BATCH_RAW_CONCAT: split_out, BATCH_RAW_SEPARATE: separate_out,
                   BATCH_MPIDIST: [np.asarray(o) for o in ours["out"]]}
            for name, outs in got.items():
                for t, (o, w) in enumerate(zip(outs, wants)):
                    wrong = _first_wrong(np.asarray(o).reshape(-1), w)
                    if wrong and failure is None:
                        failure = f"{name}, tensor {t}: {wrong}"
            agree_on_check(timer.control, failure, what)

        for fn in cases.values():
            fn()
        label = f"batch all-reduce of {tensors} x {tensor_size} {dtype}"
        check(label)
        stats = timer.compare(cases, calibrate_with=BATCH_RAW_PACKED)
        batch()
        check(label + " after timing")
    finally:
        raw_comm.Free()
    nbytes = packed.nbytes
    base = stats[BATCH_RAW_PACKED]["median"]
    for name in cases:
        row = _row(nbytes, packed.size, dtype, "sum", name, stats[name], comm.size, raw_time=base)
        row["tensors"] = tensors
        row["tensor_size"] = tensor_size
        row["time_per_tensor_us"] = row["time_us"] / tensors
        rows.append(row)
    return job, rows


def _batch_expected(size: int, t: int, count: int, dtype: str) -> np.ndarray:
    table = np.stack([pattern(r + t, count, dtype, "sum") for r in range(size)])
    return cast(np.ndarray, np.add.reduce(table, axis=0, dtype=np.dtype(dtype)))


# -- output ---------------------------------------------------------------------------------
def _fmt_bw(x: float) -> str:
    """GB/s in 7 columns, with up to 3 significant digits (nccl-tests' %.2f shows every small
    size as 0.00)."""
    digits = 2 if x <= 0 else max(2, min(5, 2 - math.floor(math.log10(x))))
    return f"{x:7.{digits}f}"


def allreduce_header(job: Job, dtype: str, timer_text: str) -> list[str]:
    """The comment lines above ``allreduce_line``'s table."""
    n = job["ranks"]
    return [
        f"# mpidist bench allreduce: {n} rank(s) on {job['nodes']} node(s) "
        f"({', '.join(job['hosts'])}), {job['mpi_vendor']}",
        "# mpidist = Communicator.all_reduce (MultiWorkerMirroredStrategy's path); "
        "raw = mpi4py comm.Allreduce(send, recv, op) on the same ranks",
        f"# {timer_text}",
        f"# algbw = size / time; busbw = algbw * 2(n-1)/n = algbw * {bus_factor(n):.3f}; "
        f"ratio = mpidist time / raw time (below 1: mpidist is faster)",
        "#",
        f"# {'':40}{'mpidist':^26}   {'raw mpi4py':^26}".rstrip(),
        f"# {'size':>10} {'count':>10} {'type':>8} {'redop':>6}   "
        f"{'time':>10} {'algbw':>7} {'busbw':>7}   {'time':>10} {'algbw':>7} {'busbw':>7} "
        f"{'ratio':>6}",
        f"# {'(B)':>10} {'(elements)':>10} {'':>8} {'':>6}   "
        f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}   {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}",
    ]


def allreduce_line(raw: Row, ours: Row) -> str:
    """One size and op: mpidist's time and bandwidths, raw MPI's, and their ratio."""
    return (f"  {ours['size_bytes']:>10} {ours['count']:>10} {ours['dtype']:>8} {ours['op']:>6}   "
            f"{ours['time_us']:10.2f} {_fmt_bw(ours['algbw_gbps'])} "
            f"{_fmt_bw(ours['busbw_gbps'])}   "
            f"{raw['time_us']:10.2f} {_fmt_bw(raw['algbw_gbps'])} {_fmt_bw(raw['busbw_gbps'])} "
            f"{ours['ratio_to_raw']:6.2f}")


def allreduce_summary(rows: list[Row]) -> list[str]:
    """Average bus bandwidths and the geometric mean, best and worst of the time ratios."""
    ours = [r for r in rows if r["impl"] == IMPL_MPIDIST]
    raw = [r for r in rows if r["impl"] == IMPL_RAW]
    if not ours:
        return []
    ratios = [r["ratio_to_raw"] for r in ours]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    lo = min(ours, key=lambda r: r["ratio_to_raw"])
    hi = max(ours, key=lambda r: r["ratio_to_raw"])
    return [
        f"# Avg bus bandwidth: mpidist {statistics.mean(r['busbw_gbps'] for r in ours):.3f} GB/s, "
        f"raw {statistics.mean(r['busbw_gbps'] for r in raw):.3f} GB/s",
        f"# mpidist / raw time: geometric mean {geo:.2f}, best {lo['ratio_to_raw']:.2f} "
        f"({human_size(lo['size_bytes'])} {lo['op']}), worst {hi['ratio_to_raw']:.2f} "
        f"({human_size(hi['size_bytes'])} {hi['op']})",
    ]


def batch_table(job: Job, rows: list[Row], timer_text: str) -> list[str]:
    """The lines of ``mpidist bench batch``'s table, one implementation a line."""
    first = rows[0]
    lines = [
        f"# mpidist bench batch: {job['ranks']} rank(s) on {job['nodes']} node(s), "
        f"{job['mpi_vendor']}",
        f"# {first['tensors']} tensors x {first['tensor_size']} {first['dtype']} "
        f"({first['size_bytes']} bytes) summed per call",
        f"# {timer_text}",
        "# ratio = time / raw pre-packed time (one Allreduce of a buffer already holding every "
        "tensor: the floor)",
        "#",
        f"# {'implementation':<26} {'time (us)':>10} {'per tensor':>11} {'algbw':>8} "
        f"{'busbw':>8} {'ratio':>7}",
    ]
    for r in rows:
        lines.append(f"  {r['impl']:<26} {r['time_us']:10.2f} {r['time_per_tensor_us']:11.3f} "
                     f"{_fmt_bw(r['algbw_gbps']):>8} {_fmt_bw(r['busbw_gbps']):>8} "
                     f"{r['ratio_to_raw']:7.2f}")
    by = {r["impl"]: r for r in rows}
    ours, sep = by[BATCH_MPIDIST]["time_us"], by[BATCH_RAW_SEPARATE]["time_us"]
    lines.append(f"# mpidist batch_reduce_to is {sep / ours:.1f}x faster than one raw Allreduce "
                 f"per tensor and takes {by[BATCH_MPIDIST]['ratio_to_raw']:.2f}x the pre-packed "
                 "floor")
    return lines


CSV_COLUMNS = ("size_bytes", "count", "dtype", "op", "impl", "calls", "time_us", "time_min_us",
               "time_max_us", "algbw_gbps", "busbw_gbps", "ratio_to_raw")


def to_csv(rows: list[Row], extra: Sequence[str] = ()) -> str:
    """``CSV_COLUMNS`` (then ``extra``) of each row, with a header line."""
    import csv  # noqa: PLC0415
    import io  # noqa: PLC0415

    columns = CSV_COLUMNS + tuple(extra)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue()
