"""``mpidist bench step``: the step a user writes, timed beside its raw baseline in the same job.

Three paths, each under every strategy this job can run (one process: OneDevice, Mirrored on
two CPU devices and MultiWorkerMirrored on one rank; several ranks: MultiWorkerMirrored with one
replica per rank):

- ``allreduce``: ``strategy.run(lambda: get_replica_context().all_reduce("SUM", x))`` against
  raw mpi4py ``comm.Allreduce(x, out)`` (Mirrored: NumPy's ``np.add(x0, x1, out=o)`` plus the
  copy to the second replica, what the data needs in one process).
- ``apply_gradients``: ``strategy.run(lambda: optimizer.apply_gradients(zip(grads, vars)))``
  with V float32 variables holding 100000 elements in all (V = 10, 100, 1000), SGD with
  momentum and Adam, against one raw ``Allreduce`` of the packed gradients plus the update
  written as fused as NumPy allows (in-place ufuncs with ``out=`` on the packed arrays).
  OneDevice's baseline is the update alone; Mirrored's is ``np.add`` of the two packed
  gradients plus the update of each replica's packed copy. A second baseline replaces the
  NumPy update by the best single pass there is, mpidist's own fused Numba kernel on the
  packed arrays (``ratio_to_fused``).
- ``fit``: one ``mpidist.fit`` epoch of N steps of an MLP (the digits example's 64-32-10, and a
  20-layer 64-128...-10), ms per step, with the time spent inside the strategy's reduction
  plan (fit's one fused all-reduce of loss and gradients: communication, including the wait
  for the slowest replica) and a raw ``Allreduce`` of the same gradient bytes for scale.

Method: results are checked against the baseline's before timing; cases alternate within each
round (order flipped every round); a sample is the slowest rank's time per call; the figure is
the median of the rounds (mpidist.cli.bench.Timer). The call count is calibrated on the mpidist
case.
"""

# wait-ok-file: the raw mpi4py calls here are the baselines being measured (and their timers'
# barriers); bounding them would change what is measured. The timed public path is mpidist's.

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mpidist.cli import bench
from mpidist.comm.mpi import mpi_module

if TYPE_CHECKING:
    from mpidist.strategies.strategy import Strategy
    from mpidist.training.optimizers import Optimizer

__all__ = ["PATHS", "FULL_SIZES", "QUICK_SIZES", "VARIABLE_COUNTS", "TOTAL_ELEMENTS", "OPTIMIZERS",
           "MODELS", "strategies_for_job", "run_step_sweep", "DeepMLP"]

PATHS = ("allreduce", "apply_gradients", "fit")
FULL_SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)
QUICK_SIZES = (4 << 10, 256 << 10)
VARIABLE_COUNTS = (10, 100, 1000)
TOTAL_ELEMENTS = 100_000  # float32: 400 KB of parameters whatever the variable count
OPTIMIZERS = ("sgd", "adam")
LEARNING_RATE = 1e-3
MOMENTUM = 0.9
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7
GLOBAL_BATCH = 256
# name -> layer widths; "digits" is examples/digits_mlp.py's model (64 -> 32 tanh -> 10).
MODELS = {"digits MLP": (64, 32, 10), "20-layer MLP": (64,) + (128,) * 19 + (10,)}


# -- strategies ---------------------------------------------------------------------------------
def strategies_for_job(size: int, nodes: int) -> list[tuple[str, Callable[[], Any]]]:
    """``[(label, factory)]`` for a job of ``size`` ranks on ``nodes`` nodes."""
    import mpidist  # noqa: PLC0415 - the strategy layer
    from mpidist.cluster_resolver import MPIClusterResolver  # noqa: PLC0415

    def mwms() -> "Strategy":
        return mpidist.MultiWorkerMirroredStrategy(
            cluster_resolver=MPIClusterResolver(local_devices=["/cpu:0"]))

    where = f" ({nodes} nodes)" if nodes > 1 else ""
    setups = [(f"MWMS {size}x1{where}", mwms)]
    if size == 1:
        setups = [("OneDevice", lambda: mpidist.OneDeviceStrategy("/cpu:0")),
                  ("Mirrored x2", lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]))] + setups
    return setups


def _replica_ids(strategy: "Strategy", rank: int) -> list[int]:
    """Global replica ids of this process's replicas (one per local device)."""
    local = len(strategy.extended.worker_devices)
    return list(range(rank * local, rank * local + local))


def _agree(control: Any, failure: str | None, what: str) -> None:
    bench.agree_on_check(control, failure, what)


def _close(got: Any, want: Any, what: str, rtol: float = 1e-5, atol: float = 1e-6
           ) -> str | None:
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    bad = np.flatnonzero(~np.isclose(got, want, rtol=rtol, atol=atol))
    if bad.size:
        i = int(bad[0])
        return f"{what}: {bad.size} of {got.size} values differ, first at {i}: " \
               f"{got[i]!r} vs {want[i]!r}"
    return None


# -- (a) run + replica-context all_reduce -------------------------------------------------------
def _allreduce_case(strategy: "Strategy", label: str, nbytes: int, timer: bench.Timer,
                    raw_comm: Any, mpi: Any, rank: int, size: int) -> bench.Row:
    from mpidist import get_replica_context  # noqa: PLC0415

    count = nbytes // 4
    ids = _replica_ids(strategy, rank)
    replicas = strategy.num_replicas_in_sync
    xs: dict[int | np.integer, np.ndarray] = {
        rid: bench.pattern(rid, count, "float32", "sum") for rid in ids}
    want = bench.expected(replicas, count, "float32", "sum")
    got: dict[str, Any] = {}

    def step() -> Any:
        ctx = get_replica_context()  # inside strategy.run: never None
        return ctx.all_reduce("SUM", xs[ctx.replica_id_in_sync_group])  # type: ignore[union-attr]

    def ours() -> None:
        got["out"] = strategy.run(step)

    outs = [np.zeros(count, np.float32) for _ in ids]
    if len(ids) > 1:  # one process, several devices: NumPy's sum, then each replica's copy
        def raw() -> None:
            np.add(xs[ids[0]], xs[ids[1]], out=outs[0])
            for extra in range(2, len(ids)):
                np.add(outs[0], xs[ids[extra]], out=outs[0])
            for o in outs[1:]:
                np.copyto(o, outs[0])
        baseline = f"np.add of {len(ids)} + copies"
    else:
        def raw() -> None:
            raw_comm.Allreduce(xs[ids[0]], outs[0], mpi.SUM)
        baseline = "raw comm.Allreduce"
    ours()
    raw()
    results = strategy.experimental_local_results(got["out"])
    failure = None
    for r in list(results) + outs:
        failure = failure or _close(r, want, "result", rtol=0, atol=0)
    _agree(timer.control, failure, f"{label}: run + all_reduce of {bench.human_size(nbytes)}")
    stats = timer.compare({"mpidist": ours, "baseline": raw}, calibrate_with="mpidist")
    return _row("allreduce", label, size, replicas, stats, baseline,
                size_bytes=nbytes, case=bench.human_size(nbytes))


# -- (b) apply_gradients ------------------------------------------------------------------------
class _PackedUpdate:
    """The baseline's optimizer: one in-place NumPy pass per step over packed arrays."""

    def __init__(self, kind: str, weights: np.ndarray) -> None:
        self.kind = kind
        self.w = weights
        self.tmp = np.empty_like(weights)
        self.slots = [np.zeros_like(weights) for _ in range(1 if kind == "sgd" else 2)]
        self.step = 0

    def apply(self, g: np.ndarray) -> None:
        w, t = self.w, self.tmp
        self.step += 1
        if self.kind == "sgd":  # m = momentum * m - lr * g; w += m
            (m,) = self.slots
            np.multiply(m, np.float32(MOMENTUM), out=m)
            np.multiply(g, np.float32(LEARNING_RATE), out=t)
            np.subtract(m, t, out=m)
            np.add(w, m, out=w)
            return
        m, v = self.slots  # Adam, Keras's rule as mpidist.optimizers.Adam writes it
        alpha = LEARNING_RATE * np.sqrt(1 - BETA_2 ** self.step) / (1 - BETA_1 ** self.step)
        np.subtract(g, m, out=t)
        np.multiply(t, np.float32(1 - BETA_1), out=t)
        np.add(m, t, out=m)
        np.multiply(g, g, out=t)
        np.subtract(t, v, out=t)
        np.multiply(t, np.float32(1 - BETA_2), out=t)
        np.add(v, t, out=v)
        np.sqrt(v, out=t)
        np.add(t, np.float32(EPSILON), out=t)
        np.divide(m, t, out=t)
        np.multiply(t, np.float32(alpha), out=t)
        np.subtract(w, t, out=w)


class _FusedPackedUpdate:
    """The best single-pass update: mpidist's fused Numba kernel (one loop over the packed
    parameters, gradients and slots), the floor any optimizer's update can reach."""

    def __init__(self, kind: str, weights: np.ndarray) -> None:
        self.kind = kind
        self.w = weights
        self.slots = [np.zeros_like(weights) for _ in range(1 if kind == "sgd" else 2)]
        self.step = 0

    def apply(self, g: np.ndarray) -> None:
        from mpidist.kernels import optimizers as fused  # noqa: PLC0415

        f32 = np.float32
        self.step += 1
        if self.kind == "sgd":
            fused.sgd_momentum_update(self.w, g, self.slots[0], f32(LEARNING_RATE), f32(MOMENTUM),
                                      False)
            return
        m, v = self.slots
        alpha = LEARNING_RATE * np.sqrt(1 - BETA_2 ** self.step) / (1 - BETA_1 ** self.step)
        fused.adam_update(self.w, g, m, v, None, f32(alpha), f32(1 - BETA_1), f32(1 - BETA_2),
                          f32(EPSILON))


def _make_optimizer(kind: str) -> "Optimizer":
    import mpidist  # noqa: PLC0415

    if kind == "sgd":
        return mpidist.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    return mpidist.optimizers.Adam(LEARNING_RATE, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON)


def _apply_case(strategy: "Strategy", label: str, kind: str, nvars: int, timer: bench.Timer,
                raw_comm: Any, mpi: Any, rank: int, size: int) -> bench.Row:
    import mpidist  # noqa: PLC0415

    per = TOTAL_ELEMENTS // nvars
    ids = _replica_ids(strategy, rank)
    replicas = strategy.num_replicas_in_sync
    start = (np.arange(TOTAL_ELEMENTS) % 11).astype(np.float32) * np.float32(0.1)
    with strategy.scope():
        variables = [mpidist.Variable(start[i * per:(i + 1) * per].copy(), name=f"v{i}")
                     for i in range(nvars)]
        optimizer = _make_optimizer(kind)
    packed_g = {rid: ((np.arange(TOTAL_ELEMENTS) % 7 + rid % 5).astype(np.float32)
                      * np.float32(1e-2)) for rid in ids}
    grads = {rid: [packed_g[rid][i * per:(i + 1) * per] for i in range(nvars)] for rid in ids}
    pairs: dict[int | np.integer, list[tuple[np.ndarray, Any]]] = {
        rid: list(zip(grads[rid], variables)) for rid in ids}

    def step() -> None:
        from mpidist import get_replica_context  # noqa: PLC0415

        # Inside strategy.run the replica context is never None.
        optimizer.apply_gradients(
            pairs[get_replica_context().replica_id_in_sync_group])  # type: ignore[union-attr]

    def ours() -> None:
        strategy.run(step)

    updates = [_PackedUpdate(kind, start.copy()) for _ in ids]
    summed = np.empty(TOTAL_ELEMENTS, np.float32)
    if len(ids) > 1:
        def comm() -> None:
            np.add(packed_g[ids[0]], packed_g[ids[1]], out=summed)
            for extra in ids[2:]:
                np.add(summed, packed_g[extra], out=summed)
        baseline = f"np.add of {len(ids)} packed + {len(ids)} NumPy updates"
    elif label == "OneDevice":
        def comm() -> None:
            pass
        summed = packed_g[ids[0]]
        baseline = "one NumPy update"
    else:
        def comm() -> None:
            raw_comm.Allreduce(packed_g[ids[0]], summed, mpi.SUM)
        baseline = "raw Allreduce + NumPy update"

    fused_updates = [_FusedPackedUpdate(kind, start.copy()) for _ in ids]

    def update() -> None:
        for u in updates:
            u.apply(summed)

    def fused_update() -> None:
        for u in fused_updates:
            u.apply(summed)

    def raw() -> None:
        comm()
        update()

    def raw_fused() -> None:
        comm()
        fused_update()

    ours()
    raw()
    raw_fused()
    failure = None
    want = updates[0].w
    failure = _close(fused_updates[0].w, want, "the fused baseline")
    for i, v in enumerate(variables):
        for value in strategy.experimental_local_results(v):
            failure = failure or _close(value, want[i * per:(i + 1) * per], f"variable {i}")
    _agree(timer.control, failure, f"{label}: apply_gradients {kind} {nvars} variables")
    cases = {"mpidist": ours, "baseline": raw, "fused baseline": raw_fused}
    if label != "OneDevice":
        cases["comm"] = comm
    cases["update"] = update
    cases["fused update"] = fused_update
    stats = timer.compare(cases, calibrate_with="mpidist")
    row = _row("apply_gradients", label, size, replicas, stats, baseline,
               optimizer=kind, variables=nvars, size_bytes=TOTAL_ELEMENTS * 4,
               case=f"{kind} {nvars}x{per}")
    row["comm_us"] = stats["comm"]["median"] * 1e6 if "comm" in stats else 0.0
    row["update_us"] = stats["update"]["median"] * 1e6
    row["ratio_to_update"] = row["time_us"] / row["update_us"]
    row["fused_update_us"] = stats["fused update"]["median"] * 1e6
    row["fused_baseline_us"] = stats["fused baseline"]["median"] * 1e6
    row["ratio_to_fused"] = row["time_us"] / row["fused_baseline_us"]
    return row


# -- (c) fit step -------------------------------------------------------------------------------
class DeepMLP:
    """An MLP of any depth (tanh hidden layers, softmax cross-entropy), backward by hand, in the
    shape ``mpidist.fit`` expects (examples/digits_mlp.py's model with widths (64, 32, 10))."""

    def __init__(self, widths: Sequence[int], seed: int = 0, dtype: Any = np.float64):
        import mpidist  # noqa: PLC0415

        rng = np.random.default_rng(seed)
        self.layers = []
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
            w = mpidist.Variable(rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)).astype(dtype),
                                 name=f"w{i}")
            b = mpidist.Variable(np.zeros(n_out, dtype), name=f"b{i}")
            self.layers.append((w, b))

    @property
    def trainable_variables(self) -> list[Any]:
        return [v for layer in self.layers for v in layer]

    def loss_and_gradients(self, x: np.ndarray,
                           y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        return mlp_loss_and_gradients([(w.read_value(), b.read_value()) for w, b in self.layers],
                                      x, y)


def mlp_loss_and_gradients(weights: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray,
                           y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """DeepMLP's forward and backward pass on plain arrays ``[(w, b), ...]``: the per-example
    losses, the gradients in variable order (w0, b0, w1, ...) and the logits."""
    acts = [np.asarray(x, dtype=weights[0][0].dtype)]
    for i, (w, b) in enumerate(weights):
        z = acts[-1] @ w + b
        acts.append(np.tanh(z) if i < len(weights) - 1 else z)
    logits = acts[-1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(y))
    per_example = -log_probs[rows, y]
    delta = np.exp(log_probs)
    delta[rows, y] -= 1.0
    grads = []
    for i in range(len(weights) - 1, -1, -1):
        grads += [delta.sum(axis=0), acts[i].T @ delta]
        if i:
            delta = (delta @ weights[i][0].T) * (1.0 - acts[i] * acts[i])
    return per_example, grads[::-1], logits


class ReductionClock:
    """Wall time spent inside the strategy's reduction plan (``reduction_plan()``'s
    ``all_reduce`` and ``all_reduce_packed``: every sum of a replica's values goes through one
    of them, ``ReplicaContext.all_reduce``'s and the optimizer's packed gradients alike),
    summed over this process's replica threads (divide by the local replicas for a step's
    share); installed only while entered (``with ReductionClock(strategy) as clock``).
    ``benchmarks/training_step.py`` times its fit steps with it too."""

    _ENTRIES = ("all_reduce", "all_reduce_packed")

    def __init__(self, strategy: "Strategy") -> None:
        self.spans: list[float] = []
        self._plan_class = type(strategy.extended.reduction_plan())
        self._saved = [(name, self._plan_class.__dict__[name]) for name in self._ENTRIES
                       if name in self._plan_class.__dict__]

    def __enter__(self) -> "ReductionClock":
        spans = self.spans
        for name, original in self._saved:
            def timed(plan: Any, *args: Any, _original: Callable[..., Any] = original,
                      **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _original(plan, *args, **kwargs)
                finally:
                    spans.append(time.perf_counter() - start)  # list.append is thread-safe
            setattr(self._plan_class, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved:
            setattr(self._plan_class, name, original)

    def take(self) -> float:
        total = sum(self.spans)
        self.spans.clear()
        return total


def _fit_case(strategy: "Strategy", label: str, model_name: str, steps: int,
              timer: bench.Timer, raw_comm: Any, mpi: Any, size: int) -> bench.Row:
    import mpidist  # noqa: PLC0415
    from mpidist.data import Dataset  # noqa: PLC0415

    widths = MODELS[model_name]
    rng = np.random.default_rng(1)
    x = rng.random((GLOBAL_BATCH * steps, widths[0]))
    y = rng.integers(0, widths[-1], GLOBAL_BATCH * steps)
    data = Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
    with strategy.scope():
        model = DeepMLP(widths)
        optimizer = mpidist.optimizers.SGD(0.01, momentum=0.9)
    grad_elements = sum(int(np.asarray(v.numpy()).size) for v in model.trainable_variables)
    packed = np.ones(grad_elements + 2)
    packed_out = np.empty_like(packed)
    local = len(strategy.extended.worker_devices)
    history = mpidist.fit(model, data, epochs=1, optimizer=optimizer, strategy=strategy,
                          verbose=0)  # warm-up; also checks the loss is a number
    loss = history.history["loss"][-1]
    _agree(timer.control, None if np.isfinite(loss) else f"loss {loss}", f"{label}: fit")
    raw_step = _RawFitStep(model, x, y, size, raw_comm, mpi)
    step_s: list[float]
    comm_s: list[float]
    raw_step_s: list[float]
    raw_comm_s: list[float]
    step_s, comm_s, raw_step_s, raw_comm_s = [], [], [], []
    clock = ReductionClock(strategy)
    with clock:
        for _ in range(timer.rounds):  # mpidist and the raw step alternate, round by round
            clock.take()
            timer.control.Barrier()
            start = time.perf_counter()
            mpidist.fit(model, data, epochs=1, optimizer=optimizer, strategy=strategy, verbose=0)
            elapsed = time.perf_counter() - start
            step_s.append(timer.control.allreduce(elapsed, op=mpi.MAX) / steps)
            comm_s.append(timer.control.allreduce(clock.take() / local, op=mpi.MAX) / steps)
            timer.control.Barrier()
            elapsed, in_allreduce = raw_step.epoch(steps)
            raw_step_s.append(timer.control.allreduce(elapsed, op=mpi.MAX) / steps)
            raw_comm_s.append(timer.control.allreduce(in_allreduce, op=mpi.MAX) / steps)
    raw = timer.compare({"raw": lambda: raw_comm.Allreduce(packed, packed_out, mpi.SUM)},
                        calibrate_with="raw")["raw"]
    step, comm = statistics.median(step_s), statistics.median(comm_s)
    raw_step_time, raw_comm = statistics.median(raw_step_s), statistics.median(raw_comm_s)
    return {
        "path": "fit", "strategy": label, "ranks": size, "replicas": strategy.num_replicas_in_sync,
        "case": model_name, "model": model_name, "layers": len(widths) - 1,
        "variables": len(model.trainable_variables), "size_bytes": packed.nbytes,
        "steps": steps, "global_batch": GLOBAL_BATCH,
        "time_us": step * 1e6, "step_ms": step * 1e3, "comm_ms": comm * 1e3,
        "comm_share": comm / step if step > 0 else 0.0,
        "raw_allreduce_us": raw["median"] * 1e6,
        "baseline": "raw Allreduce of the gradient bytes",
        "baseline_us": raw["median"] * 1e6,
        "ratio": step / raw["median"] if raw["median"] > 0 else 0.0,
        "step_samples_ms": [s * 1e3 for s in step_s],
        # the same step in plain NumPy + mpi4py (_RawFitStep), timed the same way
        "raw_step_ms": raw_step_time * 1e3, "raw_comm_ms": raw_comm * 1e3,
        "raw_comm_share": raw_comm / raw_step_time if raw_step_time > 0 else 0.0,
        "step_x_raw": step / raw_step_time if raw_step_time > 0 else 0.0,
    }


class _RawFitStep:
    """The fit step without mpidist, for the fit row's baseline: each rank computes its share
    of the global batch with ``mlp_loss_and_gradients`` on plain arrays, packs the loss sum,
    the example count and the gradients into one float64 buffer, sums it with mpi4py's
    ``Allreduce`` and applies SGD with momentum 0.9 in NumPy. ``epoch`` returns the wall time
    and the time inside ``Allreduce`` (waiting for the slower rank included, as for mpidist)."""

    def __init__(self, model: DeepMLP, x: np.ndarray, y: np.ndarray, ranks: int, comm: Any,
                 mpi: Any) -> None:
        self.weights = [(np.array(w.numpy()), np.array(b.numpy())) for w, b in model.layers]
        self.velocity = [(np.zeros_like(w), np.zeros_like(b)) for w, b in self.weights]
        rows = GLOBAL_BATCH // ranks
        rank = comm.Get_rank()
        self.batches = [(x[i + rank * rows:i + (rank + 1) * rows],
                         y[i + rank * rows:i + (rank + 1) * rows])
                        for i in range(0, len(x) - GLOBAL_BATCH + 1, GLOBAL_BATCH)]
        self.buffer = np.empty(2 + sum(w.size + b.size for w, b in self.weights))
        self.comm, self.sum = comm, mpi.SUM
        self.in_place = mpi.IN_PLACE

    def epoch(self, steps: int) -> tuple[float, float]:
        in_allreduce = 0.0
        buffer = self.buffer
        start = time.perf_counter()
        for xb, yb in self.batches[:steps]:
            per_example, grads, _ = mlp_loss_and_gradients(self.weights, xb, yb)
            buffer[0], buffer[1] = per_example.sum(), len(per_example)
            np.concatenate([g.reshape(-1) for g in grads], out=buffer[2:])
            t = time.perf_counter()
            self.comm.Allreduce(self.in_place, buffer, self.sum)
            in_allreduce += time.perf_counter() - t
            offset = 2
            for (w, b), (vw, vb) in zip(self.weights, self.velocity):
                for value, velocity in ((w, vw), (b, vb)):
                    grad = buffer[offset:offset + value.size].reshape(value.shape)
                    offset += value.size
                    velocity *= 0.9
                    velocity -= 0.01 / buffer[1] * grad  # the mean gradient over the batch
                    value += velocity
        return time.perf_counter() - start, in_allreduce


# -- rows and the sweep -------------------------------------------------------------------------
def _row(path: str, label: str, size: int, replicas: int,
         stats: Mapping[str, Mapping[str, Any]], baseline: str, **extra: Any) -> bench.Row:
    ours, base = stats["mpidist"], stats["baseline"]
    row = {"path": path, "strategy": label, "ranks": size, "replicas": replicas,
           "calls": ours["calls"], "time_us": ours["median"] * 1e6,
           "time_min_us": ours["min"] * 1e6, "time_max_us": ours["max"] * 1e6,
           "baseline": baseline, "baseline_us": base["median"] * 1e6,
           "ratio": ours["median"] / base["median"] if base["median"] > 0 else 0.0}
    row.update(extra)
    return row


def run_step_sweep(timer: bench.Timer, quick: bool = False, paths: Sequence[str] = PATHS,
                   on_row: Callable[[bench.Job, bench.Row], None] | None = None,
                   ) -> tuple[bench.Job, list[bench.Row]]:
    """The whole sweep on this job; ``(job, rows)`` on every rank. ``on_row(job, row)`` is called
    on every rank as each case finishes."""
    from mpidist.comm.communicator import world_communicator  # noqa: PLC0415 - starts MPI

    mpi = mpi_module()
    comm = world_communicator()
    raw_comm = mpi.COMM_WORLD.Dup()  # raw MPI on its own communicator, as mpidist's is
    job = bench.job_facts(comm, mpi)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    counts = VARIABLE_COUNTS[:2] if quick else VARIABLE_COUNTS
    models = list(MODELS)
    steps = 4 if quick else 16
    rows: list[bench.Row] = []

    def emit(row: bench.Row) -> None:
        row["nodes"] = comm.num_nodes
        rows.append(row)
        if on_row is not None:
            on_row(job, row)

    try:
        for label, make in strategies_for_job(comm.size, comm.num_nodes):
            strategy = make()
            if "allreduce" in paths:
                for nbytes in sizes:
                    emit(_allreduce_case(strategy, label, nbytes, timer, raw_comm, mpi,
                                         comm.rank, comm.size))
            if "apply_gradients" in paths:
                for kind in OPTIMIZERS:
                    for nvars in counts:
                        emit(_apply_case(strategy, label, kind, nvars, timer, raw_comm, mpi,
                                         comm.rank, comm.size))
            if "fit" in paths:
                for name in models:
                    emit(_fit_case(strategy, label, name, steps, timer, raw_comm, mpi,
                                   comm.size))
    finally:
        raw_comm.Free()
    return job, rows

