"""ShardedVariable (spec section 9.4), the sparse Variable operations it rests on
(``sparse_read``, ``scatter_*`` with ``mpidist.IndexedSlices``), ``mpidist.nn.embedding_lookup``
and checkpoints of sharded variables restored into other shard counts."""

import numpy as np
import pytest

import mpidist
from mpidist import IndexedSlices
from mpidist.errors import InvalidArgumentError
from mpidist.nn import embedding_lookup
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.train import Checkpoint
from replicas import mirrored

V = mpidist.Variable
TABLE = np.arange(10, dtype=np.float32).reshape(5, 2)  # row i is [2i, 2i + 1]


def sharded(rows=(3, 2), table=TABLE, name=None):
    """A ShardedVariable over plain Variables holding ``table`` cut into ``rows``."""
    bounds = np.cumsum((0,) + tuple(rows))
    shards = [V(table[a:b], name=f"v/part_{i}") for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return ShardedVariable(shards) if name is None else ShardedVariable(shards, name=name)


def shard_values(sv):
    return [v.numpy().tolist() for v in sv.variables]


# -- construction ---------------------------------------------------------------------------------
def test_shape_dtype_name_and_shards():
    sv = sharded()
    assert sv.shape == (5, 2) and sv.dtype == np.float32 and sv.ndim == 2
    assert sv.name == "ShardedVariable"
    assert isinstance(sv.variables, tuple) and len(sv.variables) == 2
    assert sv.shard_rows == (3, 2)
    assert list(sv) == list(sv.variables)  # iterating yields the shards, as TF
    assert sv.trainable is True and sv.distribute_strategy is None
    assert sharded(name="emb").name == "emb"
    assert ShardedVariable([V([1.0], trainable=False)]).trainable is False


@pytest.mark.parametrize("bad", [[], (), None, [np.zeros(2)], [V([1.0]), 3.0], "ab"])
def test_constructor_needs_a_non_empty_list_of_variables(bad):
    with pytest.raises(TypeError) as info:
        ShardedVariable(bad)
    assert str(info.value) == ("Argument `variables` should be a non-empty list of "
                               f"`variables.Variable`s. Received {bad!r}")


def test_constructor_message_for_an_empty_list_is_tfs():
    with pytest.raises(TypeError) as info:
        ShardedVariable([])
    assert str(info.value).endswith("`variables.Variable`s. Received []")


def test_constructor_refuses_mixed_dtypes():
    with pytest.raises(ValueError) as info:
        ShardedVariable([V(np.zeros((1, 2), np.float32)), V(np.zeros((1, 2), np.int32))])
    assert str(info.value) == ("All elements in argument `variables` must have the same dtype. "
                               "Received dtypes: [float32, int32]")


def test_constructor_refuses_shapes_that_differ_beyond_axis_0():
    with pytest.raises(ValueError) as info:
        ShardedVariable([V(np.zeros((1, 2))), V(np.zeros((1, 3)))])
    assert str(info.value) == ("All elements in argument `variables` must have the same shapes "
                               "except for the first axis. Received shapes: [(1, 2), (1, 3)]")
    with pytest.raises(ValueError, match=r"rank >= 1 .* Received shapes: \[\(\), \(\)\]"):
        ShardedVariable([V(1.0), V(2.0)])


# -- reads ----------------------------------------------------------------------------------------
def test_reads_concatenate_the_shards():
    sv = sharded()
    for read in (np.asarray(sv), sv.numpy(), sv.read_value(), sv.value()):
        assert isinstance(read, np.ndarray)
        np.testing.assert_array_equal(read, TABLE)
    assert np.asarray(sv, dtype=np.int64).dtype == np.int64
    assert sv[4].tolist() == [8.0, 9.0] and sv[-5].tolist() == [0.0, 1.0]
    assert sv[3, 1] == 7.0 and sv[1:4, 0].tolist() == [2.0, 4.0, 6.0]
    with pytest.raises(IndexError, match="slice index 5 of dimension 0 out of bounds"):
        sv[5]
    text = repr(sv)
    assert "'ShardedVariable' shape=(5, 2) dtype=float32 shards=[(3, 2), (2, 2)]" in text
    assert "[8., 9.]" in text


def test_sparse_read_keeps_the_order_asked_and_the_ids_shape():
    sv = sharded()
    assert sv.sparse_read([4, 0, 3]).tolist() == [[8, 9], [0, 1], [6, 7]]
    got = sv.sparse_read(np.array([[1, 4], [4, 2]]))
    assert got.shape == (2, 2, 2) and got[:, :, 0].tolist() == [[2, 8], [8, 4]]
    assert sv.sparse_read(np.zeros(0, np.int64)).shape == (0, 2)


def test_sparse_read_asks_each_touched_shard_once():
    sv = sharded((2, 2, 1))
    calls = []
    for i, shard in enumerate(sv.variables):
        original = shard.sparse_read
        shard.sparse_read = (lambda ids, original=original, i=i:
                             calls.append((i, list(ids))) or original(ids))
    assert sv.sparse_read([1, 0, 1, 4]).tolist() == [[2, 3], [0, 1], [2, 3], [8, 9]]
    assert calls == [(0, [1, 0, 1]), (2, [0])]


@pytest.mark.parametrize("ids, where", [([0, 5], "indices[1] = 5"), ([-1], "indices[0] = -1"),
                                        ([[0], [7]], "indices[1,0] = 7")])
def test_sparse_read_out_of_range_is_invalid_argument(ids, where):
    with pytest.raises(InvalidArgumentError, match=rf"{where.replace('[', '.').replace(']', '.')} "
                                                   r"is not in \[0, 5\)"):
        sharded().sparse_read(ids)


# -- dense updates --------------------------------------------------------------------------------
def test_assign_splits_the_value_by_shard():
    sv = sharded()
    new = TABLE * 10
    assert sv.assign(new) is sv
    assert shard_values(sv) == [new[:3].tolist(), new[3:].tolist()]
    sv.assign_add(np.ones((5, 2)))
    sv.assign_sub(np.full((5, 2), 2.0), read_value=False)
    np.testing.assert_array_equal(np.asarray(sv), new - 1)
    sv.assign(sharded(table=TABLE + 1))  # another ShardedVariable's value
    np.testing.assert_array_equal(np.asarray(sv), TABLE + 1)


def test_bad_assign_changes_no_shard():
    sv = sharded()
    with pytest.raises(ValueError, match=r"assign a value of shape \(4, 2\) to ShardedVariable "
                                         r"'ShardedVariable' of shape \(5, 2\)"):
        sv.assign(np.zeros((4, 2)))
    bad = np.zeros((5, 2), dtype=np.complex64)  # fails the dtype check of every shard
    with pytest.raises(TypeError):
        sv.assign_add(bad)
    np.testing.assert_array_equal(np.asarray(sv), TABLE)


def test_shards_with_any_row_split_work():
    sv = sharded((1, 4))  # not a div split
    assert sv.sparse_read([0, 1, 4]).tolist() == [[0, 1], [2, 3], [8, 9]]
    sv.scatter_update(IndexedSlices(np.array([[-1, -1]]), [2]))
    assert shard_values(sv)[1][1] == [-1, -1]


# -- scatter --------------------------------------------------------------------------------------
def test_scatter_add_routes_rows_and_accumulates_duplicates():
    sv = sharded()
    out = sv.scatter_add(IndexedSlices(np.ones((4, 2), np.float32), np.array([4, 0, 4, 3])))
    assert out is sv
    expected = TABLE.copy()
    expected[[0, 3]] += 1
    expected[4] += 2
    np.testing.assert_array_equal(np.asarray(sv), expected)


def test_scatter_sub_and_update():
    sv = sharded()
    sv.scatter_sub(IndexedSlices(np.full((2, 2), 0.5), [1, 3]))
    sv.scatter_update(IndexedSlices(np.array([[-1.0, -2.0]]), [4]))
    assert np.asarray(sv).tolist() == [[0, 1], [1.5, 2.5], [4, 5], [5.5, 6.5], [-1, -2]]
    sv.scatter_update(IndexedSlices(np.float32(7.0), [0, 2]))  # a scalar fills the rows
    assert np.asarray(sv)[[0, 2]].tolist() == [[7, 7], [7, 7]]


def test_scatter_only_touches_the_shards_holding_the_rows():
    sv = sharded((2, 2, 1))
    touched = []
    for i, shard in enumerate(sv.variables):
        original = shard.scatter_add
        shard.scatter_add = (lambda d, original=original, i=i:
                             touched.append((i, d.indices.tolist())) or original(d))
    sv.scatter_add(IndexedSlices(np.ones((2, 2)), [3, 2]))
    assert touched == [(1, [1, 0])]


def test_bad_scatter_changes_nothing():
    sv = sharded()
    with pytest.raises(InvalidArgumentError, match=r"indices\[1\] = 9 is not in \[0, 5\)"):
        sv.scatter_add(IndexedSlices(np.ones((2, 2)), [0, 9]))
    with pytest.raises(InvalidArgumentError, match=r"updates.shape = indices.shape \+ "
                                                   r"params.shape\[1:\] .* got updates.shape "
                                                   r"\(2, 3\), indices.shape \(2,\), "
                                                   r"params.shape \(5, 2\)"):
        sv.scatter_update(IndexedSlices(np.ones((2, 3)), [0, 4]))
    with pytest.raises(TypeError, match="cannot go into dtype float32"):
        sv.scatter_add(IndexedSlices(np.ones((2, 2), np.complex64), [0, 4]))
    with pytest.raises(TypeError, match="sparse_delta is not IndexedSlices"):
        sv.scatter_add(np.ones((5, 2)))
    np.testing.assert_array_equal(np.asarray(sv), TABLE)


# -- IndexedSlices and the plain Variable's sparse operations -------------------------------------
def test_indexed_slices_fields_and_dense_form():
    s = IndexedSlices([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [2, 0, 2], dense_shape=(4, 2))
    assert s.values.shape == (3, 2) and s.indices.tolist() == [2, 0, 2]
    assert s.dense_shape == (4, 2) and s.shape == (4, 2) and s.dtype == np.float64
    assert np.asarray(s).tolist() == [[3, 4], [0, 0], [6, 8], [0, 0]]
    assert IndexedSlices(np.ones(2), [0, 1]).dense_shape is None
    with pytest.raises(ValueError, match="without dense_shape cannot become a dense array"):
        np.asarray(IndexedSlices(np.ones(2), [0, 1]))
    with pytest.raises(TypeError, match="dense_shape must be a sequence of ints"):
        IndexedSlices(np.ones(2), [0, 1], dense_shape=(2.5,))
    assert mpidist.IndexedSlices is IndexedSlices and "IndexedSlices" in mpidist.__all__


def test_variable_sparse_read():
    v = V(TABLE)
    got = v.sparse_read([3, 3, 0])
    assert got.tolist() == [[6, 7], [6, 7], [0, 1]] and got.dtype == np.float32
    got[0, 0] = 100.0  # a copy, not a view
    assert v.numpy()[3, 0] == 6.0
    assert V([5, 6, 7]).sparse_read(np.array([[2], [0]])).tolist() == [[7], [5]]
    with pytest.raises(InvalidArgumentError) as info:
        v.sparse_read([1, 5])
    assert str(info.value).startswith("indices[1] = 5 is not in [0, 5) (sparse_read of variable "
                                      "'Variable:0')")
    with pytest.raises(TypeError, match="indices must be integers, got dtype float64"):
        v.sparse_read([1.0])
    with pytest.raises(ValueError, match="variable 'Variable:0' is a scalar"):
        V(1.0).sparse_read([0])


def test_variable_scatter_ops_update_in_place_and_return_the_variable():
    v = V(np.zeros((4, 2), np.float32))
    storage = v.storage
    assert v.scatter_add(IndexedSlices(np.ones((3, 2)), [1, 1, 3])) is v
    assert v.numpy().tolist() == [[0, 0], [2, 2], [0, 0], [1, 1]]
    assert v.scatter_sub(IndexedSlices(np.full((1, 2), 0.5), [3])) is v
    assert v.scatter_update(IndexedSlices(np.array([[9, 8]], np.int32), [0])) is v
    assert v.numpy().tolist() == [[9, 8], [2, 2], [0, 0], [0.5, 0.5]]
    assert v.storage is storage  # written in place
    iv = V(np.zeros(3, np.int64))
    iv.scatter_add(IndexedSlices(np.array([[1, 2, 3]]), np.array([[0, 2, 2]])))  # 2-D indices
    assert iv.numpy().tolist() == [1, 0, 5]


def test_variable_bad_scatter_changes_nothing():
    v = V(np.zeros((3, 2)))
    for delta, error, text in [
        (IndexedSlices(np.ones((2, 2)), [0, 3]), InvalidArgumentError, r"indices\[1\] = 3"),
        (IndexedSlices(np.ones((2, 2)), [0]), InvalidArgumentError, r"updates.shape \(2, 2\)"),
        (IndexedSlices(np.ones((1, 2), bool), [0]), TypeError, "dtype bool"),
        (np.ones((3, 2)), TypeError, "sparse_delta is not IndexedSlices"),
    ]:
        with pytest.raises(error, match=text):
            v.scatter_add(delta)
    assert v.numpy().tolist() == [[0, 0]] * 3


def test_mirrored_variable_scatter_updates_every_copy():
    strategy = mirrored(2)
    with strategy.scope():
        v = V(np.zeros((3, 2), np.float32))
    v.scatter_add(IndexedSlices(np.ones((2, 2)), [2, 2]))
    v.scatter_update(IndexedSlices(np.full((1, 2), 5.0), [0]))
    for copy in v.values:
        assert copy.numpy().tolist() == [[5, 5], [0, 0], [2, 2]]
    assert v.sparse_read([2, 0]).tolist() == [[2, 2], [5, 5]]


# -- embedding_lookup -----------------------------------------------------------------------------
def test_embedding_lookup_on_a_sharded_variable_is_the_spec_example():
    sv = sharded((3, 2))
    assert shard_values(sv) == [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9]]]
    assert embedding_lookup(sv, [4, 0, 3]).tolist() == [[8, 9], [0, 1], [6, 7]]


@pytest.mark.parametrize("params", [
    lambda: V(TABLE), lambda: sharded((2, 2, 1)), lambda: list(sharded((2, 3)).variables),
    lambda: [V(TABLE)], lambda: TABLE, lambda: [TABLE[:2], TABLE[2:]],
])
def test_embedding_lookup_on_every_kind_of_params(params):
    ids = np.array([[4, 1], [0, 0]])
    got = np.asarray(embedding_lookup(params(), ids))
    assert got.shape == (2, 2, 2)
    np.testing.assert_array_equal(got, TABLE[ids])


def test_embedding_lookup_errors_name_the_id_and_the_range():
    for params in (sharded(), V(TABLE), TABLE):
        with pytest.raises(InvalidArgumentError, match=r"indices\[2\] = 6 is not in \[0, 5\)"):
            embedding_lookup(params, [0, 1, 6])
    with pytest.raises(ValueError, match="Need at least one param"):
        embedding_lookup([], [0])


def test_embedding_lookup_max_norm_scales_long_rows_down():
    table = np.array([[3.0, 4.0], [0.3, 0.4]])
    got = embedding_lookup(V(table), [0, 1], max_norm=1.0)
    np.testing.assert_allclose(got, [[0.6, 0.8], [0.3, 0.4]])


# -- checkpoints ----------------------------------------------------------------------------------
def test_sharded_variable_saves_one_full_array_under_its_key(tmp_path):
    from mpidist.training.checkpoint_format import read_checkpoint_file

    path = Checkpoint(v=sharded()).write(str(tmp_path / "ckpt"))
    _, saved = read_checkpoint_file(path)
    assert set(saved) == {"v", "save_counter"}
    assert saved["v"].shape == (5, 2) and saved["v"].dtype == np.float32
    np.testing.assert_array_equal(saved["v"], TABLE)


def test_restore_into_another_number_of_shards(tmp_path):
    path = Checkpoint(v=sharded((3, 2))).write(str(tmp_path / "ckpt"))
    target = sharded((2, 2, 1), table=np.zeros((5, 2), np.float32))
    status = Checkpoint(v=target).restore(path)
    assert status.restored == ("v", "save_counter")
    assert shard_values(target) == [TABLE[:2].tolist(), TABLE[2:4].tolist(), TABLE[4:].tolist()]


def test_sharded_restores_into_plain_and_plain_into_sharded(tmp_path):
    sharded_path = Checkpoint(v=sharded((3, 2))).write(str(tmp_path / "sharded"))
    plain = V(np.zeros((5, 2), np.float32))
    Checkpoint(v=plain).restore(sharded_path)
    np.testing.assert_array_equal(plain.numpy(), TABLE)

    plain_path = Checkpoint(v=V(TABLE * 2)).write(str(tmp_path / "plain"))
    target = sharded((3, 2), table=np.zeros((5, 2), np.float32))
    Checkpoint(v=target).restore(plain_path)
    np.testing.assert_array_equal(np.asarray(target), TABLE * 2)


def test_restore_into_a_sharded_variable_of_another_shape_changes_nothing(tmp_path):
    path = Checkpoint(v=sharded()).write(str(tmp_path / "ckpt"))
    target = sharded((2, 2), table=np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"checkpoint holds shape \(5, 2\) dtype float32, the "
                                         r"variable has shape \(4, 2\)"):
        Checkpoint(v=target).restore(path)
    assert np.asarray(target).tolist() == [[0, 0]] * 4


def test_sharded_variable_inside_a_trackable_and_restored_later(tmp_path):
    class Model:
        def __init__(self, table):
            self.embedding = table

        def _checkpoint_dependencies(self):
            return {"embedding": self.embedding}

    path = Checkpoint(model=Model(sharded())).save(str(tmp_path / "ckpt"))
    model = Model(None)
    checkpoint = Checkpoint(model=model)
    status = checkpoint.restore(path)
    assert status.unused == ("model/embedding",)
    model.embedding = sharded((1, 1, 3), table=np.zeros((5, 2), np.float32))
    status.run_restore_ops()  # deferred restore into the sharded variable created after
    np.testing.assert_array_equal(np.asarray(model.embedding), TABLE)


def test_shards_made_in_a_mirrored_scope_are_refused_by_name():
    """A shard is written in place, one copy: MirroredVariables (one copy per replica) are
    refused at construction, naming them (was an AttributeError on the first assign)."""
    with mirrored(2).scope():
        shards = [V(np.ones(2)), V(np.ones(1))]
    with pytest.raises(TypeError, match=r"`variables` should hold one copy each .* got "
                                        r"MirroredVariable, MirroredVariable"):
        ShardedVariable(shards)
