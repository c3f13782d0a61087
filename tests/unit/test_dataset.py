"""mpidist.data.Dataset as a tf.data user sees it: the sources, each transformation, element_spec,
cardinality / len, shuffle's orders, prefetch's background thread, options, and the spec types.

Values are NumPy's (a Python int is int64, a Python float float64; see docs/semantics.md).
"""

import collections
import gc
import threading
import time

import numpy as np
import pytest

from mpidist.data import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    Options,
    TensorSpec,
)
from mpidist.data.experimental import AutoShardPolicy
from mpidist.data.spec import (
    PerReplicaSpec,
    empty_like_spec,
    most_specific_common,
    spec_of,
)
from mpidist.errors import InvalidArgumentError

Point = collections.namedtuple("Point", ["a", "b"])


def py(x):
    """An element (or batch) as plain Python values, keeping tuple / dict / namedtuple structure."""
    if isinstance(x, dict):
        return {k: py(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(type(x), "_fields"):
        return type(x)(*(py(v) for v in x))
    if isinstance(x, tuple):
        return tuple(py(v) for v in x)
    return np.asarray(x).tolist()


def values(ds):
    return [py(e) for e in ds]


def ints(ds):
    return [int(e) for e in ds]


def spec(shape, dtype):
    return TensorSpec(shape, dtype)


def counting_generator(items):
    """A generator function that records how many times it was called."""
    calls = []

    def gen(*args):
        calls.append(args)
        yield from items

    return gen, calls


def prefetch_threads():
    return {t for t in threading.enumerate() if t.name == "mpidist-prefetch"}


def wait_until(predicate, timeout=2.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# == sources ======================================================================================

# -- from_tensor_slices ---------------------------------------------------------------------------
def test_slices_of_a_list_of_ints():
    ds = Dataset.from_tensor_slices([1, 2, 3])
    elements = list(ds)
    assert [int(e) for e in elements] == [1, 2, 3]
    assert all(np.asarray(e).dtype == np.int64 for e in elements)
    assert ds.element_spec == spec((), np.int64)
    assert ds.cardinality() == 3
    assert len(ds) == 3


def test_slices_of_a_2d_array_keep_dtype_and_row_shape():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    ds = Dataset.from_tensor_slices(x)
    elements = list(ds)
    assert len(elements) == 4
    for i, e in enumerate(elements):
        assert e.shape == (3,) and e.dtype == np.float32
        np.testing.assert_array_equal(e, x[i])
    assert ds.element_spec == spec((3,), np.float32)
    assert ds.cardinality() == 4


def test_slices_of_python_floats_are_float64():
    ds = Dataset.from_tensor_slices([0.5, 1.5])
    assert ds.element_spec == spec((), np.float64)
    assert values(ds) == [0.5, 1.5]


def test_slices_of_a_tuple_give_tuple_elements():
    features = np.arange(6, dtype=np.float32).reshape(3, 2)
    labels = np.array([7, 8, 9], dtype=np.int32)
    ds = Dataset.from_tensor_slices((features, labels))
    assert values(ds) == [([0.0, 1.0], 7), ([2.0, 3.0], 8), ([4.0, 5.0], 9)]
    first = next(iter(ds))
    assert type(first) is tuple
    assert first[0].dtype == np.float32 and np.asarray(first[1]).dtype == np.int32
    assert ds.element_spec == (spec((2,), np.float32), spec((), np.int32))
    assert ds.cardinality() == 3


def test_slices_of_a_dict_give_dict_elements():
    ds = Dataset.from_tensor_slices({"x": [[1, 2], [3, 4], [5, 6]], "y": [0.0, 1.0, 0.0]})
    assert values(ds) == [{"x": [1, 2], "y": 0.0}, {"x": [3, 4], "y": 1.0},
                          {"x": [5, 6], "y": 0.0}]
    assert ds.element_spec == {"x": spec((2,), np.int64), "y": spec((), np.float64)}
    assert ds.cardinality() == 3


def test_slices_of_a_nested_structure():
    a = np.arange(4)
    b = np.arange(8, dtype=np.float32).reshape(4, 2)
    c = np.array([True, False, True, False])
    labels = np.arange(10, 14, dtype=np.int32)
    ds = Dataset.from_tensor_slices(({"a": a, "bc": (b, c)}, labels))
    element = list(ds)[2]
    assert py(element) == ({"a": 2, "bc": ([4.0, 5.0], True)}, 12)
    assert ds.element_spec == (
        {"a": spec((), np.int64), "bc": (spec((2,), np.float32), spec((), np.bool_))},
        spec((), np.int32))
    assert ds.cardinality() == 4


def test_slices_of_a_namedtuple_keep_the_namedtuple():
    ds = Dataset.from_tensor_slices(Point(np.arange(3), np.ones((3, 2), np.float32)))
    elements = list(ds)
    assert all(type(e) is Point for e in elements)
    assert [int(e.a) for e in elements] == [0, 1, 2]
    np.testing.assert_array_equal(elements[1].b, [1.0, 1.0])
    assert ds.element_spec == Point(spec((), np.int64), spec((2,), np.float32))


def test_a_list_is_one_array_not_a_structure():
    # A list of lists is a 2-D array sliced along rows ...
    ds = Dataset.from_tensor_slices([[1, 2], [3, 4], [5, 6]])
    assert values(ds) == [[1, 2], [3, 4], [5, 6]]
    assert ds.element_spec == spec((2,), np.int64)
    # ... a list of tuples too ...
    ds = Dataset.from_tensor_slices([(1, 2), (3, 4)])
    assert values(ds) == [[1, 2], [3, 4]]
    assert ds.element_spec == spec((2,), np.int64)
    # ... while a tuple of lists has two components.
    ds = Dataset.from_tensor_slices(([1, 2, 3], [4.0, 5.0, 6.0]))
    assert values(ds) == [(1, 4.0), (2, 5.0), (3, 6.0)]
    assert ds.element_spec == (spec((), np.int64), spec((), np.float64))


def test_lists_inside_dicts_are_arrays():
    ds = Dataset.from_tensor_slices({"ids": [[1, 2, 3], [4, 5, 6]]})
    assert ds.element_spec == {"ids": spec((3,), np.int64)}
    assert values(ds) == [{"ids": [1, 2, 3]}, {"ids": [4, 5, 6]}]


def test_slices_with_zero_rows():
    ds = Dataset.from_tensor_slices(np.zeros((0, 3), np.float32))
    assert list(ds) == []
    assert ds.cardinality() == 0
    assert len(ds) == 0
    assert ds.element_spec == spec((3,), np.float32)


def test_slices_with_mismatched_leading_dims():
    with pytest.raises(InvalidArgumentError, match="dimensions 3 and 2 are not compatible"):
        Dataset.from_tensor_slices((np.arange(3), np.arange(2)))
    with pytest.raises(InvalidArgumentError, match="dimensions 2 and 4 are not compatible"):
        Dataset.from_tensor_slices({"a": np.zeros((2, 5)), "b": np.zeros((4,))})
    # InvalidArgumentError is also a ValueError, as TF's shape errors are.
    with pytest.raises(ValueError, match="not compatible"):
        Dataset.from_tensor_slices(([1, 2, 3], [1, 2]))


def test_slices_of_a_scalar():
    with pytest.raises(InvalidArgumentError, match="at least one dimension"):
        Dataset.from_tensor_slices(5)
    with pytest.raises(InvalidArgumentError, match="at least one dimension"):
        Dataset.from_tensor_slices((np.arange(3), 1.0))


# -- from_tensors ---------------------------------------------------------------------------------
def test_from_tensors_is_one_element():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    ds = Dataset.from_tensors(x)
    elements = list(ds)
    assert len(elements) == 1
    np.testing.assert_array_equal(elements[0], x)
    assert elements[0].dtype == np.int32
    assert ds.element_spec == spec((2, 3), np.int32)
    assert ds.cardinality() == 1 and len(ds) == 1


def test_from_tensors_of_a_list_and_a_scalar():
    ds = Dataset.from_tensors([1, 2, 3])
    assert values(ds) == [[1, 2, 3]]
    assert ds.element_spec == spec((3,), np.int64)
    ds = Dataset.from_tensors(2.5)
    assert values(ds) == [2.5]
    assert ds.element_spec == spec((), np.float64)


def test_from_tensors_of_nested_structures():
    ds = Dataset.from_tensors(({"x": np.zeros((2, 2), np.float32), "n": 3}, [1, 2]))
    (element,) = list(ds)
    assert py(element) == ({"x": [[0.0, 0.0], [0.0, 0.0]], "n": 3}, [1, 2])
    assert ds.element_spec == ({"x": spec((2, 2), np.float32), "n": spec((), np.int64)},
                               spec((2,), np.int64))
    ds = Dataset.from_tensors(Point(1, [2.0, 3.0]))
    assert ds.element_spec == Point(spec((), np.int64), spec((2,), np.float64))
    assert type(next(iter(ds))) is Point


# -- range ----------------------------------------------------------------------------------------
def test_range_stop():
    ds = Dataset.range(5)
    elements = list(ds)
    assert [int(e) for e in elements] == [0, 1, 2, 3, 4]
    assert all(np.asarray(e).dtype == np.int64 for e in elements)
    assert ds.element_spec == spec((), np.int64)
    assert ds.cardinality() == 5


def test_range_start_stop():
    ds = Dataset.range(2, 5)
    assert ints(ds) == [2, 3, 4]
    assert ds.cardinality() == 3


def test_range_start_stop_step():
    ds = Dataset.range(1, 10, 3)
    assert ints(ds) == [1, 4, 7]
    assert ds.cardinality() == 3


def test_range_negative_step():
    ds = Dataset.range(10, 0, -3)
    assert ints(ds) == [10, 7, 4, 1]
    assert ds.cardinality() == 4
    assert ints(Dataset.range(5, -5, -5)) == [5, 0]


def test_range_empty():
    for ds in (Dataset.range(0), Dataset.range(5, 2), Dataset.range(0, 5, -1)):
        assert list(ds) == []
        assert ds.cardinality() == 0


def test_range_dtype():
    ds = Dataset.range(3, dtype=np.int32)
    elements = list(ds)
    assert [int(e) for e in elements] == [0, 1, 2]
    assert all(np.asarray(e).dtype == np.int32 for e in elements)
    assert ds.element_spec == spec((), np.int32)


def test_range_argument_count():
    with pytest.raises(ValueError, match="range takes 1 to 3 positional arguments.*got 0"):
        Dataset.range()
    with pytest.raises(ValueError, match="range takes 1 to 3 positional arguments.*got 4"):
        Dataset.range(1, 2, 3, 4)


# -- from_generator -------------------------------------------------------------------------------
def test_generator_with_signature_converts_dtypes():
    gen, _ = counting_generator([1, 2, 3])
    ds = Dataset.from_generator(gen, output_signature=TensorSpec((), np.float32))
    elements = list(ds)
    assert [float(e) for e in elements] == [1.0, 2.0, 3.0]
    assert all(np.asarray(e).dtype == np.float32 for e in elements)
    assert ds.element_spec == spec((), np.float32)
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_generator_with_nested_signature_and_unknown_dims():
    def gen():
        yield [1, 2, 3], {"w": 0.5}
        yield [4], {"w": 1.5}

    sig = (TensorSpec((None,), np.int32), {"w": TensorSpec((), np.float32)})
    ds = Dataset.from_generator(gen, output_signature=sig)
    elements = list(ds)
    assert [py(e) for e in elements] == [([1, 2, 3], {"w": 0.5}), ([4], {"w": 1.5})]
    assert elements[0][0].dtype == np.int32 and elements[0][1]["w"].dtype == np.float32
    assert ds.element_spec == sig


def test_generator_shape_mismatch_fails_at_that_element():
    def gen():
        yield [1, 2]
        yield [3, 4]
        yield [5, 6, 7]

    it = iter(Dataset.from_generator(gen, output_signature=TensorSpec((2,), np.int64)))
    assert py(next(it)) == [1, 2]
    assert py(next(it)) == [3, 4]
    with pytest.raises(InvalidArgumentError, match=r"element \(2\) of shape \(3,\).*does not fit"):
        next(it)


def test_generator_rank_mismatch():
    ds = Dataset.from_generator(lambda: iter([5]), output_signature=TensorSpec((None,), np.int64))
    with pytest.raises(InvalidArgumentError, match=r"element \(0\) of shape \(\)"):
        list(ds)


def test_generator_structure_mismatch():
    sig = (TensorSpec((), np.int32), TensorSpec((), np.int32))
    ds = Dataset.from_generator(lambda: iter([(1, 2), 3]), output_signature=sig)
    it = iter(ds)
    assert py(next(it)) == (1, 2)
    with pytest.raises(InvalidArgumentError, match=r"element \(1\).*did not match the expected "
                                                    r"structure"):
        next(it)


def test_generator_with_output_types_of_scalars():
    ds = Dataset.from_generator(lambda: iter([1, 2, 3]), output_types=np.int32)
    elements = list(ds)
    assert [int(e) for e in elements] == [1, 2, 3]
    assert all(np.asarray(e).dtype == np.int32 for e in elements)
    ds = Dataset.from_generator(lambda: iter([(1, 2.0)]), output_types=(np.int32, np.float32))
    (element,) = list(ds)
    assert py(element) == (1, 2.0)
    assert element[0].dtype == np.int32 and element[1].dtype == np.float32


def test_generator_args_are_passed_on_every_iteration():
    def gen(n, offset):
        for i in range(int(n)):
            yield int(offset) + i

    ds = Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64), args=(3, 10))
    assert ints(ds) == [10, 11, 12]
    assert ints(ds) == [10, 11, 12]


def test_generator_is_called_again_on_each_iteration():
    gen, calls = counting_generator([1, 2])
    ds = Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64))
    assert calls == []  # lazy: nothing runs until iteration
    assert ints(ds) == [1, 2]
    assert ints(ds) == [1, 2]
    assert len(calls) == 2
    assert ints(ds.repeat(3)) == [1, 2] * 3
    assert len(calls) == 5


def test_generator_without_signature_infers_the_spec():
    def gen():
        yield np.array([1.0, 2.0], np.float32), 7
        yield np.array([3.0, 4.0], np.float32), 8

    ds = Dataset.from_generator(gen)
    assert ds.element_spec == (spec((2,), np.float32), spec((), np.int64))
    assert values(ds) == [([1.0, 2.0], 7), ([3.0, 4.0], 8)]
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_generator_yielding_lists_gives_arrays():
    ds = Dataset.from_generator(lambda: iter([[1, 2], [3, 4]]))
    assert ds.element_spec == spec((2,), np.int64)
    elements = list(ds)
    assert all(isinstance(e, np.ndarray) and e.shape == (2,) for e in elements)


def test_generator_without_signature_that_yields_nothing():
    ds = Dataset.from_generator(lambda: iter([]))
    assert list(ds) == []
    with pytest.raises(ValueError, match="yielded no element.*pass output_signature"):
        _ = ds.element_spec


def test_generator_must_be_callable():
    with pytest.raises(TypeError, match="`generator` must be a Python callable"):
        Dataset.from_generator(iter([1, 2]))


def test_generator_error_propagates_at_its_element():
    def gen():
        yield 1
        raise RuntimeError("generator broke")

    it = iter(Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64)))
    assert int(next(it)) == 1
    with pytest.raises(RuntimeError, match="generator broke"):
        next(it)


# == batch ========================================================================================
def test_batch_with_a_partial_last_batch():
    ds = Dataset.range(10).batch(4)
    batches = list(ds)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(b.dtype == np.int64 for b in batches)
    assert ds.element_spec == spec((None,), np.int64)
    assert ds.cardinality() == 3 and len(ds) == 3


def test_batch_drop_remainder():
    ds = Dataset.range(10).batch(4, drop_remainder=True)
    assert values(ds) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ds.element_spec == spec((4,), np.int64)
    assert ds.cardinality() == 2


def test_batch_that_divides_exactly():
    ds = Dataset.range(8).batch(4)
    assert values(ds) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ds.cardinality() == 2
    assert Dataset.range(8).batch(4, drop_remainder=True).cardinality() == 2


def test_batch_larger_than_the_dataset():
    assert values(Dataset.range(3).batch(5)) == [[0, 1, 2]]
    assert Dataset.range(3).batch(5).cardinality() == 1
    dropped = Dataset.range(3).batch(5, drop_remainder=True)
    assert list(dropped) == []
    assert dropped.cardinality() == 0


def test_batch_of_rows_and_dtypes():
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    ds = Dataset.from_tensor_slices(x).batch(2)
    batches = list(ds)
    assert [b.shape for b in batches] == [(2, 3), (2, 3), (1, 3)]
    assert all(b.dtype == np.float32 for b in batches)
    np.testing.assert_array_equal(np.concatenate(batches), x)
    assert ds.element_spec == spec((None, 3), np.float32)


def test_batch_of_nested_structures():
    ds = Dataset.from_tensor_slices(
        ({"a": np.arange(5, dtype=np.int32), "b": np.ones((5, 2), np.float32)},
         np.arange(10, 15))).batch(2)
    batches = list(ds)
    assert len(batches) == 3
    features, labels = batches[0]
    assert set(features) == {"a", "b"}
    assert features["a"].tolist() == [0, 1] and features["a"].dtype == np.int32
    assert features["b"].shape == (2, 2) and features["b"].dtype == np.float32
    assert labels.tolist() == [10, 11]
    assert py(batches[2]) == ({"a": [4], "b": [[1.0, 1.0]]}, [14])
    assert ds.element_spec == ({"a": spec((None,), np.int32), "b": spec((None, 2), np.float32)},
                               spec((None,), np.int64))


def test_batch_of_namedtuples():
    ds = Dataset.from_tensor_slices(Point(np.arange(3), np.arange(3) * 10)).batch(2, True)
    (batch,) = list(ds)
    assert type(batch) is Point
    assert batch.a.tolist() == [0, 1] and batch.b.tolist() == [0, 10]
    assert ds.element_spec == Point(spec((2,), np.int64), spec((2,), np.int64))


def test_batch_of_batches():
    ds = Dataset.range(8).batch(2).batch(2)
    batches = list(ds)
    assert [b.shape for b in batches] == [(2, 2), (2, 2)]
    assert values(ds) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert ds.element_spec == spec((None, None), np.int64)
    assert Dataset.range(8).batch(2, True).batch(2, True).element_spec == spec((2, 2), np.int64)


def test_batch_cardinality_of_infinite_and_unknown_inputs():
    assert Dataset.range(3).repeat().batch(2).cardinality() == INFINITE_CARDINALITY
    gen = Dataset.from_generator(lambda: iter([1, 2, 3]), output_signature=TensorSpec((), np.int64))
    assert gen.batch(2).cardinality() == UNKNOWN_CARDINALITY
    assert values(gen.batch(2)) == [[1, 2], [3]]


def test_batch_of_an_infinite_dataset():
    assert values(Dataset.range(3).repeat().batch(4).take(2)) == [[0, 1, 2, 0], [1, 2, 0, 1]]


def test_batching_ragged_elements():
    ds = Dataset.from_generator(lambda: iter([[1, 2], [3, 4], [1, 2, 3], [4, 5]])).batch(2)
    it = iter(ds)
    assert next(it).tolist() == [[1, 2], [3, 4]]
    with pytest.raises(InvalidArgumentError,
                       match=r"Cannot batch tensors with different shapes in component 0\. First "
                             r"element had shape \[3\] and element 1 had shape \[2\]\."):
        next(it)


def test_batching_ragged_elements_names_the_component():
    ds = Dataset.from_generator(lambda: iter([(1, [1, 2, 3]), (2, [1, 2])])).batch(2)
    with pytest.raises(InvalidArgumentError,
                       match=r"component 1\. First element had shape \[3\] and element 1 had "
                             r"shape \[2\]"):
        list(ds)


@pytest.mark.parametrize("size", [0, -1, -4])
def test_batch_size_must_be_positive(size):
    with pytest.raises(InvalidArgumentError, match=f"batch_size must be greater than zero, got "
                                                   f"{size}"):
        Dataset.range(4).batch(size)


@pytest.mark.parametrize("size", [True, 2.0, "2", None])
def test_batch_size_must_be_an_int(size):
    with pytest.raises(TypeError, match="batch_size must be an int"):
        Dataset.range(4).batch(size)


def test_batch_size_may_be_a_numpy_int():
    assert values(Dataset.range(4).batch(np.int64(3))) == [[0, 1, 2], [3]]


# == shuffle ======================================================================================
def test_shuffle_with_buffer_one_keeps_the_order():
    ds = Dataset.range(20).shuffle(1, seed=5)
    assert ints(ds) == list(range(20))
    assert ints(ds) == list(range(20))


@pytest.mark.parametrize("buffer_size", [3, 10, 20, 100])
def test_shuffle_is_a_permutation(buffer_size):
    ds = Dataset.range(20).shuffle(buffer_size, seed=11)
    order = ints(ds)
    assert sorted(order) == list(range(20))
    assert order != list(range(20))
    assert ds.cardinality() == 20
    assert ds.element_spec == spec((), np.int64)


def test_shuffle_draws_from_a_window_of_buffer_size():
    # tf.data's algorithm: the i-th output is one of the first buffer_size + i inputs.
    order = ints(Dataset.range(50).shuffle(4, seed=2))
    assert sorted(order) == list(range(50))
    assert all(v < 4 + i for i, v in enumerate(order))


def test_shuffle_of_a_long_dataset_is_a_permutation():
    order = ints(Dataset.range(3000).shuffle(100, seed=9))
    assert sorted(order) == list(range(3000))
    assert all(v < 100 + i for i, v in enumerate(order))


def test_shuffle_keeps_components_together():
    x = np.arange(10)
    ds = Dataset.from_tensor_slices({"x": x, "y": x * 100}).shuffle(10, seed=3)
    elements = values(ds)
    assert sorted(e["x"] for e in elements) == list(range(10))
    assert all(e["y"] == 100 * e["x"] for e in elements)


def test_same_seed_same_order_across_separately_built_pipelines():
    a = ints(Dataset.range(20).shuffle(8, seed=42))
    b = ints(Dataset.range(20).shuffle(8, seed=42))
    assert a == b
    c = ints(Dataset.range(20).shuffle(8, seed=43))
    assert sorted(c) == list(range(20)) and c != a


def test_reshuffle_each_iteration_gives_a_new_order_per_iteration():
    ds = Dataset.range(20).shuffle(20, seed=3)  # reshuffle_each_iteration=True is the default
    first, second, third = ints(ds), ints(ds), ints(ds)
    for order in (first, second, third):
        assert sorted(order) == list(range(20))
    assert first != second and second != third and first != third


def test_reshuffled_sequence_of_orders_is_reproducible():
    a = Dataset.range(20).shuffle(20, seed=3)
    b = Dataset.range(20).shuffle(20, seed=3)
    orders_a = [ints(a) for _ in range(3)]
    orders_b = [ints(b) for _ in range(3)]
    assert orders_a == orders_b


def test_no_reshuffle_gives_the_same_order_every_iteration():
    ds = Dataset.range(20).shuffle(20, seed=3, reshuffle_each_iteration=False)
    first = ints(ds)
    assert sorted(first) == list(range(20)) and first != list(range(20))
    assert ints(ds) == first
    assert ints(ds) == first


def test_shuffle_then_repeat_reshuffles_each_pass():
    n, k = 10, 3
    order = ints(Dataset.range(n).shuffle(n, seed=1).repeat(k))
    passes = [order[i * n:(i + 1) * n] for i in range(k)]
    assert len(order) == n * k
    for p in passes:
        assert sorted(p) == list(range(n))
    assert len({tuple(p) for p in passes}) == k


def test_shuffle_then_repeat_without_reshuffle_repeats_one_order():
    n, k = 10, 3
    order = ints(Dataset.range(n).shuffle(n, seed=1, reshuffle_each_iteration=False).repeat(k))
    passes = [order[i * n:(i + 1) * n] for i in range(k)]
    assert sorted(passes[0]) == list(range(n)) and passes[0] != list(range(n))
    assert passes[1] == passes[0] and passes[2] == passes[0]


def test_shuffle_then_repeat_is_reproducible():
    a = ints(Dataset.range(10).shuffle(4, seed=8).repeat(3))
    b = ints(Dataset.range(10).shuffle(4, seed=8).repeat(3))
    assert a == b


def test_repeat_then_shuffle_mixes_across_passes():
    order = ints(Dataset.range(5).repeat(4).shuffle(20, seed=0))
    assert sorted(order) == sorted(list(range(5)) * 4)


def test_unseeded_shuffle():
    a = Dataset.range(20).shuffle(20)
    b = Dataset.range(20).shuffle(20)
    order_a, order_b = ints(a), ints(b)
    assert sorted(order_a) == list(range(20)) and sorted(order_b) == list(range(20))
    assert order_a != order_b  # 1 in 20! that they agree by chance
    fixed = Dataset.range(20).shuffle(20, reshuffle_each_iteration=False)
    assert ints(fixed) == ints(fixed)


def test_shuffle_of_an_infinite_dataset():
    ds = Dataset.range(3).repeat().shuffle(5, seed=4)
    assert ds.cardinality() == INFINITE_CARDINALITY
    taken = ints(ds.take(30))
    assert len(taken) == 30 and set(taken) == {0, 1, 2}


@pytest.mark.parametrize("size", [0, -2, -10])
def test_shuffle_buffer_size_must_be_positive(size):
    with pytest.raises(InvalidArgumentError,
                       match=f"buffer_size must be greater than zero, got {size}"):
        Dataset.range(4).shuffle(size)


@pytest.mark.parametrize("size", [2.0, True, None])
def test_shuffle_buffer_size_must_be_an_int(size):
    with pytest.raises(TypeError, match="buffer_size must be an int"):
        Dataset.range(4).shuffle(size)


@pytest.mark.parametrize("seed", [-1, 1.5, "7"])
def test_shuffle_seed_must_be_a_non_negative_int(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative int or None"):
        Dataset.range(4).shuffle(4, seed=seed)


# == repeat =======================================================================================
def test_repeat_count():
    ds = Dataset.range(3).repeat(2)
    assert ints(ds) == [0, 1, 2, 0, 1, 2]
    assert ds.cardinality() == 6 and len(ds) == 6
    assert ints(Dataset.range(3).repeat(1)) == [0, 1, 2]


@pytest.mark.parametrize("make", [lambda d: d.repeat(), lambda d: d.repeat(None),
                                  lambda d: d.repeat(-1)])
def test_repeat_forever(make):
    ds = make(Dataset.range(3))
    assert ds.cardinality() == INFINITE_CARDINALITY
    assert ints(ds.take(7)) == [0, 1, 2, 0, 1, 2, 0]
    it = iter(ds)
    assert [int(next(it)) for _ in range(100)] == [i % 3 for i in range(100)]


def test_repeat_zero_times():
    ds = Dataset.range(3).repeat(0)
    assert list(ds) == []
    assert ds.cardinality() == 0


def test_repeating_an_empty_dataset_terminates():
    ds = Dataset.range(0).repeat()
    assert list(ds) == []
    assert ds.cardinality() == 0
    empty_gen = Dataset.from_generator(lambda: iter([]), output_signature=TensorSpec((), np.int64))
    assert list(empty_gen.repeat()) == []
    assert list(Dataset.range(5).skip(5).repeat()) == []


def test_repeat_of_batches_and_batch_of_repeats():
    assert values(Dataset.range(3).batch(2).repeat(2)) == [[0, 1], [2], [0, 1], [2]]
    assert values(Dataset.range(3).repeat(2).batch(4)) == [[0, 1, 2, 0], [1, 2]]
    assert Dataset.range(3).batch(2).repeat(2).cardinality() == 4


def test_repeat_cardinality_of_unknown_input():
    gen = Dataset.from_generator(lambda: iter([1]), output_signature=TensorSpec((), np.int64))
    assert gen.repeat(3).cardinality() == UNKNOWN_CARDINALITY
    assert gen.repeat().cardinality() == UNKNOWN_CARDINALITY
    assert ints(gen.repeat(3)) == [1, 1, 1]


def test_repeat_count_must_be_an_int():
    with pytest.raises(TypeError, match="count must be an int"):
        Dataset.range(3).repeat(2.0)


# == shard ========================================================================================
def test_shard_values_and_cardinality():
    shards = [Dataset.range(10).shard(3, i) for i in range(3)]
    assert [ints(s) for s in shards] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [s.cardinality() for s in shards] == [4, 3, 3]
    assert sorted(v for s in shards for v in ints(s)) == list(range(10))


def test_shard_of_nested_elements_and_batches():
    ds = Dataset.from_tensor_slices((np.arange(6), np.arange(6) * 2.0)).shard(2, 1)
    assert values(ds) == [(1, 2.0), (3, 6.0), (5, 10.0)]
    assert ds.element_spec == (spec((), np.int64), spec((), np.float64))
    batches = Dataset.range(10).batch(3).shard(2, 0)
    assert values(batches) == [[0, 1, 2], [6, 7, 8]]
    assert batches.cardinality() == 2


def test_shard_with_more_shards_than_elements():
    ds = Dataset.range(2).shard(3, 2)
    assert list(ds) == []
    assert ds.cardinality() == 0
    assert ints(Dataset.range(2).shard(3, 1)) == [1]
    assert Dataset.range(2).shard(3, 1).cardinality() == 1


def test_shard_cardinality_of_infinite_and_unknown_inputs():
    assert Dataset.range(3).repeat().shard(2, 0).cardinality() == INFINITE_CARDINALITY
    gen = Dataset.from_generator(lambda: iter(range(5)), output_signature=TensorSpec((), np.int64))
    assert gen.shard(2, 1).cardinality() == UNKNOWN_CARDINALITY
    assert ints(gen.shard(2, 1)) == [1, 3]


@pytest.mark.parametrize("num_shards", [0, -1])
def test_shard_num_shards_must_be_positive(num_shards):
    with pytest.raises(InvalidArgumentError,
                       match=rf"Number of shards must be greater than zero \(currently "
                             rf"num_shards = {num_shards}\)"):
        Dataset.range(10).shard(num_shards, 0)


@pytest.mark.parametrize("index", [3, 4, -1])
def test_shard_index_must_be_in_range(index):
    with pytest.raises(InvalidArgumentError,
                       match=rf"Index must be between 0 and 2 \(currently index = {index}\)"):
        Dataset.range(10).shard(3, index)


# == take / skip ==================================================================================
def test_take():
    ds = Dataset.range(10)
    assert ints(ds.take(3)) == [0, 1, 2] and ds.take(3).cardinality() == 3
    assert list(ds.take(0)) == [] and ds.take(0).cardinality() == 0
    assert ints(ds.take(-1)) == list(range(10)) and ds.take(-1).cardinality() == 10
    assert ints(ds.take(20)) == list(range(10)) and ds.take(20).cardinality() == 10


def test_skip():
    ds = Dataset.range(10)
    assert ints(ds.skip(3)) == [3, 4, 5, 6, 7, 8, 9] and ds.skip(3).cardinality() == 7
    assert ints(ds.skip(0)) == list(range(10)) and ds.skip(0).cardinality() == 10
    assert list(ds.skip(20)) == [] and ds.skip(20).cardinality() == 0
    assert list(ds.skip(-1)) == [] and ds.skip(-1).cardinality() == 0
    assert list(ds.skip(10)) == [] and ds.skip(10).cardinality() == 0


def test_take_and_skip_of_an_infinite_dataset():
    inf = Dataset.range(3).repeat()
    assert inf.take(5).cardinality() == 5
    assert inf.take(-1).cardinality() == INFINITE_CARDINALITY
    assert inf.skip(5).cardinality() == INFINITE_CARDINALITY
    assert ints(inf.skip(5).take(4)) == [2, 0, 1, 2]
    assert len(inf.take(5)) == 5


def test_take_and_skip_of_an_unknown_dataset():
    gen = Dataset.from_generator(lambda: iter(range(5)), output_signature=TensorSpec((), np.int64))
    assert ints(gen.take(2)) == [0, 1] and gen.take(2).cardinality() == UNKNOWN_CARDINALITY
    assert ints(gen.skip(3)) == [3, 4] and gen.skip(3).cardinality() == UNKNOWN_CARDINALITY


def test_take_skip_compose_to_a_window():
    ds = Dataset.range(20).skip(5).take(4)
    assert ints(ds) == [5, 6, 7, 8] and ds.cardinality() == 4
    ds = Dataset.range(20).take(4).skip(1)
    assert ints(ds) == [1, 2, 3] and ds.cardinality() == 3


def test_take_and_skip_counts_must_be_ints():
    with pytest.raises(TypeError, match="count must be an int, got 2.0"):
        Dataset.range(3).take(2.0)
    with pytest.raises(TypeError, match="count must be an int, got True"):
        Dataset.range(3).skip(True)


# == map ==========================================================================================
def test_map_scalars():
    ds = Dataset.range(4).map(lambda x: x * 2)
    assert ints(ds) == [0, 2, 4, 6]
    assert ds.cardinality() == 4
    assert ds.element_spec == spec((), np.int64)


def test_map_unpacks_a_tuple_into_positional_arguments():
    ds = Dataset.from_tensor_slices((np.arange(3), np.arange(3) * 10)).map(lambda x, y: x + y)
    assert ints(ds) == [0, 11, 22]
    ds = Dataset.from_tensors((1, 2, 3)).map(lambda a, b, c: a * 100 + b * 10 + c)
    assert ints(ds) == [123]


def test_map_passes_a_dict_as_one_argument():
    seen = []

    def fn(d):
        seen.append(type(d))
        return d["a"] * 10 + d["b"]

    ds = Dataset.from_tensor_slices({"a": [1, 2], "b": [3, 4]}).map(fn)
    assert ints(ds) == [13, 24]
    assert seen == [dict, dict]


def test_map_passes_a_namedtuple_as_one_argument():
    seen = []

    def fn(p):
        seen.append(type(p))
        return p.a - p.b

    ds = Dataset.from_tensor_slices(Point(np.array([5, 6]), np.array([1, 1]))).map(fn)
    assert ints(ds) == [4, 5]
    assert seen == [Point, Point]


def test_map_returning_a_tuple():
    ds = Dataset.range(3).map(lambda x: (x, x.astype(np.float32) / np.float32(2)))
    assert values(ds) == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert ds.element_spec == (spec((), np.int64), spec((), np.float32))
    batch = next(iter(ds.batch(3)))
    assert type(batch) is tuple
    assert batch[0].tolist() == [0, 1, 2] and batch[1].dtype == np.float32


def test_map_returning_a_dict():
    ds = Dataset.range(3).map(lambda x: {"x": x, "sq": x * x})
    assert values(ds) == [{"x": 0, "sq": 0}, {"x": 1, "sq": 1}, {"x": 2, "sq": 4}]
    assert ds.element_spec == {"x": spec((), np.int64), "sq": spec((), np.int64)}


def test_map_converts_lists_inside_its_output_to_arrays():
    ds = Dataset.range(3).map(lambda x: (x, [x, x + 1]))
    elements = list(ds)
    assert all(isinstance(e[1], np.ndarray) and e[1].shape == (2,) for e in elements)
    assert values(ds) == [(0, [0, 1]), (1, [1, 2]), (2, [2, 3])]
    assert ds.element_spec == (spec((), np.int64), spec((2,), np.int64))


def test_map_changes_dtype_and_shape():
    ds = Dataset.range(3).map(lambda x: np.full((2, 2), x, dtype=np.float32))
    elements = list(ds)
    assert all(e.shape == (2, 2) and e.dtype == np.float32 for e in elements)
    assert ds.element_spec == spec((2, 2), np.float32)
    np.testing.assert_array_equal(elements[2], np.full((2, 2), 2.0, np.float32))


def test_map_of_batches_is_vectorised():
    ds = Dataset.range(6).batch(3).map(lambda b: b.sum())
    assert ints(ds) == [3, 12]


def test_map_is_lazy_and_runs_once_per_element():
    calls = []
    ds = Dataset.range(5).map(lambda x: calls.append(int(x)) or x)
    assert calls == []
    assert ints(ds.take(2)) == [0, 1]
    assert calls == [0, 1]


def test_map_error_surfaces_at_its_element():
    def fn(x):
        if x == 2:
            raise ValueError("bad element 2")
        return x

    it = iter(Dataset.range(5).map(fn))
    assert [int(next(it)), int(next(it))] == [0, 1]
    with pytest.raises(ValueError, match="bad element 2"):
        next(it)


def test_map_func_must_be_callable():
    with pytest.raises(TypeError, match="map_func must be callable"):
        Dataset.range(3).map(5)


# == prefetch =====================================================================================
def test_prefetch_gives_the_same_elements():
    base = Dataset.from_tensor_slices((np.arange(10), np.arange(10) * 1.5)).map(
        lambda x, y: {"x": x, "y": y})
    expected = values(base)
    for size in (1, 2, 5, AUTOTUNE, 0):
        ds = base.prefetch(size)
        assert values(ds) == expected
        assert values(ds) == expected  # and again: each iteration starts a new producer
        assert ds.cardinality() == 10
        assert ds.element_spec == base.element_spec


def test_prefetch_runs_in_a_background_thread():
    names = []
    ds = Dataset.range(3).map(lambda x: names.append(threading.current_thread().name) or x)
    assert ints(ds.prefetch(1)) == [0, 1, 2]
    assert names == ["mpidist-prefetch"] * 3


def test_prefetch_runs_ahead_by_at_most_its_buffer():
    produced = []
    ds = Dataset.range(100).map(lambda x: produced.append(int(x)) or x).prefetch(2)
    it = iter(ds)
    assert int(next(it)) == 0
    # One element consumed, two in the buffer, one more waiting to be put.
    assert wait_until(lambda: len(produced) == 4)
    time.sleep(0.05)
    assert produced == [0, 1, 2, 3]
    assert ints([next(it) for _ in range(3)]) == [1, 2, 3]
    it.close()


def test_prefetch_surfaces_a_map_error_at_its_element():
    def fn(x):
        if x == 3:
            raise KeyError("bad element 3")
        return x

    it = iter(Dataset.range(6).map(fn).prefetch(2))
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="bad element 3"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_prefetch_surfaces_a_generator_error():
    def gen():
        yield 1
        raise RuntimeError("source failed")

    ds = Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64)).prefetch(4)
    it = iter(ds)
    assert int(next(it)) == 1
    with pytest.raises(RuntimeError, match="source failed"):
        next(it)


def test_abandoned_prefetch_iterator_stops_its_thread():
    before = prefetch_threads()
    it = iter(Dataset.range(10 ** 9).prefetch(2))
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    ours = prefetch_threads() - before
    assert len(ours) == 1
    del it
    gc.collect()
    assert wait_until(lambda: not (ours & prefetch_threads())), "prefetch thread still running"


def test_exhausted_prefetch_iterator_stops_its_thread():
    before = prefetch_threads()
    it = iter(Dataset.range(5).prefetch(2))
    assert ints(it) == [0, 1, 2, 3, 4]
    assert wait_until(lambda: not (prefetch_threads() - before))


def test_prefetch_of_an_infinite_dataset():
    ds = Dataset.range(3).repeat().prefetch(AUTOTUNE)
    assert ds.cardinality() == INFINITE_CARDINALITY
    assert ints(ds.take(7)) == [0, 1, 2, 0, 1, 2, 0]


def test_prefetch_buffer_size_errors():
    with pytest.raises(InvalidArgumentError, match="buffer_size must be >= 0 or AUTOTUNE, got -5"):
        Dataset.range(3).prefetch(-5)
    with pytest.raises(TypeError, match="buffer_size must be an int"):
        Dataset.range(3).prefetch(1.5)


# == options ======================================================================================
def test_auto_shard_policy_values_match_tf():
    assert [int(p) for p in (AutoShardPolicy.OFF, AutoShardPolicy.AUTO, AutoShardPolicy.FILE,
                             AutoShardPolicy.DATA, AutoShardPolicy.HINT)] == [-1, 0, 1, 2, 3]


def test_default_options():
    o = Dataset.range(3).options()
    assert o.experimental_distribute.auto_shard_policy is AutoShardPolicy.AUTO
    assert o.experimental_distribute.num_devices is None
    assert o.deterministic is None
    assert o == Options()


def test_with_options_sets_and_survives_transformations():
    o = Options()
    o.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    ds = Dataset.range(6).with_options(o).map(lambda x: x + 1).batch(2).prefetch(1)
    assert ds.options().experimental_distribute.auto_shard_policy is AutoShardPolicy.DATA
    assert values(ds) == [[1, 2], [3, 4], [5, 6]]
    assert ds.cardinality() == 3
    plain = Dataset.range(6).with_options(o)
    assert ints(plain) == list(range(6)) and plain.element_spec == spec((), np.int64)


def test_with_options_merge_later_wins():
    first = Options()
    first.experimental_distribute.auto_shard_policy = AutoShardPolicy.OFF
    first.deterministic = True
    second = Options()
    second.experimental_distribute.auto_shard_policy = AutoShardPolicy.FILE
    ds = Dataset.range(3).with_options(first).batch(2).with_options(second)
    merged = ds.options()
    assert merged.experimental_distribute.auto_shard_policy is AutoShardPolicy.FILE
    assert merged.deterministic is True  # not set later, so the earlier value stays
    # The earlier dataset keeps its own options.
    assert Dataset.range(3).with_options(first).options() == first


def test_options_merge():
    a = Options()
    a.deterministic = False
    a.experimental_distribute.num_devices = 4
    b = Options()
    b.experimental_distribute.auto_shard_policy = AutoShardPolicy.HINT
    m = a.merge(b)
    assert m.deterministic is False
    assert m.experimental_distribute.auto_shard_policy is AutoShardPolicy.HINT
    assert m.experimental_distribute.num_devices == 4
    b.deterministic = True
    assert a.merge(b).deterministic is True
    assert b.merge(a).deterministic is False
    # merge builds a new object; its inputs are unchanged.
    assert a.experimental_distribute.auto_shard_policy is AutoShardPolicy.AUTO


def test_options_equality_and_repr():
    a, b = Options(), Options()
    assert a == b
    a.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    assert a != b
    b.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    assert a == b
    assert repr(a) == "Options(auto_shard_policy=DATA, deterministic=None)"
    assert a != "Options"


def test_with_options_needs_options():
    with pytest.raises(TypeError, match="options must be an mpidist.data.Options, got dict"):
        Dataset.range(3).with_options({})


# == cardinality, len, iteration ==================================================================
def test_cardinality_constants():
    assert INFINITE_CARDINALITY == -1
    assert UNKNOWN_CARDINALITY == -2
    assert AUTOTUNE == -1


def test_len_of_an_infinite_dataset():
    with pytest.raises(TypeError, match="The dataset is infinite"):
        len(Dataset.range(3).repeat())
    with pytest.raises(TypeError, match="The dataset is infinite"):
        len(Dataset.range(3).repeat().map(lambda x: x).batch(2))


def test_len_of_an_unknown_dataset():
    gen = Dataset.from_generator(lambda: iter([1]), output_signature=TensorSpec((), np.int64))
    with pytest.raises(TypeError, match="The dataset length is unknown"):
        len(gen)
    with pytest.raises(TypeError, match="The dataset length is unknown"):
        len(gen.batch(2).take(3))


def test_cardinality_through_a_pipeline():
    ds = (Dataset.range(100).shuffle(10, seed=0).map(lambda x: x).shard(3, 1).skip(3).take(20)
          .batch(6).prefetch(2))
    # shard(3, 1) of 100 = 33, skip 3 = 30, take 20 = 20, batch 6 = 4
    assert ds.cardinality() == 4
    assert len(list(ds)) == 4
    assert [len(b) for b in ds] == [6, 6, 6, 2]


def test_an_empty_dataset_is_truthy():
    assert bool(Dataset.range(0)) is True


def test_as_numpy_iterator():
    it = Dataset.range(3).as_numpy_iterator()
    assert iter(it) is it
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(StopIteration):
        next(it)
    assert values(Dataset.from_tensor_slices({"a": [1, 2]}).as_numpy_iterator()) == [
        {"a": 1}, {"a": 2}]


def test_iterators_are_independent():
    ds = Dataset.range(4)
    a, b = iter(ds), iter(ds)
    assert int(next(a)) == 0 and int(next(a)) == 1
    assert int(next(b)) == 0
    assert ints(a) == [2, 3]
    assert ints(b) == [1, 2, 3]


def test_transformations_do_not_change_their_input():
    base = Dataset.range(6)
    base.batch(2), base.shuffle(6, seed=1), base.take(1), base.skip(2), base.map(lambda x: -x)
    assert ints(base) == list(range(6))
    assert base.cardinality() == 6 and base.element_spec == spec((), np.int64)


def test_repr_names_the_dataset_and_its_spec():
    assert repr(Dataset.range(2).batch(2)) == (
        "<BatchDataset element_spec=TensorSpec(shape=(None,), dtype=int64, name=None)>")


# == determinism ==================================================================================
def test_shuffled_batched_pipeline_is_bit_identical_when_rebuilt():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 3)).astype(np.float32)
    y = np.arange(50, dtype=np.int32)

    def build():
        return Dataset.from_tensor_slices((x, y)).shuffle(16, seed=7).batch(8)

    a, b = build(), build()
    for _ in range(2):  # two epochs: the reshuffled second epoch agrees too
        batches_a, batches_b = list(a), list(b)
        assert len(batches_a) == len(batches_b) == 7
        for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
            assert xa.dtype == xb.dtype == np.float32 and ya.dtype == yb.dtype == np.int32
            assert xa.tobytes() == xb.tobytes() and ya.tobytes() == yb.tobytes()
        labels = np.concatenate([yb for _, yb in batches_a])
        assert sorted(labels.tolist()) == list(range(50))
        assert labels.tolist() != list(range(50))
        rows = np.concatenate([xb for xb, _ in batches_a])
        np.testing.assert_array_equal(rows, x[labels])  # rows stayed with their labels


# == TensorSpec and spec helpers ==================================================================
def test_tensor_spec_fields():
    s = TensorSpec([2, None], np.int32, name="ids")
    assert s.shape == (2, None)
    assert s.dtype == np.dtype(np.int32)
    assert s.name == "ids"
    assert TensorSpec(()).dtype == np.float32
    assert repr(s) == "TensorSpec(shape=(2, None), dtype=int32, name='ids')"


def test_tensor_spec_compatibility():
    s = TensorSpec((None, 3), np.float32)
    assert s.is_compatible_with(np.zeros((5, 3), np.float32))
    assert s.is_compatible_with(np.zeros((0, 3), np.float32))
    assert not s.is_compatible_with(np.zeros((5, 3), np.float64))
    assert not s.is_compatible_with(np.zeros((5, 4), np.float32))
    assert not s.is_compatible_with(np.zeros((3,), np.float32))
    assert s.is_compatible_with(TensorSpec((2, None), np.float32))


def test_tensor_spec_equality_and_batch_dim():
    s = TensorSpec((3,), np.int64)
    assert s == TensorSpec([3], "int64")
    assert hash(s) == hash(TensorSpec((3,), np.int64))
    assert s != TensorSpec((3,), np.int32)
    assert s != TensorSpec((None,), np.int64)
    assert s != (3,)
    assert s.with_batch_dim(None) == TensorSpec((None, 3), np.int64)
    assert s.with_batch_dim(8) == TensorSpec((8, 3), np.int64)


def test_spec_of_an_element():
    element = ({"a": np.zeros((2, 3), np.float32)}, np.int64(1), np.array([1.0, 2.0]))
    assert spec_of(element) == ({"a": TensorSpec((2, 3), np.float32)}, TensorSpec((), np.int64),
                                TensorSpec((2,), np.float64))


def test_most_specific_common():
    a = (TensorSpec((3, 2), np.float32), TensorSpec((), np.int64))
    b = (TensorSpec((4, 2), np.float32), TensorSpec((), np.int64))
    assert most_specific_common(a, b) == (TensorSpec((None, 2), np.float32),
                                          TensorSpec((), np.int64))
    with pytest.raises(TypeError, match="different dtypes: float32 and float64"):
        most_specific_common(TensorSpec((2,), np.float32), TensorSpec((2,), np.float64))
    with pytest.raises(TypeError, match=r"different ranks: shapes \(2,\) and \(2, 1\)"):
        most_specific_common(TensorSpec((2,), np.float32), TensorSpec((2, 1), np.float32))
    with pytest.raises(ValueError, match="same nested structure"):
        most_specific_common(TensorSpec((2,)), (TensorSpec((2,)),))


def test_empty_like_spec():
    out = empty_like_spec({"x": TensorSpec((None, None, 3), np.float32),
                           "y": TensorSpec((None,), np.int32)})
    assert out["x"].shape == (0, 0, 3) and out["x"].dtype == np.float32
    assert out["y"].shape == (0,) and out["y"].dtype == np.int32


def test_per_replica_spec():
    s = PerReplicaSpec(TensorSpec((None,), np.int64), TensorSpec((None,), np.int64))
    assert s.value_specs == (TensorSpec((None,), np.int64),) * 2
    assert s == PerReplicaSpec(*s.value_specs)
    assert hash(s) == hash(PerReplicaSpec(*s.value_specs))
    assert s != PerReplicaSpec(TensorSpec((None,), np.int64))
    assert repr(s).startswith("PerReplicaSpec(TensorSpec(shape=(None,)")


# -- tf.data behaviours fixed after review ------------------------------------------------------
def test_from_generator_output_types_and_shapes():
    ds = Dataset.from_generator(lambda: iter([[1, 2], [3, 4]]), output_types=np.int64,
                                output_shapes=(2,))
    assert ds.element_spec == TensorSpec((2,), np.int64)
    assert [e.tolist() for e in ds] == [[1, 2], [3, 4]]
    pair = Dataset.from_generator(lambda: iter([(1, [2.0, 3.0])]), output_types=(np.int64, np.float32),
                                  output_shapes=((), (2,)))
    assert pair.element_spec == (TensorSpec((), np.int64), TensorSpec((2,), np.float32))
    (element,) = list(pair)
    assert element[1].dtype == np.float32 and element[1].tolist() == [2.0, 3.0]


def test_from_generator_output_types_alone_leave_the_shape_unknown():
    ds = Dataset.from_generator(lambda: iter([[1, 2], [3, 4, 5]]), output_types=np.int64)
    assert ds.element_spec.shape is None and ds.element_spec.dtype == np.int64
    assert [e.tolist() for e in ds] == [[1, 2], [3, 4, 5]]
    assert ds.batch(2).element_spec.shape is None


def test_from_generator_args_arrive_as_arrays():
    seen = []
    ds = Dataset.from_generator(lambda n: seen.append(type(n)) or iter(range(int(n))),
                                output_signature=TensorSpec((), np.int64), args=(3,))
    assert [int(e) for e in ds] == [0, 1, 2]
    assert seen == [np.ndarray]


def test_map_returning_a_list_gives_a_tuple():
    ds = Dataset.range(3).map(lambda x: [x, x * 2])
    assert ds.element_spec == (TensorSpec((), np.int64), TensorSpec((), np.int64))
    assert [(int(a), int(b)) for a, b in ds] == [(0, 0), (1, 2), (2, 4)]


def test_map_element_spec_is_traced():
    assert Dataset.range(5).batch(2).map(lambda x: x).element_spec == TensorSpec((None,), np.int64)
    assert Dataset.range(4).batch(2, drop_remainder=True).map(lambda x: x * 2).element_spec == \
        TensorSpec((2,), np.int64)
    reshaped = Dataset.from_tensor_slices(np.zeros((10, 3, 4))).batch(2).map(lambda x: x.reshape(-1, 12))
    assert reshaped.element_spec == TensorSpec((None, 12), np.float64)
    assert Dataset.range(0).map(lambda x: (x, x)).element_spec == \
        (TensorSpec((), np.int64), TensorSpec((), np.int64))
    signature = TensorSpec((None,), np.int64)
    gen = Dataset.from_generator(lambda: iter([[1, 2, 3]]), output_signature=signature)
    assert gen.map(lambda x: x * 2).element_spec == signature


def test_auto_shard_policy_must_be_the_enum():
    o = Options()
    with pytest.raises(TypeError, match="AutoShardPolicy"):
        o.experimental_distribute.auto_shard_policy = 2
    with pytest.raises(TypeError, match="AutoShardPolicy"):
        o.experimental_distribute.auto_shard_policy = "DATA"
    assert o.experimental_distribute.auto_shard_policy is AutoShardPolicy.AUTO


def test_range_step_zero():
    with pytest.raises(InvalidArgumentError, match="step must be a non-zero integer"):
        Dataset.range(0, 5, 0)


def test_skip_all_of_unknown_or_infinite_keeps_the_cardinality():
    gen = Dataset.from_generator(lambda: iter([1, 2]), output_signature=TensorSpec((), np.int64))
    assert gen.skip(-1).cardinality() == UNKNOWN_CARDINALITY
    assert Dataset.range(3).repeat().skip(-1).cardinality() == INFINITE_CARDINALITY
    assert Dataset.range(3).skip(-1).cardinality() == 0


def test_sources_hold_a_read_only_snapshot():
    x = np.arange(6).reshape(3, 2)
    ds = Dataset.from_tensor_slices(x)
    x[0, 0] = 100  # the dataset keeps the data as it was when built
    first = next(iter(ds))
    assert first.tolist() == [0, 1]
    with pytest.raises(ValueError, match="read-only"):
        first[0] = -5
    batch = next(iter(ds.batch(2)))
    batch[0, 0] = -5  # batches are new arrays: writable, and the source is untouched
    assert next(iter(ds.batch(2)))[0, 0] == 0
    single = Dataset.from_tensors(np.ones(2))
    with pytest.raises(ValueError, match="read-only"):
        next(iter(single))[0] = 0


def test_tensor_spec_equality_includes_the_name():
    assert TensorSpec((2,), np.float32, name="x") != TensorSpec((2,), np.float32)
    assert TensorSpec((2,), np.float32, name="x") == TensorSpec((2,), np.float32, name="x")
