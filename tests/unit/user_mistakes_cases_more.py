"""The corpus's training, variable, metric, loss, optimizer and configuration mistakes
(see test_user_mistakes.py)."""

import collections
import json
import os

import numpy as np

import mpidist
from mpidist import metrics, optimizers
from mpidist.errors import InvalidArgumentError
from user_mistakes_world import ALL, DISTRIBUTED, STRATEGIES_ONLY

Case = collections.namedtuple("Case", "id kinds action error match")


def _foreign_variable(w):
    other = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    with other.scope():
        return mpidist.Variable(np.zeros(3), name="foreign")


def _with_tf_config(config, fn):
    old = os.environ.get("TF_CONFIG")
    os.environ["TF_CONFIG"] = config if isinstance(config, str) else json.dumps(config)
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["TF_CONFIG"]
        else:
            os.environ["TF_CONFIG"] = old


def _tf_config_case(config, fn=lambda r: r.cluster_spec()):
    return lambda w: _with_tf_config(
        config, lambda: fn(mpidist.cluster_resolver.TFConfigClusterResolver()))


def _optimizer_of_other_strategy(w):
    other = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    with other.scope():
        opt = optimizers.SGD(0.1)
    return w.s.run(lambda: opt.apply_gradients([(w.g, w.v)]))


def _metric_of_other_strategy(w):
    other = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    with other.scope():
        m = metrics.Mean()
    return w.s.run(lambda: m.update_state(1.0))


def _bad_schedule(w):
    w.opt.learning_rate = lambda step: "0.1"
    try:
        return w.step([(w.g, w.v)])
    finally:
        w.opt.learning_rate = 0.1


MORE_CASES = [
    # -- apply_gradients -------------------------------------------------------------------
    Case("apply_swapped_pair", ALL, lambda w: w.step([(w.v, w.g)]), TypeError,
         r"pair 0 is \(variable 'v:0', array.*the order is \(gradient, variable\); pass zip"),
    Case("apply_without_zip", ALL, lambda w: w.s.run(lambda: w.opt.apply_gradients([w.g], [w.v])),
         TypeError, r"takes ONE iterable .* got list .*pass zip\(gradients, variables\) instead"),
    Case("apply_grads_only", ALL, lambda w: w.step([w.g, w.g]), ValueError,
         r"element 0 of grads_and_vars is ndarray .*each element must be a \(gradient, variable\) pair"),
    Case("apply_generator_of_triples", ALL,
         lambda w: w.s.run(lambda: w.opt.apply_gradients(x for x in [(w.g, w.v, 1.0)])), ValueError,
         r"element 0 of grads_and_vars is tuple .*pass zip\(gradients, variables\)"),
    Case("apply_not_iterable", ALL, lambda w: w.step(5), TypeError,
         r"takes an iterable of \(gradient, variable\) pairs, got int 5"),
    Case("apply_single_variable", ALL, lambda w: w.step(w.v), TypeError,
         r"got (Mirrored)?Variable .*zip\(gradients, variables\)"),
    Case("apply_dict", ALL, lambda w: w.step({"v": w.g}), TypeError,
         r"got dict .*zip\(gradients, variables\)"),
    Case("apply_perreplica_as_variable", ALL, lambda w: w.step([(w.g, w.floats)]), TypeError,
         r"the variable of pair 0 is (PerReplica|ndarray) .*not an mpidist.Variable"),
    Case("apply_array_as_variable", ALL, lambda w: w.step([(w.g, np.zeros(3))]), TypeError,
         r"the variable of pair 0 is ndarray .*created with mpidist.Variable inside strategy.scope"),
    Case("apply_complex_gradient", ALL, lambda w: w.step([(np.ones(3, complex), w.v)]), TypeError,
         r"gradient of pair 0 \(for variable 'v:0' of dtype float64\) has dtype complex128.*astype\('float64'\)"),
    Case("apply_bool_gradient", ALL, lambda w: w.step([(np.ones(3, bool), w.v)]), TypeError,
         r"has dtype bool; gradients must be real numbers"),
    Case("apply_object_gradient", ALL, lambda w: w.step([(np.array([1, 2, None]), w.v)]),
         TypeError, r"has dtype object"),
    Case("apply_string_gradient", ALL, lambda w: w.step([("abc", w.v)]), TypeError,
         r"has dtype <U3"),
    Case("apply_ragged_gradient", ALL, lambda w: w.step([([[1.0], [1.0, 2.0]], w.v)]), ValueError,
         r"gradient of pair 0 \(for variable 'v:0'\) is not an array.*shape \(3,\)"),
    Case("apply_wrong_shape", ALL, lambda w: w.step([(np.ones(2), w.v)]), ValueError,
         r"Gradient of shape \(2,\) does not match variable 'v:0' of shape \(3,\) \(pair 0\)"),
    Case("apply_wrong_shape_second", ALL,
         lambda w: w.step([(w.g, w.v), (np.ones((2, 3)), w.w)]), ValueError,
         r"shape \(2, 3\) does not match variable 'w:0' of shape \(2, 2\) \(pair 1\)"),
    Case("apply_same_variable_twice", ALL, lambda w: w.step([(w.g, w.v), (w.g, w.v)]),
         ValueError, r"variable 'v:0' appears twice \(pairs 0 and 1\); add its gradients together"),
    Case("apply_all_none", ALL, lambda w: w.step([(None, w.v), (None, w.w)]), ValueError,
         r"No gradients provided for any variable"),
    Case("apply_empty", ALL, lambda w: w.step([]), ValueError,
         r"No gradients provided for any variable"),
    Case("apply_variable_outside_scope", STRATEGIES_ONLY,
         lambda w: w.step([(w.g, mpidist.Variable(np.zeros(3), name="plain"))]), ValueError,
         r"variable 'plain:0' was created outside any strategy scope, but apply_gradients runs "
         r"under .*Create the variables .* inside `with strategy.scope\(\):`"),
    Case("apply_variable_of_other_strategy", ALL,
         lambda w: w.step([(w.g, _foreign_variable(w))]), (ValueError, RuntimeError),
         r"variable 'foreign:0' was created in the scope of .*MirroredStrategy|Mixing different"),
    Case("apply_optimizer_of_other_strategy", STRATEGIES_ONLY, _optimizer_of_other_strategy,
         ValueError, r"Optimizer 'SGD' was created in the scope of .* create the optimizer inside"),
    Case("apply_in_cross_replica_context", STRATEGIES_ONLY,
         lambda w: _in_scope(w, lambda: w.opt.apply_gradients([(w.g, w.v)])), RuntimeError,
         r"cannot be called in cross-replica context. Use `mpidist.Strategy.run`"),
    Case("apply_name_not_string", ALL,
         lambda w: w.s.run(lambda: w.opt.apply_gradients([(w.g, w.v)], 3)), TypeError,
         r"`name` must be a string or None, got 3"),
    Case("apply_perreplica_gradient", ALL,
         lambda w: w.s.run(lambda: w.opt.apply_gradients([(mpidist.PerReplica([w.g] * w.n), w.v)])),
         TypeError, r"gradient of pair 0 \(for variable 'v:0'\) is a PerReplica; call apply_gradients inside strategy.run"),
    Case("apply_bad_schedule", ALL, _bad_schedule, TypeError,
         r"learning_rate schedule of optimizer 'SGD' returned '0.1' for step 1; it must return a number"),
    Case("get_slot_unknown_variable", ALL,
         lambda w: w.opt.get_slot(mpidist.Variable(1.0, name="x"), "momentum"), ValueError,
         r"Optimizer 'SGD' has no slots for variable 'x:0'.*optimizer.build"),
    Case("get_slot_unknown_name", ALL, lambda w: w.opt.get_slot(w.v, "velocity"), ValueError,
         r"'v:0' has no slot 'velocity'; slots: \['momentum'\]"),
    # -- optimizer constructors ------------------------------------------------------------
    Case("sgd_negative_lr", ALL, lambda w: optimizers.SGD(-0.1), ValueError,
         r"learning_rate must be a finite number >= 0, got -0.1"),
    Case("sgd_string_lr", ALL, lambda w: optimizers.SGD("0.1"), TypeError,
         r"learning_rate must be a number, got '0.1'"),
    Case("sgd_momentum_one", ALL, lambda w: optimizers.SGD(0.1, momentum=1.0), ValueError,
         r"momentum must be in \[0, 1\), got 1.0"),
    Case("sgd_nesterov_string", ALL, lambda w: optimizers.SGD(0.1, nesterov="no"), TypeError,
         r"nesterov must be True or False, got 'no'"),
    Case("sgd_name_int", ALL, lambda w: optimizers.SGD(0.1, name=3), TypeError,
         r"Optimizer name must be a string, got 3"),
    Case("sgd_two_clips", ALL, lambda w: optimizers.SGD(clipnorm=1.0, clipvalue=1.0), ValueError,
         r"Only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set"),
    Case("sgd_clipnorm_zero", ALL, lambda w: optimizers.SGD(clipnorm=0), ValueError,
         r"clipnorm must be a finite number > 0, got 0.0"),
    Case("adam_beta_above_one", ALL, lambda w: optimizers.Adam(beta_1=1.5), ValueError,
         r"beta_1 must be in \[0, 1\), got 1.5"),
    Case("adam_epsilon_zero", ALL, lambda w: optimizers.Adam(epsilon=0), ValueError,
         r"epsilon must be a finite number > 0, got 0.0"),
    Case("adam_amsgrad_string", ALL, lambda w: optimizers.Adam(amsgrad="yes"), TypeError,
         r"amsgrad must be True or False, got 'yes'"),
    # -- variables -------------------------------------------------------------------------
    Case("variable_shape_mismatch", ALL,
         lambda w: _in_scope(w, lambda: mpidist.Variable(np.zeros(3), shape=(2,))), ValueError,
         r"initial_value has shape \(3,\) but shape=\(2,\) was requested"),
    Case("variable_shape_string", ALL,
         lambda w: _in_scope(w, lambda: mpidist.Variable(np.zeros(3), shape="3")), TypeError,
         r"shape must be a tuple of ints such as \(3, 2\), got '3'"),
    Case("variable_ragged", ALL, lambda w: _in_scope(w, lambda: mpidist.Variable([[1, 2], [3]])),
         ValueError, r"initial_value \[\[1, 2\], \[3\]\] cannot become an array.*equal-length rows"),
    Case("variable_objects", ALL,
         lambda w: _in_scope(w, lambda: mpidist.Variable(np.array([None, 1]))), TypeError,
         r"gives an array of Python objects"),
    Case("variable_none", ALL, lambda w: _in_scope(w, lambda: mpidist.Variable(None)), ValueError,
         r"initial_value must be specified: pass an array, a number or a callable"),
    Case("variable_name_int", ALL, lambda w: _in_scope(w, lambda: mpidist.Variable(1.0, name=3)),
         TypeError, r"Variable name must be a string, got 3"),
    Case("variable_bad_aggregation", ALL,
         lambda w: _in_scope(w, lambda: mpidist.Variable(1.0, aggregation="MAX")), ValueError,
         r"Invalid variable aggregation mode: 'MAX' .*use one of \['NONE', 'SUM', 'MEAN', 'ONLY_FIRST_REPLICA'\]"),
    Case("variable_bad_synchronization", ALL,
         lambda w: _in_scope(w, lambda: mpidist.Variable(1.0, synchronization="sometimes")),
         ValueError, r"Invalid variable synchronization mode: 'sometimes'; use one of"),
    Case("variable_sync_none", DISTRIBUTED,
         lambda w: _in_scope(w, lambda: mpidist.Variable(
             1.0, synchronization=mpidist.VariableSynchronization.NONE, name="n")), ValueError,
         r"`NONE` variable synchronization mode is not supported.*for variable: n"),
    Case("variable_mean_of_ints", DISTRIBUTED,
         lambda w: _in_scope(w, lambda: mpidist.Variable(1, aggregation="MEAN")), ValueError,
         r"aggregation=MEAN and a non-floating dtype \(int64\) is not supported"),
    Case("variable_bad_device", ("default",),
         lambda w: mpidist.Variable(1.0, device="/tpu:0"), ValueError,
         r"Cannot parse device string '/tpu:0'"),
    Case("variable_init_perreplica", ALL,
         lambda w: _in_scope(w, lambda: mpidist.Variable(w.floats)) if w.n > 1
         else mpidist.Variable(mpidist.PerReplica([1.0, 2.0])), ValueError,
         r"It looks like you are using a PerReplica object while not inside a replica context"),
    Case("assign_wrong_shape", ALL, lambda w: w.v.assign(np.zeros(2)), ValueError,
         r"Cannot assign a value of shape \(2,\) to variable 'v(/replica_\d)?:0' of shape \(3,\)"),
    Case("assign_complex", ALL, lambda w: w.v.assign(np.ones(3, complex)), TypeError,
         r"dtype complex128 to variable 'v:0' of dtype float64; cast it first"),
    Case("assign_string", ALL, lambda w: w.v.assign("abc"), TypeError,
         r"Cannot assign 'abc' \(dtype <U3\) to variable 'v:0' of dtype float64"),
    Case("assign_none", ALL, lambda w: w.v.assign(None), TypeError,
         r"Cannot assign None \(dtype object\)"),
    Case("assign_bool_to_float", ALL, lambda w: w.v.assign_add(np.ones(3, bool)), TypeError,
         r"\(dtype bool\) to variable 'v:0'.*booleans are not numbers here"),
    Case("assign_ragged", ALL, lambda w: w.v.assign([[1.0], [1.0, 2.0]]), ValueError,
         r"Cannot assign .* to variable 'v:0': it is not an array of shape \(3,\)"),
    Case("assign_perreplica_wrong_count", DISTRIBUTED,
         lambda w: w.v.assign(mpidist.PerReplica([np.ones(3)] * (w.n + 1))), ValueError,
         r"Cannot update variable 'v:0' \(\d components\) from a PerReplica with \d components"),
    Case("assign_perreplica_in_replica", DISTRIBUTED,
         lambda w: w.s.run(lambda: w.v.assign(w.floats)), TypeError,
         r"Cannot use DistributedValues to update variables in replica context"),
    Case("variable_of_other_strategy_in_run", STRATEGIES_ONLY,
         lambda w: w.s.run(lambda: _foreign_variable(w).assign_add(np.ones(3))), RuntimeError,
         r"Mixing different mpidist.Strategy objects"),
    # -- metrics ---------------------------------------------------------------------------
    Case("metric_string_values", ALL, lambda w: w.in_replicas(lambda: w.metric.update_state("a")),
         TypeError, r"Metric 'mean': values must hold real numbers, got 'a' \(dtype <U1\)"),
    Case("metric_none_values", ALL, lambda w: w.in_replicas(lambda: w.metric.update_state(None)),
         TypeError, r"Metric 'mean': values must hold real numbers, got None"),
    Case("metric_complex_values", ALL,
         lambda w: w.in_replicas(lambda: w.metric.update_state(np.array([1j]))), TypeError,
         r"dtype complex128"),
    Case("metric_string_weight", ALL,
         lambda w: w.in_replicas(lambda: w.metric.update_state(1.0, sample_weight="x")),
         TypeError, r"sample_weight must hold real numbers, got 'x'"),
    Case("metric_weight_shape", ALL,
         lambda w: w.in_replicas(lambda: w.metric.update_state(np.ones(2), sample_weight=np.ones(3))),
         ValueError, r"sample_weight of shape \(3,\) cannot be broadcast to the values' shape \(2,\)"),
    Case("metric_perreplica_outside_run", DISTRIBUTED, lambda w: w.metric.update_state(w.floats),
         TypeError, r"A metric got a PerReplica: call update_state inside strategy.run"),
    Case("metric_of_other_strategy", STRATEGIES_ONLY, _metric_of_other_strategy, RuntimeError,
         r"Metric 'mean' cannot update_state inside strategy.run of .*Create the metric inside"),
    Case("metric_reset_in_run", STRATEGIES_ONLY,
         lambda w: w.s.run(lambda: w.metric.reset_state()), RuntimeError,
         r"reset_state\(\) must be called in cross-replica context"),
    Case("metric_name_int", ALL, lambda w: metrics.Mean(name=3), TypeError,
         r"A metric's name must be a string, got 3"),
    Case("metric_dtype_string", ALL, lambda w: metrics.Sum(dtype=str), TypeError,
         r"Metric 'sum' needs a numeric dtype for its state, got <U0"),
    Case("metric_mean_int_dtype", ALL, lambda w: metrics.Mean(dtype=np.int32), ValueError,
         r"Metric 'mean' needs a floating dtype, got int32"),
    Case("accuracy_shapes", ALL,
         lambda w: metrics.Accuracy().update_state(np.ones(3), np.ones(2)), ValueError,
         r"y_true of shape \(3,\) and y_pred of shape \(2,\) are not compatible"),
    Case("sparse_accuracy_string_labels", ALL,
         lambda w: metrics.SparseCategoricalAccuracy().update_state(np.array(["a", "b"]), np.ones((2, 4))),
         TypeError, r"y_true \(integer class labels\) must hold real numbers, got array\(\['a', 'b'\]"),
    Case("sparse_accuracy_shapes", ALL,
         lambda w: metrics.SparseCategoricalAccuracy().update_state(np.ones(3), np.ones((2, 4))),
         ValueError, r"y_true of shape \(3,\) and y_pred of shape \(2, 4\) are not compatible"),
    # -- losses ----------------------------------------------------------------------------
    Case("average_loss_strings", ALL,
         lambda w: w.in_replicas(lambda: mpidist.nn.compute_average_loss(np.array(["a"]))),
         TypeError, r"per_example_loss must hold real numbers .*dtype <U1; pass a float array"),
    Case("average_loss_bool", ALL,
         lambda w: w.in_replicas(lambda: mpidist.nn.compute_average_loss(np.array([True]))),
         TypeError, r"per_example_loss must hold real numbers .*dtype bool"),
    Case("average_loss_scalar", ALL,
         lambda w: w.in_replicas(lambda: mpidist.nn.compute_average_loss(3.0)), ValueError,
         r"Expected a tensor with at least rank 1. Received per_example_loss=3.0 with rank 0"),
    Case("average_loss_float_batch", ALL,
         lambda w: mpidist.nn.compute_average_loss(np.ones(2), global_batch_size=2.0), TypeError,
         r"global_batch_size must be an integer. Got 2.0"),
    Case("average_loss_negative_batch", ALL,
         lambda w: mpidist.nn.compute_average_loss(np.ones(2), global_batch_size=-1),
         InvalidArgumentError, r"global_batch_size must be non-negative. Got -1"),
    Case("average_loss_string_weight", ALL,
         lambda w: mpidist.nn.compute_average_loss(np.ones(2), sample_weight="a",
                                                   global_batch_size=2), TypeError,
         r"sample_weight must hold real numbers, got 'a'"),
    Case("average_loss_perreplica", DISTRIBUTED,
         lambda w: mpidist.nn.compute_average_loss(w.floats, global_batch_size=4), TypeError,
         r"per_example_loss is a PerReplica: compute the loss inside strategy.run"),
    Case("average_loss_cross_replica", STRATEGIES_ONLY,
         lambda w: _in_scope(w, lambda: mpidist.nn.compute_average_loss(np.ones(2))), RuntimeError,
         r"You are calling `compute_average_loss` in cross replica context"),
    Case("regularization_loss_none", ALL,
         lambda w: w.in_replicas(lambda: mpidist.nn.scale_regularization_loss(None)), TypeError,
         r"regularization_loss must hold real numbers .*got None"),
    Case("regularization_loss_cross_replica", STRATEGIES_ONLY,
         lambda w: _in_scope(w, lambda: mpidist.nn.scale_regularization_loss(1.0)), RuntimeError,
         r"You are calling `scale_regularization_loss` in cross replica context"),
    # -- strategies, options, resolvers ----------------------------------------------------
    Case("mirrored_devices_int", ALL, lambda w: mpidist.MirroredStrategy(5), TypeError,
         r"devices must be a list of device strings such as \['/cpu:0', '/cpu:1'\], got int 5"),
    Case("mirrored_devices_empty", ALL, lambda w: mpidist.MirroredStrategy([]), ValueError,
         r"MirroredStrategy needs at least one device, e.g. devices=\['/cpu:0'\]"),
    Case("mirrored_device_twice", ALL, lambda w: mpidist.MirroredStrategy(["/cpu:0", "/CPU:0"]),
         ValueError, r"got the device '/CPU:0' twice; list each device once"),
    Case("mirrored_device_unparsable", ALL, lambda w: mpidist.MirroredStrategy(["cpu0"]),
         ValueError, r"Cannot parse device string 'cpu0'.*such as '/cpu:0'"),
    Case("mirrored_missing_gpu", ALL, lambda w: mpidist.MirroredStrategy(["/gpu:7"]), ValueError,
         r"got GPU device\(s\) \[7\] but this process sees \d+ GPU\(s\); check CUDA_VISIBLE_DEVICES"),
    Case("mirrored_cross_device_ops_string", ALL,
         lambda w: mpidist.MirroredStrategy(["/cpu:0"], cross_device_ops="nccl"), TypeError,
         r"cross_device_ops must be a mpidist.CrossDeviceOps instance .* got 'nccl'"),
    Case("one_device_list", ALL, lambda w: mpidist.OneDeviceStrategy(["/cpu:0"]), TypeError,
         r"A device must be a string such as '/cpu:0', got list"),
    Case("one_device_missing_gpu", ALL, lambda w: mpidist.OneDeviceStrategy("/gpu:7"), ValueError,
         r"OneDeviceStrategy got '/gpu:7' but this process sees \d+ GPU\(s\)"),
    Case("communication_options_negative_pack", ALL,
         lambda w: mpidist.experimental.CommunicationOptions(bytes_per_pack=-1), ValueError,
         r"Argument `bytes_per_pack` must be >=0, Received -1"),
    Case("communication_options_bad_implementation", ALL,
         lambda w: mpidist.experimental.CommunicationOptions(implementation="foo"), ValueError,
         r"'FOO' is not a valid CommunicationImplementation"),
    Case("communication_options_string_timeout", ALL,
         lambda w: mpidist.experimental.CommunicationOptions(timeout_seconds="5"), ValueError,
         r"`timeout_seconds` must be None \(the default deadline, MPIDIST_COLLECTIVE_TIMEOUT\) or a finite positive number of seconds, Received '5'"),
    Case("tf_config_not_json", ALL, _tf_config_case("{bad json"), ValueError,
         r"TF_CONFIG environment variable is not valid JSON .*'\{bad json'"),
    Case("tf_config_list", ALL, _tf_config_case("[1, 2]"), ValueError,
         r"TF_CONFIG environment variable is a JSON list, not an object"),
    Case("tf_config_worker_string", ALL,
         _tf_config_case({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}),
         TypeError, r"tasks for job 'worker' must be a list or a dictionary .* got str 'a:1'"),
    Case("tf_config_index_string", ALL,
         _tf_config_case({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "x"}},
                         lambda r: r.task_id), ValueError,
         r"task.index must be an integer, got 'x'"),
    Case("cluster_spec_not_dict", ALL, lambda w: mpidist.cluster_resolver.ClusterSpec(5), TypeError,
         r"`cluster` must be a dictionary mapping job names to lists of network addresses"),
]


def _in_scope(w, fn):
    with w.s.scope():
        return fn()
