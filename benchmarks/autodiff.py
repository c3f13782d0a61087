"""What the autodiff backends cost per training step, beside the same model's hand-written
backward (issue 16).

    python benchmarks/autodiff.py [--rounds 7] [--dtypes float64 float32] [--models digits deep]
    python benchmarks/autodiff.py --strategy mirrored --replicas 2
    mpiexec -n 2 python benchmarks/autodiff.py --strategy multi-worker --replicas 1

Models (tanh hidden layers, softmax cross-entropy, global batch 64 of synthetic data):
``digits`` is the MLP of ``examples/digits_mlp.py`` (64-32-10, 4 variables, the same initial
weights in float64); ``deep`` has 50 layers of weight + bias (64-32-...-32-10, 100 variables),
where a per-variable cost would show.

Ways, each timed as ``strategy.run(step, args=(x, y))``:

- ``hand``: the backward written out in array code, as the example's ``loss_and_gradients``
  (extended to any depth), gradients scaled to this replica's share of the mean loss;
- ``autograd`` and ``jax``: ``mpidist.autodiff.value_and_grad`` of the same loss;
- ``jax+jit``: the same, with the user's loss function wrapped in ``jax.jit`` before it is
  passed in (the backward pass itself stays eager: ``value_and_grad`` differentiates it);
- ``jax+compiled``: ``value_and_grad(..., jit=True)``, which compiles the loss and its
  gradient together once and reuses them;
- references without ``mpidist.autodiff``, the library called directly on the variables'
  values: ``autograd-direct`` and ``jax-direct`` (``value_and_grad`` of the library; the
  difference to ``autograd`` / ``jax`` is mpidist's own cost), and ``jax-direct-jit``
  (``jax.jit(jax.value_and_grad(loss))``: what a JAX user gets with the backward compiled too).

Each way is timed twice: the gradients alone, and a whole step (gradients plus
``optimizer.apply_gradients`` with SGD). Every dtype is timed on its own, hand-written code
included, so each backend is compared with the hand-written version in the same dtype. JAX
computes in float32 unless 64-bit mode is on, so the run turns ``jax_enable_x64`` on for its
duration (float32 models stay float32 in JAX) and restores it after. Before timing, every way's
gradients are checked against the hand-written ones. Rounds interleave the ways; medians over
rounds of the slowest rank.
"""

import argparse
import importlib.util
import itertools
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import mpidist
from mpidist.backend import array_module
from mpidist.backend.traced import namespace_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import digits_mlp
from job import interleaved, world

GLOBAL_BATCH = digits_mlp.GLOBAL_BATCH
MODELS = {
    "digits": (64, 32, 10),               # 2 layers, 4 variables
    "deep": (64,) + (32,) * 49 + (10,),   # 50 layers, 100 variables
}
WAYS = ("hand", "autograd", "jax", "jax+jit", "jax+compiled", "autograd-direct", "jax-direct",
        "jax-direct-jit")
# Gradient agreement asked of each way, by dtype: (rtol, atol relative to the largest gradient).
TOLERANCE = {"float64": (1e-9, 1e-12), "float32": (2e-4, 2e-6)}


class MLP:
    """tanh MLP with layer sizes ``widths`` and its hand-written backward; variables created in
    the current strategy's scope. Drawn as ``digits_mlp.MLP`` draws, so ``widths=(64, 32, 10)``
    in float64 starts from that example's weights."""

    def __init__(self, widths, dtype, seed=0):
        rng = np.random.default_rng(seed)
        self.trainable_variables = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
            w = rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)).astype(dtype)
            self.trainable_variables += [mpidist.Variable(w, name=f"w{i}"),
                                         mpidist.Variable(np.zeros(n_out, dtype), name=f"b{i}")]

    def loss_and_gradients(self, x, y):
        """Per-example cross-entropy, and the gradients of its sum over this batch."""
        values = [v.read_value() for v in self.trainable_variables]
        xp = array_module(values[0])
        activations = [xp.asarray(x)]
        for w, b in zip(values[:-2:2], values[1:-2:2]):
            activations.append(xp.tanh(activations[-1] @ w + b))
        logits = activations[-1] @ values[-2] + values[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        rows = xp.arange(len(y))
        per_example = -log_probs[rows, y]
        delta = xp.exp(log_probs)  # d(sum of losses) / d(logits) = softmax - one_hot
        delta[rows, y] -= 1.0
        grads = []
        for layer in reversed(range(len(values) // 2)):
            inputs = activations[layer]
            grads[:0] = [inputs.T @ delta, delta.sum(axis=0)]
            if layer:  # back through this layer's weights and the tanh below them
                delta = (delta @ values[2 * layer].T) * (1.0 - inputs * inputs)
        return per_example, grads


def mean_loss(params, x, y):
    """The same model's loss written for a backend: ``params`` are the variables' values,
    traced by autograd or JAX; ``namespace_of`` picks that library's array functions, so one
    function serves both."""
    xp = namespace_of(params[0])
    h = x
    for w, b in zip(params[:-2:2], params[1:-2:2]):
        h = xp.tanh(h @ w + b)
    logits = h @ params[-2] + params[-1]
    shifted = logits - xp.max(logits, axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))
    per_example = -log_probs[xp.arange(len(y)), y]
    return mpidist.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)


def library_of(way):
    """The autodiff library ``way`` needs: "autograd", "jax", or None for the hand-written
    backward."""
    return None if way == "hand" else way.split("-")[0].split("+")[0]


def available_ways():
    """The ways whose library is installed."""
    return [w for w in WAYS
            if library_of(w) is None or importlib.util.find_spec(library_of(w)) is not None]


@contextmanager
def jax_x64():
    """JAX's 64-bit mode on for the block (globally: replica threads must see it too), then
    back as it was. Nothing happens without JAX."""
    if importlib.util.find_spec("jax") is None:
        yield
        return
    import jax  # an optional extra

    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def gradient_fn(way, model):
    """``(x, y) -> gradients of this replica's share of the mean loss`` computed ``way``."""
    variables = model.trainable_variables
    if way == "hand":
        def hand(x, y):
            _, grads = model.loss_and_gradients(x, y)
            return [g / GLOBAL_BATCH for g in grads]  # the example's scaling to the mean
        return hand
    if "-direct" in way:
        return direct_gradient_fn(way, variables)
    loss_fn = mean_loss
    if way == "jax+jit":
        import jax  # an optional extra

        loss_fn = jax.jit(mean_loss)
    backend = library_of(way)
    compiled = way == "jax+compiled"  # mpidist compiles value and gradient together

    def backend_grads(x, y):
        _, grads = mpidist.autodiff.value_and_grad(loss_fn, variables, x, y, backend=backend,
                                                   jit=compiled)
        return grads
    return backend_grads


def direct_gradient_fn(way, variables):
    """The references without ``mpidist.autodiff``: the library's own ``value_and_grad``
    (compiled whole by ``jax.jit`` for ``jax-direct-jit``) called on the variables' current
    values, the gradients handed back as NumPy arrays for ``apply_gradients``."""
    if way == "autograd-direct":
        import autograd  # an optional extra

        differentiate = autograd.value_and_grad(mean_loss)
    else:
        import jax  # an optional extra

        differentiate = jax.value_and_grad(mean_loss)
        if way == "jax-direct-jit":
            differentiate = jax.jit(differentiate)

    def direct(x, y):
        _, grads = differentiate([v.read_value() for v in variables], x, y)
        return [np.asarray(g) for g in grads]
    return direct


def make_case(strategy, widths, dtype, way):
    """``(gradients_step, training_step)``: callables that run one step of ``way`` on a fresh
    model (the same initial weights for every way) and return the per-replica gradients."""
    with strategy.scope():
        model = MLP(widths, dtype)
        optimizer = mpidist.optimizers.SGD(0.01)
    grads_of = gradient_fn(way, model)

    def train(x, y):
        grads = grads_of(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return grads

    return grads_of, train


def batch(strategy, widths, dtype, seed=1):
    """One global batch of synthetic data, split into this worker's replicas' shares."""
    rng = np.random.default_rng(seed)
    x = rng.random((GLOBAL_BATCH, widths[0])).astype(dtype)
    y = rng.integers(0, widths[-1], GLOBAL_BATCH)
    n = strategy.num_replicas_in_sync
    xs, ys = np.array_split(x, n), np.array_split(y, n)
    dist = strategy.experimental_distribute_values_from_function
    return (dist(lambda ctx: xs[ctx.replica_id_in_sync_group]),
            dist(lambda ctx: ys[ctx.replica_id_in_sync_group]))


def local_gradients(strategy, result):
    """Each variable's gradient on every local replica: a list of tuples of arrays."""
    return [tuple(np.asarray(g) for g in strategy.experimental_local_results(r)) for r in result]


def check_gradients(strategy, steps, args, dtype):
    """Every way's gradients against the hand-written ones (AssertionError if they differ)."""
    rtol, atol = TOLERANCE[dtype]
    reference = local_gradients(strategy, strategy.run(steps["hand"][0], args=args))
    scale = max(float(np.abs(g).max()) for per_var in reference for g in per_var)
    for way, (grads_of, _) in steps.items():
        got = local_gradients(strategy, strategy.run(grads_of, args=args))
        assert len(got) == len(reference), f"{way}: {len(got)} gradients, not {len(reference)}"
        for i, (ours, theirs) in enumerate(zip(got, reference)):
            for g, r in zip(ours, theirs):
                assert g.dtype == np.dtype(dtype), f"{way}: gradient {i} is {g.dtype}"
                np.testing.assert_allclose(g, r, rtol=rtol, atol=atol * scale,
                                           err_msg=f"{way}: gradient {i}")


def measure(strategy, comm, widths, dtype, ways, rounds, min_time):
    """Median µs per call of each way's gradients and training step, after the check:
    ``{way: {"gradients": µs, "step": µs}}``."""
    args = batch(strategy, widths, dtype)
    steps = {way: make_case(strategy, widths, dtype, way) for way in ways}
    check_gradients(strategy, steps, args, dtype)
    calls = {(way, part): (lambda fn=fn: strategy.run(fn, args=args))
             for way, pair in steps.items() for part, fn in zip(("gradients", "step"), pair)}
    times = {way: {} for way in ways}
    for (way, part), median in interleaved(calls, rounds, comm, min_time).items():
        times[way][part] = median
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="one-device",
                        choices=["one-device", "mirrored", "multi-worker"])
    parser.add_argument("--replicas", type=int, default=2, help="CPU replicas (per rank)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"],
                        choices=["float64", "float32"])
    parser.add_argument("--ways", nargs="+", default=None, choices=list(WAYS),
                        help="default: every way whose backend is installed")
    parser.add_argument("--quick", action="store_true", help="2 ms samples (a smoke test)")
    args = parser.parse_args(argv)
    ways = [w for w in (args.ways or WAYS) if w in available_ways()]
    if "hand" not in ways:
        ways.insert(0, "hand")  # the baseline every ratio is taken against
    min_time = 0.002 if args.quick else 0.05
    comm = world()
    rank0 = comm is None or comm.Get_rank() == 0
    strategy = digits_mlp.make_strategy(args.strategy, args.replicas)
    rows = []
    with jax_x64():
        for model in args.models:
            widths = MODELS[model]
            for dtype in args.dtypes:
                times = measure(strategy, comm, widths, dtype, ways, args.rounds, min_time)
                rows += [(model, 2 * (len(widths) - 1), dtype, way, times[way], times["hand"])
                         for way in ways]
    if rank0:
        print(f"## autodiff backends under {args.strategy} x{strategy.num_replicas_in_sync}, "
              f"global batch {GLOBAL_BATCH} (µs; ratio = time / hand-written; overhead = step "
              "minus hand-written step)")
        print("| model | variables | dtype | way | gradients | ratio | step | ratio | overhead |")
        print("|---|---|---|---|---|---|---|---|---|")
        for model, nvars, dtype, way, t, hand in rows:
            print(f"| {model} | {nvars} | {dtype} | {way} | {t['gradients']:.0f} | "
                  f"{t['gradients'] / hand['gradients']:.1f}x | {t['step']:.0f} | "
                  f"{t['step'] / hand['step']:.1f}x | {t['step'] - hand['step']:+.0f} |")
    return rows


if __name__ == "__main__":
    main()
