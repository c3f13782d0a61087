"""mpidist.metrics: Keras-style metrics on SyncOnRead variables (docs/metrics.md).

Every distributed result is checked for exact equality against NumPy on the whole global batch.
Values and weights are multiples of 1/4 and small integers, so every partial sum is exact in
float64 whatever order the replicas add in.
"""

import itertools

import numpy as np
import pytest
from gpu_gate import need_gpus
from replicas import mirrored, rid

import mpidist
from mpidist import VariableAggregation as Agg
from mpidist import VariableSynchronization as Sync
from mpidist import metrics
from mpidist.data import Dataset

NS = [1, 2, 3, 4]
MULTI = [2, 3, 4]
N_EXAMPLES = 29
CLASSES = 5


# ---------------------------------------------------------------------------------------------
# data and NumPy references
# ---------------------------------------------------------------------------------------------


def data(seed=0, n=N_EXAMPLES):
    rng = np.random.default_rng(seed)
    values = rng.integers(-40, 40, size=n) / 4.0
    weights = rng.integers(0, 8, size=n) / 2.0
    labels = rng.integers(0, CLASSES, size=n)
    scores = rng.integers(0, 16, size=(n, CLASSES)) / 4.0
    dense_pred = np.where(rng.random(n) < 0.6, labels, (labels + 1) % CLASSES)
    return {"values": values, "weights": weights, "labels": labels, "scores": scores,
            "dense_pred": dense_pred}


def ref_mean(values, weights=None):
    w = np.ones_like(values) if weights is None else np.broadcast_to(weights, values.shape)
    count = w.sum()
    return 0.0 if count == 0 else (values * w).sum() / count


def ref_sum(values, weights=None):
    return (values if weights is None else values * weights).sum()


def ref_sparse_accuracy(labels, scores, weights=None):
    return ref_mean((labels == scores.argmax(-1)).astype(np.float64), weights)


def ref_accuracy(y_true, y_pred, weights=None):
    return ref_mean((y_true == y_pred).astype(np.float64), weights)


def splits(n_replicas, n=N_EXAMPLES):
    """Unequal per-replica slices covering range(n): replica i gets a share growing with i,
    and the last replica of 3+ gets nothing."""
    if n_replicas == 1:
        return [slice(0, n)]
    sizes = [i + 1 for i in range(n_replicas)]
    if n_replicas >= 3:
        sizes[-1] = 0
    cuts = np.cumsum([0] + sizes, dtype=np.int64)
    cuts = (cuts * n) // cuts[-1]
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(cuts)]


def per_replica(strategy, array, n_replicas):
    parts = splits(n_replicas, len(array))
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: array[parts[ctx.replica_id_in_sync_group]])


def _spy(name, original, calls):
    def spy(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    return spy


def components(strategy, var):
    return [c.numpy().item() for c in strategy.experimental_local_results(var)]


# The four metrics, each with how to feed it one batch of ``d`` sliced by ``sl`` and its reference.
CASES = {
    "sum": (metrics.Sum, lambda d, sl, w: (d["values"][sl],), ref_sum, "values"),
    "mean": (metrics.Mean, lambda d, sl, w: (d["values"][sl],), ref_mean, "values"),
    "accuracy": (metrics.Accuracy, lambda d, sl, w: (d["labels"][sl], d["dense_pred"][sl]),
                 lambda d, w: ref_accuracy(d["labels"], d["dense_pred"], w), None),
    "sparse": (metrics.SparseCategoricalAccuracy,
               lambda d, sl, w: (d["labels"][sl], d["scores"][sl]),
               lambda d, w: ref_sparse_accuracy(d["labels"], d["scores"], w), None),
}


def reference(case, d, weighted):
    _, _, ref, key = CASES[case]
    w = d["weights"] if weighted else None
    return ref(d[key], w) if key else ref(d, w)


def batch_args(case, d, sl, weighted):
    args = CASES[case][1](d, sl, weighted)
    kwargs = {"sample_weight": d["weights"][sl]} if weighted else {}
    return args, kwargs


# ---------------------------------------------------------------------------------------------
# the default strategy (no scope): plain Variables
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("weighted", [False, True])
def test_default_strategy_matches_numpy(case, weighted):
    d = data()
    m = CASES[case][0]()
    for v in m.variables:
        assert type(v) is mpidist.Variable
        assert v.synchronization is Sync.ON_READ and v.aggregation is Agg.SUM
        assert v.trainable is False
    for start in range(0, N_EXAMPLES, 7):
        args, kwargs = batch_args(case, d, slice(start, start + 7), weighted)
        m.update_state(*args, **kwargs)
    got = m.result()
    assert isinstance(got, np.float64) and isinstance(got, float)
    assert got == reference(case, d, weighted)


def test_default_strategy_inside_run_of_the_default_strategy():
    m = metrics.Mean()
    s = mpidist.get_strategy()
    s.run(lambda: m.update_state([1.0, 2.0, 6.0]))
    assert s.run(m.result) == 3.0
    assert m.result() == 3.0


def test_names_dtypes_and_checkpoint_dependencies():
    assert (metrics.Sum().name, metrics.Mean().name, metrics.Accuracy().name,
            metrics.SparseCategoricalAccuracy().name) == (
        "sum", "mean", "accuracy", "sparse_categorical_accuracy")
    m = metrics.Mean(name="loss")
    assert m.name == "loss" and m.dtype == np.float64
    deps = m._checkpoint_dependencies()
    assert list(deps) == ["total", "count"]
    assert deps["total"] is m.total and deps["count"] is m.count
    assert m.variables == [m.total, m.count]
    assert m.total.name == "total:0"
    assert list(metrics.Sum()._checkpoint_dependencies()) == ["total"]
    assert metrics.Metric().name == "metric"


def test_empty_metrics_give_zero():
    for cls in (metrics.Sum, metrics.Mean, metrics.Accuracy, metrics.SparseCategoricalAccuracy):
        assert cls().result() == 0.0
    m = metrics.Mean()
    m.update_state([1.0, 2.0], sample_weight=0.0)  # count stays 0: divide_no_nan
    assert m.result() == 0.0


def test_call_updates_then_returns_the_result():
    m = metrics.Mean()
    assert m([1.0, 3.0]) == 2.0
    assert m([8.0]) == 4.0
    acc = metrics.SparseCategoricalAccuracy()
    assert acc([1, 0], [[0.1, 0.9], [0.2, 0.8]]) == 0.5


def test_sample_weight_broadcasting():
    m = metrics.Mean()
    m.update_state([[1.0, 3.0], [5.0, 7.0]], sample_weight=[1.0, 0.0])  # per sample
    assert m.result() == 2.0 and m.count.numpy() == 2.0
    m.reset_state()
    m.update_state([[1.0, 3.0], [5.0, 7.0]], sample_weight=[[1.0], [3.0]])  # [N, 1]
    assert m.result() == (4.0 + 36.0) / 8.0
    m.reset_state()
    m.update_state([1.0, 3.0], sample_weight=[[2.0], [0.0]])  # trailing 1 dropped
    assert m.result() == 1.0
    m.reset_state()
    m.update_state([1.0, 3.0], sample_weight=2.0)  # scalar
    assert m.result() == 2.0 and m.count.numpy() == 4.0
    s = metrics.Sum()
    s.update_state([[1.0, 2.0], [3.0, 4.0]], sample_weight=[[1.0, 0.0], [0.0, 1.0]])
    assert s.result() == 5.0


def test_accuracy_shapes():
    acc = metrics.Accuracy()
    acc.update_state([[1], [2], [3]], [1, 2, 0])  # [N, 1] vs [N]
    assert acc.result() == 2 / 3
    acc.reset_state()
    acc.update_state([[1, 2], [3, 4]], [[1, 0], [3, 4]])  # elementwise, count = 4
    assert acc.result() == 0.75 and acc.count.numpy() == 4.0
    sca = metrics.SparseCategoricalAccuracy()
    sca.update_state([[2], [0], [1]], [[0, 0, 1], [1, 0, 0], [0, 0, 1]])  # [N, 1] labels
    assert sca.result() == 2 / 3
    sca.update_state(np.array([1.0]), [[0.0, 1.0, 0.0]])  # float labels compare as values
    assert sca.result() == 0.75


@pytest.mark.parametrize("bad", [
    (metrics.Accuracy, ([1, 2, 3], [1, 2]), {},
     r"y_true of shape \(3,\) and y_pred of shape \(2,\)"),
    (metrics.Accuracy, ([[1, 2]], [[1], [2]]), {}, r"\(1, 2\).*\(2, 1\)"),
    (metrics.SparseCategoricalAccuracy, ([1, 2], [[0.1, 0.9]]), {}, r"\(2,\).*\(1, 2\)"),
    (metrics.SparseCategoricalAccuracy, ([1, 2], [0.3, 0.5]), {}, r"\(2,\).*\(2,\)"),
    (metrics.SparseCategoricalAccuracy, ([[1, 0]], [[0.1, 0.9]]), {}, r"\(1, 2\).*\(1, 2\)"),
    (metrics.SparseCategoricalAccuracy, ([], np.zeros((0, 0))), {}, r"C > 0"),
    (metrics.Mean, ([1.0, 2.0, 3.0],), {"sample_weight": [1.0, 2.0]},
     r"sample_weight of shape \(2,\) cannot be broadcast to the values' shape \(3,\)"),
    (metrics.Sum, ([[1.0, 2.0]],), {"sample_weight": [[[1.0, 2.0]]]}, r"\(1, 1, 2\).*\(1, 2\)"),
    (metrics.Accuracy, ([1, 2], [1, 2]), {"sample_weight": [1.0, 2.0, 3.0]}, r"\(3,\).*\(2,\)"),
])
def test_bad_input_raises_value_error_and_leaves_state(bad):
    cls, args, kwargs, match = bad
    m = cls()
    good = {metrics.Accuracy: ([1, 2], [1, 0]), metrics.Mean: ([2.0],), metrics.Sum: ([2.0],),
            metrics.SparseCategoricalAccuracy: ([1], [[0.2, 0.8]])}[cls]
    m.update_state(*good)
    before = [v.numpy().copy() for v in m.variables]
    with pytest.raises(ValueError, match=match):
        m.update_state(*args, **kwargs)
    assert [v.numpy() for v in m.variables] == before


def test_dtypes():
    m = metrics.Mean(dtype=np.float32)
    m.update_state(np.array([1, 2], dtype=np.int64))
    assert m.total.dtype == np.float32 and m.result().dtype == np.float32 and m.result() == 1.5
    s = metrics.Sum(dtype=np.int64)
    s.update_state([1, 2, 3])
    assert s.result() == 6 and s.result().dtype == np.int64
    with pytest.raises(ValueError, match="floating dtype"):
        metrics.Mean(dtype=np.int32)


def test_api_module():
    assert set(metrics.__all__) == {"Metric", "Mean", "Sum", "Accuracy",
                                    "SparseCategoricalAccuracy"}
    from mpidist.training import metrics as impl

    assert metrics.Mean is impl.Mean


def test_metric_base_requires_the_hooks():
    m = metrics.Metric(name="custom")
    with pytest.raises(NotImplementedError):
        m.update_state(1.0)
    with pytest.raises(NotImplementedError):
        m.result()


def test_a_custom_metric_through_the_hooks():
    class Max(metrics.Metric):  # the sum of per-batch maxima, say
        def __init__(self):
            super().__init__(name="sum_of_max")
            self.add_weight("acc")

        def _update_deltas(self, values):
            return {"acc": np.max(values)}

        def _result_from(self, totals):
            return self.dtype.type(totals["acc"])

    s = mirrored(2)
    with s.scope():
        m = Max()
    with pytest.raises(ValueError, match="already has"):
        m.add_weight("acc")
    s.run(lambda: m.update_state(np.arange(3.0) + rid()))
    assert m.result() == 2.0 + 3.0


# ---------------------------------------------------------------------------------------------
# MirroredStrategy, 1-4 virtual CPU devices, unequal per-replica batches
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("weighted", [False, True])
def test_mirrored_unequal_batches_match_numpy(n, case, weighted):
    s, d = mirrored(n), data(seed=n)
    with s.scope():
        m = CASES[case][0]()
    for v in m.variables:
        assert isinstance(v, mpidist.SyncOnReadVariable)
        assert v.synchronization is Sync.ON_READ and v.aggregation is Agg.SUM
        assert v.trainable is False and len(v.values) == n
    parts = splits(n)
    feed = {k: s.experimental_distribute_values_from_function(
        lambda ctx, a=a: a[parts[ctx.replica_id_in_sync_group]]) for k, a in d.items()}

    def step(f):
        args, kwargs = batch_args(case, f, slice(None), weighted)
        m.update_state(*args, **kwargs)

    s.run(step, args=(feed,))
    want = reference(case, d, weighted)
    assert m.result() == want
    with s.scope():
        assert m.result() == want
    # The same data once more, as one global batch in cross-replica context: counted once.
    args, kwargs = batch_args(case, d, slice(None), weighted)
    with s.scope():
        m.update_state(*args, **kwargs)
    doubled = {k: np.concatenate([a, a]) for k, a in d.items()}
    assert m.result() == reference(case, doubled, weighted)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("weighted", [False, True])
def test_mirrored_distributed_dataset_matches_numpy(n, weighted):
    s, d = mirrored(n), data(seed=10 + n)
    with s.scope():
        acc = metrics.SparseCategoricalAccuracy()
        mean = metrics.Mean()
        total = metrics.Sum()
    ds = Dataset.from_tensor_slices((d["labels"], d["scores"], d["values"], d["weights"])).batch(7)

    def step(labels, scores, values, weights):
        w = weights if weighted else None
        acc.update_state(labels, scores, sample_weight=w)
        mean.update_state(values, sample_weight=w)
        total.update_state(values, sample_weight=w)

    for _epoch in range(2):
        for batch in s.experimental_distribute_dataset(ds):
            s.run(step, args=batch)
        w = d["weights"] if weighted else None
        assert acc.result() == ref_sparse_accuracy(d["labels"], d["scores"], w)
        assert mean.result() == ref_mean(d["values"], w)
        assert total.result() == ref_sum(d["values"], w)
        for m in (acc, mean, total):
            m.reset_state()
            assert m.result() == 0.0


@pytest.mark.parametrize("n", MULTI)
def test_update_in_replica_context_is_local_and_communicates_nothing(n, monkeypatch):
    s = mirrored(n)
    with s.scope():
        m = metrics.Mean()
    ops = s.extended._cross_device_ops
    calls = []
    for name in ("reduce", "batch_reduce", "broadcast", "_gather"):
        monkeypatch.setattr(ops, name, _spy(name, getattr(ops, name), calls))
    s.run(lambda: m.update_state(np.full(int(rid()) + 1, float(rid()))))
    assert calls == []
    # Each replica wrote only its own copy: replica r added r+1 values equal to r.
    assert components(s, m.total) == [float(r * (r + 1)) for r in range(n)]
    assert components(s, m.count) == [float(r + 1) for r in range(n)]
    want = sum(r * (r + 1) for r in range(n)) / sum(r + 1 for r in range(n))
    assert m.result() == want
    assert calls == ["batch_reduce"]  # the two state variables travel in one reduction


@pytest.mark.parametrize("n", MULTI)
def test_cross_replica_update_adds_once(n):
    s = mirrored(n)
    with s.scope():
        m = metrics.Sum()
        m.update_state([1.0, 2.0])
        assert components(s, m.total) == [3.0] + [0.0] * (n - 1)
        assert m.result() == 3.0
    m.update_state([4.0])  # outside the scope: still the strategy's variables, still once
    assert m.result() == 7.0


@pytest.mark.parametrize("n", NS)
def test_result_inside_run_is_the_global_value_on_every_replica(n):
    s = mirrored(n)
    with s.scope():
        m = metrics.Mean()

    def step():
        m.update_state([float(rid())])
        return m.result()

    got = s.experimental_local_results(s.run(step))
    assert list(got) == [sum(range(n)) / n] * n
    assert s.experimental_local_results(s.run(lambda: m(np.array([float(n)]))))[0] == \
        (sum(range(n)) + n * n) / (2 * n)


@pytest.mark.parametrize("n", NS)
def test_reset_state(n):
    s = mirrored(n)
    with s.scope():
        m = metrics.SparseCategoricalAccuracy()
    s.run(lambda: m.update_state([0], [[1.0, 0.0]]))
    assert m.result() == 1.0 and components(s, m.count) == [1.0] * n
    m.reset_state()
    assert components(s, m.total) == [0.0] * n and components(s, m.count) == [0.0] * n
    assert m.result() == 0.0
    with s.scope():
        s.run(lambda: m.update_state([1], [[1.0, 0.0]]))
        m.reset_states()
    assert m.result() == 0.0
    with pytest.raises(RuntimeError, match="reset_state.*cross-replica"):
        s.run(m.reset_state)


@pytest.mark.parametrize("n", NS)
def test_bad_input_in_replica_context_leaves_every_copy(n):
    s = mirrored(n)
    with s.scope():
        m = metrics.Accuracy()
    s.run(lambda: m.update_state([1, 2], [1, 0]))
    before = (components(s, m.total), components(s, m.count))
    with pytest.raises(ValueError, match=r"y_true of shape \(2,\) and y_pred of shape \(3,\)"):
        s.run(lambda: m.update_state([1, 2], [1, 2, 3]))
    assert (components(s, m.total), components(s, m.count)) == before
    assert m.result() == 0.5


def test_metric_from_outside_the_scope_cannot_run_in_replicas():
    s = mirrored(2)
    m = metrics.Mean()
    with pytest.raises(RuntimeError, match="outside any strategy scope"):
        s.run(lambda: m.update_state([1.0]))
    assert m.result() == 0.0
    with s.scope():  # cross-replica: a plain local metric still works
        m.update_state([1.0])
        assert m.result() == 1.0


def test_mixing_strategies_raises():
    a, b = mirrored(2), mirrored(2)
    with a.scope():
        m = metrics.Sum()
    for call in (lambda: m.update_state([1.0]), m.result, m.reset_state):
        with b.scope(), pytest.raises(RuntimeError, match="Mixing different"):
            call()
    with pytest.raises(RuntimeError, match="created in"):
        b.run(lambda: m.update_state([1.0]))
    assert m.result() == 0.0


def test_one_device_strategy():
    s = mpidist.OneDeviceStrategy("/cpu:0")
    with s.scope():
        m = metrics.Mean()
    s.run(lambda: m.update_state([1.0, 2.0]))
    assert s.run(m.result) == 1.5
    with s.scope():
        m.update_state([6.0])
        assert m.result() == 3.0
    m.reset_state()
    assert m.result() == 0.0


def test_variable_inputs():
    s = mirrored(2)
    with s.scope():
        m = metrics.Sum()
        v = mpidist.Variable(2.0)
    s.run(lambda: m.update_state(v))
    assert m.result() == 4.0


# ---------------------------------------------------------------------------------------------
# CuPy inputs (skipped where no GPU is visible)
# ---------------------------------------------------------------------------------------------


def _cupy_or_skip():
    need_gpus(1)
    import cupy

    return cupy


@pytest.mark.parametrize("where", ["default", "cpu_replicas", "gpu_replicas"])
def test_cupy_inputs(where):
    cupy = _cupy_or_skip()
    from mpidist.backend import num_gpus

    d = data(seed=3)
    if where == "default":
        s = mpidist.get_strategy()
    elif where == "cpu_replicas":
        s = mirrored(2)
    else:
        s = mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(num_gpus())])
    with s.scope():
        ms = [metrics.Mean(), metrics.Sum(), metrics.Accuracy(),
              metrics.SparseCategoricalAccuracy()]
    n = s.num_replicas_in_sync
    parts = splits(n)

    def on_gpu(ctx, key):
        with cupy.cuda.Device(0 if where != "gpu_replicas" else ctx.replica_id_in_sync_group):
            return cupy.asarray(d[key][parts[ctx.replica_id_in_sync_group]])

    feed = [s.experimental_distribute_values_from_function(lambda ctx, k=k: on_gpu(ctx, k))
            for k in ("values", "weights", "labels", "dense_pred", "scores")]

    def fn(values, weights, labels, dense_pred, scores):
        ms[0].update_state(values, sample_weight=weights)
        ms[1].update_state(values, sample_weight=weights.get())  # mixed NumPy and CuPy
        ms[2].update_state(labels, dense_pred, sample_weight=weights)
        ms[3].update_state(labels, scores)

    s.run(fn, args=feed)
    w = d["weights"]
    assert ms[0].result() == ref_mean(d["values"], w)
    assert ms[1].result() == ref_sum(d["values"], w)
    assert ms[2].result() == ref_accuracy(d["labels"], d["dense_pred"], w)
    assert ms[3].result() == ref_sparse_accuracy(d["labels"], d["scores"])
    for m in ms:
        m.reset_state()
        assert m.result() == 0.0
