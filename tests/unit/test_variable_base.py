"""One Variable base (issue 24, item 3): every variable kind initialises through
``VariableBase.__init__`` and declares none of the identity properties again.

The mechanism is checked two ways: over every subclass of ``VariableBase`` that importing
mpidist defines (none re-declares an identity property or writes an identity field), and on
an instance of each kind, built as users get it, whose initialisation is counted.
"""

import ast
import inspect
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.ps.variables import PSVariable
from mpidist.values.aggregating import AggregatingVariable
from mpidist.values.distributed_variables import MirroredVariable, SyncOnReadVariable
from mpidist.values.variable_base import ArrayIdentity, VariableBase

from ps_cluster import ps_job

IDENTITY = {"name", "dtype", "shape", "ndim", "size", "device", "device_spec", "trainable",
            "synchronization", "aggregation", "distribute_strategy"}
FIELDS = {"_name", "_dtype", "_shape", "_size", "_device", "_trainable", "_synchronization",
          "_aggregation", "_distribute_strategy", "distributed_container"}
Sync, Agg = mpidist.VariableSynchronization, mpidist.VariableAggregation


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


KINDS = sorted({c for c in _subclasses(VariableBase) if c.__module__.startswith("mpidist.")},
               key=lambda c: c.__qualname__)


def test_the_walk_sees_every_kind():
    assert {mpidist.Variable, MirroredVariable, SyncOnReadVariable, AggregatingVariable,
            PSVariable} <= set(KINDS)


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__qualname__)
def test_no_kind_redeclares_an_identity_property(kind):
    assert not IDENTITY & set(vars(kind)), (
        f"{kind.__qualname__} declares {sorted(IDENTITY & set(vars(kind)))} again: the "
        "identity is VariableBase's (pass it to VariableBase.__init__ instead)")


def _identity_writes(cls):
    """The identity fields ``cls``'s own source assigns on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {target.attr for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == "self" and target.attr in FIELDS}


@pytest.mark.parametrize("kind", KINDS, ids=lambda c: c.__qualname__)
def test_no_kind_writes_an_identity_field(kind):
    written = _identity_writes(kind)
    assert not written, f"{kind.__qualname__} sets {sorted(written)} itself"


def test_the_field_check_sees_a_direct_write():
    class Bypassing(mpidist.Variable):
        def __init__(self):
            self._name: str = "x:0"
            self.distributed_container = None

    assert _identity_writes(Bypassing) == {"_name", "distributed_container"}


@pytest.fixture
def counted(monkeypatch):
    """The instances whose ``VariableBase.__init__`` ran, in order."""
    seen = []
    original = VariableBase.__init__

    def init(self, **kwargs):
        seen.append(self)
        original(self, **kwargs)

    monkeypatch.setattr(VariableBase, "__init__", init)
    return seen


def _once_each(seen, *variables):
    for v in variables:
        assert sum(s is v for s in seen) == 1, f"{type(v).__name__} was not initialised once"


def test_plain_and_one_device_variables_initialise_through_the_base(counted):
    v = mpidist.Variable(np.ones(3), name="v")
    with mpidist.OneDeviceStrategy("/cpu:0").scope():
        w = mpidist.Variable(1.0)
    c = mpidist.Variable.plain(2.0, distribute_strategy="owner")
    _once_each(counted, v, w, c)
    assert c.distribute_strategy == "owner" and v.distribute_strategy is None


@pytest.mark.parametrize("sync", [Sync.ON_WRITE, Sync.ON_READ])
def test_distributed_variables_initialise_through_the_base(counted, sync):
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = mpidist.Variable(np.ones(2), synchronization=sync, aggregation="SUM")
    _once_each(counted, v, *v.values)
    assert type(v) is (MirroredVariable if sync is Sync.ON_WRITE else SyncOnReadVariable)


def test_aggregating_variables_initialise_through_the_base(counted):
    strategy = mpidist.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = mpidist.Variable(np.ones(2), aggregation="MEAN")
    assert type(v) is AggregatingVariable
    _once_each(counted, v, v.get())


@pytest.mark.timeout(60)
def test_parameter_server_variables_initialise_through_the_base(counted):
    with ps_job(num_ps=1, num_workers=1) as (strategy, _):
        with strategy.scope():
            v = mpidist.Variable(np.ones((3, 2), np.float32), name="ps")
        ps_variables = [x for x in counted if isinstance(x, PSVariable)]
        assert ps_variables and all(sum(s is x for s in counted) == 1 for x in ps_variables)
        assert type(v) is PSVariable and v.name == v.handle.name  # the handle's, as before
        assert (v.dtype, v.shape, v.ndim, v.size) == (np.float32, (3, 2), 2, 6)
        assert "/job:ps/" in v.device and v.trainable and v.aggregation is Agg.NONE
        assert v.distribute_strategy is strategy


_dtypes = st.sampled_from([np.float32, np.float64, np.int32])
_shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)
_aggs = st.sampled_from([Agg.NONE, Agg.SUM, Agg.ONLY_FIRST_REPLICA, "sum", "mean"])
_trainable = st.sampled_from([None, True, False])


def _expected(name, dtype, shape, trainable, sync, agg):
    return {"name": f"{name}:0", "dtype": np.dtype(dtype), "shape": shape, "ndim": len(shape),
            "size": int(np.prod(shape, dtype=np.int64)),
            "trainable": sync is not Sync.ON_READ if trainable is None else trainable,
            "aggregation": Agg[agg.upper()] if isinstance(agg, str) else agg}


def _identity(v):
    return {k: getattr(v, k) for k in ("name", "dtype", "shape", "ndim", "size", "trainable",
                                       "aggregation")}


@settings(max_examples=30, deadline=None)
@given(dtype=_dtypes, shape=_shapes, trainable=_trainable, agg=_aggs,
       sync=st.sampled_from([Sync.AUTO, Sync.ON_WRITE, Sync.ON_READ, Sync.NONE]))
def test_a_plain_variable_reports_the_identity_it_was_given(dtype, shape, trainable, agg, sync):
    v = mpidist.Variable(np.zeros(shape, dtype), trainable=trainable, name="w",
                         synchronization=sync, aggregation=agg)
    assert _identity(v) == _expected("w", dtype, shape, trainable, sync, agg)
    assert v.synchronization is sync and v.device_spec is None
    assert v.device == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert v.distribute_strategy is None and v.distributed_container is None


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), shape=_shapes, trainable=_trainable,
       agg=_aggs, on_read=st.booleans())
def test_a_distributed_variable_reports_its_primary_copys_identity(dtype, shape, trainable, agg,
                                                                   on_read):
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    sync = Sync.ON_READ if on_read else Sync.ON_WRITE
    with strategy.scope():
        v = mpidist.Variable(np.zeros(shape, dtype), trainable=trainable, name="m",
                             synchronization=sync, aggregation=agg)
    assert _identity(v) == _expected("m", dtype, shape, trainable, sync, agg)
    assert v.synchronization is sync and v.distribute_strategy is strategy
    assert (v.device, v.device_spec) == (v.values[0].device, v.values[0].device_spec)
    assert [c.name for c in v.values] == ["m:0", "m/replica_1:0"]
    assert all(c.distributed_container is v for c in v.values)


@pytest.mark.parametrize("sync", [Sync.AUTO, Sync.ON_READ])
def test_an_aggregating_variable_reports_the_wrapped_identity(sync):
    strategy = mpidist.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = mpidist.Variable(np.zeros((2, 3), np.float32), name="c", synchronization=sync,
                             aggregation="sum")
    inner = v.get()
    assert _identity(v) == _identity(inner)
    assert (v.device, v.device_spec, v.synchronization) == (
        inner.device, inner.device_spec, inner.synchronization)
    assert v.aggregation is Agg.SUM and v.distribute_strategy is strategy


BAD = [({"synchronization": "sometimes"}, ValueError, "Invalid variable synchronization mode"),
       ({"aggregation": "MAX"}, ValueError, "Invalid variable aggregation mode: 'MAX'"),
       ({"name": 3}, TypeError, "Variable name must be a string, got 3."),
       ({"device": "/tpu:0"}, ValueError, "Cannot parse device string '/tpu:0'")]


@pytest.mark.parametrize("make", [mpidist.Variable, mpidist.Variable.plain], ids=["call", "plain"])
@pytest.mark.parametrize("bad, error, message", BAD, ids=[str(b) for b, _, _ in BAD])
def test_arguments_are_checked_before_initial_value_is_called(make, bad, error, message):
    called = []
    with pytest.raises(error, match=message.replace("(", r"\(")):
        make(lambda: called.append(1) or 1.0, **bad)
    assert called == []  # as TF: a wrong argument never runs the user's initializer


def test_the_base_needs_a_layout():
    with pytest.raises(TypeError, match="dtype and shape"):
        VariableBase(name="x:0")


def test_a_sharded_variable_shares_the_array_identity():
    sv = ShardedVariable([mpidist.Variable(np.zeros((2, 3))), mpidist.Variable(np.zeros((1, 3)))])
    assert isinstance(sv, ArrayIdentity) and not isinstance(sv, mpidist.Variable)
    assert (sv.name, sv.dtype, sv.shape, sv.ndim) == ("ShardedVariable", np.float64, (3, 3), 2)


def test_identity_survives_adopting_storage():
    v = mpidist.Variable(np.arange(6.0).reshape(2, 3))
    arena = np.zeros(10)
    v.adopt_storage(arena[2:8].reshape(2, 3))
    assert (v.dtype, v.shape, v.size) == (np.float64, (2, 3), 6)
    np.testing.assert_array_equal(arena[2:8], np.arange(6.0))
