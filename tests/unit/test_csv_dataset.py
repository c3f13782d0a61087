"""CSV sources (mpidist.data.experimental.CsvDataset, make_csv_dataset): TF's documented uses
(defaults, required columns, header, select_cols / exclude_cols, quoted fields, na_value,
label_name, select_columns, inferred types), errors naming file, line and column, and random
tables read back exactly (Hypothesis)."""

import csv
import gzip
import zlib
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpidist.data import Dataset
from mpidist.data.dataset import file_shard_units, find_file_reader
from mpidist.data.experimental import CsvDataset, make_csv_dataset
from mpidist.errors import InvalidArgumentError

TABLE = "col1,col2,col3,col4\n1,2.5,,a\n2,,x,\"b,c\"\n3,4.5,y,\"say \"\"hi\"\"\"\n"


def write(path, text, compression=None):
    data = text.encode()
    if compression == "GZIP":
        data = gzip.compress(data)
    elif compression == "ZLIB":
        data = zlib.compress(data)
    path.write_bytes(data)
    return str(path)


def rows(dataset):
    return [tuple(v.item() for v in r) for r in dataset]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_defaults_fill_missing_values(tmp_path, compression):
    path = write(tmp_path / "t.csv", TABLE, compression)
    ds = CsvDataset(path, [[0], [-1.0], ["none"], [""]], compression_type=compression, header=True)
    assert [s.dtype for s in ds.element_spec] == [np.int32, np.float32, np.str_, np.str_]
    assert rows(ds) == [(1, 2.5, "none", "a"), (2, -1.0, "x", "b,c"), (3, 4.5, "y", 'say "hi"')]


def test_dtypes_as_defaults_or_required(tmp_path):
    path = write(tmp_path / "t.csv", "1,2,3.5,4.25,s\n")
    ds = CsvDataset(path, [np.int64, np.zeros(0, np.int32), "float32", np.array([0.0]), str])
    assert [s.dtype for s in ds.element_spec] == [np.int64, np.int32, np.float32, np.float64, np.str_]
    assert rows(ds) == [(1, 2, 3.5, 4.25, "s")]


def test_select_and_exclude_cols(tmp_path):
    path = write(tmp_path / "t.csv", TABLE)
    assert rows(CsvDataset(path, [[0], ["?"]], header=True, select_cols=[0, 2])) == [
        (1, "?"), (2, "x"), (3, "y")]
    assert rows(CsvDataset(path, [[0.0], [""]], header=True, exclude_cols=[0, 2])) == [
        (2.5, "a"), (0.0, "b,c"), (4.5, 'say "hi"')]
    with pytest.raises(InvalidArgumentError, match="increasing order"):
        CsvDataset(path, [[0], [0]], select_cols=[2, 0])
    with pytest.raises(InvalidArgumentError, match="not both"):
        CsvDataset(path, [[0]], select_cols=[0], exclude_cols=[1])


def test_na_value_and_quotes_off(tmp_path):
    path = write(tmp_path / "t.csv", "1,NA,\"q\"\nNA,2,r\n")
    ds = CsvDataset(path, [[-1], [-2], [""]], na_value="NA")
    assert rows(ds) == [(1, -2, "q"), (-1, 2, "r")]
    raw = CsvDataset(path, [[-1], [-2], [""]], na_value="NA", use_quote_delim=False)
    assert rows(raw)[0] == (1, -2, '"q"')
    semi = write(tmp_path / "s.csv", "1;2\n3;4\n")
    assert rows(CsvDataset(semi, [[0], [0]], field_delim=";")) == [(1, 2), (3, 4)]


def test_wrong_field_count_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.csv", "a,b,c\n1,2,3\n4,5,6\n7,8\n")
    ds = CsvDataset(path, [[0]] * 3, header=True)
    with pytest.raises(InvalidArgumentError, match=r"bad\.csv line 4 has 2 fields, but 3 are expected"):
        list(ds)


def test_required_missing_names_file_line_and_column(tmp_path):
    path = write(tmp_path / "req.csv", "1,2\n3,\n")
    with pytest.raises(InvalidArgumentError, match=r"req\.csv line 2 column 1 is missing .* required"):
        list(CsvDataset(path, [[0], np.int32]))


def test_bad_value_names_file_line_and_column(tmp_path):
    path = write(tmp_path / "val.csv", "x,y\n1,2\n3,4.5\n", "GZIP")
    with pytest.raises(InvalidArgumentError, match=r"val\.csv line 3 column 1: '4\.5' is not a int32"):
        list(CsvDataset(path, [[0], [0]], "GZIP", header=True))


def test_record_defaults_must_match_the_columns(tmp_path):
    path = write(tmp_path / "w.csv", "1,2,3\n")
    with pytest.raises(InvalidArgumentError, match=r"has 3 columns .* record_defaults has 2 entries"):
        list(CsvDataset(path, [[0], [0]]))
    with pytest.raises(InvalidArgumentError, match="record_defaults\\[0\\]"):
        CsvDataset(path, [[1, 2]])
    with pytest.raises(InvalidArgumentError, match="pass compression_type='GZIP'"):
        list(CsvDataset(write(tmp_path / "z.csv", "1,2,3\n" * 50, "GZIP"), [[0]] * 3))


def test_files_are_split_by_file(tmp_path):
    names = [write(tmp_path / f"p{i}.csv", f"{i},0\n{i},1\n") for i in range(3)]
    ds = CsvDataset(names, [[0], [0]])
    assert rows(ds) == [(i, j) for i in range(3) for j in range(2)]
    assert file_shard_units(find_file_reader(ds)) == tuple(names)
    listed = Dataset.list_files(str(tmp_path / "p*.csv"), shuffle=False).interleave(
        lambda f: CsvDataset(f, [[0], [0]]))
    assert file_shard_units(find_file_reader(listed)) == tuple(names)


def test_make_csv_dataset_with_label(tmp_path):
    # TF's tutorial shape: a header line, a label column, batches of (OrderedDict, label)
    text = "survived,sex,age,fare\n0,male,22.0,7.25\n1,female,38.0,71.28\n1,female,,7.92\n0,male,35.0,8.05\n"
    path = write(tmp_path / "train.csv", text)
    ds = make_csv_dataset(path, batch_size=3, label_name="survived", num_epochs=1, shuffle=False)
    (f1, l1), (f2, l2) = list(ds)
    assert isinstance(f1, OrderedDict) and list(f1) == ["sex", "age", "fare"]
    np.testing.assert_array_equal(l1, [0, 1, 1])
    assert l1.dtype == np.int32 and f1["age"].dtype == np.float32
    assert f1["sex"].tolist() == ["male", "female", "female"]
    np.testing.assert_array_equal(f1["age"], [22.0, 38.0, 0.0])  # inferred: missing is 0
    np.testing.assert_array_equal(l2, [0])
    np.testing.assert_allclose(f2["fare"], [8.05])


def test_make_csv_dataset_select_defaults_and_epochs(tmp_path):
    path = write(tmp_path / "d.csv", "a,b,c\n1,x,2.5\n2,y,\n3,z,1.0\n")
    ds = make_csv_dataset(path, 2, select_columns=["c", "a"], column_defaults=[[0], [-1.0]],
                          num_epochs=2, shuffle=False)
    batches = list(ds)
    assert [list(b) for b in batches] == [["a", "c"]] * 3
    np.testing.assert_array_equal(np.concatenate([b["a"] for b in batches]), [1, 2, 3, 1, 2, 3])
    np.testing.assert_array_equal(np.concatenate([b["c"] for b in batches]), [2.5, -1, 1, 2.5, -1, 1])
    forever = make_csv_dataset(path, 2, shuffle=True, shuffle_seed=3)
    taken = list(forever.take(5))
    assert all(len(b["a"]) == 2 for b in taken)  # num_epochs None: whole batches, repeated
    assert sorted(np.concatenate([b["a"] for b in taken[:3]]).tolist()) == [1, 1, 2, 2, 3, 3]


def test_make_csv_dataset_names_without_header_and_errors(tmp_path):
    path = write(tmp_path / "n.csv", "1,2\n3,4\n5,x\n")
    with pytest.raises(InvalidArgumentError, match="column_names must be given"):
        make_csv_dataset(path, 2, header=False)
    ds = make_csv_dataset(path, 4, column_names=["p", "q"], header=False, num_epochs=1,
                          shuffle=False, num_rows_for_inference=2)
    with pytest.raises(InvalidArgumentError, match=r"n\.csv line 3 column 1: 'x' is not a int32"):
        list(ds)
    kept = make_csv_dataset(path, 4, column_names=["p", "q"], header=False, num_epochs=1,
                            shuffle=False, num_rows_for_inference=2, ignore_errors=True)
    (batch,) = list(kept)
    np.testing.assert_array_equal(batch["q"], [2, 4])
    with pytest.raises(InvalidArgumentError, match="label_name 'r'"):
        make_csv_dataset(path, 2, column_names=["p", "q"], header=False, label_name="r")


cell = st.one_of(st.integers(-1000, 1000).map(str), st.just(""),
                 st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=6))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.integers(1, 4).flatmap(lambda w: st.lists(st.lists(cell, min_size=w, max_size=w), min_size=1, max_size=20)),
       delim=st.sampled_from([",", ";", "\t"]))
def test_random_tables_read_back_exactly(tmp_path, table, delim):
    table = [r for r in table if any(c != "" for c in r)]  # blank lines are skipped
    if not table:
        return
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter=delim, lineterminator="\n", quoting=csv.QUOTE_ALL).writerows(table)
    width = len(table[0])
    got = rows(CsvDataset(str(path), [["<na>"]] * width, field_delim=delim))
    assert got == [tuple(c if c != "" else "<na>" for c in r) for r in table]
