"""``mpidist bench keras``: a Keras ``model.fit`` step under MultiWorkerMirroredStrategy beside
the same model's raw step in JAX + mpi4py, in the same job.

Models (Keras 3, JAX backend): an MLP 784-1024-10 (global batch 256) and a small CNN on 28x28x1
(Conv 32 3x3, max-pool, Conv 64 3x3, max-pool, Dense 10; global batch 128), SGD with a learning
rate of 0.01, sparse categorical cross-entropy on logits.

* ``keras``: ``model.fit(x, y, batch_size=G, epochs=1, shuffle=False, verbose=0)``, the model
  built and compiled in ``MultiWorkerMirroredStrategy().scope()``. The figure is the epoch's
  time from Keras's ``on_epoch_begin`` to its ``on_epoch_end`` over its steps (each step: Keras's
  loop and callbacks, the rank's share of the batch, the jitted gradient, the checked
  all-reduce, the jitted update and the global metrics); ``fit_call_ms`` is the whole call
  (Keras's per-call setup and mpidist's agreement at the start of training included).
* ``raw``: the rank's share of the same batches through ``jax.jit(value_and_grad)`` of the
  model's ``stateless_call`` with the gradients packed into one buffer inside the jit, one
  mpi4py ``Allreduce``, and a jitted SGD update: the least a data-parallel step can do.
* ``mpi4jax`` (where installed): the raw step with the all-reduce inside the jit
  (``mpi4jax.allreduce``), the peer's way.

Before timing, one epoch of each path from the same weights must give the same weights.
Rounds alternate the paths; a sample is the slowest rank's time; figures are medians.
"""

# wait-ok-file: the raw mpi4py calls here are the baselines being measured (and their timers'
# barriers); bounding them would change what is measured. The timed public path is mpidist's.

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mpidist.cli import bench

__all__ = ["MODELS", "run_keras_benchmark"]

LEARNING_RATE = 0.01
# name -> (input shape, global batch)
MODELS = {"MLP 784-1024-10": ((784,), 256), "CNN 28x28x1": ((28, 28, 1), 128)}


def _build(name: str) -> Any:
    import keras  # noqa: PLC0415 - Keras (and JAX) only for this benchmark

    shape, _ = MODELS[name]
    keras.utils.set_random_seed(0)
    if name.startswith("MLP"):
        layers = [keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)]
    else:
        layers = [keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
                  keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
                  keras.layers.Flatten(), keras.layers.Dense(10)]
    model = keras.Sequential([keras.Input(shape)] + layers)
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _RawStep:
    """The model's step without Keras's trainer or mpidist: jitted gradient of the rank's share
    (packed inside the jit), one Allreduce (mpi4py, or mpi4jax inside the jit), jitted SGD."""

    def __init__(self, model: Any, comm: Any, mpi: Any, in_jit: bool) -> None:
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415
        import keras  # noqa: PLC0415

        self.params = [jnp.asarray(v.numpy()) for v in model.trainable_variables]
        shapes = [p.shape for p in self.params]
        sizes = [int(np.prod(s)) for s in shapes]
        ranks = comm.Get_size()

        def loss(params: Any, x: Any, y: Any) -> Any:
            logits, _ = model.stateless_call(params, [], x)
            return keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                from_logits=True).mean()

        def packed_gradient(params: Any, x: Any, y: Any) -> Any:
            # The barrier keeps XLA on CPU from fusing the matrix products into the
            # concatenation (plain loops, 10x slower): the raw step at its best.
            grads = jax.lax.optimization_barrier(  # type: ignore[no-untyped-call]
                jax.grad(loss)(params, x, y))
            return jnp.concatenate([g.reshape(-1) for g in grads])

        def update(params: Any, summed: Any) -> Any:
            out, at = [], 0
            for p, shape, size in zip(params, shapes, sizes):
                out.append(p - LEARNING_RATE / ranks * summed[at:at + size].reshape(shape))
                at += size
            return out

        self._update = jax.jit(update, donate_argnums=0)
        if in_jit:
            import mpi4jax  # noqa: PLC0415

            def step(params: Any, x: Any, y: Any) -> Any:
                summed = mpi4jax.allreduce(packed_gradient(params, x, y), op=mpi.SUM,
                                           comm=comm)
                return update(params, summed)

            self._fused: Any = jax.jit(step)
        else:
            self._fused = None
            self._gradient = jax.jit(packed_gradient)
            self._summed = np.empty(sum(sizes), np.float32)
        self.comm, self.mpi = comm, mpi

    def run(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
        start = time.perf_counter()
        params = self.params
        for x, y in batches:
            if self._fused is not None:
                params = self._fused(params, x, y)
            else:
                packed = np.asarray(self._gradient(params, x, y))
                self.comm.Allreduce(packed, self._summed, self.mpi.SUM)
                params = self._update(params, self._summed)
        params[-1].block_until_ready()
        self.params = params
        return time.perf_counter() - start


def _case(name: str, strategy: Any, comm: Any, mpi: Any, steps: int, rounds: int
          ) -> bench.Row:
    import keras  # noqa: PLC0415

    shape, global_batch = MODELS[name]
    rank, ranks = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(1)
    x = rng.random((global_batch * steps,) + shape, dtype=np.float32)
    y = rng.integers(0, 10, global_batch * steps)
    share = global_batch // ranks
    batches = [(x[i + rank * share:i + (rank + 1) * share], y[i + rank * share:i + (rank + 1)
                                                              * share])
               for i in range(0, len(x), global_batch)]
    with strategy.scope():
        model = _build(name)

    class EpochClock(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.seconds = time.perf_counter() - self.start

    clock = EpochClock()

    def keras_epoch() -> tuple[float, float]:
        start = time.perf_counter()
        model.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[clock])
        return clock.seconds, time.perf_counter() - start

    raw = _RawStep(model, comm, mpi, in_jit=False)
    peers: dict[str, _RawStep] = {"raw": raw}
    try:
        peers["mpi4jax"] = _RawStep(model, comm, mpi, in_jit=True)
    except ImportError:
        pass
    # The same start, one epoch each: the same weights (the check), and every jit compiled.
    for peer in peers.values():
        peer.run(batches)
    keras_epoch()
    got = np.concatenate([v.numpy().reshape(-1) for v in model.trainable_variables])
    for label, peer in peers.items():
        want = np.concatenate([np.asarray(p).reshape(-1) for p in peer.params])
        error = float(np.max(np.abs(got - want)))
        if comm.allreduce(error, op=mpi.MAX) > 1e-4:
            raise bench.CheckFailed(f"{name}: model.fit and the {label} step disagree after one "
                                    f"epoch (max difference {error:g})")
    samples: dict[str, list[float]] = {"keras": [], "fit_call": [], **{k: [] for k in peers}}

    def slowest(seconds: float) -> float:
        return float(comm.allreduce(seconds, op=mpi.MAX)) / steps

    for round_index in range(rounds):  # alternate, the order flipped every round
        order: list[tuple[str, Callable[[], Any]]] = [("keras", keras_epoch)] + [
            (label, functools.partial(peer.run, batches)) for label, peer in peers.items()]
        for label, run in order if round_index % 2 == 0 else order[::-1]:
            comm.Barrier()
            result = run()
            if label == "keras":
                samples["keras"].append(slowest(result[0]))
                samples["fit_call"].append(slowest(result[1]))
            else:
                samples[label].append(slowest(result))
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    row: bench.Row = {
        "path": "keras fit", "model": name, "ranks": ranks,
        "replicas": strategy.num_replicas_in_sync, "global_batch": global_batch,
        "steps": steps, "rounds": rounds,
        "parameters": int(sum(v.numpy().size for v in model.trainable_variables)),
        "step_ms": med["keras"], "fit_call_ms": med["fit_call"], "raw_step_ms": med["raw"],
        "x_raw": med["keras"] / med["raw"],
        "step_samples_ms": [s * 1e3 for s in samples["keras"]],
        "raw_samples_ms": [s * 1e3 for s in samples["raw"]],
    }
    if "mpi4jax" in med:
        row.update(mpi4jax_step_ms=med["mpi4jax"], mpi4jax_x_raw=med["mpi4jax"] / med["raw"])
    return row


def run_keras_benchmark(steps: int = 16, rounds: int = 5, models: list[str] | None = None
                        ) -> tuple[bench.Job, list[bench.Row]]:
    """Every model's row, on every rank (``(job facts, rows)``)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import mpidist  # noqa: PLC0415
    from mpidist.comm.communicator import world_communicator  # noqa: PLC0415 - starts MPI
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    mpi = mpi_module()
    job = bench.job_facts(world_communicator(), mpi)
    comm = mpi.COMM_WORLD.Dup()  # the baselines' and the timers' own communicator
    try:
        strategy = mpidist.MultiWorkerMirroredStrategy()
        rows = [_case(name, strategy, comm, mpi, steps, rounds) for name in models or MODELS]
    finally:
        comm.Free()
    return job, rows


def keras_table(job: bench.Job, rows: list[bench.Row]) -> list[str]:
    lines = [f"Keras model.fit under MultiWorkerMirroredStrategy, {job['ranks']} rank(s): ms per "
             "step (median; slowest rank)",
             f"{'model':<18} {'batch':>5} {'fit step':>9} {'raw step':>9} {'x raw':>6} "
             f"{'mpi4jax':>8} {'x raw':>6} {'fit call/step':>13}"]
    for r in rows:
        peer = (f"{r['mpi4jax_step_ms']:>8.2f} {r['mpi4jax_x_raw']:>6.2f}"
                if "mpi4jax_step_ms" in r else f"{'-':>8} {'-':>6}")
        lines.append(f"{r['model']:<18} {r['global_batch']:>5} {r['step_ms']:>9.2f} "
                     f"{r['raw_step_ms']:>9.2f} {r['x_raw']:>6.2f} {peer} "
                     f"{r['fit_call_ms']:>13.2f}")
    return lines
