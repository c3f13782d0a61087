"""Input mistakes on one worker: each gets a clear error (the builtin or mpidist.errors type TF
would raise) whose message names the offending value and says the fix, and leaves the
dataset, options and strategy as they were, still usable.

Before these checks, several of these inputs were silently misread: a bare array was read as
one global batch per row, ``shard(2.5, 0)`` as ``shard(2, 0)``, ``drop_remainder="False"`` as
True, ``take(-2)`` as "take all", a map function returning None as a dataset of None objects,
and ``options.auto_shard_policy = OFF`` (a misplaced option) was ignored.
"""

import re

import numpy as np
import pytest

import mpidist
from mpidist.data import Dataset, Options, TensorSpec
from mpidist.data.experimental import AutoShardPolicy
from mpidist.errors import InvalidArgumentError

from replicas import mirrored

X = np.arange(24, dtype=np.float64).reshape(8, 3)
Y = np.arange(8)
FIX = re.escape("mpidist.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH)")
PER_REPLICA_FIX = re.escape("mpidist.data.Dataset.from_tensor_slices(x).batch("
                            "input_context.get_per_replica_batch_size(GLOBAL_BATCH))")


def steps(strategy, dist):
    return [[np.asarray(v).tolist() for v in strategy.experimental_local_results(x)] for x in dist]


def source():
    """A small batched dataset and the steps it gives over 2 replicas (to show it is intact)."""
    return Dataset.from_tensor_slices((X, Y)).batch(4)


def assert_distributes_normally(strategy):
    """The strategy still splits a proper dataset after refusing a bad input."""
    got = steps(strategy, strategy.experimental_distribute_dataset(Dataset.range(4).batch(4)))
    assert got == [[[0, 1], [2, 3]]]


# -- experimental_distribute_dataset: inputs that are not streams of global batches --------------
DISTRIBUTE_MISTAKES = [
    ("bare 2-D array", lambda: np.ones((512, 3)),
     [r"was given a numpy\.ndarray of shape \(512, 3\) and dtype float64",
      r"iterating it gives 512 batch\(es\) of one row each", FIX]),
    ("bare 1-D array", lambda: np.arange(6),
     [r"numpy\.ndarray of shape \(6,\) and dtype int64", "6 batch", FIX]),
    ("0-d array", lambda: np.array(3.0),
     [r"numpy\.ndarray of shape \(\) and dtype float64", "a single value", FIX]),
    ("tuple of arrays", lambda: (X, Y),
     [r"a tuple of 2 item\(s\) \(shape \(8, 3\), shape \(8,\)\)",
      r"gives its 2 component\(s\) as separate batches", FIX]),
    ("dict of arrays", lambda: {"x": X, "y": Y},
     [r"a dict with keys \['x', 'y'\]", "iterating it gives its keys", FIX]),
    ("scalar", lambda: 512, [r"an int \(512\)", "not a stream of batches", FIX]),
    ("string", lambda: "train.csv", [r"a str \('train\.csv'\)", "gives its characters", FIX]),
    ("None", lambda: None, ["was given None", FIX]),
    ("list of numbers", lambda: [1.0, 2.0],
     [r"item 0 of the list has a component that is a float \(1\.0\)", FIX]),
    ("list of Python rows", lambda: [[1, 2, 3], [4, 5, 6]],
     [r"item 0 of the list has a component that is an int \(1\)", FIX]),
    ("list with an unbatched item", lambda: [np.ones((4, 2)), np.float32(1)],
     [r"item 1 of the list has a component that is a float32", FIX]),
    ("a dataset function", lambda: (lambda ctx: Dataset.range(4).batch(2)),
     ["not iterable", r"strategy\.distribute_datasets_from_function\(dataset_fn\) instead"]),
]


@pytest.mark.parametrize("make, parts", [c[1:] for c in DISTRIBUTE_MISTAKES],
                         ids=[c[0] for c in DISTRIBUTE_MISTAKES])
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_distributing_what_is_not_a_dataset_of_batches(make, parts, replicas):
    s = mirrored(replicas) if replicas > 1 else mpidist.OneDeviceStrategy("/cpu:0")
    value = make()
    with pytest.raises(TypeError) as info:
        s.experimental_distribute_dataset(value)
    for part in parts:
        assert re.search(part, str(info.value)), (part, str(info.value))
    if isinstance(value, np.ndarray):  # the user's array is not touched
        assert value.flags.writeable and value.shape == make().shape
    if replicas == 2:
        assert_distributes_normally(s)


def test_default_strategy_refuses_a_bare_array_too():
    """The default strategy hands a dataset back unchanged, so a bare array would be iterated
    row by row by the user's loop: it is refused the same way."""
    s = mpidist.get_strategy()
    with pytest.raises(TypeError, match=r"numpy\.ndarray of shape \(512, 3\).*" + FIX):
        s.experimental_distribute_dataset(np.ones((512, 3)))
    ds = source()
    assert s.experimental_distribute_dataset(ds) is ds


def test_distributing_a_distributed_dataset():
    s = mirrored(2)
    dist = s.experimental_distribute_dataset(Dataset.range(6).batch(4))
    with pytest.raises(TypeError, match="was given a DistributedDataset, which is already "
                                        "distributed.*iterate it directly"):
        s.experimental_distribute_dataset(dist)
    assert steps(s, dist) == [[[0, 1], [2, 3]], [[4], [5]]]


def test_dataset_options_given_as_input_options():
    s = mirrored(2)
    options = Options()
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.OFF
    with pytest.raises(TypeError, match=r"options must be an mpidist\.InputOptions, got an Options "
                                        r"\(Options\(auto_shard_policy=OFF.*set them with "
                                        r"dataset\.with_options\(options\)"):
        s.experimental_distribute_dataset(Dataset.range(4).batch(4), options)
    assert options.experimental_distribute.auto_shard_policy is AutoShardPolicy.OFF
    assert_distributes_normally(s)


def test_second_pass_over_a_generator_object():
    """A generator object gives one pass; a second iter() used to give no step at all."""
    s = mirrored(2)
    dist = s.experimental_distribute_dataset(b for b in [np.arange(4), np.arange(4, 6)])
    assert steps(s, dist) == [[[0, 1], [2, 3]], [[4], [5]]]
    with pytest.raises(RuntimeError, match=r"one-shot iterator .* already iterated once.*"
                                           r"Dataset\.from_generator\(gen\)"):
        iter(dist)
    listed = s.experimental_distribute_dataset([np.arange(4), np.arange(4, 6)])
    assert steps(s, listed) == steps(s, listed) == [[[0, 1], [2, 3]], [[4], [5]]]


# -- distribute_datasets_from_function -----------------------------------------------------------
def test_dataset_fn_returning_an_array():
    s = mirrored(2)
    with pytest.raises(TypeError, match=r"dataset_fn returned a numpy\.ndarray of shape \(8, 3\) "
                                        r"and dtype float64.*" + PER_REPLICA_FIX):
        s.distribute_datasets_from_function(lambda ctx: X)
    assert X.shape == (8, 3) and X[1, 0] == 3.0


def test_dataset_fn_returning_none():
    s = mirrored(2)

    def forgot_return(ctx):
        Dataset.range(4).batch(2)

    with pytest.raises(TypeError, match="dataset_fn returned None: it is not a stream of batches.*"
                                        + PER_REPLICA_FIX):
        s.distribute_datasets_from_function(forgot_return)


def test_dataset_fn_returning_a_distributed_dataset():
    s = mirrored(2)
    dist = s.experimental_distribute_dataset(source())
    with pytest.raises(TypeError, match="distribute_datasets_from_function was given a "
                                        "DistributedDataset"):
        s.distribute_datasets_from_function(lambda ctx: dist)


def test_dataset_fn_without_an_argument():
    s = mirrored(2)
    calls = []

    def dataset_fn():
        calls.append(1)
        return Dataset.range(4).batch(2)

    with pytest.raises(TypeError, match=r"dataset_fn must take one argument, the "
                                        r"mpidist\.InputContext, but .*dataset_fn\(\) cannot be "
                                        r"called with one positional argument.*"
                                        r"def dataset_fn\(input_context\)"):
        s.distribute_datasets_from_function(dataset_fn)
    assert calls == []  # refused before it ran
    got = steps(s, s.distribute_datasets_from_function(lambda ctx: dataset_fn()))
    assert got == [[[0, 1], [2, 3]]]


def test_dataset_given_instead_of_a_function():
    s = mirrored(2)
    ds = Dataset.range(4).batch(2)
    with pytest.raises(TypeError, match=r"dataset_fn must be a function of one argument.*got a "
                                        r"dataset \(<BatchDataset.*experimental_distribute_dataset"):
        s.distribute_datasets_from_function(ds)
    assert [b.tolist() for b in ds] == [[0, 1], [2, 3]]


def test_per_replica_batch_size_of_a_string():
    ctx = mpidist.InputContext(1, 0, 2)
    with pytest.raises(TypeError, match="global_batch_size must be an int, got '64' of type str"):
        ctx.get_per_replica_batch_size("64")
    with pytest.raises(TypeError, match="got 64.0 of type float"):
        ctx.get_per_replica_batch_size(64.0)
    with pytest.raises(ValueError, match="global_batch_size must be greater than zero, got 0"):
        ctx.get_per_replica_batch_size(0)
    assert ctx.get_per_replica_batch_size(np.int64(64)) == 32


# -- Dataset methods -----------------------------------------------------------------------------
DATASET_MISTAKES = [
    ("batch(0)", lambda ds: ds.batch(0), InvalidArgumentError,
     "batch_size must be greater than zero, got 0"),
    ("batch(-1)", lambda ds: ds.batch(-1), InvalidArgumentError,
     "batch_size must be greater than zero, got -1"),
    ("batch(2.5)", lambda ds: ds.batch(2.5), TypeError,
     "batch_size must be an int, got 2.5 of type float"),
    ("batch(drop_remainder='False')", lambda ds: ds.batch(2, drop_remainder="False"), TypeError,
     "drop_remainder must be True or False, got 'False' of type str"),
    ("shard(2.5, 0)", lambda ds: ds.shard(2.5, 0), TypeError,
     "num_shards must be an int, got 2.5 of type float"),
    ("shard('2', 0)", lambda ds: ds.shard("2", 0), TypeError,
     "num_shards must be an int, got '2' of type str"),
    ("shard(None, 0)", lambda ds: ds.shard(None, 0), TypeError,
     "num_shards must be an int, got None"),
    ("shard(2, 2)", lambda ds: ds.shard(2, 2), InvalidArgumentError,
     r"Index must be between 0 and 1 \(currently index = 2\)"),
    ("shard(2, -1)", lambda ds: ds.shard(2, -1), InvalidArgumentError,
     r"currently index = -1"),
    ("shard(0, 0)", lambda ds: ds.shard(0, 0), InvalidArgumentError,
     r"currently num_shards = 0"),
    ("take(1.5)", lambda ds: ds.take(1.5), TypeError, "count must be an int, got 1.5"),
    ("take(-2)", lambda ds: ds.take(-2), InvalidArgumentError,
     "count must be >= 0, or -1 to take all; got -2"),
    ("skip('1')", lambda ds: ds.skip("1"), TypeError, "count must be an int, got '1'"),
    ("skip(-3)", lambda ds: ds.skip(-3), InvalidArgumentError,
     "count must be >= 0, or -1 to skip all; got -3"),
    ("repeat(-2)", lambda ds: ds.repeat(-2), InvalidArgumentError,
     "count must be >= 0, or -1 to repeat forever; got -2"),
    ("shuffle(reshuffle_each_iteration=1)",
     lambda ds: ds.shuffle(4, reshuffle_each_iteration=1), TypeError,
     "reshuffle_each_iteration must be True or False, got 1 of type int"),
    ("with_options(InputOptions)", lambda ds: ds.with_options(mpidist.InputOptions()), TypeError,
     "options must be an mpidist.data.Options, got InputOptions"),
]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in DATASET_MISTAKES],
                         ids=[c[0] for c in DATASET_MISTAKES])
def test_dataset_method_mistakes(call, error, message):
    ds = Dataset.range(6)
    with pytest.raises(error, match=message):
        call(ds)
    assert [int(v) for v in ds] == list(range(6))  # the dataset is intact and usable
    assert ds.cardinality() == 6


@pytest.mark.parametrize("args, message", [
    ((2.5,), "stop must be an int, got 2.5 of type float"),
    (("3",), "stop must be an int, got '3' of type str"),
    ((0, 10, 0.5), "step must be an int, got 0.5"),
    ((None, 3), "start must be an int, got None"),
])
def test_range_of_non_integers(args, message):
    """range(2.5) used to be range(2), range("3") range(3)."""
    with pytest.raises(TypeError, match=message):
        Dataset.range(*args)
    assert [int(v) for v in Dataset.range(np.int64(3))] == [0, 1, 2]


def test_from_tensor_slices_of_components_of_different_lengths():
    with pytest.raises(InvalidArgumentError, match="dimensions 8 and 7 are not compatible; every "
                                                   "component must have the same number of rows"):
        Dataset.from_tensor_slices((X, Y[:7]))
    assert Y.shape == (8,) and X.shape == (8, 3)


def test_from_tensor_slices_of_ragged_lists():
    with pytest.raises(ValueError, match=r"from_tensor_slices: cannot convert a non-rectangular "
                                         r"Python sequence to an array \(\[\[1, 2\], \[3\]\]\).*"
                                         "Pad the rows"):
        Dataset.from_tensor_slices([[1, 2], [3]])


def test_from_tensor_slices_of_python_objects():
    with pytest.raises(ValueError, match=r"from_tensor_slices: \[1, None\] holds Python objects.*"
                                         "give numbers, booleans or strings"):
        Dataset.from_tensor_slices([1, None])
    with pytest.raises(ValueError, match="from_tensors: None holds Python objects"):
        Dataset.from_tensors(None)


def test_map_function_returning_none():
    ds = Dataset.range(4)

    def forgot_return(v):
        v * 2  # the mistake under test

    mapped = ds.map(forgot_return)
    with pytest.raises(TypeError, match=r"map_func .*forgot_return returned None for element 0: "
                                        r"it must return the transformed element.*`return`"):
        list(mapped)
    with pytest.raises(TypeError, match="returned None for element 0"):
        mapped.element_spec  # noqa: B018 - element_spec runs map_func
    assert [int(v) for v in ds.map(lambda v: v * 2)] == [0, 2, 4, 6]


def test_map_function_returning_none_in_a_component():
    with pytest.raises(ValueError, match=r"map_func's result for element 2: None holds Python "
                                         "objects"):
        list(Dataset.range(4).map(lambda v: (v, None if v == 2 else v)))


def test_map_function_with_the_wrong_number_of_arguments():
    ds = Dataset.from_tensor_slices((X, Y))
    with pytest.raises(TypeError, match=r"map_func .*\(x\) cannot take the dataset's elements: "
                                        r"each element is a tuple of 2 components, passed as 2 "
                                        r"positional arguments.*lambda x, y"):
        list(ds.map(lambda x: x))
    # A TypeError raised inside a map_func that takes the right arguments is its own.
    def strict(x, y):
        raise TypeError(f"labels must be floats, got {y.dtype}")

    with pytest.raises(TypeError, match="^labels must be floats, got int64$"):
        list(ds.map(strict))
    assert len(list(ds.map(lambda x, y: x))) == 8


def test_from_generator_mistakes():
    def gen():
        yield np.ones(2, np.float32)

    with pytest.raises(TypeError, match=r"`generator` must be a Python callable.*got "
                                        r"<generator object.*Pass the generator function itself "
                                        r"\(gen\), not a generator object \(gen\(\)\)"):
        Dataset.from_generator(gen())
    with pytest.raises(TypeError, match=r"output_signature must be a TensorSpec or a tuple / dict "
                                        r"of them.*got <class 'numpy\.float32'>"):
        Dataset.from_generator(gen, output_signature=np.float32)
    with pytest.raises(ValueError, match=r"output_shapes \{'b': \(2,\)\} does not match "
                                         r"output_types \{'a': .*give one shape per type"):
        Dataset.from_generator(gen, output_types={"a": np.float32}, output_shapes={"b": (2,)})
    with pytest.raises(ValueError, match=r"`generator` element 1: cannot convert a "
                                         r"non-rectangular Python sequence"):
        list(Dataset.from_generator(lambda: iter([[1, 2], [[1, 2], [3]]])))
    ok = Dataset.from_generator(gen, output_signature=TensorSpec((2,), np.float32))
    assert [v.tolist() for v in ok] == [[1.0, 1.0]]


# -- options -------------------------------------------------------------------------------------
def test_auto_shard_policy_set_on_the_wrong_object():
    """``options.auto_shard_policy = OFF`` used to be stored and ignored: the policy stayed AUTO."""
    options = Options()
    with pytest.raises(ValueError, match=r"Cannot set the option 'auto_shard_policy' on "
                                             r"Options.*options\.experimental_distribute\."
                                             "auto_shard_policy"):
        options.auto_shard_policy = AutoShardPolicy.OFF
    assert options.experimental_distribute.auto_shard_policy is AutoShardPolicy.AUTO
    with pytest.raises(ValueError, match="Cannot set the option 'auto_shard' on "
                                             "DistributeOptions: it has only auto_shard_policy"):
        options.experimental_distribute.auto_shard = AutoShardPolicy.OFF
    with pytest.raises(TypeError, match="auto_shard_policy must be an mpidist.data.experimental."
                                        "AutoShardPolicy.*got 'OFF'"):
        options.experimental_distribute.auto_shard_policy = "OFF"
    with pytest.raises(TypeError, match="deterministic must be True, False or None, got 'yes'"):
        options.deterministic = "yes"
    assert options == Options()
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.OFF
    assert Dataset.range(2).with_options(options).options().experimental_distribute \
        .auto_shard_policy is AutoShardPolicy.OFF


@pytest.mark.parametrize("kwargs, error, message", [
    ({"experimental_fetch_to_device": "no"}, TypeError,
     "experimental_fetch_to_device must be True or False, got 'no' of type str"),
    ({"experimental_place_dataset_on_device": 1}, TypeError,
     "experimental_place_dataset_on_device must be True or False, got 1 of type int"),
    ({"experimental_replication_mode": "PER_DEVICE"}, ValueError,
     "experimental_replication_mode must be an mpidist.InputReplicationMode, got 'PER_DEVICE'"),
    ({"experimental_per_replica_buffer_size": -1}, ValueError,
     "experimental_per_replica_buffer_size must be an int >= 0.*got -1"),
])
def test_input_options_mistakes(kwargs, error, message):
    """``InputOptions(experimental_fetch_to_device="no")`` used to mean True."""
    with pytest.raises(error, match=message):
        mpidist.InputOptions(**kwargs)
    assert mpidist.InputOptions(experimental_fetch_to_device=False).experimental_fetch_to_device \
        is False


# -- elements with nothing to split --------------------------------------------------------------
def test_elements_without_components():
    """An empty tuple element used to fail with an IndexError inside the distribution layer."""
    s = mirrored(2)
    for ds in (Dataset.from_tensors(()), Dataset.range(4).batch(2).map(lambda x: ())):
        with pytest.raises(ValueError, match=r"experimental_distribute_dataset: the dataset's "
                                             r"elements have no components \(element_spec \(\)\)"):
            s.experimental_distribute_dataset(ds)
    with pytest.raises(ValueError, match="An input element has no components"):
        next(iter(s.experimental_distribute_dataset(iter([()]))))
    with pytest.raises(ValueError, match=r"distribute_datasets_from_function: the dataset's "
                                         r"elements have no components \(element_spec \{\}\)"):
        s.distribute_datasets_from_function(lambda ctx: Dataset.from_tensors({}))
    assert_distributes_normally(s)


def test_unbatched_pipeline_of_dataset_fn_at_a_partial_step():
    """Scalar elements can be dealt to replicas, but a replica left without one has no empty
    batch to get: that used to be an IndexError."""
    s = mirrored(2)
    it = iter(s.distribute_datasets_from_function(lambda ctx: Dataset.range(3)))
    assert [int(v) for v in next(it).values] == [0, 1]
    with pytest.raises(ValueError, match=r"Local replica 1 has no element this step, and the "
                                         r"elements are scalars.*dataset\.batch\(input_context\."
                                         r"get_per_replica_batch_size\(GLOBAL_BATCH\)\)"):
        next(it)


@pytest.mark.parametrize("args, message", [
    ((1, 0, 0), "num_replicas_in_sync must be an int >= 1, got 0"),
    ((2, 2, 4), r"input_pipeline_id must be below num_input_pipelines \(2\), got 2"),
    ((1, -1, 2), "input_pipeline_id must be an int >= 0, got -1"),
    ((1.5, 0, 2), "num_input_pipelines must be an int >= 1, got 1.5"),
])
def test_input_context_arguments(args, message):
    """InputContext(1, 0, 0).get_per_replica_batch_size(4) used to divide by zero."""
    with pytest.raises(ValueError, match=message):
        mpidist.InputContext(*args)
    assert mpidist.InputContext(2, 1, 4).get_per_replica_batch_size(8) == 2
