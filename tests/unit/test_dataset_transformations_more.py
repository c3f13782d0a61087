"""The tf.data transformations of mpidist/data/ops, continued: choose_from_datasets,
sample_from_datasets, group_by_window, bucket_by_sequence_length, ignore_errors; how the new
operations sit in a chain that FILE auto-sharding reads; and the generic invariants, with
Hypothesis (unbatch(batch) is the identity, enumerate's indices, concatenate's cardinality,
window + flat_map rebuilds the sequence, sample_from_datasets is reproducible and draws every
element once).
"""

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.data import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    NpyDataset,
    Options,
    TensorSpec,
)
from mpidist.data.dataset import (
    IterationContext,
    file_shard_units,
    find_file_reader,
    iterate,
    static_batch_size,
)
from mpidist.data.experimental import AutoShardPolicy
from mpidist.errors import InvalidArgumentError
from dataset_values import values


# -- choose_from_datasets --------------------------------------------------------------------------
def test_choose_from_datasets_docstring_example():
    datasets = [Dataset.from_tensors(np.array("foo")).repeat(),
                Dataset.from_tensors(np.array("bar")).repeat(),
                Dataset.from_tensors(np.array("baz")).repeat()]
    choice = Dataset.range(3).repeat(3)  # 0, 1, 2, 0, 1, 2, 0, 1, 2
    result = Dataset.choose_from_datasets(datasets, choice)
    assert [str(x) for x in result] == ["foo", "bar", "baz"] * 3
    assert result.element_spec == TensorSpec((), np.dtype("<U3"))
    # TF's DirectedInterleave: INFINITE as soon as one dataset is, whatever the choices
    assert result.cardinality() == INFINITE_CARDINALITY
    finite = Dataset.choose_from_datasets([Dataset.range(2), Dataset.range(2)], choice)
    assert finite.cardinality() == UNKNOWN_CARDINALITY


def test_choose_from_datasets_on_an_empty_dataset_stops_or_skips():
    a, b = Dataset.range(2), Dataset.range(10, 15)
    choice = Dataset.from_tensor_slices(np.array([0, 1, 0, 1, 0, 1, 1], np.int64))
    assert values(Dataset.choose_from_datasets([a, b], choice)) == [0, 10, 1, 11]
    assert values(Dataset.choose_from_datasets([a, b], choice, stop_on_empty_dataset=False)) == [
        0, 10, 1, 11, 12, 13]


def test_choose_from_datasets_mistakes():
    a = Dataset.range(3)
    pair = Dataset.zip(a, a)
    choice = Dataset.range(2)
    with pytest.raises(TypeError, match=r"datasets\[2\] has elements \(TensorSpec.*datasets\[0\] has "
                                         r"TensorSpec\(shape=\(\), dtype=int64"):
        Dataset.choose_from_datasets([a, a, pair], choice)
    with pytest.raises(ValueError, match="must not be empty"):
        Dataset.choose_from_datasets([], choice)
    with pytest.raises(TypeError, match="must be int64 scalars"):
        Dataset.choose_from_datasets([a, a], Dataset.range(2, dtype=np.int32))
    with pytest.raises(TypeError, match="must be a list of mpidist.data.Dataset"):
        Dataset.choose_from_datasets(a, choice)
    out_of_range = Dataset.choose_from_datasets([a, a], Dataset.range(5))
    with pytest.raises(InvalidArgumentError, match=r"choice 2 \(element 2 of choice_dataset\) "
                                                   r"is out of range"):
        list(out_of_range)
    with pytest.raises(TypeError, match="stop_on_empty_dataset must be True or False"):
        Dataset.choose_from_datasets([a], choice, stop_on_empty_dataset=None)


# -- sample_from_datasets --------------------------------------------------------------------------
def test_sample_from_datasets_never_draws_a_dataset_of_weight_zero():
    d1 = Dataset.range(100, 110)
    d2 = Dataset.range(200, 210)
    ds = Dataset.sample_from_datasets([d1, d2], weights=[0.0, 1.0], seed=7)
    # d2 exhausted, what is left has weight 0: the output ends (TF would draw d2 forever)
    assert values(ds) == list(range(200, 210))
    uneven = Dataset.sample_from_datasets([d1, Dataset.range(200, 202)], weights=[0.5, 0.5],
                                          seed=7, stop_on_empty_dataset=True)
    out = values(uneven)
    assert [x for x in out if x >= 200] == [200, 201]
    assert len(out) < 12  # it ended when range(200, 202) ran dry, before d1 did


def test_sample_from_datasets_is_reproducible_and_rerandomizes_on_request():
    def make(seed, rerandomize=None):
        return Dataset.sample_from_datasets([Dataset.range(50), Dataset.range(100, 150)],
                                            seed=seed, rerandomize_each_iteration=rerandomize)
    first = values(make(3))
    assert first == values(make(3))  # another object, same seed
    ds = make(3)
    assert values(ds) == values(ds)  # each pass draws the same sequence by default
    assert first != values(make(4))
    again = make(3, rerandomize=True)
    assert values(again) != values(again)
    unseeded = make(None)
    assert values(unseeded) == values(unseeded)  # fixed for the object


def test_sample_from_datasets_spec_cardinality_and_mistakes():
    a = Dataset.from_tensor_slices(np.zeros((3, 2)))
    b = Dataset.from_tensor_slices(np.zeros((3, 4)))
    assert Dataset.sample_from_datasets([a, b], seed=1).element_spec == TensorSpec(
        (None,), np.float64)
    assert Dataset.sample_from_datasets([a, b]).cardinality() == UNKNOWN_CARDINALITY
    assert Dataset.sample_from_datasets([a, b.repeat()]).cardinality() == INFINITE_CARDINALITY
    with pytest.raises(TypeError, match=r"datasets\[1\] has elements .*int64.*float64"):
        Dataset.sample_from_datasets([a, Dataset.range(3)])
    with pytest.raises(ValueError, match=r"one weight per dataset \(2\)"):
        Dataset.sample_from_datasets([a, b], weights=[1.0])
    with pytest.raises(ValueError, match="not all 0"):
        Dataset.sample_from_datasets([a, b], weights=[0.0, 0.0])
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        Dataset.sample_from_datasets([a, b], seed=1.5)


def test_sample_from_datasets_takes_a_dataset_of_weights():
    weights = Dataset.from_tensor_slices(np.array([[1.0, 0.0], [0.0, 1.0]] * 3))
    ds = Dataset.sample_from_datasets([Dataset.range(3), Dataset.range(10, 13)],
                                      weights=weights, seed=0)
    assert values(ds) == [0, 10, 1, 11, 2, 12]


# -- group_by_window / bucket_by_sequence_length ---------------------------------------------------
def test_group_by_window_docstring_example():
    window_size = 5
    ds = Dataset.range(10).group_by_window(
        key_func=lambda x: x % 2, reduce_func=lambda key, d: d.batch(window_size),
        window_size=window_size)
    assert values(ds) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert ds.element_spec == TensorSpec((None,), np.int64)
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_group_by_window_flushes_in_key_order_and_sizes_by_key():
    ds = Dataset.range(11).group_by_window(
        key_func=lambda x: 2 - x % 3, reduce_func=lambda key, d: d.batch(10).map(
            lambda b: (np.int64(key), b)),
        window_size_func=lambda key: key + 1)
    # key 2: 0,3,6,9 in windows of 3; key 1: 1,4,7,10 in windows of 2; key 0: 2,5,8 one by one
    assert values(ds) == [(0, [2]), (1, [1, 4]), (0, [5]), (2, [0, 3, 6]), (0, [8]),
                          (1, [7, 10]), (2, [9])]


def test_group_by_window_mistakes():
    ds = Dataset.range(4)
    with pytest.raises(ValueError, match="exactly one of window_size and window_size_func"):
        ds.group_by_window(lambda x: x, lambda k, d: d)
    with pytest.raises(ValueError, match="exactly one"):
        ds.group_by_window(lambda x: x, lambda k, d: d, window_size=2,
                           window_size_func=lambda k: 2)
    with pytest.raises(TypeError, match="key_func must return an int64 scalar, got .*0.5.* of type float64"):
        list(ds.group_by_window(lambda x: x / 2 + 0.5, lambda k, d: d, window_size=2))
    with pytest.raises(TypeError, match="must return an mpidist.data.Dataset"):
        ds.group_by_window(lambda x: x, lambda k, d: [1], window_size=2)
    with pytest.raises(InvalidArgumentError, match="window size must be greater than zero"):
        list(ds.group_by_window(lambda x: x, lambda k, d: d, window_size_func=lambda k: 0))


def test_bucket_by_sequence_length_docstring_example():
    elements = [[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11], [13, 14, 15, 16, 19, 20],
                [21, 22]]
    ds = Dataset.from_generator(lambda: iter(elements), np.int64)
    ds = ds.bucket_by_sequence_length(element_length_func=lambda elem: np.shape(elem)[0],
                                      bucket_boundaries=[3, 5], bucket_batch_sizes=[2, 2, 2])
    assert values(ds) == [[[1, 2, 3, 4], [5, 6, 7, 0]],
                          [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]],
                          [[0, 0], [21, 22]]]


def test_bucket_by_sequence_length_pads_to_the_boundary_or_not_at_all():
    elements = [[1], [2, 2], [3, 3, 3], [4, 4, 4, 4]]
    ds = Dataset.from_generator(lambda: iter(elements),
                                output_signature=TensorSpec((None,), np.int64))
    to_boundary = ds.bucket_by_sequence_length(
        lambda e: len(e), bucket_boundaries=[3, 6], bucket_batch_sizes=[2, 2, 2],
        pad_to_bucket_boundary=True)
    # bucket 0 ([1], [2, 2]) pads to 3 - 1 = 2; bucket 1 ([3]*3, [4]*4) to 6 - 1 = 5
    assert values(to_boundary) == [[[1, 0], [2, 2]], [[3, 3, 3, 0, 0], [4, 4, 4, 4, 0]]]
    same = Dataset.from_tensor_slices(np.arange(8).reshape(4, 2)).bucket_by_sequence_length(
        lambda e: e[0], bucket_boundaries=[4], bucket_batch_sizes=[2, 3], no_padding=True,
        drop_remainder=True)
    assert values(same) == [[[0, 1], [2, 3]]]  # bucket 1 holds 2 < 3 rows: dropped
    too_long = ds.bucket_by_sequence_length(
        lambda e: len(e), bucket_boundaries=[2], bucket_batch_sizes=[1, 1],
        pad_to_bucket_boundary=True)
    with pytest.raises(InvalidArgumentError, match="length < max"):
        list(too_long)


def test_bucket_by_sequence_length_mistakes():
    ds = Dataset.range(3)
    with pytest.raises(ValueError, match=r"must equal len\(bucket_boundaries\) \+ 1"):
        ds.bucket_by_sequence_length(lambda x: x, [3, 5], [2, 2])
    with pytest.raises(ValueError, match="sorted in increasing order"):
        ds.bucket_by_sequence_length(lambda x: x, [5, 3], [2, 2, 2])
    with pytest.raises(TypeError, match="bucket_batch_sizes must be a list of ints >= 1"):
        ds.bucket_by_sequence_length(lambda x: x, [3], [2, 0])


# -- ignore_errors ---------------------------------------------------------------------------------
def checked_inverse(x):
    if x == 0:
        raise ValueError("no inverse of 0")
    return np.float64(1.0) / x


def test_ignore_errors_docstring_example(caplog):
    ds = Dataset.from_tensor_slices(np.array([1.0, 2.0, 0.0, 4.0]))
    with pytest.raises(ValueError, match="no inverse of 0"):
        list(ds.map(checked_inverse))
    ok = ds.map(checked_inverse).ignore_errors()
    assert values(ok) == [1.0, 0.5, 0.25]
    assert ok.cardinality() == UNKNOWN_CARDINALITY
    with caplog.at_level(logging.WARNING, logger="mpidist.data"):
        assert values(ds.map(checked_inverse).ignore_errors(log_warning=True)) == [1.0, 0.5, 0.25]
    assert "no inverse of 0" in caplog.text


def test_ignore_errors_covers_filter_and_only_what_is_upstream():
    ds = Dataset.range(5).filter(lambda x: [True, True, None, True, False][int(x)] is True or
                                 (_ for _ in ()).throw(KeyError(int(x))))
    assert values(ds.ignore_errors()) == [0, 1, 3]
    after = Dataset.range(4).ignore_errors().map(checked_inverse)
    with pytest.raises(ValueError, match="no inverse of 0"):
        list(after)  # a map after ignore_errors is not covered


# -- in a chain FILE auto-sharding reads ----------------------------------------------------------
def test_file_auto_sharding_still_finds_the_reader_under_the_new_operations(tmp_path):
    names = []
    for k in range(4):
        np.save(tmp_path / f"part-{k}.npy", np.arange(3.0) + 10 * k)
        names.append(str(tmp_path / f"part-{k}.npy"))
    base = Dataset.list_files(str(tmp_path / "*.npy"), shuffle=False).interleave(
        NpyDataset, cycle_length=1)
    for ds in (base.filter(lambda x: x >= 0), base.cache(), base.enumerate(),
               base.window(2).flat_map(lambda w: w.batch(2)), base.batch(2).unbatch(),
               base.take_while(lambda x: True), base.ignore_errors(),
               Dataset.zip(base, base), base.concatenate(base)):
        reader = find_file_reader(ds)
        assert file_shard_units(reader) == tuple(names), ds
    # worker 1 of 2 reads files 1 and 3, through a filter and a cache
    ds = base.filter(lambda x: x % 2 == 0).cache()
    reader = find_file_reader(ds)
    ctx = IterationContext(file_shard=(2, 1, reader))
    assert [float(x) for x in iterate(ds, ctx)] == [10.0, 12.0, 30.0, 32.0]


# -- invariants ------------------------------------------------------------------------------------
rows = st.integers(min_value=0, max_value=40)


@settings(max_examples=40, deadline=None)
@given(n=rows, size=st.integers(1, 7), drop=st.booleans())
def test_unbatch_of_batch_is_the_identity(n, size, drop):
    data = np.arange(n * 2).reshape(n, 2)
    ds = Dataset.from_tensor_slices((data, np.arange(n))).batch(size, drop_remainder=drop).unbatch()
    kept = n // size * size if drop else n
    assert values(ds) == [(data[i].tolist(), i) for i in range(kept)]


@settings(max_examples=40, deadline=None)
@given(n=rows, size=st.integers(1, 7), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_rebatch_is_unbatch_then_batch(n, size, sizes):
    batched = Dataset.range(n).batch(size)
    expected, i, k = [], 0, 0
    while i < n:
        expected.append(list(range(i, min(n, i + sizes[k % len(sizes)]))))
        i, k = i + sizes[k % len(sizes)], k + 1
    assert values(batched.rebatch(sizes)) == expected
    assert values(batched.rebatch(size)) == values(batched.unbatch().batch(size))


@settings(max_examples=40, deadline=None)
@given(n=rows, start=st.integers(-5, 5))
def test_enumerate_counts_from_start(n, start):
    out = values(Dataset.range(100, 100 + n).enumerate(start))
    assert out == [(start + i, 100 + i) for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(a=st.integers(-2, 6), b=st.integers(-2, 6))
def test_concatenate_cardinality(a, b):
    def make(n):
        return {-1: Dataset.range(1).repeat(), -2: Dataset.range(3).filter(lambda x: True)}.get(
            n, Dataset.range(n))
    ds = make(a).concatenate(make(b))
    expected = -1 if -1 in (a, b) else -2 if -2 in (a, b) else a + b
    assert ds.cardinality() == expected
    if expected >= 0:
        assert len(list(ds)) == expected


@settings(max_examples=60, deadline=None)
@given(n=rows, size=st.integers(1, 6), shift=st.integers(1, 6), stride=st.integers(1, 3),
       drop=st.booleans())
def test_window_then_flat_map_rebuilds_the_sequence(n, size, shift, stride, drop):
    ds = Dataset.range(n).window(size, shift, stride, drop)
    out = values(ds.flat_map(lambda w: w.batch(size)))
    expected = []
    for start in range(0, n, shift):
        window = list(range(start, min(n, start + (size - 1) * stride + 1), stride))
        if drop and len(window) < size:
            break
        expected.append(window)
    assert out == expected
    assert ds.cardinality() == len(expected)
    if shift == size and stride == 1:  # tiling windows give back the whole sequence
        assert [x for w in out for x in w] == list(range(n if not drop else n // size * size))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4), seed=st.integers(0, 2 ** 32),
       weights=st.none() | st.lists(st.floats(0.05, 5.0), min_size=4, max_size=4))
def test_sample_from_datasets_is_reproducible_and_draws_every_element_once(sizes, seed, weights):
    def make():
        datasets = [Dataset.range(100 * k, 100 * k + n) for k, n in enumerate(sizes)]
        return Dataset.sample_from_datasets(
            datasets, weights=None if weights is None else weights[:len(sizes)], seed=seed)
    first = values(make())
    assert first == values(make())
    assert sorted(first) == sorted(100 * k + i for k, n in enumerate(sizes) for i in range(n))
    for k in range(len(sizes)):  # each dataset's elements keep their order
        own = [x for x in first if x // 100 == k]
        assert own == sorted(own)


@settings(max_examples=40, deadline=None)
@given(n=rows, keys=st.integers(1, 4), size=st.integers(1, 5))
def test_group_by_window_loses_nothing(n, keys, size):
    ds = Dataset.range(n).group_by_window(lambda x: x % keys, lambda k, d: d.batch(size),
                                          window_size=size)
    out = values(ds)
    assert sorted(x for b in out for x in b) == list(range(n))
    assert all(len({x % keys for x in b}) == 1 and len(b) <= size for b in out)


@settings(max_examples=40, deadline=None)
@given(n=rows, m=rows)
def test_zip_ends_with_the_shortest(n, m):
    ds = Dataset.zip(Dataset.range(n), Dataset.range(10, 10 + m))
    assert values(ds) == [(i, 10 + i) for i in range(min(n, m))]
    assert ds.cardinality() == min(n, m)


# -- under a strategy ------------------------------------------------------------------------------
def test_static_batch_size_is_the_closest_batching_node():
    assert static_batch_size(Dataset.range(8).batch(4).rebatch(2)) == 2
    assert static_batch_size(Dataset.range(8).batch(4).rebatch([2, 3])) is None
    assert static_batch_size(Dataset.range(8).map(lambda x: np.full(2, x)).padded_batch(3)) == 3
    assert static_batch_size(Dataset.range(8).batch(4).unbatch()) is None
    assert static_batch_size(Dataset.range(8).batch(4).filter(lambda b: True)) == 4


def test_rebatched_and_zipped_datasets_are_split_over_replicas():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    off = Options()
    off.experimental_distribute.auto_shard_policy = AutoShardPolicy.OFF
    ds = Dataset.range(10).batch(3).rebatch(4).with_options(off)
    dist = strategy.experimental_distribute_dataset(ds)
    got = [[np.asarray(v).tolist() for v in strategy.experimental_local_results(x)] for x in dist]
    # balanced rule with the rebatched size G = 4: 2 rows per replica
    assert got == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], []]]
    pairs = Dataset.zip(Dataset.range(4), Dataset.range(10, 14)).batch(4)
    steps = list(strategy.experimental_distribute_dataset(pairs))
    x, y = steps[0]
    assert [v.tolist() for v in strategy.experimental_local_results(y)] == [[10, 11], [12, 13]]


@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(0, 3))
@settings(max_examples=30, deadline=None)
def test_a_seeded_shuffle_s_order_depends_on_seed_and_elements_only(seed, n, steps_before):
    """TF's rule: the same seed over the same elements gives the same order, wherever the
    shuffle sits in the pipeline (identity maps and full takes before it change nothing)."""
    plain = Dataset.range(n).shuffle(n, seed=seed)
    deeper = Dataset.range(n)
    for _ in range(steps_before):
        deeper = deeper.map(lambda x: x).take(n)
    deeper = deeper.shuffle(n, seed=seed)
    assert [int(v) for v in plain.as_numpy_iterator()] == \
        [int(v) for v in deeper.as_numpy_iterator()]
    assert sorted(int(v) for v in plain.as_numpy_iterator()) == list(range(n))
