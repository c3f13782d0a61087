"""The tf.data transformations of mpidist/data/ops: zip, concatenate, filter, take_while,
enumerate, cache, unbatch, padded_batch, rebatch, window, scan.

Each reproduces TF's documented examples (the expected values are those TF's docstrings
print), its element_spec and cardinality, and the mistakes users make. Sampling, grouping and
ignore_errors: test_dataset_transformations_more.py.
"""

import collections
import os

import numpy as np
import pytest

from mpidist.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, TensorSpec
from mpidist.data.spec import DatasetSpec
from mpidist.errors import InvalidArgumentError
from dataset_values import py, values


I64 = TensorSpec((), np.int64)


# -- zip -------------------------------------------------------------------------------------------
def test_zip_docstring_examples():
    a = Dataset.range(1, 4)  # [1, 2, 3]
    b = Dataset.range(4, 7)  # [4, 5, 6]
    assert values(Dataset.zip(a, b)) == [(1, 4), (2, 5), (3, 6)]
    assert values(Dataset.zip(b, a)) == [(4, 1), (5, 2), (6, 3)]
    c = Dataset.range(7, 13).batch(2)  # [[7, 8], [9, 10], [11, 12]]
    assert values(Dataset.zip(a, b, c)) == [(1, 4, [7, 8]), (2, 5, [9, 10]), (3, 6, [11, 12])]
    d = Dataset.range(13, 15)  # [13, 14]
    assert values(Dataset.zip(a, d)) == [(1, 13), (2, 14)]  # the shortest ends it


def test_zip_nested_and_dict_structures_and_the_datasets_keyword():
    a, b = Dataset.range(3), Dataset.range(10, 13)
    ds = Dataset.zip({"x": a, "y": (b, a)})
    assert values(ds) == [{"x": 0, "y": (10, 0)}, {"x": 1, "y": (11, 1)}, {"x": 2, "y": (12, 2)}]
    assert ds.element_spec == {"x": I64, "y": (I64, I64)}
    assert values(Dataset.zip(datasets=(a, b))) == [(0, 10), (1, 11), (2, 12)]
    assert values(Dataset.zip((a,))) == [(0,), (1,), (2,)]
    assert values(Dataset.zip(a)) == [0, 1, 2]  # a single dataset is its own structure


def test_zip_spec_and_cardinality():
    a = Dataset.from_tensor_slices(np.zeros((5, 3), np.float32))
    b = Dataset.range(2)
    ds = Dataset.zip(a, b)
    assert ds.element_spec == (TensorSpec((3,), np.float32), I64)
    assert ds.cardinality() == 2
    assert Dataset.zip(a, b.repeat()).cardinality() == 5
    assert Dataset.zip(a.repeat(), b.repeat()).cardinality() == INFINITE_CARDINALITY
    assert Dataset.zip(a, b.filter(lambda x: x > 0)).cardinality() == UNKNOWN_CARDINALITY
    # TF: unknown wins even over an empty input
    assert Dataset.zip(a.take(0), b.filter(lambda x: x > 0)).cardinality() == UNKNOWN_CARDINALITY
    assert len(Dataset.zip(a, b)) == 2


def test_zip_mistakes():
    a = Dataset.range(3)
    with pytest.raises(TypeError, match="list of datasets is not supported.*tuple"):
        Dataset.zip([a, a])
    with pytest.raises(TypeError, match="at least one dataset"):
        Dataset.zip()
    with pytest.raises(TypeError, match="either positionally or as `datasets=`"):
        Dataset.zip(a, datasets=(a, a))
    with pytest.raises(TypeError, match=r"must be an mpidist.data.Dataset, got array"):
        Dataset.zip((a, np.arange(3)))
    with pytest.raises(TypeError, match="got 3 of type int"):
        Dataset.zip(3)


# -- concatenate -----------------------------------------------------------------------------------
def test_concatenate_docstring_example():
    a = Dataset.range(1, 4)  # [1, 2, 3]
    b = Dataset.range(4, 8)  # [4, 5, 6, 7]
    ds = a.concatenate(b)
    assert values(ds) == [1, 2, 3, 4, 5, 6, 7]
    assert ds.cardinality() == 7
    assert ds.element_spec == I64


def test_concatenate_refuses_incompatible_elements_naming_both_specs():
    a = Dataset.range(1, 4)
    c = Dataset.zip((Dataset.range(7, 13).batch(2), Dataset.range(13, 19).batch(2)))
    with pytest.raises(TypeError, match=r"incompatible dataset elements: TensorSpec\(shape=\(\), "
                                         r"dtype=int64.* vs\. \(TensorSpec\(shape=\(None,\)"):
        a.concatenate(c)
    d = Dataset.range(13, 15).map(lambda x: np.str_(x))  # TF: tf.strings.as_string
    with pytest.raises(TypeError, match=r"int64.* vs\. TensorSpec\(shape=\(\), dtype=str"):
        a.concatenate(d)
    f = Dataset.from_tensor_slices(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="float64"):
        a.concatenate(f)
    with pytest.raises(TypeError, match="must be an mpidist.data.Dataset, got"):
        a.concatenate([4, 5])


def test_concatenate_spec_relaxes_dims_and_keeps_strings_alike():
    a = Dataset.from_tensor_slices(np.zeros((2, 3)))
    b = Dataset.from_tensor_slices(np.zeros((2, 4)))
    assert a.concatenate(b).element_spec == TensorSpec((None,), np.float64)
    c = Dataset.from_tensor_slices(np.zeros((2, 4, 1)))
    assert a.concatenate(c).element_spec == TensorSpec(None, np.float64)  # ranks differ
    s = Dataset.from_tensor_slices(np.array(["a", "bb"])).concatenate(
        Dataset.from_tensor_slices(np.array(["cccc"])))
    assert [str(x) for x in s] == ["a", "bb", "cccc"]


@pytest.mark.parametrize("left,right,expected", [
    (3, 4, 7), (-1, 4, -1), (4, -1, -1), (-2, 4, -2), (-2, -1, -1), (0, 0, 0)])
def test_concatenate_cardinality_rules(left, right, expected):
    def make(n):
        if n == -1:
            return Dataset.range(2).repeat()
        if n == -2:
            return Dataset.range(2).filter(lambda x: True)
        return Dataset.range(n)
    assert make(left).concatenate(make(right)).cardinality() == expected


# -- filter / take_while ---------------------------------------------------------------------------
def test_filter_docstring_examples():
    ds = Dataset.from_tensor_slices(np.array([1, 2, 3]))
    assert values(ds.filter(lambda x: x < 3)) == [1, 2]
    assert values(ds.filter(lambda x: np.equal(x, 1))) == [1]


def test_filter_passes_tuple_components_positionally_and_keeps_the_spec():
    ds = Dataset.from_tensor_slices((np.arange(6), np.arange(6) * 10))
    kept = ds.filter(lambda x, y: (x + y) % 3 == 0)
    assert values(kept) == [(0, 0), (3, 30)]
    assert kept.element_spec == ds.element_spec
    d = Dataset.from_tensor_slices({"a": np.arange(4)}).filter(lambda e: e["a"] >= 2)
    assert values(d) == [{"a": 2}, {"a": 3}]


def test_filter_cardinality_is_unknown_as_tf_documents():
    assert Dataset.range(42).filter(lambda x: True).cardinality() == UNKNOWN_CARDINALITY
    # TF's cardinality docs: range(42).repeat().filter(...) is UNKNOWN
    assert Dataset.range(42).repeat().filter(lambda x: True).cardinality() == UNKNOWN_CARDINALITY
    with pytest.raises(TypeError, match="unknown"):
        len(Dataset.range(3).filter(lambda x: True))


def test_filter_predicate_must_return_a_scalar_bool():
    ds = Dataset.range(4)
    with pytest.raises(TypeError, match=r"`predicate` must return a scalar boolean.*dtype int64"):
        ds.filter(lambda x: x)  # a number, refused when filter is called
    with pytest.raises(TypeError, match=r"shape \(2,\)"):
        ds.filter(lambda x: np.array([True, False]))
    with pytest.raises(TypeError, match="'yes' of type str"):
        ds.filter(lambda x: "yes")
    # where no stand-in can be made (rank unknown), each real element is checked
    unknown_rank = Dataset.from_generator(lambda: iter([0, 1]), np.int64)
    lazy = unknown_rank.filter(lambda x: {0: True, 1: 1}[int(x)])
    with pytest.raises(TypeError, match="for element 1 it returned 1 of type int"):
        list(lazy)
    with pytest.raises(TypeError, match="predicate must be a callable"):
        ds.filter(True)


def test_take_while_docstring_example_and_cardinality():
    ds = Dataset.range(10).take_while(lambda x: x < 5)
    assert values(ds) == [0, 1, 2, 3, 4]
    assert ds.cardinality() == UNKNOWN_CARDINALITY
    # it stops at the first False, even if later elements pass
    assert values(Dataset.from_tensor_slices(np.array([1, 5, 1])).take_while(lambda x: x < 3)) == [1]
    assert values(Dataset.range(10).repeat().take_while(lambda x: x < 2)) == [0, 1]
    with pytest.raises(TypeError, match="scalar boolean"):
        Dataset.range(3).take_while(lambda x: x + 1)


# -- enumerate ---------------------------------------------------------------------------------------
def test_enumerate_docstring_examples():
    ds = Dataset.from_tensor_slices(np.array([1, 2, 3])).enumerate(start=5)
    assert values(ds) == [(5, 1), (6, 2), (7, 3)]
    # a list of tuples is one tensor (data, not structure): its rows are the elements
    rows = Dataset.from_tensor_slices([(7, 8), (9, 10)]).enumerate()
    assert values(rows) == [(0, [7, 8]), (1, [9, 10])]
    nested = Dataset.from_tensor_slices((np.array([7, 8]), np.array([9, 10]))).enumerate()
    assert values(nested) == [(0, (7, 9)), (1, (8, 10))]


def test_enumerate_spec_cardinality_and_index_dtype():
    ds = Dataset.range(3).repeat(2).enumerate()
    assert ds.element_spec == (I64, I64)
    assert ds.cardinality() == 6
    assert all(type(i) is np.int64 for i, _ in ds)
    assert Dataset.range(2).repeat().enumerate().cardinality() == INFINITE_CARDINALITY
    with pytest.raises(TypeError, match="start must be an int"):
        Dataset.range(2).enumerate(1.5)


# -- cache -----------------------------------------------------------------------------------------
def counted(n):
    """A generator dataset of range(n) and the list of its passes read to the end (finding
    an element_spec reads the first element only, and does not count)."""
    calls = []

    def gen():
        yield from range(n)
        calls.append(1)
    return Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64)), calls


def test_cache_in_memory_reads_the_input_once():
    ds, calls = counted(5)
    cached = ds.cache()
    assert values(cached) == [0, 1, 2, 3, 4]
    assert values(cached) == [0, 1, 2, 3, 4]
    assert len(calls) == 1
    assert cached.element_spec == ds.element_spec
    assert Dataset.range(5).cache().cardinality() == 5
    # TF's docstring: the map runs on the first pass only
    assert values(Dataset.range(5).map(lambda x: x ** 2).cache()) == [0, 1, 4, 9, 16]


def test_cache_in_memory_keeps_nothing_from_a_pass_that_stops_early():
    ds, calls = counted(5)
    cached = ds.cache()
    assert values(cached.take(2)) == [0, 1]
    assert values(cached) == [0, 1, 2, 3, 4]  # not just the two elements read so far
    assert values(cached) == [0, 1, 2, 3, 4]
    assert len(calls) == 1  # the second pass read the input to the end, the third the cache


def test_cache_to_a_file_is_read_by_later_passes_and_other_pipelines(tmp_path):
    prefix = str(tmp_path / "cache" / "train")
    ds, calls = counted(4)
    cached = ds.map(lambda x: (x, np.full(2, x, np.float32))).cache(prefix)
    expected = [(i, [float(i)] * 2) for i in range(4)]
    assert values(cached) == expected
    assert os.listdir(tmp_path / "cache") == ["train.npcache"]
    assert values(cached) == expected
    again, calls2 = counted(4)
    assert values(again.map(lambda x: (x, np.full(2, x, np.float32))).cache(prefix)) == expected
    assert (len(calls), len(calls2)) == (1, 0)  # both later passes read the file


def test_cache_file_is_not_written_by_a_pass_that_stops_early(tmp_path):
    prefix = str(tmp_path / "c")
    cached = Dataset.range(6).cache(prefix)
    assert values(cached.take(3)) == [0, 1, 2]
    assert os.listdir(tmp_path) == []  # no partial file, published or temporary
    assert values(cached) == list(range(6))
    assert values(Dataset.range(6).cache(prefix)) == list(range(6))


def test_cache_file_of_another_pipeline_is_refused(tmp_path):
    prefix = str(tmp_path / "c")
    list(Dataset.range(3).cache(prefix))
    other = Dataset.from_tensor_slices(np.zeros((3, 2), np.float32)).cache(prefix)
    with pytest.raises(InvalidArgumentError, match="holds elements TensorSpec.*int64.*float32"):
        list(other)


def test_cache_filename_mistakes(tmp_path):
    with pytest.raises(TypeError, match="cache: filename must be a file name"):
        Dataset.range(3).cache(3)


# -- unbatch ---------------------------------------------------------------------------------------
def test_unbatch_docstring_example():
    elements = [[1, 2, 3], [1, 2], [1, 2, 3, 4]]
    ds = Dataset.from_generator(lambda: iter(elements), np.int64).unbatch()
    assert values(ds) == [1, 2, 3, 1, 2, 1, 2, 3, 4]


def test_unbatch_splits_every_component_and_its_spec():
    ds = Dataset.from_tensor_slices((np.arange(6).reshape(3, 2), np.arange(3) * 10)).batch(2)
    flat = ds.unbatch()
    assert values(flat) == [([0, 1], 0), ([2, 3], 10), ([4, 5], 20)]
    assert flat.element_spec == (TensorSpec((2,), np.int64), I64)
    assert flat.cardinality() == UNKNOWN_CARDINALITY  # the last batch may be short
    assert Dataset.range(7).batch(2, drop_remainder=True).unbatch().cardinality() == 6
    assert Dataset.range(7).batch(2).repeat().unbatch().cardinality() == INFINITE_CARDINALITY


def test_unbatch_mistakes():
    with pytest.raises(ValueError, match="cannot split a scalar component"):
        Dataset.range(3).unbatch()
    ragged = Dataset.from_tensors((np.arange(3), np.arange(2)))
    with pytest.raises(InvalidArgumentError,
                       match="Component 0 had size 3 but component 1 had size 2"):
        list(ragged.unbatch())


# -- padded_batch ----------------------------------------------------------------------------------
def fills():
    """TF's docstring dataset A: range(1, 5) as int32, each x becoming [x] * x."""
    return Dataset.range(1, 5, dtype=np.int32).map(lambda x: np.full([x], x))


def test_padded_batch_docstring_examples():
    # a size that follows a value is unknown, as TF's tf.fill([x], x)
    assert fills().element_spec == TensorSpec((None,), np.int32)
    assert fills().padded_batch(2).element_spec == TensorSpec((None, None), np.int32)
    assert fills().padded_batch(2, padded_shapes=5).element_spec == TensorSpec((None, 5), np.int32)
    assert values(fills().padded_batch(2)) == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]]]
    assert values(fills().padded_batch(2, padded_shapes=5)) == [
        [[1, 0, 0, 0, 0], [2, 2, 0, 0, 0]], [[3, 3, 3, 0, 0], [4, 4, 4, 4, 0]]]
    assert values(fills().padded_batch(2, padded_shapes=5, padding_values=-1)) == [
        [[1, -1, -1, -1, -1], [2, 2, -1, -1, -1]], [[3, 3, 3, -1, -1], [4, 4, 4, 4, -1]]]
    elements = [([1, 2, 3], [10]), ([4, 5], [11, 12])]
    ds = Dataset.from_generator(lambda: iter(elements), (np.int32, np.int32))
    out = list(ds.padded_batch(2, padded_shapes=([4], [None]), padding_values=(-1, 100)))
    assert len(out) == 1 and py(out[0]) == ([[1, 2, 3, -1], [4, 5, -1, -1]], [[10, 100], [11, 12]])
    assert out[0][0].dtype == np.int32
    e = Dataset.zip((fills(), fills())).padded_batch(2, padding_values=-1)
    assert values(e) == [([[1, -1], [2, 2]], [[1, -1], [2, 2]]),
                         ([[3, 3, 3, -1], [4, 4, 4, 4]], [[3, 3, 3, -1], [4, 4, 4, 4]])]


def test_padded_batch_spec_cardinality_and_defaults():
    ds = Dataset.from_generator(lambda: iter([[1], [2, 3], [4, 5, 6]]),
                                output_signature=TensorSpec((None,), np.int64))
    assert ds.padded_batch(2).element_spec == TensorSpec((None, None), np.int64)
    assert ds.padded_batch(2, padded_shapes=[4], drop_remainder=True).element_spec == \
        TensorSpec((2, 4), np.int64)
    assert values(ds.padded_batch(2, drop_remainder=True)) == [[[1, 0], [2, 3]]]
    assert Dataset.range(5).padded_batch(2).cardinality() == 3
    assert Dataset.range(5).padded_batch(2, drop_remainder=True).cardinality() == 2
    words = Dataset.from_generator(lambda: iter([["a"], ["bb", "c"]]),
                                   output_signature=TensorSpec((None,), np.str_))
    assert values(words.padded_batch(2)) == [[["a", ""], ["bb", "c"]]]  # strings pad with ""
    flags = Dataset.from_generator(lambda: iter([[True], [True, True]]),
                                   output_signature=TensorSpec((None,), np.bool_))
    assert values(flags.padded_batch(2)) == [[[True, False], [True, True]]]


def test_padded_batch_mistakes():
    with pytest.raises(InvalidArgumentError, match="smaller size than the input element"):
        list(fills().padded_batch(2, padded_shapes=[2]))
    with pytest.raises(ValueError, match="padding_values must be a scalar"):
        fills().padded_batch(2, padding_values=[0, 1])
    with pytest.raises(TypeError, match="cannot pad a component of dtype int32"):
        fills().padded_batch(2, padding_values="x")
    with pytest.raises(ValueError, match="give one per component"):
        Dataset.zip((fills(), fills())).padded_batch(2, padded_shapes=([4],))
    with pytest.raises(ValueError, match=r"padded shape \(4, 4\) is not compatible"):
        fills().padded_batch(2, padded_shapes=[4, 4])
    with pytest.raises(TypeError, match="batch_size must be an int"):
        fills().padded_batch(2.0)


# -- rebatch ---------------------------------------------------------------------------------------
def test_rebatch_docstring_examples():
    assert values(Dataset.range(6).batch(2).rebatch(3)) == [[0, 1, 2], [3, 4, 5]]
    assert values(Dataset.range(7).batch(4).rebatch(3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert values(Dataset.range(7).batch(2).rebatch(batch_size=[1, 2, 1, 3])) == [
        [0], [1, 2], [3], [4, 5, 6]]
    assert values(Dataset.range(7).batch(4).rebatch(3, drop_remainder=True)) == [
        [0, 1, 2], [3, 4, 5]]


def test_rebatch_spec_and_mistakes():
    ds = Dataset.from_tensor_slices((np.zeros((8, 2)), np.arange(8))).batch(4)
    assert ds.rebatch(2, drop_remainder=True).element_spec == (
        TensorSpec((2, 2), np.float64), TensorSpec((2,), np.int64))
    assert ds.rebatch(2).element_spec == (TensorSpec((None, 2), np.float64),
                                          TensorSpec((None,), np.int64))
    assert ds.rebatch(2).cardinality() == UNKNOWN_CARDINALITY
    with pytest.raises(ValueError, match="scalar component"):
        Dataset.range(3).rebatch(2)
    with pytest.raises(InvalidArgumentError, match="greater than zero"):
        ds.rebatch(0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        ds.rebatch([2, "3"])


# -- window ----------------------------------------------------------------------------------------
def windows(ds):
    return [values(w) if not isinstance(w, (tuple, dict)) else py_windows(w) for w in ds]


def py_windows(w):
    if isinstance(w, dict):
        return {k: values(v) for k, v in w.items()}
    return tuple(values(v) for v in w)


def test_window_docstring_examples():
    ds = Dataset.range(7).window(3)
    assert all(isinstance(w, Dataset) and w.element_spec == I64 for w in ds)
    assert windows(ds) == [[0, 1, 2], [3, 4, 5], [6]]
    assert windows(Dataset.range(7).window(3, shift=1, drop_remainder=True)) == [
        [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6]]
    assert windows(Dataset.range(7).window(3, shift=1, stride=2, drop_remainder=True)) == [
        [0, 2, 4], [1, 3, 5], [2, 4, 6]]
    nested = Dataset.from_tensor_slices((np.array([1, 2, 3, 4, 5]),
                                         np.array([6, 7, 8, 9, 10]))).window(2)
    assert windows(nested) == [([1, 2], [6, 7]), ([3, 4], [8, 9]), ([5], [10])]
    d = Dataset.from_tensor_slices({"a": np.array([1, 2, 3]), "b": np.array([4, 5, 6]),
                                    "c": np.array([7, 8, 9])}).window(2)
    assert windows(d) == [{"a": [1, 2], "b": [4, 5], "c": [7, 8]}, {"a": [3], "b": [6], "c": [9]}]


def test_window_then_flat_map_batch_gives_batches():
    ds = Dataset.range(7).window(3).flat_map(lambda w: w.batch(3))
    assert values(ds) == [[0, 1, 2], [3, 4, 5], [6]]
    sliding = Dataset.range(10).window(5, shift=1, drop_remainder=True).flat_map(
        lambda w: w.batch(5))
    assert values(sliding) == [list(range(i, i + 5)) for i in range(6)]
    pairs = Dataset.from_tensor_slices((np.arange(1, 6), np.arange(6, 11))).window(2).flat_map(
        lambda x, y: Dataset.zip(x.batch(2), y.batch(2)))
    assert values(pairs) == [([1, 2], [6, 7]), ([3, 4], [8, 9]), ([5], [10])]


def test_window_spec_and_cardinality():
    ds = Dataset.from_tensor_slices((np.zeros((5, 2), np.float32), np.arange(5)))
    w = ds.window(2)
    assert w.element_spec == (DatasetSpec(TensorSpec((2,), np.float32)), DatasetSpec(I64))
    assert Dataset.range(7).window(3).cardinality() == 3
    assert Dataset.range(7).window(3, shift=1, drop_remainder=True).cardinality() == 5
    assert Dataset.range(7).window(3, shift=1, stride=2, drop_remainder=True).cardinality() == 3
    assert Dataset.range(2).window(3, drop_remainder=True).cardinality() == 0
    assert Dataset.range(2).repeat().window(3).cardinality() == INFINITE_CARDINALITY
    assert windows(Dataset.range(10).window(2, shift=4)) == [[0, 1], [4, 5], [8, 9]]


def test_window_mistakes():
    with pytest.raises(InvalidArgumentError, match="size must be greater than zero"):
        Dataset.range(3).window(0)
    with pytest.raises(TypeError, match="shift must be an int"):
        Dataset.range(3).window(2, shift=1.5)
    with pytest.raises(TypeError, match="drop_remainder must be True or False"):
        Dataset.range(3).window(2, drop_remainder=1)


# -- scan ------------------------------------------------------------------------------------------
def test_scan_docstring_example():
    ds = Dataset.range(10).scan(initial_state=np.int64(0),
                                scan_func=lambda state, i: (state + i, state + i))
    assert values(ds) == [0, 1, 3, 6, 10, 15, 21, 28, 36, 45]
    assert ds.element_spec == I64
    assert ds.cardinality() == 10


def test_scan_gets_the_element_whole_and_restarts_each_pass():
    pairs = Dataset.from_tensor_slices((np.arange(3), np.arange(3) * 10))
    ds = pairs.scan((np.int64(0), np.int64(0)),
                    lambda s, e: ((s[0] + e[0], s[1] + e[1]), s[0] + s[1]))
    assert values(ds) == [0, 0, 11]
    assert values(ds) == [0, 0, 11]


def test_scan_mistakes():
    ds = Dataset.range(3)
    with pytest.raises(TypeError, match="must return a pair"):
        list(ds.scan(np.int64(0), lambda s, x: s + x))
    with pytest.raises(TypeError, match="expected int32, got int64"):
        list(ds.scan(np.int32(0), lambda s, x: (s + x, x)))
    with pytest.raises(TypeError, match="initial state's structure"):
        list(ds.scan(np.int64(0), lambda s, x: ((s, s), x)))
    with pytest.raises(TypeError, match="scan_func must be a callable"):
        ds.scan(0, None)


Point = collections.namedtuple("Point", ["x", "y"])


def test_new_operations_keep_namedtuples():
    ds = Dataset.from_tensor_slices(Point(np.arange(4), np.arange(4) * 2))
    out = list(ds.filter(lambda p: p.x % 2 == 0).cache().batch(2).unbatch())
    assert [type(p) for p in out] == [Point, Point] and py(tuple(out[1])) == (2, 4)
