"""What FILE auto-sharding splits, as the workers compare it: the names in the order the shard
is applied, for every kind of reader; None where only reading would tell."""

import numpy as np

from mpidist.data import Dataset, NpyDataset, TextLineDataset
from mpidist.data.dataset import file_shard_units, find_file_reader, source_units


def make_files(tmp_path, count=3):
    names = []
    for k in reversed(range(count)):  # created out of order: listing sorts them
        path = tmp_path / f"part-{k}.npy"
        np.save(path, np.arange(2.0) + k)
        names.append(str(path))
    return sorted(names)


def units_of(dataset):
    return file_shard_units(find_file_reader(dataset))


def test_list_files_splits_the_sorted_names_whatever_its_shuffle(tmp_path):
    names = make_files(tmp_path)
    for shuffle in (True, False, None):
        files = Dataset.list_files(str(tmp_path / "part-*.npy"), shuffle=shuffle)
        assert units_of(files.interleave(NpyDataset).batch(2)) == tuple(names)


def test_a_reader_of_a_list_splits_the_list_in_its_order(tmp_path):
    names = make_files(tmp_path)
    mixed = [names[2], names[0], names[1]]
    assert units_of(NpyDataset(mixed).map(lambda x: x * 2)) == tuple(mixed)
    (tmp_path / "a.txt").write_text("1\n")
    assert units_of(TextLineDataset([str(tmp_path / "a.txt")])) == (str(tmp_path / "a.txt"),)


def test_names_through_a_map_are_split_at_their_source(tmp_path):
    names = make_files(tmp_path)
    ds = Dataset.from_tensor_slices(np.array(names)).map(lambda f: f)
    assert units_of(ds.flat_map(NpyDataset)) == tuple(names)
    as_bytes = Dataset.from_tensor_slices(np.array([n.encode() for n in names]))
    assert units_of(as_bytes.interleave(lambda f: NpyDataset(f.decode()))) == tuple(names)


def test_a_saved_dataset_splits_its_shard_files(tmp_path):
    Dataset.range(10).save(str(tmp_path / "saved"))
    loaded = Dataset.load(str(tmp_path / "saved"))
    units = units_of(loaded)
    assert units and all(str(tmp_path / "saved") in u for u in units)


def test_names_from_a_generator_are_unknown_before_reading(tmp_path):
    names = make_files(tmp_path)
    gen = Dataset.from_generator(lambda: iter(names), output_types=str)
    assert [str(n) for n in gen] == names  # a string of any length fits the str spec
    assert units_of(gen.interleave(NpyDataset)) is None


def test_source_units_are_names_only_for_a_list_of_names():
    assert source_units(Dataset.from_tensor_slices(np.array(["b", "a"]))) == ("b", "a")
    assert source_units(Dataset.from_tensor_slices(np.arange(4.0))) is None
    assert source_units(Dataset.range(3)) is None
