"""Spec section 6.3-6.6: NcclAllReduce / HierarchicalCopyAllReduce, packing, the hierarchical
copy algorithm (with TF's odd-count bug fixed), fused batch reduces, and MirroredStrategy's
choice of cross-device ops. Every op must give the same numbers as ReductionToOneDevice."""

import functools
import warnings

import numpy as np
import pytest

import mpidist
from mpidist.ops.hierarchical_copy import hierarchical_copy_sum, main_devices
from mpidist.core.devices import DeviceSpec
from mpidist.strategies.mirrored import select_cross_device_ops

from replicas import mirrored


def cpu_devices(n):
    return tuple(DeviceSpec("CPU", i) for i in range(n))


def all_ops():
    return [
        mpidist.ReductionToOneDevice(),
        mpidist.HierarchicalCopyAllReduce(),
        mpidist.HierarchicalCopyAllReduce(num_packs=0),
        mpidist.HierarchicalCopyAllReduce(num_packs=3),
        mpidist.NcclAllReduce(),
        mpidist.NcclAllReduce(num_packs=2),
    ]


def per_replica(strategy, fn):
    return strategy.run(lambda: fn(mpidist.get_replica_context().replica_id_in_sync_group))


# -- constructors and errors (6.3) -------------------------------------------------------------
@pytest.mark.parametrize("cls, name", [(mpidist.NcclAllReduce, "NCCL all-reduce"),
                                       (mpidist.HierarchicalCopyAllReduce, "HierarchicalCopy")])
def test_negative_num_packs_is_the_spec_error(cls, name):
    with pytest.raises(ValueError, match=f"^{name} requires num_packs >= 0, but -1 is specified$"):
        cls(num_packs=-1)


@pytest.mark.parametrize("bad", [1.5, "2", True, None])
def test_num_packs_must_be_an_int(bad):
    with pytest.raises(TypeError, match="NcclAllReduce: argument 'num_packs' got .*it accepts an int"):
        mpidist.NcclAllReduce(num_packs=bad)


def test_num_packs_zero_is_allowed_and_kept():
    assert mpidist.HierarchicalCopyAllReduce(num_packs=0).num_packs == 0
    assert mpidist.NcclAllReduce().num_packs == 1


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="all_reduce_alg must be one of"):
        mpidist.AllReduceCrossDeviceOps("ring")


# -- the hierarchical copy algorithm (6.4) -------------------------------------------------------
@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("index", range(9))
def test_hierarchical_copy_sums_every_device_for_any_count(n, index):
    arrays = [np.array([float(i + 1), 10.0 * (i + 1)]) for i in range(n)]
    results = hierarchical_copy_sum(index, arrays, cpu_devices(n))
    total = n * (n + 1) / 2
    assert len(results) == n
    for r in results:
        np.testing.assert_array_equal(r, [total, 10 * total])
        assert all(r is not a for a in arrays)


def test_hierarchical_copy_three_devices_counts_the_third():
    # TF gives 3 here (device 2 is in neither group); the sum is 6.
    results = hierarchical_copy_sum(0, [np.array(1.0), np.array(2.0), np.array(3.0)], cpu_devices(3))
    assert [float(r) for r in results] == [6.0, 6.0, 6.0]


@pytest.mark.parametrize("index, expected", [
    (0, ([0, 1, 2, 3], [4, 5, 6, 7], 0, 4)),
    (1, ([0, 1, 2, 3], [4, 5, 6, 7], 1, 5)),
    (5, ([4, 5, 6, 7], [0, 1, 2, 3], 5, 1)),
    (7, ([4, 5, 6, 7], [0, 1, 2, 3], 7, 3)),
    (8, ([0, 1, 2, 3], [4, 5, 6, 7], 0, 4)),
])
def test_main_devices_rotate_like_tf_for_eight(index, expected):
    assert main_devices(index, 8) == expected


@pytest.mark.parametrize("n", [3, 5, 7])
def test_main_devices_odd_counts_cover_every_device(n):
    for index in range(2 * n):
        group0, group1, g0, g1 = main_devices(index, n)
        assert sorted(group0 + group1) == list(range(n))
        assert g0 in group0 and g1 in group1


# -- all ops give the same numbers ---------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN"])
def test_every_op_reduces_like_the_spec_example(n, reduce_op):
    s = mirrored(n)
    v = per_replica(s, lambda i: np.array([i + 1.0, 10.0 * (i + 1)]))
    total = n * (n + 1) / 2
    expected = np.array([total, 10 * total]) / (n if reduce_op == "MEAN" else 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for ops in all_ops():
            to_host = ops.reduce(reduce_op, v, "/cpu:0")
            np.testing.assert_array_equal(to_host, expected)
            everywhere = ops.reduce(reduce_op, v, v)
            if n == 1:
                np.testing.assert_array_equal(everywhere, expected)
            else:
                assert isinstance(everywhere, mpidist.Mirrored)
                for c in everywhere.values:
                    np.testing.assert_array_equal(c, expected)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN"])
def test_batch_reduce_identical_across_ops_and_to_separate_reduces(n, dtype, reduce_op):
    rng = np.random.default_rng(7 + n)
    shapes = [(3, 4), (), (0,), (5,), (2, 1, 3), (7,)]
    data = [[(rng.standard_normal(shape) * 50).astype(dtype) for _ in range(n)] for shape in shapes]
    s = mirrored(n)
    values = [per_replica(s, lambda i, d=d: d[i]) for d in data]
    reference = [mpidist.ReductionToOneDevice().reduce(reduce_op, v, "/cpu:0") for v in values]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for ops in all_ops():
            out = ops.batch_reduce(reduce_op, [(v, v) for v in values])
            assert len(out) == len(values)
            for got, ref, shape in zip(out, reference, shapes):
                assert isinstance(got, mpidist.Mirrored)
                assert len(got.values) == n
                for c in got.values:
                    assert c.shape == shape and c.dtype == ref.dtype
                    np.testing.assert_array_equal(c, ref)
            # and directly through the all-reduce algorithm, as on GPUs: it sums in a tree (two
            # halves, then their partial sums), so float results may differ from the sequential
            # sum in the last bits from 3 devices on; integers and 2 devices are exact.
            if isinstance(ops, mpidist.HierarchicalCopyAllReduce):
                direct = ops._batch_all_reduce(mpidist.ReduceOp(reduce_op), list(values))
                exact = n == 2 or np.dtype(dtype).kind == "i"
                rtol = {"float16": 4e-3, "float32": 1e-6, "float64": 1e-14}.get(dtype, 0)
                for got, ref in zip(direct, reference):
                    for c in got.values:
                        assert c.dtype == ref.dtype
                        if exact:
                            np.testing.assert_array_equal(c, ref)
                        else:
                            np.testing.assert_allclose(c, ref, rtol=rtol, atol=rtol * 100)


def test_batch_reduce_expected_numbers_for_integers():
    s = mirrored(3)
    v = per_replica(s, lambda i: np.array([i, 2 * i], dtype=np.int32))
    w = per_replica(s, lambda i: np.array([[i * 100]], dtype=np.int32))
    summed = mpidist.ReductionToOneDevice().batch_reduce("SUM", [(v, v), (w, "/cpu:0")])
    np.testing.assert_array_equal(summed[0].values[2], [3, 6])
    assert summed[0].values[2].dtype == np.int32
    np.testing.assert_array_equal(summed[1], [[300]])
    mean = mpidist.ReductionToOneDevice().batch_reduce("MEAN", [(v, v), (w, w)])
    assert mean[0].values[0].dtype == np.float64
    np.testing.assert_array_equal(mean[0].values[0], [1.0, 2.0])
    np.testing.assert_array_equal(mean[1].values[1], [[100.0]])


def test_fused_batch_results_do_not_alias_inputs_or_each_other():
    s = mirrored(2)
    values = [per_replica(s, lambda i, k=k: np.full(4, float(i + k))) for k in range(3)]
    out = mpidist.ReductionToOneDevice().batch_reduce("SUM", [(v, v) for v in values])
    out[0].values[0][:] = -1.0
    np.testing.assert_array_equal(out[0].values[1], [1.0] * 4)   # other device's copy untouched
    np.testing.assert_array_equal(out[1].values[0], [3.0] * 4)   # neighbour tensor untouched
    np.testing.assert_array_equal(values[0].values[0], [0.0] * 4)  # inputs untouched
    again = mpidist.ReductionToOneDevice().batch_reduce("SUM", [(v, v) for v in values])
    np.testing.assert_array_equal(out[2].values[0], [5.0] * 4)  # a later call leaves it alone
    np.testing.assert_array_equal(again[2].values[0], [5.0] * 4)


def test_fused_batch_reuses_its_pack_buffers_across_calls():
    s = mirrored(2)
    values = [per_replica(s, lambda i, k=k: np.full((2, 3), float(k)).astype(np.float16))
              for k in range(4)]
    ops = mpidist.ReductionToOneDevice()
    ops.batch_reduce("SUM", [(v, v) for v in values])
    pooled = len(ops._fusion.pool)
    buffers = dict(ops._fusion.pool._buffers)
    ops.batch_reduce("SUM", [(v, v) for v in values])
    assert len(ops._fusion.pool) == pooled == 2  # one pack buffer per replica
    assert all(ops._fusion.pool._buffers[k] is b for k, b in buffers.items())


def test_batch_reduce_mixed_shapes_across_replicas_is_the_reduce_error():
    s = mirrored(2)
    bad = per_replica(s, lambda i: np.zeros(2 + i))
    good = per_replica(s, lambda i: np.zeros(2))
    for ops in (mpidist.ReductionToOneDevice(), mpidist.HierarchicalCopyAllReduce()):
        with pytest.raises(mpidist.errors.InvalidArgumentError, match="same shape"):
            ops.batch_reduce("SUM", [(good, good), (bad, bad)])


def test_batch_reduce_with_accumulation_fn_is_not_fused():
    s = mirrored(3)
    v = per_replica(s, lambda i: np.array([i + 1.0, 10.0 * (i + 1)]))
    ops = mpidist.ReductionToOneDevice(accumulation_fn=lambda xs: np.max(np.stack(xs), axis=0))
    out = ops.batch_reduce("MEAN", [(v, "/cpu:0"), (v, "/cpu:1")])
    for r in out:
        np.testing.assert_array_equal(r, [1.0, 10.0])  # max / 3
    assert len(ops._fusion.pool) == 0


def test_nccl_on_cpu_warns_once_and_falls_back():
    s = mirrored(2)
    v = per_replica(s, lambda i: np.array([float(i)]))
    ops = mpidist.NcclAllReduce()
    with pytest.warns(RuntimeWarning, match="NCCL runs between GPUs only"):
        np.testing.assert_array_equal(ops.reduce("SUM", v, "/cpu:0"), [1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(ops.reduce("SUM", v, "/cpu:0"), [1.0])


def test_nccl_all_reduce_without_nccl_says_so():
    s = mirrored(2)
    v = per_replica(s, lambda i: np.array([float(i)]))
    with pytest.raises(RuntimeError, match="NCCL cannot be used: .*HierarchicalCopyAllReduce"):
        mpidist.NcclAllReduce()._batch_all_reduce(mpidist.ReduceOp.SUM, [v])


def test_hierarchical_on_cpu_is_silent():
    s = mirrored(2)
    v = per_replica(s, lambda i: np.array([float(i)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(mpidist.HierarchicalCopyAllReduce().reduce("SUM", v, v).values[1], [1.0])


@pytest.mark.parametrize("num_packs", [0, 1, 2, 3, 7, 50])
def test_packing_splits_do_not_change_numbers(num_packs):
    s = mirrored(4)
    sizes = [6, 4, 1, 0, 9]
    values = [per_replica(s, lambda i, n=n: np.arange(n, dtype=np.float32) * (i + 1)) for n in sizes]
    ops = mpidist.HierarchicalCopyAllReduce(num_packs=num_packs)
    out = ops._batch_all_reduce(mpidist.ReduceOp.SUM, list(values))
    for got, n in zip(out, sizes):
        for c in got.values:
            np.testing.assert_array_equal(c, np.arange(n, dtype=np.float32) * 10)


# -- MirroredStrategy's choice (6.6) -------------------------------------------------------------
def test_default_on_cpu_is_reduction_to_one_device():
    assert isinstance(mirrored(2).extended._cross_device_ops, mpidist.ReductionToOneDevice)
    assert isinstance(select_cross_device_ops(cpu_devices(3)), mpidist.ReductionToOneDevice)


def test_default_on_gpus_prefers_nccl_else_hierarchical(monkeypatch):
    gpus = (DeviceSpec("GPU", 0), DeviceSpec("GPU", 1))
    import mpidist.strategies.mirrored as m

    monkeypatch.setattr(m, "nccl_module", lambda: None)
    assert type(select_cross_device_ops(gpus)) is mpidist.HierarchicalCopyAllReduce
    monkeypatch.setattr(m, "nccl_module", lambda: object())
    assert type(select_cross_device_ops(gpus)) is mpidist.NcclAllReduce
    mixed = (DeviceSpec("GPU", 0), DeviceSpec("CPU", 0))
    assert type(select_cross_device_ops(mixed)) is mpidist.ReductionToOneDevice


@pytest.mark.parametrize("n", [2, 3, 4])
def test_mirrored_strategy_accepts_each_op_with_identical_training_numbers(n):
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for ops in all_ops():
            s = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)], cross_device_ops=ops)
            with s.scope():
                w = mpidist.Variable(np.zeros(3))
                b = mpidist.Variable(0.5)

            def step(x):
                grads = (x * 2.0, np.sum(x))
                ctx = mpidist.get_replica_context()
                gw, gb = ctx.all_reduce("MEAN", grads)
                w.assign_sub(0.1 * gw)
                b.assign_sub(0.1 * gb)
                return ctx.all_reduce("SUM", np.float64(np.sum(x)))

            for k in range(3):
                out = s.run(step, args=(s.run(lambda k=k: np.arange(3.0) + k + mpidist.get_replica_context().replica_id_in_sync_group),))
            total = float(np.sum(s.reduce("SUM", s.run(lambda: np.ones(2) * mpidist.get_replica_context().replica_id_in_sync_group), axis=None)))
            results.append((np.asarray(w).copy(), float(np.asarray(b)), np.asarray(s.experimental_local_results(out)[0]).copy(), total))
    first = results[0]
    for other in results[1:]:
        np.testing.assert_array_equal(other[0], first[0])
        assert other[1] == first[1]
        np.testing.assert_array_equal(other[2], first[2])
        assert other[3] == first[3]
    mean_x = np.arange(3.0) + 2 + (n - 1) / 2  # last step's mean input
    assert first[3] == 2 * functools.reduce(lambda a, b: a + b, range(n))
    assert first[2] == np.sum(mean_x) * n
