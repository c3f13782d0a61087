"""mpidist.train.Checkpoint and CheckpointManager: what spec section 4.5 says is saved for
each kind of variable, restoring across strategies and replica counts, the file format (no
pickles, checksums, clear errors for damaged files), atomic writes and the manager.

``S(N)`` is a MirroredStrategy over N virtual CPU devices; ``comps(v)`` lists a variable's
per-replica component values.
"""

import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

import mpidist
from mpidist.errors import InvalidArgumentError
from mpidist.train import Checkpoint, CheckpointManager, latest_checkpoint
from mpidist.training import checkpoint_format as file_format
from mpidist.core import durable
from replicas import mirrored as S, rid
from mpidist import VariableAggregation as Agg
from mpidist import VariableSynchronization as Sync


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def comps(v):
    if isinstance(v, mpidist.DistributedValues):
        return [c.numpy().item() for c in v.values]
    return [v.numpy().item()]


def on_read(strategy, aggregation, init=0.0):
    with strategy.scope():
        return mpidist.Variable(init, synchronization=Sync.ON_READ, aggregation=aggregation)


def mirrored_var(strategy, init=0.0, **kwargs):
    with strategy.scope():
        return mpidist.Variable(init, **kwargs)


def set_components(strategy, v, values):
    """Replica i's component of ``v`` (local-only writes) takes values[i]."""
    strategy.run(lambda: v.assign(np.float64(values[int(rid())]), read_value=False))


def plain(value, dtype=None):
    return mpidist.Variable(np.asarray(value, dtype=dtype))


def manifest(path):
    with np.load(path, allow_pickle=False) as z:
        return json.loads(z["manifest"].tobytes().decode())


def saved_values(path):
    """{key: array} as stored in the file, read with plain NumPy."""
    m = manifest(path)
    with np.load(path, allow_pickle=False) as z:
        return {e["key"]: z[e["member"][:-4]] for e in m["entries"]}


class Box:
    """A small trackable: its attributes are its dependencies."""

    def __init__(self, **deps):
        self.deps = deps

    def _checkpoint_dependencies(self):
        return dict(self.deps)


def files(directory):
    return sorted(os.listdir(directory))


# ---------------------------------------------------------------------------------------------
# Spec 4.5: what is saved, what is restored
# ---------------------------------------------------------------------------------------------
SPEC_TABLE = [  # aggregation, saved value from components [3, 5], components after restore
    (Agg.SUM, 8.0, [4.0, 4.0]),
    (Agg.MEAN, 4.0, [4.0, 4.0]),
    (Agg.ONLY_FIRST_REPLICA, 3.0, [3.0, 3.0]),
]


class TestSpecTable:
    @pytest.mark.parametrize("agg,saved,restored", SPEC_TABLE, ids=lambda x: str(x))
    def test_sync_on_read_saves_aggregate_and_restores(self, tmp_path, agg, saved, restored):
        s = S(2)
        v = on_read(s, agg)
        set_components(s, v, [3.0, 5.0])
        path = Checkpoint(v=v).save(str(tmp_path / "ck"))
        assert saved_values(path)["v"] == saved
        set_components(s, v, [0.0, 0.0])
        Checkpoint(v=v).restore(path).assert_consumed()
        assert comps(v) == restored
        p = plain(0.0)
        Checkpoint(v=p).restore(path).assert_consumed()
        assert p.numpy() == saved

    def test_sync_on_read_none_cannot_be_saved_and_nothing_is_written(self, tmp_path):
        s = S(2)
        v = on_read(s, Agg.NONE)
        set_components(s, v, [3.0, 5.0])
        ck = Checkpoint(v=v)
        with pytest.raises(ValueError,
                           match=r"'v'.*Could not convert from `mpidist.VariableAggregation`"):
            ck.save(str(tmp_path / "ck"))
        assert files(tmp_path) == []
        assert int(ck.save_counter.numpy()) == 0  # the failed save did not count

    def test_mirrored_saves_replica_0_and_restores_everywhere(self, tmp_path):
        s = S(2)
        m = mirrored_var(s)  # aggregation NONE: replica writes stay local, copies drift
        set_components(s, m, [1.0, 2.0])
        path = Checkpoint(m=m).save(str(tmp_path / "ck"))
        assert saved_values(path)["m"] == 1.0
        Checkpoint(m=m).restore(path)
        assert comps(m) == [1.0, 1.0]

    def test_plain_value_into_sum_sync_on_read_and_mirrored(self, tmp_path):
        path = Checkpoint(v=plain(8.0)).save(str(tmp_path / "ck"))
        s = S(2)
        v, m = on_read(s, Agg.SUM), mirrored_var(s)
        Checkpoint(v=v).restore(path).assert_consumed()
        Checkpoint(v=m).restore(path).assert_consumed()
        assert comps(v) == [4.0, 4.0]
        assert comps(m) == [8.0, 8.0]

    @pytest.mark.parametrize("agg,saved,_", SPEC_TABLE, ids=lambda x: str(x))
    def test_portable_to_three_replicas_and_one_device(self, tmp_path, agg, saved, _):
        s2 = S(2)
        v, m = on_read(s2, agg), mirrored_var(s2, 7.0)
        set_components(s2, v, [3.0, 5.0])
        path = Checkpoint(v=v, m=m).save(str(tmp_path / "ck"))
        s3 = S(3)
        v3, m3 = on_read(s3, agg), mirrored_var(s3)
        Checkpoint(v=v3, m=m3).restore(path).assert_consumed()
        want = saved / 3 if agg is Agg.SUM else saved
        np.testing.assert_allclose(comps(v3), [want] * 3)
        assert comps(m3) == [7.0] * 3
        with s3.scope():
            assert float(v3.read_value()) == pytest.approx(saved)
        one = mpidist.OneDeviceStrategy("/cpu:0")
        with one.scope():
            v1, m1 = mpidist.Variable(0.0), mpidist.Variable(0.0)
        Checkpoint(v=v1, m=m1).restore(path).assert_consumed()
        assert (v1.numpy(), m1.numpy()) == (saved, 7.0)

    def test_one_device_variable_saves_its_value(self, tmp_path):
        one = mpidist.OneDeviceStrategy("/cpu:0")
        with one.scope():
            w = mpidist.Variable(np.arange(3.0))
        path = Checkpoint(w=w).save(str(tmp_path / "ck"))
        np.testing.assert_array_equal(saved_values(path)["w"], np.arange(3.0))

    def test_integer_sum_restore_divides_and_casts(self, tmp_path):
        path = Checkpoint(n=plain(8, np.int32)).save(str(tmp_path / "ck"))
        s = S(2)
        with s.scope():
            n = mpidist.Variable(np.int32(0), synchronization=Sync.ON_READ, aggregation=Agg.SUM)
        Checkpoint(n=n).restore(path).assert_consumed()
        assert comps(n) == [4, 4] and n.values[0].dtype == np.int32

    def test_save_and_restore_inside_the_strategy_scope(self, tmp_path):
        s = S(2)
        v = on_read(s, Agg.SUM)
        set_components(s, v, [3.0, 5.0])
        with s.scope():
            path = Checkpoint(v=v).save(str(tmp_path / "ck"))
            set_components(s, v, [0.0, 0.0])
            Checkpoint(v=v).restore(path)
        assert comps(v) == [4.0, 4.0]

    def test_save_in_replica_context_is_refused(self, tmp_path):
        s = S(2)
        v = on_read(s, Agg.SUM)
        ck = Checkpoint(v=v)
        with pytest.raises(RuntimeError, match="cross-replica context"):
            s.run(lambda: ck.save(str(tmp_path / "ck")))
        with pytest.raises(RuntimeError, match="cross-replica context"):
            s.run(lambda: ck.restore(str(tmp_path / "ck-1")))


# ---------------------------------------------------------------------------------------------
# Keys, the object graph, arguments
# ---------------------------------------------------------------------------------------------
class TestObjectGraph:
    def test_keys_are_slash_paths(self, tmp_path):
        w, b, it, m0 = plain([1.0, 2.0]), plain(0.5), plain(3, np.int64), plain([0.0, 0.0])
        opt = Box(iterations=it, slots={"0": {"m": m0}})
        ck = Checkpoint(model=Box(w=w, b=b), opt=opt, extra=[plain(1.0), {"a/b": plain(2.0)}])
        path = ck.write(str(tmp_path / "w"))
        keys = [e["key"] for e in manifest(path)["entries"]]
        assert keys == ["model/w", "model/b", "opt/iterations", "opt/slots/0/m", "extra/0",
                        "extra/1/a%2Fb", "save_counter"]

    def test_nested_trackables_restore(self, tmp_path):
        w = plain([1.0, 2.0])
        m = plain([3.0, 4.0])
        path = Checkpoint(model=Box(w=w), optimizer=Box(slots=[{"m": m}])).save(str(tmp_path / "c"))
        w2, m2 = plain([0.0, 0.0]), plain([0.0, 0.0])
        status = Checkpoint(model=Box(w=w2), optimizer=Box(slots=[{"m": m2}])).restore(path)
        status.assert_consumed().assert_existing_objects_matched().assert_nontrivial_match()
        assert w2.numpy().tolist() == [1.0, 2.0] and m2.numpy().tolist() == [3.0, 4.0]

    def test_objects_are_attributes(self):
        w = plain(1.0)
        ck = Checkpoint(model=w)
        assert ck.model is w and not hasattr(ck, "nothing")

    def test_non_trackable_values_raise_type_error_naming_the_key(self, tmp_path):
        with pytest.raises(TypeError, match=r"'model'.*int.*_checkpoint_dependencies"):
            Checkpoint(model=3)
        with pytest.raises(TypeError, match=r"'model/w'.*ndarray.*mpidist.Variable"):
            Checkpoint(model=Box(w=np.zeros(2))).save(str(tmp_path / "ck"))
        with pytest.raises(TypeError, match=r"returned a list"):
            Checkpoint(model=type("Bad", (), {"_checkpoint_dependencies": lambda self: []})()
                       ).save(str(tmp_path / "ck"))
        with pytest.raises(ValueError, match="save_counter"):
            Checkpoint(save_counter=plain(1.0))
        assert files(tmp_path) == []

    def test_none_dependencies_are_skipped_and_cycles_end(self, tmp_path):
        a = Box(w=plain(1.0), later=None)
        a.deps["self"] = a
        path = Checkpoint(a=a).save(str(tmp_path / "ck"))
        assert [e["key"] for e in manifest(path)["entries"]] == ["a/w", "save_counter"]

    def test_shared_variable_under_two_keys(self, tmp_path):
        w = plain(5.0)
        path = Checkpoint(a=w, b=Box(w=w)).save(str(tmp_path / "ck"))
        assert saved_values(path)["a"] == saved_values(path)["b/w"] == 5.0
        w.assign(0.0)
        Checkpoint(a=w, b=Box(w=w)).restore(path).assert_consumed()
        assert w.numpy() == 5.0

    def test_two_variables_with_one_key_raise(self, tmp_path):
        with pytest.raises(ValueError, match=r"checkpoint key '0/x'"):
            Checkpoint(root=Box(**{"0": {"x": plain(1.0)}}),
                       **{"0": {"x": plain(2.0)}}).save(str(tmp_path / "ck"))

    def test_component_stands_for_its_distributed_variable(self, tmp_path):
        s = S(2)
        v = on_read(s, Agg.SUM)
        set_components(s, v, [3.0, 5.0])
        path = Checkpoint(v=v.values[1]).save(str(tmp_path / "ck"))
        assert saved_values(path)["v"] == 8.0

    def test_root_dependencies_are_top_level_keys(self, tmp_path):
        path = Checkpoint(root=Box(w=plain(1.0)), x=plain(2.0)).save(str(tmp_path / "ck"))
        assert [e["key"] for e in manifest(path)["entries"]] == ["w", "x", "save_counter"]
        with pytest.raises(TypeError, match="root"):
            Checkpoint(root=plain(1.0))

    def test_bad_paths_and_options(self, tmp_path):
        ck = Checkpoint(x=plain(1.0))
        with pytest.raises(TypeError, match=r"file_prefix must be a path.*got 3"):
            ck.save(3)
        with pytest.raises(ValueError, match="must not be empty"):
            ck.write("")
        with pytest.raises(NotImplementedError, match="options"):
            ck.save(str(tmp_path / "ck"), options=object())
        with pytest.raises(FileNotFoundError, match="No checkpoint file"):
            ck.restore(str(tmp_path / "missing"))
        with pytest.raises(IsADirectoryError, match="latest_checkpoint"):
            ck.restore(str(tmp_path))
        with pytest.raises(TypeError, match=r"'x'.*dtype <U4: checkpoints hold bool, integer"):
            Checkpoint(x=plain("text")).save(str(tmp_path / "ck"))
        assert int(ck.save_counter.numpy()) == 0

    def test_pathlike_prefix(self, tmp_path):
        path = Checkpoint(x=plain(1.0)).save(tmp_path / "ck")
        assert path == str(tmp_path / "ck") + "-1"
        Checkpoint(x=plain(0.0)).restore(tmp_path / "ck-1").assert_consumed()


# ---------------------------------------------------------------------------------------------
# Counter, write/read, status
# ---------------------------------------------------------------------------------------------
class TestSaveCounterAndStatus:
    def test_save_numbers_and_counter_is_restored(self, tmp_path):
        x = plain(1.0)
        ck = Checkpoint(x=x)
        prefix = str(tmp_path / "ck")
        assert [ck.save(prefix) for _ in range(3)] == [f"{prefix}-{i}" for i in (1, 2, 3)]
        assert ck.write(str(tmp_path / "plain")) == str(tmp_path / "plain")
        assert int(ck.save_counter.numpy()) == 3
        assert saved_values(str(tmp_path / "plain"))["save_counter"] == 3
        other = Checkpoint(x=plain(0.0))
        other.restore(f"{prefix}-2").assert_consumed()
        assert int(other.save_counter.numpy()) == 2
        assert other.save(prefix) == f"{prefix}-3"
        other.read(str(tmp_path / "plain")).assert_consumed()
        assert int(other.save_counter.numpy()) == 3
        assert ck.save_counter.dtype == np.int64

    def test_save_records_latest_write_does_not(self, tmp_path):
        ck = Checkpoint(x=plain(1.0))
        assert latest_checkpoint(str(tmp_path)) is None
        assert latest_checkpoint(str(tmp_path / "nowhere")) is None
        ck.write(str(tmp_path / "w"))
        assert latest_checkpoint(str(tmp_path)) is None
        p1 = ck.save(str(tmp_path / "ck"))
        p2 = ck.save(str(tmp_path / "ck"))
        assert latest_checkpoint(str(tmp_path)) == p2
        state = json.loads((tmp_path / "checkpoint").read_text())
        assert state["latest_checkpoint"] == "ck-2" and state["all_checkpoints"] == ["ck-2"]
        os.remove(p2)
        assert latest_checkpoint(str(tmp_path)) is None  # TF: a missing latest file: None
        assert os.path.exists(p1)

    def test_restore_none_is_initialization_only(self):
        x = plain(1.0)
        status = Checkpoint(x=x).restore(None)
        assert status.expect_partial() is status
        for check in (status.assert_consumed, status.assert_existing_objects_matched,
                      status.assert_nontrivial_match):
            with pytest.raises(AssertionError, match="save_path=None"):
                check()
        assert x.numpy() == 1.0

    def test_status_unused_and_unmatched(self, tmp_path):
        path = Checkpoint(a=plain(1.0), b=plain(2.0)).save(str(tmp_path / "ck"))
        a = plain(0.0)
        status = Checkpoint(a=a).restore(path)  # b in the file is unused
        assert a.numpy() == 1.0
        assert status.unused == ("b",) and status.unmatched == ()
        status.assert_existing_objects_matched().assert_nontrivial_match()
        with pytest.raises(AssertionError, match=r"no variable has taken yet: 'b'"):
            status.assert_consumed()
        assert status.expect_partial() is status
        c = plain(7.0)
        status = Checkpoint(a=plain(0.0), c=c).restore(path)  # c has no value in the file
        assert c.numpy() == 7.0 and status.unmatched == ("c",)
        with pytest.raises(AssertionError, match=r"no value for.*'c'"):
            status.assert_existing_objects_matched()
        with pytest.raises(AssertionError, match=r"'c'"):
            status.assert_consumed()
        with pytest.warns(RuntimeWarning, match=r"matched no key: the checkpoint holds 'a', "
                                                r"'b' and this Checkpoint's variables are at 'z'"):
            status = Checkpoint(z=plain(0.0)).restore(path)
        with pytest.raises(AssertionError, match="Nothing but the save counter"):
            status.assert_nontrivial_match()

    @pytest.mark.parametrize("saved,target,what", [
        (np.zeros(3), np.zeros(4), r"shape \(3,\) dtype float64.*shape \(4,\) dtype float64"),
        (np.zeros(3), np.zeros(3, np.float32), r"shape \(3,\) dtype float64.*dtype float32"),
    ])
    def test_shape_or_dtype_mismatch_changes_nothing(self, tmp_path, saved, target, what):
        path = Checkpoint(a=plain(5.0), w=plain(saved)).save(str(tmp_path / "ck"))
        a, w = plain(0.0), plain(target + 1)
        ck = Checkpoint(a=a, w=w)
        with pytest.raises(ValueError, match=r"checkpoint key 'w'.*" + what):
            ck.restore(path)
        assert a.numpy() == 0.0 and np.all(w.numpy() == 1)  # 'a' came first, still untouched
        assert int(ck.save_counter.numpy()) == 0

    def test_mismatch_into_distributed_variable_leaves_every_copy(self, tmp_path):
        path = Checkpoint(m=plain(np.zeros(2))).save(str(tmp_path / "ck"))
        s = S(2)
        m = mirrored_var(s, np.ones(3))
        with pytest.raises(ValueError, match="'m'"):
            Checkpoint(m=m).restore(path)
        assert [c.numpy().tolist() for c in m.values] == [[1.0] * 3] * 2


# ---------------------------------------------------------------------------------------------
# Bit-exact round trips
# ---------------------------------------------------------------------------------------------
def _special_floats(dtype):
    bits = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}[dtype]
    info = np.finfo(dtype)
    vals = np.array([0.0, -0.0, np.inf, -np.inf, info.tiny, info.max, -1.5], dtype=dtype)
    nbits = np.dtype(bits).itemsize * 8
    mant = info.nmant
    exp_all = ((1 << (nbits - 1 - mant)) - 1) << mant
    payloads = np.array([exp_all | 1, exp_all | (1 << (mant - 1)) | 5,
                         (1 << (nbits - 1)) | exp_all | 3], dtype=bits).view(dtype)
    return np.concatenate([vals, payloads])


ROUND_TRIP = [
    _special_floats(np.float16), _special_floats(np.float32), _special_floats(np.float64),
    np.array([np.iinfo(np.int8).min, -1, 0, np.iinfo(np.int8).max], np.int8),
    np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64),
    np.array([0, np.iinfo(np.uint64).max], np.uint64),
    np.array([[0, 65535], [1, 2]], np.uint16),
    np.array([True, False, True]),
    np.array([1 + 2j, complex(np.nan, -0.0)], np.complex128),
    np.float32(-0.0).reshape(()),
    np.zeros((0, 3), np.float32),
]


class TestRoundTrip:
    @pytest.mark.parametrize("value", ROUND_TRIP, ids=lambda a: f"{a.dtype}{list(a.shape)}")
    def test_bit_exact_plain(self, tmp_path, value):
        path = Checkpoint(x=plain(value)).save(str(tmp_path / "ck"))
        x = plain(np.zeros_like(value))
        Checkpoint(x=x).restore(path).assert_consumed()
        got = x.numpy()
        assert got.dtype == value.dtype and got.shape == value.shape
        assert got.tobytes() == value.tobytes()

    @pytest.mark.parametrize("value", ROUND_TRIP[:3], ids=lambda a: str(a.dtype))
    def test_bit_exact_mirrored_and_mean(self, tmp_path, value):
        s = S(2)
        path = Checkpoint(x=plain(value)).save(str(tmp_path / "ck"))
        m = mirrored_var(s, np.zeros_like(value))
        with s.scope():
            v = mpidist.Variable(np.zeros_like(value), synchronization=Sync.ON_READ,
                                 aggregation=Agg.ONLY_FIRST_REPLICA)
        Checkpoint(x=m).restore(path)
        Checkpoint(x=v).restore(path)
        for c in list(m.values) + list(v.values):
            assert c.numpy().tobytes() == value.tobytes()
        path2 = Checkpoint(x=m).save(str(tmp_path / "again"))
        assert saved_values(path2)["x"].tobytes() == value.tobytes()


# ---------------------------------------------------------------------------------------------
# Damaged files
# ---------------------------------------------------------------------------------------------
CORRUPT = r"is truncated or corrupt: .*restore an earlier checkpoint"


@pytest.fixture
def good_file(tmp_path):
    w = plain(np.arange(1000, dtype=np.float64))
    return Checkpoint(w=w, b=plain(1.0)).save(str(tmp_path / "ck"))


def _restore_into_fresh(path):
    w, b = plain(np.zeros(1000)), plain(0.0)
    try:
        return Checkpoint(w=w, b=b).restore(path)
    finally:
        assert np.all(w.numpy() == 0) or np.array_equal(w.numpy(), np.arange(1000.0))


class TestDamagedFiles:
    @pytest.mark.parametrize("keep", [0, 10, 100, 0.5, 0.9, -1])
    def test_truncated(self, good_file, keep):
        data = Path(good_file).read_bytes()
        if isinstance(keep, float):
            n = int(len(data) * keep)
        else:
            n = len(data) + keep if keep < 0 else keep
        Path(good_file).write_bytes(data[:n])
        with pytest.raises(InvalidArgumentError, match=CORRUPT):
            _restore_into_fresh(good_file)

    @pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
    def test_flipped_bytes(self, good_file, where):
        data = bytearray(Path(good_file).read_bytes())
        i = int(len(data) * where)
        data[i:i + 4] = bytes(b ^ 0xFF for b in data[i:i + 4])
        Path(good_file).write_bytes(bytes(data))
        with pytest.raises(InvalidArgumentError, match=CORRUPT):
            _restore_into_fresh(good_file)

    def test_every_single_byte_flip_is_caught_or_harmless(self, tmp_path):
        """No single flipped byte restores a wrong value silently."""
        path = Checkpoint(w=plain(np.arange(4.0))).save(str(tmp_path / "ck"))
        data = Path(path).read_bytes()
        for i in range(0, len(data), 7):
            bad = bytearray(data)
            bad[i] ^= 0x55
            Path(path).write_bytes(bytes(bad))
            w = plain(np.zeros(4))
            try:
                Checkpoint(w=w).restore(path)
            except (InvalidArgumentError, ValueError):
                assert np.all(w.numpy() == 0)
            else:
                assert w.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]

    def test_garbage_and_empty(self, tmp_path):
        for i, content in enumerate([b"", b"garbage" * 100, os.urandom(4096)]):
            path = tmp_path / f"bad{i}"
            path.write_bytes(content)
            with pytest.raises(InvalidArgumentError, match=CORRUPT):
                Checkpoint(w=plain(0.0)).restore(str(path))

    def _rewrite_manifest(self, path, change):
        m = manifest(path)
        change(m)
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["manifest"] = np.frombuffer(json.dumps(m).encode(), np.uint8)
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    def test_newer_format_version(self, good_file):
        self._rewrite_manifest(good_file, lambda m: m.update(version=2))
        with pytest.raises(InvalidArgumentError, match=r"format version 2.*newer mpidist; upgrade"):
            _restore_into_fresh(good_file)

    def test_bad_version_and_format(self, good_file):
        self._rewrite_manifest(good_file, lambda m: m.update(version="x"))
        with pytest.raises(InvalidArgumentError, match=r"format version 'x'.*corrupt"):
            _restore_into_fresh(good_file)
        self._rewrite_manifest(good_file, lambda m: m.update(format="other"))
        with pytest.raises(InvalidArgumentError, match="not describe an mpidist checkpoint"):
            _restore_into_fresh(good_file)

    def test_checksum_mismatch(self, good_file):
        self._rewrite_manifest(good_file, lambda m: m["entries"][0].update(sha256="0" * 64))
        with pytest.raises(InvalidArgumentError, match=r"'w' do not match their checksum"):
            _restore_into_fresh(good_file)

    def test_manifest_shape_disagrees_with_member(self, good_file):
        self._rewrite_manifest(good_file, lambda m: m["entries"][0].update(shape=[999]))
        with pytest.raises(InvalidArgumentError,
                           match=r"manifest says dtype float64 shape \(999,\)"):
            _restore_into_fresh(good_file)

    def test_object_arrays_are_refused_and_never_unpickled(self, tmp_path):
        marker = tmp_path / "executed"

        class Evil:
            def __reduce__(self):
                return (open, (str(marker), "w"))

        obj = np.empty(1, dtype=object)
        obj[0] = Evil()
        good = Checkpoint(w=plain(0.0)).save(str(tmp_path / "ck"))
        m = manifest(good)
        m["entries"][0].update(dtype="|O")
        path = tmp_path / "evil"
        with zipfile.ZipFile(path, "w") as zf:
            with zf.open("manifest.npy", "w") as fh:
                np.lib.format.write_array(fh, np.frombuffer(json.dumps(m).encode(), np.uint8))
            with zf.open("t0.npy", "w") as fh:
                np.lib.format.write_array(fh, obj, allow_pickle=True)
        with pytest.raises(InvalidArgumentError, match=r"dtype '\|O'.*only bool, integer"):
            Checkpoint(w=plain(0.0)).restore(str(path))
        m["entries"][0].update(dtype="<f8")  # the manifest lies; the member header is checked
        with zipfile.ZipFile(path, "w") as zf:
            with zf.open("manifest.npy", "w") as fh:
                np.lib.format.write_array(fh, np.frombuffer(json.dumps(m).encode(), np.uint8))
            with zf.open("t0.npy", "w") as fh:
                np.lib.format.write_array(fh, obj, allow_pickle=True)
        with pytest.raises(InvalidArgumentError, match="holds dtype object"):
            Checkpoint(w=plain(0.0)).restore(str(path))
        path.write_bytes(pickle.dumps(Evil()))
        with pytest.raises(InvalidArgumentError, match=CORRUPT):
            Checkpoint(w=plain(0.0)).restore(str(path))
        assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------
class TestAtomicWrite:
    def test_failure_midway_leaves_no_file(self, tmp_path, monkeypatch):
        real = file_format._write_member
        calls = []

        def fail_on_second(zf, name, arr):
            calls.append(name)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            real(zf, name, arr)

        monkeypatch.setattr(file_format, "_write_member", fail_on_second)
        ck = Checkpoint(w=plain(np.arange(10.0)))
        with pytest.raises(OSError, match="No space left"):
            ck.save(str(tmp_path / "ck"))
        assert files(tmp_path) == []
        assert int(ck.save_counter.numpy()) == 0

    def test_failed_overwrite_keeps_the_old_file(self, tmp_path, monkeypatch):
        path = str(tmp_path / "w")
        Checkpoint(w=plain(1.0)).write(path)
        monkeypatch.setattr(durable.os, "replace",
                            lambda *a: (_ for _ in ()).throw(OSError("rename failed")))
        with pytest.raises(OSError, match="rename failed"):
            Checkpoint(w=plain(2.0)).write(path)
        monkeypatch.undo()
        assert files(tmp_path) == ["w"]
        w = plain(0.0)
        Checkpoint(w=w).restore(path)
        assert w.numpy() == 1.0

    def test_file_and_directory_are_fsynced_before_and_after_rename(self, tmp_path, monkeypatch):
        events = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
            real_fsync(fd)

        def replace(src, dst):
            events.append(("replace", os.path.basename(dst)))
            real_replace(src, dst)

        monkeypatch.setattr(durable.os, "fsync", fsync)
        monkeypatch.setattr(durable.os, "replace", replace)
        Checkpoint(w=plain(1.0)).save(str(tmp_path / "ck"))
        d = tmp_path.name
        assert [e[0] for e in events] == ["fsync", "replace", "fsync"] * 2
        unnamed = "#"  # /proc names an O_TMPFILE file "#<inode> (deleted)"
        assert events[0][1].startswith((".ck-1.tmp-", unnamed))
        assert events[1:3] == [("replace", "ck-1"), ("fsync", d)]
        assert events[3][1].startswith((".checkpoint.tmp-", unnamed))
        assert events[4:] == [("replace", "checkpoint"), ("fsync", d)]

    def test_file_mode_follows_umask(self, tmp_path):
        old = os.umask(0o022)
        try:
            path = Checkpoint(w=plain(1.0)).save(str(tmp_path / "ck"))
        finally:
            os.umask(old)
        assert os.stat(path).st_mode & 0o777 == 0o644

    def test_missing_directories_are_created(self, tmp_path):
        path = Checkpoint(w=plain(1.0)).save(str(tmp_path / "a" / "b" / "ck"))
        assert os.path.isfile(path) and latest_checkpoint(str(tmp_path / "a" / "b")) == path


# ---------------------------------------------------------------------------------------------
# CheckpointManager
# ---------------------------------------------------------------------------------------------
class TestManager:
    def test_keeps_the_last_k(self, tmp_path):
        x = plain(0.0)
        d = str(tmp_path)
        mgr = CheckpointManager(Checkpoint(x=x), d, max_to_keep=2)
        assert mgr.latest_checkpoint is None and mgr.checkpoints == []
        paths = []
        for i in range(4):
            x.assign(float(i))
            paths.append(mgr.save())
        assert paths == [os.path.join(d, f"ckpt-{i}") for i in (1, 2, 3, 4)]
        assert mgr.checkpoints == paths[2:] and mgr.latest_checkpoint == paths[3]
        assert files(tmp_path) == ["checkpoint", "ckpt-3", "ckpt-4"]
        assert latest_checkpoint(d) == paths[3]
        state = json.loads((tmp_path / "checkpoint").read_text())
        assert state["all_checkpoints"] == ["ckpt-3", "ckpt-4"]
        assert len(state["all_checkpoint_timestamps"]) == 2

    def test_none_keeps_all_and_numbers_can_be_given(self, tmp_path):
        x = plain(0.0)
        mgr = CheckpointManager(Checkpoint(x=x), str(tmp_path), max_to_keep=None,
                                checkpoint_name="model")
        mgr.save()
        step = plain(100, np.int64)
        mgr.save(checkpoint_number=step)
        mgr.save(checkpoint_number=np.int32(7))
        mgr.save()
        assert [os.path.basename(p) for p in mgr.checkpoints] == \
            ["model-1", "model-100", "model-7", "model-4"]
        assert files(tmp_path) == ["checkpoint", "model-1", "model-100", "model-4", "model-7"]

    def test_resaving_a_kept_number_moves_it_to_the_end(self, tmp_path):
        mgr = CheckpointManager(Checkpoint(x=plain(0.0)), str(tmp_path), max_to_keep=2)
        mgr.save(checkpoint_number=1)
        mgr.save(checkpoint_number=2)
        mgr.save(checkpoint_number=1)
        assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-2", "ckpt-1"]
        mgr.save(checkpoint_number=3)
        assert files(tmp_path) == ["checkpoint", "ckpt-1", "ckpt-3"]

    def test_restarted_job_continues(self, tmp_path):
        d = str(tmp_path)
        x = plain(0.0)
        mgr = CheckpointManager(Checkpoint(x=x), d, max_to_keep=3)
        for i in range(3):
            x.assign(float(i + 1))
            mgr.save()
        # A new process: fresh objects, same directory.
        x2 = plain(0.0)
        ck2 = Checkpoint(x=x2)
        mgr2 = CheckpointManager(ck2, d, max_to_keep=3)
        assert mgr2.checkpoints == mgr.checkpoints
        assert mgr2.latest_checkpoint == mgr.latest_checkpoint
        assert mgr2.restore_or_initialize() == os.path.join(d, "ckpt-3")
        assert x2.numpy() == 3.0 and int(ck2.save_counter.numpy()) == 3
        assert mgr2.save() == os.path.join(d, "ckpt-4")
        assert files(tmp_path) == ["checkpoint", "ckpt-2", "ckpt-3", "ckpt-4"]

    def test_restore_or_initialize_without_checkpoint(self, tmp_path):
        called = []
        mgr = CheckpointManager(Checkpoint(x=plain(0.0)), str(tmp_path / "new"), max_to_keep=1,
                                init_fn=lambda: called.append(1))
        assert mgr.restore_or_initialize() is None and called == [1]

    def test_failed_save_changes_nothing(self, tmp_path, monkeypatch):
        x = plain(0.0)
        mgr = CheckpointManager(Checkpoint(x=x), str(tmp_path), max_to_keep=1)
        first = mgr.save()
        monkeypatch.setattr(file_format, "_write_member",
                            lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
        with pytest.raises(OSError, match="disk gone"):
            mgr.save()
        assert mgr.checkpoints == [first] and files(tmp_path) == ["checkpoint", "ckpt-1"]
        monkeypatch.undo()
        assert mgr.save() == os.path.join(str(tmp_path), "ckpt-2")

    def test_works_under_a_strategy(self, tmp_path):
        s = S(2)
        v, m = on_read(s, Agg.SUM), mirrored_var(s, 2.0)
        set_components(s, v, [3.0, 5.0])
        mgr = CheckpointManager(Checkpoint(v=v, m=m), str(tmp_path), max_to_keep=1)
        path = mgr.save()
        set_components(s, v, [0.0, 0.0])
        assert mgr.restore_or_initialize() == path
        assert comps(v) == [4.0, 4.0] and comps(m) == [2.0, 2.0]

    @pytest.mark.parametrize("kwargs,error,match", [
        ({"max_to_keep": 0}, ValueError, "positive integer or `None` for `max_to_keep`, got 0"),
        ({"max_to_keep": -1}, ValueError, "got -1"),
        ({"max_to_keep": "3"}, ValueError, "got '3'"),
        ({"max_to_keep": True}, ValueError, "got True"),
        ({"max_to_keep": 1, "checkpoint_name": "a/b"}, ValueError, "checkpoint_name"),
        ({"max_to_keep": 1, "checkpoint_name": "checkpoint"}, ValueError, "checkpoint_name"),
        ({"max_to_keep": 1, "keep_checkpoint_every_n_hours": 1}, NotImplementedError,
         "keep_checkpoint_every_n_hours"),
        ({"max_to_keep": 1, "init_fn": 3}, TypeError, "init_fn"),
    ])
    def test_bad_arguments(self, tmp_path, kwargs, error, match):
        with pytest.raises(error, match=match):
            CheckpointManager(Checkpoint(x=plain(0.0)), str(tmp_path), **kwargs)

    def test_bad_checkpoint_and_directory(self, tmp_path):
        with pytest.raises(TypeError, match="needs an mpidist.train.Checkpoint, got a Variable"):
            CheckpointManager(plain(0.0), str(tmp_path), max_to_keep=1)
        with pytest.raises(TypeError, match="directory must be a path"):
            CheckpointManager(Checkpoint(x=plain(0.0)), None, max_to_keep=1)
        mgr = CheckpointManager(Checkpoint(x=plain(0.0)), str(tmp_path), max_to_keep=1)
        with pytest.raises(TypeError, match="checkpoint_number must be an integer"):
            mgr.save(checkpoint_number=1.5)
        with pytest.raises(TypeError, match="checkpoint_number must be an integer"):
            mgr.save(checkpoint_number=True)

    def test_corrupt_state_file(self, tmp_path):
        """A damaged state file does not hide the checkpoints: the manager warns and takes the
        numbered files in the directory (the highest number is the latest)."""
        x = plain(0.0)
        manager = CheckpointManager(Checkpoint(x=x), str(tmp_path), max_to_keep=3)
        for value in (1.0, 2.0):
            x.assign(value)
            manager.save()
        (tmp_path / "checkpoint").write_text("{not json")
        with pytest.raises(InvalidArgumentError, match="corrupt"):
            latest_checkpoint(str(tmp_path))
        fresh = plain(0.0)
        with pytest.warns(RuntimeWarning, match=r"state file .* is corrupt.*using the 2 "
                                                r"checkpoint files named ckpt-<n>"):
            again = CheckpointManager(Checkpoint(x=fresh), str(tmp_path), max_to_keep=3)
        assert again.checkpoints == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-2")]
        assert again.restore_or_initialize() == str(tmp_path / "ckpt-2")
        assert fresh.numpy() == 2.0
