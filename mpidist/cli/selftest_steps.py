"""The steps of ``mpidist selftest --gpu``: each GPU path done once as a user would, on device
``GPU:0`` with CuPy values, and checked against NumPy on the host.

Each step runs in a process of its own (``python -m mpidist.cli.selftest_steps NAME``; the
2-rank step under ``mpiexec -n 2``), started by ``mpidist.cli.selftest`` under the step's
timeout, and ends by printing one line ``SELFTEST-RESULT: {"status", "detail"}``: ``pass``,
``fail`` (the error and the numbers) or ``skip`` (what is missing and the command that brings
it). ``--stand-in cpu`` runs the same code with NumPy on ``/cpu:0`` (the kernels under Numba's
simulator): a rehearsal of the steps themselves on a machine without a GPU, never a claim that
a GPU ran.
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpidist.cli.selftest_skip import SkipStep

__all__ = ["MARKER", "STEP_FUNCTIONS", "Target", "SkipStep", "ulp_distance", "main"]

MARKER = "SELFTEST-RESULT: "
Detail = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """Where a step computes: CuPy on ``/gpu:0``, or NumPy on ``/cpu:0`` (the stand-in)."""

    gpu: bool
    xp: Any
    device: str

    def host(self, x: Any) -> np.ndarray:
        """``x`` as a NumPy array (a copy from the device for CuPy)."""
        if hasattr(x, "numpy") and not isinstance(x, np.ndarray) and not hasattr(x, "get"):
            x = x.numpy()  # a Variable
        return np.asarray(x.get() if hasattr(x, "get") else x)

    def on_device(self, x: Any, what: str) -> None:
        """Fail unless ``x`` lives where the target computes (GPU 0 for CuPy)."""
        if not self.gpu:
            if not isinstance(x, np.ndarray | np.generic):
                raise AssertionError(f"{what}: a {type(x).__name__}, not a NumPy array")
            return
        if not isinstance(x, self.xp.ndarray):
            raise AssertionError(f"{what}: a {type(x).__module__}.{type(x).__name__}, "
                                 "not a CuPy array")
        if int(x.device.id) != 0:
            raise AssertionError(f"{what}: on GPU {x.device.id}, not GPU 0")


def make_target(stand_in: str | None) -> Target:
    """The step's target; SkipStep where no GPU is usable (saying why)."""
    if stand_in == "cpu":
        return Target(False, np, "/cpu:0")
    from mpidist.backend import cupy_backend  # noqa: PLC0415 - imports CuPy

    cupy = cupy_backend.get_cupy()
    if cupy is None or cupy_backend.gpu_count() < 1:
        raise SkipStep(f"no GPU ({cupy_backend.unavailable_reason()})")
    return Target(True, cupy, "/gpu:0")


# -- numbers ----------------------------------------------------------------------------------
_UINT = {2: np.int16, 4: np.int32, 8: np.int64}


def ulp_distance(got: Any, want: Any) -> float:
    """The largest distance in units in the last place between ``got`` and ``want`` (same
    shape and dtype); 0 for bit-identical arrays, inf where one is NaN and the other not.
    Integers: the largest absolute difference."""
    a, b = np.asarray(got), np.asarray(want)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise AssertionError(f"shape/dtype {a.shape} {a.dtype} != {b.shape} {b.dtype}")
    if a.size == 0:
        return 0.0
    if a.dtype.kind in "iub":
        return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    if a.dtype.kind == "c":
        return max(ulp_distance(a.real.copy(), b.real.copy()),
                   ulp_distance(a.imag.copy(), b.imag.copy()))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if np.any(nan_a != nan_b):
        return float("inf")
    ints = _UINT[a.dtype.itemsize]

    def ordered(x: np.ndarray) -> np.ndarray:
        # sign-magnitude bits to a monotone integer line (-0.0 and 0.0 both 0), exact as
        # Python integers (float64's bit patterns do not fit a float's mantissa)
        i = np.ascontiguousarray(x).view(ints).astype(object)
        lowest = -(2 ** (8 * a.dtype.itemsize - 1))
        return np.where(i < 0, lowest - i, i)

    keep = ~nan_a
    if not np.any(keep):
        return 0.0
    return float(max(abs(d) for d in ordered(a[keep]) - ordered(b[keep])))


def require_bitwise(got: Any, want: Any, what: str, ulps: dict[str, float]) -> None:
    """Record ``what``'s ulp distance in ``ulps``; fail unless bit-identical."""
    distance = ulp_distance(got, want)
    ulps[what] = distance
    if distance != 0.0:
        raise AssertionError(f"{what}: not bit-identical to NumPy ({distance:g} ulp apart)")


# -- the steps -------------------------------------------------------------------------------
def _replica_context() -> Any:
    """The ReplicaContext of the replica running this (inside ``strategy.run``)."""
    import mpidist  # noqa: PLC0415

    ctx = mpidist.get_replica_context()
    if ctx is None:
        raise AssertionError("no replica context: called outside strategy.run")
    return ctx


def step_kernels(t: Target) -> Detail:
    """Numba kernels of mpidist.kernels against their NumPy twins, bit for bit
    (tests/unit/cudasim_checks.py's checks, on the GPU; under the simulator for the stand-in)."""
    from mpidist.cli.selftest_kernels import run_kernel_checks  # noqa: PLC0415

    results = run_kernel_checks()
    failed = {name: r for name, r in results.items() if not r.get("ok")}
    ulps = {name: r["max_ulp"] for name, r in results.items() if r.get("max_ulp")}
    detail: Detail = {"checks": len(results), "failed": len(failed), "ulp_differences": ulps}
    if failed:
        detail["failures"] = {name: str(r.get("detail", ""))[-1500:] for name, r in failed.items()}
        raise StepFailed(f"{len(failed)} of {len(results)} kernel checks differ from NumPy: "
                         + ", ".join(sorted(failed)), detail)
    return detail


def step_mirrored(t: Target) -> Detail:
    """MirroredStrategy on one GPU: a step whose replica all-reduces CuPy values (SUM, and MEAN
    of floats) of five dtypes, a cross-replica reduce, and a MEAN variable updated in the
    step."""
    import mpidist  # noqa: PLC0415

    xp = t.xp
    rng = np.random.default_rng(1)
    data = {dtype: (rng.standard_normal(1001) * 100).astype(dtype)
            for dtype in ("float16", "float32", "float64", "int32", "int64")}
    strategy = mpidist.MirroredStrategy([t.device])

    def step() -> dict[str, Any]:
        ctx = _replica_context()
        out = {}
        for dtype, host in data.items():
            x = xp.asarray(host)
            out[f"SUM {dtype}"] = ctx.all_reduce("SUM", x)
            if dtype.startswith("float"):
                out[f"MEAN {dtype}"] = ctx.all_reduce("MEAN", x)
        return out

    results = strategy.run(step)
    ulps: dict[str, float] = {}
    for name, value in results.items():
        local = strategy.experimental_local_results(value)[0]
        t.on_device(local, name)
        require_bitwise(t.host(local), data[name.split()[1]], name, ulps)  # one replica: x
    total = strategy.reduce("SUM", strategy.run(lambda: xp.asarray(data["float32"])), axis=None)
    require_bitwise(t.host(total), data["float32"], "strategy.reduce SUM", ulps)
    with strategy.scope():
        v = mpidist.Variable(np.ones(5, np.float32), aggregation=mpidist.VariableAggregation.MEAN)
    strategy.run(lambda: v.assign_add(xp.full((5,), 2.0, dtype=xp.float32)))
    component = strategy.experimental_local_results(v)[0]
    t.on_device(component.value(), "the variable's component")
    require_bitwise(t.host(component.numpy()), np.full(5, 3.0, np.float32),
                    "MEAN variable assign_add", ulps)
    return {"replicas": strategy.num_replicas_in_sync,
            "devices": list(strategy.extended.worker_devices), "checks": len(ulps)}


def step_nccl(t: Target) -> Detail:
    """NcclAllReduce on one device: all_reduce in a step and batch_reduce_to, every NCCL dtype
    (and complex64, which NCCL has no type for)."""
    import mpidist  # noqa: PLC0415
    from mpidist.comm.nccl import nccl_module  # noqa: PLC0415

    if t.gpu and nccl_module() is None:
        from mpidist.cli.gpu_components import cuda_extra  # noqa: PLC0415

        raise SkipStep(f"NCCL does not load through CuPy ({cuda_extra(None)} brings "
                       "nvidia-nccl)")
    xp = t.xp
    strategy = mpidist.MirroredStrategy([t.device], cross_device_ops=mpidist.NcclAllReduce())
    rng = np.random.default_rng(2)
    ulps: dict[str, float] = {}
    errors: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the stand-in's fallback warning
        for dtype in ("float16", "float32", "float64", "int32", "int64", "uint8", "complex64"):
            host = (rng.standard_normal(4099) * 50).astype(dtype)
            try:
                value = strategy.run(lambda h=host: _replica_context().all_reduce(
                    "SUM", xp.asarray(h)))
                local = strategy.experimental_local_results(value)[0]
                t.on_device(local, f"all_reduce {dtype}")
                require_bitwise(t.host(local), host, f"all_reduce {dtype}", ulps)
                per_replica = strategy.run(lambda h=host: xp.asarray(h))
                batch = strategy.extended.batch_reduce_to(
                    "SUM", [(per_replica, per_replica), (per_replica, t.device)])
                for i, got in enumerate(batch):
                    got = strategy.experimental_local_results(got)[0] \
                        if isinstance(got, mpidist.DistributedValues) else got
                    require_bitwise(t.host(got), host, f"batch_reduce_to[{i}] {dtype}", ulps)
            except Exception as exc:  # noqa: BLE001 - each dtype is reported
                errors[dtype] = f"{type(exc).__name__}: {exc}"[:600]
    detail: Detail = {"checks": len(ulps), "nccl_loaded": nccl_module() is not None}
    if errors:
        detail["errors"] = errors
        raise StepFailed(f"NcclAllReduce failed for {', '.join(errors)}", detail)
    return detail


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def step_mwms_rank(t: Target) -> Detail:
    """One rank of MultiWorkerMirroredStrategy at 2 ranks sharing GPU 0: all-reduce, reduce and
    gather of CuPy values across ranks, checked against NumPy. Ranks sharing a GPU cannot both
    drive it through NCCL, so the strategy must choose MPI (reported as ``nccl_across_ranks``)."""
    import mpidist  # noqa: PLC0415

    lines = _Lines()
    logging.getLogger("mpidist").addHandler(lines)
    xp = t.xp
    strategy = mpidist.MultiWorkerMirroredStrategy()
    resolver: Any = strategy.cluster_resolver
    communicator: Any = strategy.extended.communicator
    rank, size = int(resolver.task_id), int(communicator.size)
    hosts = [np.random.default_rng(10 + r).standard_normal(2049).astype(np.float32)
             for r in range(size)]

    def step() -> Any:
        ctx = _replica_context()
        return ctx.all_reduce("SUM", xp.asarray(hosts[rank])), ctx.all_reduce(
            "SUM", xp.full((7,), rank + 1, dtype=xp.int32))

    total, counted = strategy.run(step)
    ulps: dict[str, float] = {}
    want = hosts[0].copy()
    for h in hosts[1:]:
        want = want + h  # rank order; a + b is commutative, so any order gives these bits
    local = strategy.experimental_local_results(total)[0]
    t.on_device(local, "all_reduce SUM")
    require_bitwise(t.host(local), want, "all_reduce SUM float32", ulps)
    require_bitwise(t.host(strategy.experimental_local_results(counted)[0]),
                    np.full(7, size * (size + 1) // 2, np.int32), "all_reduce SUM int32", ulps)
    reduced = strategy.reduce("SUM", strategy.run(lambda: xp.full((3,), float(rank + 1))),
                              axis=None)
    require_bitwise(t.host(reduced), np.full(3, size * (size + 1) / 2), "strategy.reduce", ulps)
    gathered = strategy.gather(strategy.run(lambda: xp.full((2, 3), float(rank))), axis=0)
    require_bitwise(t.host(gathered), np.repeat(np.arange(size, dtype=np.float64), 2)[:, None]
                    * np.ones((1, 3)), "strategy.gather", ulps)
    nccl = [line.split("NCCL across ranks ")[1].split(";")[0] for line in lines.lines
            if "NCCL across ranks " in line]
    return {"rank": rank, "size": size, "devices": list(strategy.extended.worker_devices),
            "nccl_across_ranks": nccl[0] if nccl else "not logged", "checks": len(ulps)}


def step_prefetch(t: Target) -> Detail:
    """experimental_distribute_dataset with batches prefetched to the GPU (fetch_to_device,
    2 steps ahead): each batch a CuPy array on GPU 0 holding the host batch, and a step on it."""
    import mpidist  # noqa: PLC0415
    from mpidist.data import Dataset  # noqa: PLC0415

    strategy = mpidist.MirroredStrategy([t.device])
    # whole numbers: the step's sums are exact in any order (CuPy's reduction order is not
    # NumPy's)
    x = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    options = mpidist.InputOptions(experimental_fetch_to_device=True,
                                   experimental_per_replica_buffer_size=2)
    dist = strategy.experimental_distribute_dataset(Dataset.from_tensor_slices(x).batch(8),
                                                    options)
    batches, ulps = 0, dict[str, float]()
    for batch, want in zip(dist, np.split(x, 5), strict=True):
        local = strategy.experimental_local_results(batch)[0]
        t.on_device(local, f"batch {batches}")
        require_bitwise(t.host(local), want, f"batch {batches}", ulps)
        sums = strategy.run(lambda b: b.sum(axis=0), args=(batch,))
        require_bitwise(t.host(strategy.experimental_local_results(sums)[0]), want.sum(axis=0),
                        f"step on batch {batches}", ulps)
        batches += 1
    return {"batches": batches, "buffer_size": 2, "checks": len(ulps)}


def _optimizers() -> dict[str, Callable[[], Any]]:
    import mpidist  # noqa: PLC0415

    return {"SGD": lambda: mpidist.optimizers.SGD(0.1),
            "SGD momentum": lambda: mpidist.optimizers.SGD(0.1, momentum=0.9),
            "SGD nesterov": lambda: mpidist.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
            "Adam": lambda: mpidist.optimizers.Adam(1e-2),
            "Adam amsgrad": lambda: mpidist.optimizers.Adam(1e-2, amsgrad=True)}


def _train(strategy: Any, make: Callable[[], Any], dtype: str, xp: Any, steps: int) -> list[Any]:
    import mpidist  # noqa: PLC0415

    rng = np.random.default_rng(3)
    shapes = [(257,), (33, 7), ()]
    with strategy.scope():
        variables = [mpidist.Variable(rng.standard_normal(s).astype(dtype)) for s in shapes]
        optimizer = make()
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    for step_grads in grads:
        strategy.run(lambda g=step_grads: optimizer.apply_gradients(
            zip([xp.asarray(x) for x in g], variables)))
    return variables


def step_optimizers(t: Target) -> Detail:
    """The fused optimizers (SGD, momentum, Nesterov, Adam, AMSGrad) applied to GPU variables for
    3 steps, float32 and float64, compared bit for bit with the same steps on the CPU."""
    import mpidist  # noqa: PLC0415

    gpu = mpidist.MirroredStrategy([t.device])
    cpu = mpidist.MirroredStrategy(["/cpu:0"])
    ulps: dict[str, float] = {}
    failed = []
    for name, make in _optimizers().items():
        for dtype in ("float32", "float64"):
            got = _train(gpu, make, dtype, t.xp, steps=3)
            want = _train(cpu, make, dtype, np, steps=3)
            for i, (g, w) in enumerate(zip(got, want)):
                t.on_device(gpu.experimental_local_results(g)[0].value(), f"{name} var {i}")
                try:
                    require_bitwise(t.host(g.numpy()), t.host(w.numpy()),
                                    f"{name} {dtype} var {i}", ulps)
                except AssertionError as err:
                    failed.append(str(err))
    detail: Detail = {"checks": len(ulps),
                      "ulp_differences": {k: v for k, v in ulps.items() if v}}
    if failed:
        raise StepFailed(f"{len(failed)} of {len(ulps)} results differ from the CPU's", detail)
    return detail


def step_autodiff(t: Target) -> Detail:
    """mpidist.autodiff.value_and_grad with backend="jax" on a CuPy batch (what GPU prefetch
    delivers), jit off and on, against the closed-form gradient computed with NumPy."""
    import mpidist  # noqa: PLC0415

    try:
        from mpidist.training.autodiff import jax_module  # noqa: PLC0415

        jax = jax_module()
        jnp = jax.numpy
    except Exception as exc:  # noqa: BLE001 - JAX missing or broken
        raise SkipStep(f"JAX does not import ({type(exc).__name__}: {exc}); "
                       "pip install 'mpidist[jax]'") from None
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 5)).astype(np.float32)
    y = rng.standard_normal((64, 3)).astype(np.float32)
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    b0 = rng.standard_normal(3).astype(np.float32)
    err = (x.astype(np.float64) @ w0 + b0 - y)
    want_loss = float(np.mean(err ** 2))
    want = [2 * x.T.astype(np.float64) @ err / err.size, 2 * err.sum(axis=0) / err.size]
    strategy = mpidist.MirroredStrategy([t.device])
    with strategy.scope():
        w, b = mpidist.Variable(w0), mpidist.Variable(b0)

    def loss_fn(params: Sequence[Any], xb: Any, yb: Any) -> Any:
        wp, bp = params
        return jnp.mean((xb @ wp + bp - yb) ** 2)

    detail: Detail = {"jax": jax.__version__, "backend": jax.default_backend()}
    for jit in (False, True):
        def step(xb: Any, yb: Any, jit: bool = jit) -> Any:
            return mpidist.autodiff.value_and_grad(loss_fn, [w, b], xb, yb, backend="jax",
                                                   jit=jit)

        loss, grads = strategy.run(step, args=(t.xp.asarray(x), t.xp.asarray(y)))
        loss = strategy.experimental_local_results(loss)[0]
        grads = [strategy.experimental_local_results(g)[0] for g in grads]
        for i, g in enumerate(grads):
            t.on_device(g, f"jit={jit} grad {i}")
        worst = max(float(np.max(np.abs(t.host(g) - w_) / (np.abs(w_) + 1e-3)))
                    for g, w_ in zip(grads, want))
        loss_error = abs(float(t.host(loss)) - want_loss) / want_loss
        detail[f"jit={jit}"] = {"loss_rel_error": loss_error, "grad_rel_error": worst}
        if worst > 1e-4 or loss_error > 1e-5:
            raise StepFailed(f"jit={jit}: gradients {worst:.2e} / loss {loss_error:.2e} "
                             "relative error from NumPy's closed form", detail)
    return detail


def step_checkpoint(t: Target) -> Detail:
    """A checkpoint of GPU variables (a mirrored variable and Adam's slots): save, overwrite,
    restore, compare bit for bit; then restore into a CPU strategy and compare again."""
    import mpidist  # noqa: PLC0415

    xp = t.xp
    rng = np.random.default_rng(5)
    init = rng.standard_normal((17, 3)).astype(np.float32)
    grad = rng.standard_normal((17, 3)).astype(np.float32)
    strategy = mpidist.MirroredStrategy([t.device])
    with strategy.scope():
        v = mpidist.Variable(init.copy(), name="v")
        optimizer = mpidist.optimizers.Adam(1e-2)
    strategy.run(lambda: optimizer.apply_gradients([(xp.asarray(grad), v)]))
    saved = t.host(v.numpy()).copy()
    ulps: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="mpidist-selftest-") as folder:
        checkpoint = mpidist.train.Checkpoint(v=v, optimizer=optimizer)
        path = checkpoint.save(os.path.join(folder, "ckpt"))
        v.assign(np.zeros((17, 3), np.float32))
        checkpoint.restore(path)
        t.on_device(strategy.experimental_local_results(v)[0].value(), "restored variable")
        require_bitwise(t.host(v.numpy()), saved, "restored on the GPU", ulps)
        cpu = mpidist.MirroredStrategy(["/cpu:0"])
        with cpu.scope():
            v_cpu = mpidist.Variable(np.zeros((17, 3), np.float32), name="v")
        mpidist.train.Checkpoint(v=v_cpu).restore(path).expect_partial()
        require_bitwise(t.host(v_cpu.numpy()), saved, "restored on the CPU", ulps)
    return {"checks": len(ulps), "path": Path(path).name}


def step_bench(t: Target) -> Detail:
    """``mpidist bench gpu --quick``'s rows: strategy.run + all_reduce (default ops and
    NcclAllReduce) beside raw NCCL and a raw device copy, medians of interleaved rounds."""
    from mpidist.cli import bench_gpu  # noqa: PLC0415

    job, rows = bench_gpu.run_gpu_allreduce(bench_gpu.target_for(t.gpu), quick=True)
    return {"job": job, "rows": rows, "table": bench_gpu.table(job, rows)}


class StepFailed(AssertionError):
    """A step's check failed; ``detail`` holds the numbers gathered so far."""

    def __init__(self, message: str, detail: Detail):
        super().__init__(message)
        self.detail = detail


STEP_FUNCTIONS: dict[str, Callable[[Target], Detail]] = {
    "kernels": step_kernels,
    "mirrored": step_mirrored,
    "nccl": step_nccl,
    "mwms_2_ranks": step_mwms_rank,
    "prefetch": step_prefetch,
    "optimizers": step_optimizers,
    "autodiff_jax": step_autodiff,
    "checkpoint": step_checkpoint,
    "bench": step_bench,
}


def run_one(name: str, stand_in: str | None) -> dict[str, Any]:
    """``{"status", "detail"}`` of step ``name`` run here."""
    try:
        target = make_target(stand_in)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            detail = STEP_FUNCTIONS[name](target)
    except SkipStep as skip:
        return {"status": "skip", "detail": {"reason": str(skip)}}
    except StepFailed as err:
        return {"status": "fail", "detail": {"error": str(err), **err.detail}}
    except Exception as err:  # noqa: BLE001 - every failure goes into the report
        return {"status": "fail", "detail": {"error": f"{type(err).__name__}: {err}"[:3000],
                                             "traceback": traceback.format_exc(limit=12)[-6000:]}}
    return {"status": "pass", "detail": detail}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist.cli.selftest_steps")
    parser.add_argument("step", choices=sorted(STEP_FUNCTIONS))
    parser.add_argument("--stand-in", choices=["cpu"], default=None)
    args = parser.parse_args(argv)
    result = run_one(args.step, args.stand_in)
    print(MARKER + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
