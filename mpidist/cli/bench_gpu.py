"""``mpidist bench gpu``: the all-reduce a user writes on a GPU (``strategy.run`` +
``ReplicaContext.all_reduce`` on CuPy values, with the default cross-device ops and with
``NcclAllReduce``) beside raw NCCL (``cupy.cuda.nccl`` ``allReduce`` on the same buffer) and a
raw device copy, in the same process, one GPU.

On one device an all-reduce is a copy of the replica's value: the raw copy is the floor, raw
NCCL the library's own cost, and the ratio (mpidist's time / raw NCCL's) is what mpidist's
public path adds. Every implementation's result is checked against the input before and after
timing. Timing is ``bench.Timer``'s (calibrated call count, warm-up, implementations
interleaved with the order flipped every round, the median reported), with the device
synchronized before and after each sample. ``--stand-in cpu`` times the same path with NumPy
on ``/cpu:0`` against a NumPy copy: a rehearsal without a GPU, not a GPU number.
"""

# wait-ok-file: a one-process benchmark; the device synchronizations bound what is measured.

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpidist.cli import bench
from mpidist.cli.bench import CheckFailed, Job, Row

__all__ = ["DeviceTimer", "GpuTarget", "target_for", "run_gpu_allreduce", "table",
           "QUICK_SIZES", "DEFAULT_SIZES", "IMPLS"]

QUICK_SIZES = "4K,1M"
DEFAULT_SIZES = "4K,64K,1M,16M,64M"
IMPLS = {
    "mpidist_run_all_reduce": "strategy.run + all_reduce (default cross-device ops)",
    "mpidist_nccl_all_reduce": "strategy.run + all_reduce (NcclAllReduce)",
    "raw_nccl": "raw cupy.cuda.nccl allReduce on the same buffer",
    "raw_copy": "raw device copy (the floor of a one-device all-reduce)",
}


@dataclass(frozen=True)
class GpuTarget:
    """The array library, device string and synchronization of the timed device."""

    gpu: bool
    xp: Any
    device: str
    sync: Callable[[], None]


def target_for(gpu: bool) -> GpuTarget:
    """CuPy on ``/gpu:0`` (``gpu``), else NumPy on ``/cpu:0`` (the stand-in)."""
    if not gpu:
        return GpuTarget(False, np, "/cpu:0", lambda: None)
    from mpidist.backend import cupy_backend  # noqa: PLC0415 - imports CuPy

    cupy = cupy_backend.get_cupy()
    if cupy is None or cupy_backend.gpu_count() < 1:
        raise RuntimeError(f"mpidist bench gpu needs a GPU: {cupy_backend.unavailable_reason()}")
    device = cupy.cuda.Device(0)
    return GpuTarget(True, cupy, "/gpu:0", device.synchronize)


class _LocalControl:
    """``bench.Timer``'s control communicator for one process: nothing to agree with."""

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        return None

    def allreduce(self, value: float, op: object = None) -> float:
        return value

    def Free(self) -> None:  # noqa: N802 - mpi4py's name
        return None


class _NoMpi:
    MAX = None


class DeviceTimer(bench.Timer):
    """``bench.Timer`` in one process, synchronizing the device around every sample (a GPU
    call returns before its work is done)."""

    def __init__(self, sync: Callable[[], None], *, min_time: float, warmup: int, rounds: int):
        super().__init__(_LocalControl(), _NoMpi(), iters=None, min_time=min_time,
                         warmup=warmup, rounds=rounds)
        self.sync = sync

    def sample(self, fn: Callable[..., object], calls: int) -> float:
        self.sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        self.sync()
        return (time.perf_counter() - start) / calls


def _implementations(t: GpuTarget, x: Any, out: Any) -> dict[str, Callable[[], Any]]:
    """``{impl: call}``; each call returns the all-reduced value (on the device)."""
    import mpidist  # noqa: PLC0415
    from mpidist.comm.nccl import nccl_module  # noqa: PLC0415

    default = mpidist.MirroredStrategy([t.device])
    nccl = mpidist.MirroredStrategy([t.device], cross_device_ops=mpidist.NcclAllReduce())

    def public(strategy: Any) -> Callable[[], Any]:
        def step() -> Any:
            ctx: Any = mpidist.get_replica_context()  # inside strategy.run: never None
            return ctx.all_reduce("SUM", x)

        return lambda: strategy.experimental_local_results(strategy.run(step))[0]

    impls = {"mpidist_run_all_reduce": public(default),
             "mpidist_nccl_all_reduce": public(nccl)}
    module = nccl_module() if t.gpu else None
    if module is not None:
        comm = module.NcclCommunicator.initAll([0])[0]
        dtype = {np.dtype(np.float32): module.NCCL_FLOAT32}[np.dtype(x.dtype)]

        def raw_nccl() -> Any:
            stream = t.xp.cuda.get_current_stream()
            comm.allReduce(x.data.ptr, out.data.ptr, x.size, dtype, module.NCCL_SUM, stream.ptr)
            return out

        impls["raw_nccl"] = raw_nccl

    def raw_copy() -> Any:
        t.xp.copyto(out, x)
        return out

    impls["raw_copy"] = raw_copy
    return impls


def _check(t: GpuTarget, impls: Mapping[str, Callable[[], Any]], want: np.ndarray,
           when: str) -> None:
    for name, call in impls.items():
        got = call()
        t.sync()
        host = np.asarray(got.get() if hasattr(got, "get") else got)
        if host.shape != want.shape or not np.array_equal(host, want):
            raise CheckFailed(f"{name} gave wrong values {when} timing")


def run_gpu_allreduce(t: GpuTarget, sizes: Sequence[int] | None = None, quick: bool = False,
                      rounds: int | None = None, min_time: float | None = None,
                      warmup: int | None = None) -> tuple[Job, list[Row]]:
    """``(job, rows)``: one row per size and implementation (see the module); ``ratio`` is the
    time over raw NCCL's (raw copy's where NCCL is absent)."""
    sizes = list(sizes) if sizes else bench.parse_sizes(QUICK_SIZES if quick else DEFAULT_SIZES)
    timer = DeviceTimer(t.sync, min_time=min_time or (0.005 if quick else 0.02),
                        warmup=warmup if warmup is not None else (2 if quick else 5),
                        rounds=rounds or (3 if quick else 7))
    rows: list[Row] = []
    baseline = "raw_copy"
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        host = (np.arange(count) % 251).astype(np.float32)
        x, out = t.xp.asarray(host), t.xp.empty_like(t.xp.asarray(host))
        impls = _implementations(t, x, out)
        baseline = "raw_nccl" if "raw_nccl" in impls else "raw_copy"
        _check(t, impls, host, "before")
        stats = timer.compare(impls, calibrate_with=baseline)
        _check(t, impls, host, "after")
        base = stats[baseline]["median"]
        for name, s in stats.items():
            seconds = s["median"]
            rows.append({"size_bytes": count * 4, "count": count, "dtype": "float32",
                         "impl": name, "label": IMPLS[name], "calls": s["calls"],
                         "time_us": seconds * 1e6, "time_min_us": s["min"] * 1e6,
                         "time_max_us": s["max"] * 1e6,
                         "algbw_gbps": count * 4 / seconds / 1e9 if seconds > 0 else 0.0,
                         "ratio": seconds / base if base > 0 else math.nan,
                         "baseline": baseline})
    job = _job(t, timer, baseline)
    return job, rows


def _job(t: GpuTarget, timer: DeviceTimer, baseline: str) -> Job:
    device = "cpu (stand-in: not a GPU number)"
    if t.gpu:
        props = t.xp.cuda.runtime.getDeviceProperties(0)
        name = props.get("name", b"")
        device = name.decode() if isinstance(name, bytes) else str(name)
    return {"device": device, "gpu": t.gpu, "baseline": baseline, "rounds": timer.rounds,
            "warmup": timer.warmup, "min_time": timer.min_time}


def table(job: Job, rows: Sequence[Row]) -> list[str]:
    """The report printed by ``mpidist bench gpu``: one line per size and implementation."""
    lines = [f"# mpidist bench gpu: one device, {job['device']}",
             f"# time = median over {job['rounds']} interleaved rounds (device synchronized "
             f"around each sample of >= {job['min_time'] * 1e3:g} ms); results checked before "
             "and after",
             f"# ratio = time / {job['baseline']} time",
             "#"]
    lines += [f"# {key:<24} {label}" for key, label in IMPLS.items()]
    lines.append(f"# {'size':>8} {'implementation':<24} {'time (us)':>10} {'algbw GB/s':>11} "
                 f"{'ratio':>7}")
    for r in rows:
        lines.append(f"  {bench.human_size(r['size_bytes']):>8} {r['impl']:<24} "
                     f"{r['time_us']:>10.2f} {r['algbw_gbps']:>11.3f} {r['ratio']:>7.2f}")
    return lines
