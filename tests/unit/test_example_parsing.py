"""tf.train.Example parsing without TensorFlow (mpidist.io): every feature kind, defaults,
missing features, wrong types and lengths as InvalidArgumentError naming the feature, what the
record holds and what the spec says; encode_example's bytes are TF's wire format."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpidist.errors import InvalidArgumentError
from mpidist.io import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    SparseTensor,
    VarLenFeature,
    decode_example,
    encode_example,
    parse_example,
    parse_single_example,
    sparse_to_dense,
    train,
)

REC = encode_example({"f": [1.5, 2.5, 3.5, 4.5], "i": 7, "s": [b"a\x00", "b"], "v": [1, 2, 3]})


def test_encode_example_is_the_wire_format():
    # Example{features{feature{key "a" value{int64_list{value: 0}}}}}, by hand:
    # 0a 0c (features, 12 bytes) 0a 0a (map entry, 10) 0a 01 'a' (key) 12 05 (value, 5)
    # 1a 03 (int64_list, 3) 0a 01 00 (packed values, 1 byte: varint 0)
    assert encode_example({"a": 0}) == bytes.fromhex("0a0c0a0a0a016112051a030a0100")
    # float_list (Feature field 2, tag 12): FloatList{value packed: 0a 04 + 1.0f little-endian}
    assert encode_example({"b": 1.0}) == bytes.fromhex("0a0f0a0d0a016212081206" "0a040000803f")
    # bytes_list (Feature field 1, tag 0a): BytesList{value: 0a 02 'xy'}
    assert encode_example({"c": b"xy"}) == bytes.fromhex("0a0d0a0b0a01631206" "0a040a027879")
    ex = train.Example.FromString(REC)
    assert list(ex.features.feature["f"].float_list.value) == [1.5, 2.5, 3.5, 4.5]


def test_fixed_len_of_each_dtype():
    got = parse_single_example(REC, {
        "f": FixedLenFeature([2, 2], "float32"), "i": FixedLenFeature([], np.int64),
        "s": FixedLenFeature([2], "string")})
    np.testing.assert_array_equal(got["f"], [[1.5, 2.5], [3.5, 4.5]])
    assert got["f"].dtype == np.float32 and got["i"].dtype == np.int64
    assert got["i"].shape == () and int(got["i"]) == 7
    assert got["s"].dtype == object and got["s"].tolist() == [b"a\x00", b"b"]


def test_defaults_fill_missing_features():
    got = parse_single_example(REC, {
        "missing": FixedLenFeature([3], np.float32, default_value=[0.0, 1.0, 2.0]),
        "name": FixedLenFeature([], "string", default_value="none"),
        "n": FixedLenFeature((), "int64", default_value=-1)})
    np.testing.assert_array_equal(got["missing"], [0.0, 1.0, 2.0])
    assert got["name"].item() == b"none" and int(got["n"]) == -1
    batch = parse_example([REC, encode_example({"n": 5})], {"n": FixedLenFeature([], "int64", default_value=-1)})
    np.testing.assert_array_equal(batch["n"], [-1, 5])


def test_var_len_is_sparse():
    got = parse_single_example(REC, {"v": VarLenFeature("int64"), "s": VarLenFeature(np.object_)})
    assert isinstance(got["v"], SparseTensor)
    np.testing.assert_array_equal(got["v"].indices, [[0], [1], [2]])
    np.testing.assert_array_equal(got["v"].values, [1, 2, 3])
    np.testing.assert_array_equal(got["v"].dense_shape, [3])
    batch = parse_example([encode_example({"v": [4, 5]}), encode_example({"w": 1}), REC],
                          {"v": VarLenFeature("int64")})
    sp = batch["v"]
    np.testing.assert_array_equal(sp.indices, [[0, 0], [0, 1], [2, 0], [2, 1], [2, 2]])
    np.testing.assert_array_equal(sp.values, [4, 5, 1, 2, 3])
    np.testing.assert_array_equal(sp.dense_shape, [3, 3])
    np.testing.assert_array_equal(sparse_to_dense(sp), [[4, 5, 0], [0, 0, 0], [1, 2, 3]])


def test_fixed_len_sequence_pads_the_batch():
    spec = {"f": FixedLenSequenceFeature([2], "float32", allow_missing=True, default_value=-1.0)}
    one = parse_single_example(REC, spec)
    np.testing.assert_array_equal(one["f"], [[1.5, 2.5], [3.5, 4.5]])
    batch = parse_example([REC, encode_example({"f": [9.0, 8.0]}), encode_example({"x": 1})], spec)
    np.testing.assert_array_equal(batch["f"], [[[1.5, 2.5], [3.5, 4.5]], [[9, 8], [-1, -1]],
                                               [[-1, -1], [-1, -1]]])
    with pytest.raises(InvalidArgumentError, match="allow_missing=True"):
        parse_single_example(REC, {"f": FixedLenSequenceFeature([], "float32")})


def test_missing_required_feature_names_it_and_what_the_record_has():
    with pytest.raises(InvalidArgumentError, match=r"feature 'label' \(FixedLenFeature\(shape=\[\], dtype=int64\)\) "
                                                   r"is required but example 1 does not have it; it has \['x'\]"):
        parse_example([encode_example({"label": 1}), encode_example({"x": 1})],
                      {"label": FixedLenFeature([], "int64")})


def test_wrong_type_names_feature_record_and_spec():
    with pytest.raises(InvalidArgumentError, match=r"feature 'f' of the example holds 4 float value\(s\) "
                                                   r"\(a float_list\), but its spec FixedLenFeature\(shape=\[4\], "
                                                   r"dtype=int64\) reads int64 values"):
        parse_single_example(REC, {"f": FixedLenFeature([4], "int64")})
    with pytest.raises(InvalidArgumentError, match="'s' of example 0 holds 2 string"):
        parse_example([REC], {"s": VarLenFeature("float32")})


def test_wrong_length_names_feature_count_and_shape():
    with pytest.raises(InvalidArgumentError, match=r"feature 'f' of the example has 4 float value\(s\), but its "
                                                   r"spec FixedLenFeature\(shape=\[3\], dtype=float32\) needs exactly 3"):
        parse_single_example(REC, {"f": FixedLenFeature([3], "float32")})
    with pytest.raises(InvalidArgumentError, match="needs a multiple of 3"):
        parse_single_example(REC, {"f": FixedLenSequenceFeature([3], "float32", allow_missing=True)})


def test_spec_mistakes():
    with pytest.raises(InvalidArgumentError, match="dtype must be float32, int64 or string"):
        parse_single_example(REC, {"f": FixedLenFeature([], np.float64)})
    with pytest.raises(InvalidArgumentError, match="shape must be a list or tuple"):
        parse_single_example(REC, {"f": FixedLenFeature("3", "float32")})
    with pytest.raises(InvalidArgumentError, match="default_value has 2 values, but shape \\[3\\] holds 3"):
        parse_single_example(REC, {"f": FixedLenFeature([3], "float32", default_value=[1, 2])})
    with pytest.raises(TypeError, match="must be a FixedLenFeature"):
        parse_single_example(REC, {"f": "float32"})
    with pytest.raises(InvalidArgumentError, match="is not a serialized tf.train.Example"):
        parse_single_example(b"\xff\xff\xff", {"f": VarLenFeature("float32")})
    with pytest.raises(InvalidArgumentError, match="use parse_single_example"):
        parse_example(REC, {"f": VarLenFeature("float32")})
    with pytest.raises(InvalidArgumentError, match="empty list"):
        encode_example({"e": []})


def test_inputs_as_dataset_elements():
    one = np.empty((), object)
    one[()] = REC
    assert int(parse_single_example(one, {"i": FixedLenFeature([], "int64")})["i"]) == 7
    batch = np.empty(2, object)
    batch[:] = [REC, REC]
    np.testing.assert_array_equal(parse_example(batch, {"i": FixedLenFeature([], "int64")})["i"], [7, 7])


values = st.one_of(
    st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=5),
    st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=5),
    st.lists(st.binary(max_size=8), min_size=1, max_size=5))


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), values, min_size=1, max_size=5))
def test_round_trip_of_random_examples(features):
    record = encode_example(features)
    decoded = decode_example(record)
    assert set(decoded) == set(features)
    spec = {}
    for key, vals in features.items():
        dtype = "int64" if isinstance(vals[0], int) else "float32" if isinstance(vals[0], float) else "string"
        spec[key] = FixedLenFeature([len(vals)], dtype)
        assert decoded[key].tolist() == (vals if dtype != "float32" else
                                         np.asarray(vals, np.float32).tolist())
    got = parse_example([record, record], spec)
    for key, vals in features.items():
        assert got[key].shape == (2, len(vals))
        assert got[key][1].tolist() == decoded[key].tolist()
