"""Silent numeric traps are errors or warnings: labels against predictions that would
broadcast, integer or boolean variables given to an optimizer, ``np.asarray(variable)``
lending the live storage, a global batch size smaller than a replica's rows, a restore that
matches no key, and two callbacks managing one directory."""

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.training.callbacks import check_callbacks
from mpidist.training.losses import match_label_shapes

# -- labels against predictions ---------------------------------------------------------------
shapes = st.tuples(st.integers(1, 4), st.sampled_from([(), (1,), (2,), (3,)]),
                   st.booleans()).map(lambda t: ((t[0],) + t[1], t[2]))


def _keras_match(a, b):
    """The shapes Keras makes equal: one trailing 1 on the longer side dropped."""
    if len(a) == len(b) + 1 and a[-1] == 1:
        a = a[:-1]
    elif len(b) == len(a) + 1 and b[-1] == 1:
        b = b[:-1]
    return a == b


@settings(max_examples=60, deadline=None)
@given(true=shapes, pred=shapes, seed=st.integers(0, 2 ** 16))
def test_accuracy_matches_shapes_as_keras_or_names_both(true, pred, seed):
    (t_shape, t_row), (p_shape, _) = true, pred
    if t_row:  # a row vector (1, N): broadcasting it against (N,) gives (N, N)
        t_shape = (1,) + t_shape
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, 2, t_shape)
    y_pred = rng.integers(0, 2, p_shape)
    metric = mpidist.metrics.Accuracy()
    if _keras_match(t_shape, p_shape):
        metric.update_state(y_true, y_pred)
        expected = np.mean(y_true.reshape(-1) == y_pred.reshape(-1))
        assert metric.result() == pytest.approx(expected)
    else:
        with pytest.raises(ValueError) as info:
            metric.update_state(y_true, y_pred)
        assert str(t_shape) in str(info.value) and str(p_shape) in str(info.value)
        assert metric.result() == 0.0  # nothing was accumulated


@pytest.mark.parametrize("true,pred", [((5,), (1, 5)), ((2,), (5, 2)), ((4, 1), (1, 4))])
def test_the_helper_names_the_broadcast_it_refuses(true, pred):
    with pytest.raises(ValueError, match=r"NumPy would broadcast them to \(\d+, \d+\)"):
        match_label_shapes(np.zeros(true), np.zeros(pred), "here")


def test_sparse_categorical_accuracy_refuses_one_hot_labels():
    metric = mpidist.metrics.SparseCategoricalAccuracy()
    with pytest.raises(ValueError, match=r"y_true of shape \(4, 3\) and y_pred of shape \(4, 3\) "
                                         r"are not compatible \(y_pred's predicted classes"):
        metric.update_state(np.eye(3)[[0, 1, 2, 0]], np.eye(3)[[0, 1, 2, 1]])
    metric.update_state(np.array([[0], [1]]), np.eye(2))  # (N, 1) labels: Keras squeezes
    assert metric.result() == 1.0


# -- optimizers take floating-point variables only -------------------------------------------
@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(["int8", "int32", "int64", "uint8", "bool", "float16", "float32",
                              "float64"]),
       optimizer=st.sampled_from(["SGD", "Adam"]))
def test_an_integer_or_boolean_variable_is_refused_by_name(dtype, optimizer):
    var = mpidist.Variable(np.ones(3, dtype), name="counter")
    opt = getattr(mpidist.optimizers, optimizer)(0.1)
    grad = np.full(3, 0.25, np.float64 if np.dtype(dtype).kind != "f" else dtype)
    if np.dtype(dtype).kind == "f":
        opt.apply_gradients([(grad, var)])
        assert int(opt.iterations.numpy()) == 1
        return
    with pytest.raises(TypeError, match=rf"variable 'counter:0' has dtype {dtype}.*float dtype"):
        opt.apply_gradients([(grad, var)])
    assert int(opt.iterations.numpy()) == 0
    assert (var.numpy() == 1).all()


# -- np.asarray(variable) ---------------------------------------------------------------------
def _mirrored(value):
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        return mpidist.Variable(value, name="m")


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from([(), (3,), (2, 2)]),
       dtype=st.sampled_from(["float32", "float64", "int32"]),
       mirrored=st.booleans())
def test_numpy_conversion_never_lends_writable_storage(shape, dtype, mirrored):
    value = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    var = _mirrored(value) if mirrored else mpidist.Variable(value)
    for arr in (np.asarray(var), np.array(var), np.array(var, copy=True)):
        assert arr.flags.writeable and arr.dtype == var.dtype
        arr[...] = 7  # a copy: the variable (every copy of it) is unchanged
    for copy in ([var.numpy()] + [c.numpy() for c in getattr(var, "values", ())]):
        np.testing.assert_array_equal(copy, value)
    lent = np.asarray(var, copy=False)  # no copy: the storage itself, read-only
    assert not lent.flags.writeable
    with pytest.raises(ValueError):
        lent[...] = 7
    other = "float16" if dtype != "float16" else "float32"
    with pytest.raises(ValueError, match=r"copy=False\): the value cannot be lent .*dtype"):
        np.asarray(var, dtype=other, copy=False)
    # arithmetic still works and reads the current value
    np.testing.assert_array_equal(np.add(var, 1), value + 1)
    np.testing.assert_array_equal(var * 2, value * 2)
    np.testing.assert_array_equal(np.asarray(var, dtype="float64"), value.astype("float64"))


# -- the global batch size --------------------------------------------------------------------
def test_a_global_batch_size_smaller_than_a_replicas_rows_is_an_error():
    with pytest.raises(ValueError, match=r"global_batch_size=4 but this replica alone received "
                                         r"8 examples"):
        mpidist.nn.compute_average_loss(np.ones(8), global_batch_size=4)
    assert float(mpidist.nn.compute_average_loss(np.ones(8), global_batch_size=0)) == 0.0  # TF


def test_a_per_replica_batch_size_given_as_the_global_one_warns():
    strategy = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def step(g):
        return mpidist.nn.compute_average_loss(np.ones(4), global_batch_size=g)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy.run(step, args=(8,))  # 4 rows on each of 2 replicas: right
    with pytest.warns(RuntimeWarning, match=r"looks like the per-replica batch size.*2 times"):
        strategy.run(step, args=(4,))


# -- a restore that matches no key ------------------------------------------------------------
def test_a_restore_matching_no_key_warns_but_a_deferred_one_does_not(tmp_path):
    path = mpidist.train.Checkpoint(model=mpidist.Variable(1.0)).save(str(tmp_path / "ck"))
    with pytest.warns(RuntimeWarning, match=r"ck-1'\) matched no key: the checkpoint holds "
                                            r"'model' .* variables are at 'net'"):
        mpidist.train.Checkpoint(net=mpidist.Variable(0.0)).restore(path)

    class Later:  # no variables yet: its values wait for them (deferred restore)
        def _checkpoint_dependencies(self):
            return {}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mpidist.train.Checkpoint(model=Later()).restore(path)


# -- callbacks that manage one directory -------------------------------------------------------
@pytest.mark.parametrize("first,second", [("run", "run"), ("run", "run/"),
                                          ("run", "run/sub/..")])
def test_two_callbacks_on_one_directory_are_refused_before_fit_writes(tmp_path, first, second):
    x = np.ones((4, 2), np.float32)
    y = np.ones(4, np.float32)

    class Model:
        def __init__(self):
            self.w = mpidist.Variable(np.zeros(2, np.float32), name="w")
            self.trainable_variables = [self.w]

        def loss_and_gradients(self, x, y):
            err = x @ self.w.read_value() - y
            return err ** 2, [2 * x.T @ err]

    callbacks = [mpidist.callbacks.ModelCheckpoint(str(tmp_path / first)),
                 mpidist.callbacks.BackupAndRestore(str(tmp_path / second))]
    dataset = mpidist.data.Dataset.from_tensor_slices((x, y)).batch(2)
    with pytest.raises(ValueError, match=r"callbacks ModelCheckpoint\(.*\) and "
                                         r"BackupAndRestore\(.*\) both manage"):
        mpidist.fit(Model(), dataset, optimizer=mpidist.optimizers.SGD(0.1), callbacks=callbacks)
    assert not os.path.exists(tmp_path / "run")


def test_a_checkpoint_inside_the_backup_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"one inside the other \(BackupAndRestore deletes"):
        check_callbacks([mpidist.callbacks.BackupAndRestore(str(tmp_path)),
                         mpidist.callbacks.ModelCheckpoint(str(tmp_path / "ck"))])
    check_callbacks([mpidist.callbacks.ModelCheckpoint(str(tmp_path / "ck")),
                     mpidist.callbacks.BackupAndRestore(str(tmp_path / "backup"))])


def test_a_sharded_variable_cannot_be_lent_without_a_copy():
    from mpidist.ps.sharded_variable import ShardedVariable

    sharded = ShardedVariable([mpidist.Variable(np.ones((2, 2))), mpidist.Variable(np.ones((1, 2)))])
    np.testing.assert_array_equal(np.asarray(sharded), np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"copy=False\): its value is the concatenation"):
        np.asarray(sharded, copy=False)


# -- other traps of the same classes in losses and metrics ------------------------------------
def test_sample_weights_broadcast_to_the_losses_never_the_reverse():
    loss = np.ones(3)
    with pytest.raises(ValueError, match=r"sample_weight of shape \(3, 3\) cannot be broadcast"):
        mpidist.nn.compute_average_loss(loss, sample_weight=np.ones((3, 3)), global_batch_size=3)
    for weight in (2.0, np.full(3, 2.0), np.full((3, 1), 2.0)):
        assert float(mpidist.nn.compute_average_loss(loss, sample_weight=weight,
                                                     global_batch_size=3)) == 2.0


def test_accuracy_of_probabilities_against_labels_warns():
    metric = mpidist.metrics.Accuracy()
    with pytest.warns(RuntimeWarning, match=r"y_pred holds fractions .*> 0\.5"):
        metric.update_state(np.array([1, 0, 1]), np.array([0.9, 0.2, 0.7]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update_state(np.array([1, 0]), np.array([1.0, 0.0]))  # labels as floats: fine


@pytest.mark.parametrize("labels,words", [([1, 2, 3], r"values from 1 to 3"),
                                          ([0.5, 1.0, 0.0], r"fractional values"),
                                          ([-1, 0, 1], r"values from -1 to 1")])
def test_sparse_labels_outside_the_classes_are_refused(labels, words):
    metric = mpidist.metrics.SparseCategoricalAccuracy()
    with pytest.raises(ValueError, match=rf"class indices in \[0, 3\).*{words}"):
        metric.update_state(np.array(labels), np.eye(3))
    assert metric.result() == 0.0


@pytest.mark.parametrize("labels", [(4,), (4, 1)])
def test_fit_and_evaluate_refuse_n_by_n_losses_from_a_hand_written_model(labels):
    x = np.ones((4, 3), np.float32)
    y = np.ones(labels, np.float32)

    class Model:
        def __init__(self):
            self.w = mpidist.Variable(np.zeros((3, 1), np.float32), name="w")
            self.trainable_variables = [self.w]

        def loss_and_gradients(self, x, y):
            err = x @ self.w.read_value() - y.reshape(-1)  # (4, 1) - (4,): (4, 4)
            return err ** 2, [np.zeros((3, 1), np.float32)]

    dataset = mpidist.data.Dataset.from_tensor_slices((x, y)).batch(4)
    words = r"loss_and_gradients\(x, y\) returned per-example losses of shape \(4, 4\)"
    with pytest.raises(ValueError, match=words):
        mpidist.fit(Model(), dataset, optimizer=mpidist.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match=r"per-example loss returned per-example losses of "
                                         r"shape \(4, 4\)"):
        mpidist.evaluate(Model(), dataset)
