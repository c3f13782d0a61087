"""The on-disk format of Dataset.save / Dataset.load (mpidist.data.saved_format): round trips
of generated structures and dtypes, shard assignment, atomic replacement, and that every
truncation or corruption of a shard is a DataLossError, never fewer rows. Writing and reading
200 MiB with memory bounded by blocks is the scenario tests/scenarios/test_saved_format_200mb.py."""

import collections
import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mpidist.core import nest
from mpidist.data import saved_format as sf
from mpidist.data.spec import TensorSpec
from mpidist.errors import DataLossError, InvalidArgumentError, NotFoundError

Point = collections.namedtuple("Point", ["x", "y"])


# -- helpers ---------------------------------------------------------------------------------

def read_all(path, element_spec=None):
    """Every row of a saved dataset, shard by shard: {shard id: [flat leaves of each row]}."""
    meta = sf.read_metadata(path)
    out = {}
    for shard in meta.shards:
        rows = []
        for block in sf.read_shard_blocks(shard.path, element_spec):
            leaves = nest.flatten(block)
            assert len({len(leaf) for leaf in leaves}) == 1, "leaves of a block share rows"
            rows.extend([leaf[i, ...] for leaf in leaves] for i in range(len(leaves[0])))
        assert len(rows) == shard.rows == sf.read_shard_header(shard.path).rows
        out[shard.id] = rows
    assert sum(map(len, out.values())) == meta.rows
    return out


def same_leaf(saved, got):
    saved, got = np.asarray(saved), np.asarray(got)
    assert got.shape == saved.shape
    if saved.dtype.kind in "US":
        assert got.dtype.kind == saved.dtype.kind  # a block holds its longest string
        assert got.tolist() == saved.tolist()
    else:
        assert got.dtype == saved.dtype
        assert got.tobytes() == saved.tobytes()  # bit-exact: NaN payloads, -0.0


def as_blocks(elements, most=3):
    """Consecutive elements whose leaves have equal shapes and kinds, stacked in blocks."""
    def key(e):
        return [(np.shape(x), np.asarray(x).dtype.kind) for x in nest.flatten(e)]

    run = []
    for e in elements:
        if run and (key(e) != key(run[0]) or len(run) == most):
            yield nest.map_structure(lambda *xs: np.stack(xs), *run)
            run = []
        run.append(e)
    if run:
        yield nest.map_structure(lambda *xs: np.stack(xs), *run)


def check_round_trip(elements, spec, path, shard_of=None, blocks=False, **kw):
    source = as_blocks(elements) if blocks else iter(elements)
    meta = sf.write_dataset(source, spec, path, shard_of, blocks=blocks, **kw)
    got = read_all(path)
    expected = collections.defaultdict(list)
    for i, e in enumerate(elements):
        shard = i % kw.get("num_shards", sf.DEFAULT_NUM_SHARDS) if shard_of is None else int(
            shard_of(i, e))
        expected[shard].append(nest.flatten(e))
    if not elements:
        expected[0] = []
    assert sorted(got) == sorted(expected)
    for shard, rows in expected.items():
        assert len(got[shard]) == len(rows)
        for saved_row, got_row in zip(rows, got[shard]):
            for a, b in zip(saved_row, got_row):
                same_leaf(a, b)
    return meta


def siblings(path):
    """Entries next to ``path`` other than it: temporary directories left behind."""
    parent, base = os.path.split(str(path))
    return [n for n in os.listdir(parent) if n != base]


def spec_like(element):
    return nest.map_structure(lambda x: TensorSpec(np.shape(x), np.asarray(x).dtype), element)


# -- round trips -----------------------------------------------------------------------------

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
          np.dtype(">i4"), np.dtype("<U4"), np.dtype("S3"), np.dtype("M8[ns]"),
          np.dtype("m8[s]")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_each_dtype_scalars_and_arrays(tmp_path, dtype):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, size=(7, 3, 2), dtype=np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw &= 1  # other bytes are not valid NumPy bools
    arrays = np.frombuffer(np.resize(raw, 7 * 6 * np.dtype(dtype).itemsize).tobytes(),
                           dtype).reshape(7, 3, 2)
    elements = [(arrays[i], arrays[i, 0, 0:1].reshape(())) for i in range(7)]  # keeps >i4
    spec = (TensorSpec((3, 2), dtype), TensorSpec((), dtype))
    check_round_trip(elements, spec, tmp_path / "ds", num_shards=3)


def test_round_trip_nested_structures_and_namedtuple_class(tmp_path):
    elements = [{"image": np.full((2, 2), i, np.float32),
                 "meta": (np.int64(i), {"label": np.str_(f"n{i}"), "p": Point(
                     np.float64(i / 3), np.array([i, -i], np.int16))})} for i in range(11)]
    spec = spec_like(elements[0])
    spec["meta"][1]["label"] = TensorSpec((), np.dtype("<U1"))
    check_round_trip(elements, spec, tmp_path / "ds", num_shards=2)
    meta = sf.read_metadata(tmp_path / "ds")
    assert type(meta.element_spec["meta"][1]["p"]) is Point
    block = next(sf.read_shard_blocks(meta.shards[0].path))
    assert type(block["meta"][1]["p"]) is Point
    assert list(block) == ["image", "meta"]


def test_varying_shapes_split_blocks_and_keep_shapes(tmp_path):
    elements = [np.arange(n, dtype=np.float32) for n in [2, 2, 3, 3, 3, 0, 2, 2]]
    check_round_trip(elements, TensorSpec((None,), np.float32), tmp_path / "ds", num_shards=1)
    blocks = list(sf.read_shard_blocks(sf.read_metadata(tmp_path / "ds").shards[0].path))
    assert [b.shape for b in blocks] == [(2, 2), (3, 3), (1, 0), (2, 2)]


def test_strings_of_any_length_share_a_block(tmp_path):
    words = ["", "a", "hello", "xy", "a much longer string", "é漢字"]
    check_round_trip([np.str_(w) for w in words], TensorSpec((), np.dtype("<U1")),
                     tmp_path / "ds", num_shards=1)
    (block,) = sf.read_shard_blocks(sf.read_metadata(tmp_path / "ds").shards[0].path)
    assert block.tolist() == words


@pytest.mark.parametrize("block_rows,block_bytes,sizes", [
    (3, 1 << 20, [3, 3, 3, 1]),
    (100, 4 * 8 * 4, [4, 4, 2]),  # rows of 8 float32: 4 rows fill 128 bytes
    (1, 1 << 20, [1] * 10),
    (100, 1, [1] * 10),  # a row larger than block_bytes is a block of its own
])
def test_blocks_are_bounded_by_rows_and_bytes(tmp_path, block_rows, block_bytes, sizes):
    elements = [np.full(8, i, np.float32) for i in range(10)]
    check_round_trip(elements, TensorSpec((8,), np.float32), tmp_path / "ds", num_shards=1,
                     block_rows=block_rows, block_bytes=block_bytes)
    path = sf.read_metadata(tmp_path / "ds").shards[0].path
    assert [len(b) for b in sf.read_shard_blocks(path)] == sizes
    assert sf.read_shard_header(path).blocks == len(sizes)


def test_empty_dataset_has_one_empty_shard(tmp_path):
    meta = check_round_trip([], (TensorSpec((2,), np.int32),), tmp_path / "ds")
    assert [(s.id, s.rows) for s in meta.shards] == [(0, 0)]
    assert list(sf.read_shard_blocks(meta.shards[0].path)) == []


LEAF_DTYPES = st.sampled_from([np.bool_, np.int8, np.uint32, np.int64, np.float16, np.float32,
                               np.float64, np.complex128, np.dtype("<U3"), np.dtype("S2")])


@st.composite
def spec_and_elements(draw):
    """A random element structure, a spec with some dims unknown, and elements fitting it."""
    leaf_specs = st.builds(
        lambda dtype, dims, unknown: TensorSpec(
            [None if u else d for d, u in zip(dims, unknown)], dtype),
        LEAF_DTYPES, st.lists(st.integers(0, 3), max_size=3),
        st.lists(st.booleans(), min_size=3, max_size=3))
    spec = draw(st.recursive(
        leaf_specs,
        lambda children: st.one_of(
            st.lists(children, min_size=1, max_size=3).map(tuple),
            st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), children, min_size=1,
                            max_size=3),
            st.tuples(children, children).map(lambda t: Point(*t))),
        max_leaves=5))
    n = draw(st.integers(0, 12))

    def element():
        def leaf(s):
            shape = tuple(draw(st.integers(0, 2)) if d is None else d for d in s.shape)
            return draw(hnp.arrays(s.dtype, shape))
        return nest.map_structure(leaf, spec)

    return spec, [element() for _ in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(spec_and_elements(), st.integers(1, 4), st.integers(1, 5), st.booleans(), st.booleans())
def test_generated_structures_round_trip(case, num_shards, block_rows, custom_shards, blocks):
    spec, elements = case
    shard_of = (lambda i, e: (i * 7) % 5) if custom_shards else None
    with tempfile.TemporaryDirectory() as d:
        check_round_trip(elements, spec, os.path.join(d, "ds"), shard_of, blocks,
                         num_shards=num_shards, block_rows=block_rows)


def shard_names(path):
    """The names in ``path`` with each shard file's writer token left out: every save writes
    ``shard-NNNNN.<host>-<pid>-<id>.mpds``, all of one save sharing the token."""
    names = os.listdir(path)
    tokens = {n.split(".", 1)[1].rsplit(".", 1)[0] for n in names if n.startswith("shard-")}
    assert len(tokens) <= 1, names  # the published save's shards only
    return [n if not n.startswith("shard-") else n.split(".", 1)[0] + ".mpds" for n in names]


# -- shards ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shard_of,expected_ids", [
    (lambda i, e: 0, [0]),
    (lambda i, e: np.int64(i % 3), [0, 1, 2]),
    (lambda i, e: np.array(5 if i < 4 else 1000, np.uint8 if i < 4 else np.int32), [5, 1000]),
    (lambda i, e: int(e[0]) % 2 * 7, [0, 7]),  # gaps: shards 1..6 get no file
])
@pytest.mark.parametrize("blocks", [False, True])
def test_shard_of_assigns_shards(tmp_path, shard_of, expected_ids, blocks):
    elements = [(np.int64(i),) for i in range(10)]
    meta = check_round_trip(elements, (TensorSpec((), np.int64),), tmp_path / "ds", shard_of,
                            blocks)
    assert [s.id for s in meta.shards] == expected_ids
    assert sorted(shard_names(tmp_path / "ds")) == sorted(
        [sf.METADATA_FILE] + [f"shard-{i:05d}.mpds" for i in expected_ids])


@pytest.mark.parametrize("blocks", [False, True])
def test_default_sharding_is_round_robin_over_num_shards(tmp_path, blocks):
    elements = [np.int32(i) for i in range(20)]
    meta = check_round_trip(elements, TensorSpec((), np.int32), tmp_path / "ds", None, blocks)
    assert [s.rows for s in meta.shards] == [3, 3, 3, 3, 2, 2, 2, 2]
    assert len(meta.shards) == sf.DEFAULT_NUM_SHARDS
    small = check_round_trip(elements[:3], TensorSpec((), np.int32), tmp_path / "small")
    assert [s.id for s in small.shards] == [0, 1, 2]


def test_more_shards_than_open_files(tmp_path):
    elements = [np.full(3, i, np.int64) for i in range(450)]
    meta = check_round_trip(elements, TensorSpec((3,), np.int64), tmp_path / "ds",
                            lambda i, e: i % 150, block_rows=2)
    assert len(meta.shards) == 150


@pytest.mark.parametrize("bad", [-1, 1.0, "0", None, True, np.bool_(False), np.float64(2),
                                 np.array([1]), 2**63, np.uint64(2**63)])
def test_bad_shard_func_result_names_element_and_value(tmp_path, bad):
    (tmp_path / "out").mkdir()
    elements = [np.int32(i) for i in range(5)]
    with pytest.raises(InvalidArgumentError, match=r"shard_func returned .* for element 3"):
        sf.write_dataset(iter(elements), TensorSpec((), np.int32), tmp_path / "out" / "ds",
                         lambda i, e: bad if i == 3 else 0)
    assert os.listdir(tmp_path / "out") == []  # nothing written, the temporary dir removed


# -- atomic writes ---------------------------------------------------------------------------

def test_existing_dataset_is_replaced_and_nothing_left_beside_it(tmp_path):
    path = tmp_path / "ds"
    check_round_trip([np.int8(1)] * 20, TensorSpec((), np.int8), path)
    check_round_trip([np.float32(2.5)] * 3, TensorSpec((), np.float32), path, num_shards=1)
    assert sorted(shard_names(path)) == [sf.METADATA_FILE, "shard-00000.mpds"]
    assert siblings(path) == []


def test_failure_mid_write_keeps_the_old_dataset_and_removes_the_temporary(tmp_path):
    path = tmp_path / "ds"
    check_round_trip([np.int8(1)] * 5, TensorSpec((), np.int8), path)
    before = {n: (path / n).read_bytes() for n in os.listdir(path)}

    def elements():
        yield from [np.int8(7)] * 100
        raise RuntimeError("input pipeline failed")

    with pytest.raises(RuntimeError, match="input pipeline failed"):
        sf.write_dataset(elements(), TensorSpec((), np.int8), path, block_rows=4)
    assert {n: (path / n).read_bytes() for n in os.listdir(path)} == before
    assert siblings(path) == []


def test_element_not_fitting_spec_is_named(tmp_path):
    elements = [np.zeros(2, np.float32), np.zeros(3, np.float32)]
    with pytest.raises(InvalidArgumentError, match="element 1 has a leaf"):
        sf.write_dataset(iter(elements), TensorSpec((2,), np.float32), tmp_path / "ds")
    with pytest.raises(InvalidArgumentError, match="element 0 does not have"):
        sf.write_dataset(iter([(np.zeros(2),)]), TensorSpec((2,), np.float64), tmp_path / "ds")
    with pytest.raises(InvalidArgumentError, match="cannot hold"):
        sf.write_dataset(iter([]), TensorSpec((), object), tmp_path / "ds")
    assert os.listdir(tmp_path) == []


def test_block_not_fitting_spec_is_named(tmp_path):
    spec = (TensorSpec((2,), np.float32), TensorSpec((), np.int64))
    good = (np.zeros((3, 2), np.float32), np.zeros(3, np.int64))
    for bad in [(np.zeros((3, 2), np.float32), np.zeros(4, np.int64)),
                (np.zeros((3, 3), np.float32), np.zeros(3, np.int64)),
                (np.zeros(2, np.float32), np.int64(0))]:
        with pytest.raises(InvalidArgumentError, match="the block of elements 3.. has a leaf"):
            sf.write_dataset(iter([good, bad]), spec, tmp_path / "ds", blocks=True)
    assert os.listdir(tmp_path) == []


def test_empty_directory_is_used(tmp_path):
    (tmp_path / "ds").mkdir()
    check_round_trip([np.int8(1)], TensorSpec((), np.int8), tmp_path / "ds")


def test_other_directory_or_file_at_path_is_an_error_and_untouched(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(InvalidArgumentError, match="non-empty directory that is not a saved"):
        sf.write_dataset(iter([np.int8(1)]), TensorSpec((), np.int8), other)
    assert os.listdir(other) == ["precious.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        sf.write_dataset(iter([np.int8(1)]), TensorSpec((), np.int8), tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["file", "other"]


# -- reading errors --------------------------------------------------------------------------

def test_missing_path_is_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist"):
        sf.read_metadata(tmp_path / "nothing")


@pytest.mark.parametrize("damage,message", [
    (lambda p: os.remove(p / sf.METADATA_FILE), "has no mpidist-dataset.json"),
    (lambda p: (p / sf.METADATA_FILE).write_text("{not json"), "not valid JSON"),
    (lambda p: _edit_metadata(p, format="tfrecord"), "does not name the format"),
    (lambda p: _edit_metadata(p, version=99), "format version 99"),
    (lambda p: _edit_metadata(p, element_spec={"kind": "tensor"}), "malformed"),
    (lambda p: _edit_metadata(p, rows=5), "says the dataset has 5"),
])
def test_not_a_saved_dataset(tmp_path, damage, message):
    path = tmp_path / "ds"
    sf.write_dataset(iter([np.int8(1)] * 3), TensorSpec((), np.int8), path)
    damage(path)
    with pytest.raises(InvalidArgumentError, match=message) as e:
        sf.read_metadata(path)
    assert str(path) in str(e.value) and "Dataset.save" in str(e.value)


def test_a_file_is_not_a_saved_dataset(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        sf.read_metadata(tmp_path / "f")


def _edit_metadata(path, **changes):
    data = json.loads((path / sf.METADATA_FILE).read_text())
    data.update(changes)
    (path / sf.METADATA_FILE).write_text(json.dumps(data))


def test_missing_or_resized_shard_is_data_loss(tmp_path):
    path = tmp_path / "ds"
    sf.write_dataset(iter([np.int8(1)] * 3), TensorSpec((), np.int8), path)
    (shard,) = path.glob("shard-00001.*.mpds")
    data = shard.read_bytes()
    shard.write_bytes(data[:-1])
    with pytest.raises(DataLossError, match=r"shard-00001\..*\.mpds has \d+ bytes .* truncated"):
        sf.read_metadata(path)
    os.remove(shard)
    with pytest.raises(DataLossError, match=r"shard-00001\..*\.mpds .* is missing"):
        sf.read_metadata(path)


def _small_shard(tmp_path):
    elements = [{"a": np.arange(i % 3, dtype=np.float32), "b": np.str_("xy"[: i % 3])}
                for i in range(9)]
    spec = {"a": TensorSpec((None,), np.float32), "b": TensorSpec((), np.dtype("<U2"))}
    meta = sf.write_dataset(iter(elements), spec, tmp_path / "ds", num_shards=1, block_rows=2)
    path = meta.shards[0].path
    return path, open(path, "rb").read(), spec


def _read_rows(path, spec=None):
    return sum(len(nest.flatten(b)[0]) for b in sf.read_shard_blocks(path, spec))


def test_every_truncation_is_data_loss(tmp_path):
    path, data, spec = _small_shard(tmp_path)
    assert _read_rows(path) == 9
    cut = str(tmp_path / "cut.mpds")
    for n in range(len(data)):
        with open(cut, "wb") as f:
            f.write(data[:n])
        with pytest.raises(DataLossError, match="cut.mpds"):
            _read_rows(cut, spec)


def test_every_flipped_byte_is_data_loss(tmp_path):
    path, data, spec = _small_shard(tmp_path)
    bad = str(tmp_path / "bad.mpds")
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[i] ^= bit
            with open(bad, "wb") as f:
                f.write(damaged)
            with pytest.raises(DataLossError, match="bad.mpds"):
                _read_rows(bad)


def test_appended_bytes_are_data_loss(tmp_path):
    path, data, _ = _small_shard(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(DataLossError, match="bytes, its header says"):
        _read_rows(path)


def test_missing_shard_file_is_not_found(tmp_path):
    with pytest.raises(NotFoundError):
        sf.read_shard_header(tmp_path / "x.mpds")
    with pytest.raises(NotFoundError):
        _read_rows(tmp_path / "x.mpds")


# -- specs -----------------------------------------------------------------------------------

def test_spec_json_round_trip_and_key_order():
    spec = {"z": TensorSpec((None, 3), np.float32, name="feat"), 1: (
        TensorSpec(None, np.int64), [TensorSpec((), np.bool_)]), "a": Point(
        TensorSpec((2,), np.complex64), TensorSpec((), np.dtype("S4")))}
    data = json.loads(json.dumps(sf.spec_to_json(spec)))
    back = sf.spec_from_json(data)
    assert back == spec and list(back) == ["z", 1, "a"] and type(back["a"]) is Point


def test_namedtuple_from_a_module_not_imported_is_rebuilt_without_importing():
    data = sf.spec_to_json(Point(TensorSpec((), np.int8), TensorSpec((), np.int8)))
    data["class"] = "no_such_module_imported.sub:Thing"
    back = sf.spec_from_json(data)
    assert type(back).__name__ == "Thing" and back._fields == ("x", "y")
    assert "no_such_module_imported" not in os.sys.modules


@pytest.mark.parametrize("bad,match", [
    ({(1, 2): TensorSpec((), np.int8)}, "mapping key"),
    (TensorSpec((), object), "cannot hold"),
    ((TensorSpec((), np.int8), 3), "is int 3"),
])
def test_unsavable_specs(bad, match):
    with pytest.raises(InvalidArgumentError, match=match):
        sf.spec_to_json(bad)


def test_load_spec_must_describe_the_saved_one():
    saved = (TensorSpec((None, 3), np.float32), {"s": TensorSpec((), np.dtype("<U5"))})
    assert sf.check_load_spec(None, saved, "p") is saved
    ok = (TensorSpec((4, None), np.float32), {"s": TensorSpec((), np.dtype("<U1"))})
    assert sf.check_load_spec(ok, saved, "p") is ok
    for bad in [(TensorSpec((None, 3), np.float64), {"s": TensorSpec((), np.dtype("<U5"))}),
                (TensorSpec((None, 4), np.float32), {"s": TensorSpec((), np.dtype("<U5"))}),
                (TensorSpec((None, 3), np.float32), {"t": TensorSpec((), np.dtype("<U5"))}),
                TensorSpec((None, 3), np.float32)]:
        with pytest.raises(InvalidArgumentError, match="does not match the dataset saved at p"):
            sf.check_load_spec(bad, saved, "p")

