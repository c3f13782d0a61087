"""Agreement (issue 22, item 6) and the hangs of item 1 that one process shows, in process:

* the comparison of the ranks' facts (``config_agreement.differences``), on generated facts;
* what a resolver contributes (its cluster and settings; not this task's place in it);
* the content digest a restore agrees on;
* re-entering strategies in every generated nesting of scope / run / merge_call ends (a
  result or TF's RuntimeError), never a hang;
* a ``fit`` epoch that can never end (an infinite dataset) or never start (an empty one) is
  refused up front;
* a strategy within one process, launched on several ranks, warns once.

The cross-rank halves run under mpiexec: tests/mpi/test_agreement_on_ranks.py and
tests/test_construction_agreement.py.
"""

import itertools
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.cluster_resolver import SimpleClusterResolver, TFConfigClusterResolver
from mpidist.cluster_resolver.agreement import layout_facts
from mpidist.cluster_resolver.base import configuration_facts
from mpidist.cluster_resolver.cluster_spec import ClusterSpec
from mpidist.comm.config_agreement import check_agreement, differences
from mpidist.data import Dataset
from mpidist.errors import InvalidArgumentError
from mpidist.strategies import alone_warning
from mpidist.training.restore_agreement import content_digest

# -- comparing facts ----------------------------------------------------------------------------
values = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", None]),
                   st.tuples(st.integers(0, 2), st.booleans()))
facts_of_a_rank = st.dictionaries(st.sampled_from(["cluster_spec", "options", "nccl"]), values,
                                  max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(facts_of_a_rank, min_size=1, max_size=6))
def test_differences_name_each_differing_fact_and_every_rank(everyone):
    lines = differences(everyone)
    keys = {k for facts in everyone for k in facts}
    differing = {k for k in keys
                 if len({repr(f[k]) if k in f else "<not set>" for f in everyone}) > 1}
    assert {line.split(":")[0] for line in lines} == differing
    for line in lines:
        named = [int(r) for part in line.split(": ", 1)[1].split("; ")
                 for r in part.split(" ha")[0].replace("ranks ", "").replace("rank ", "")
                 .split(", ")]
        assert sorted(named) == list(range(len(everyone))), line  # each rank in one group
    if differing:
        with pytest.raises(InvalidArgumentError, match="must agree"):
            check_agreement("X()", everyone)
    else:
        check_agreement("X()", everyone)


def test_a_difference_says_which_rank_has_what_and_the_fix():
    with pytest.raises(InvalidArgumentError) as info:
        check_agreement("ParameterServerStrategy", [{"ps": 1}, {"ps": 1}, {"ps": 2}], "Fix it.")
    assert "ps: ranks 0, 1 have 1; rank 2 has 2" in str(info.value)
    assert str(info.value).endswith("Fix it.")


# -- what a resolver contributes ------------------------------------------------------------------
def test_resolver_facts_leave_out_the_task_and_keep_the_cluster(monkeypatch):
    spec = ClusterSpec({"worker": ["h:1", "h:2"]})
    a = configuration_facts(SimpleClusterResolver(spec, task_type="worker", task_id=0))
    b = configuration_facts(SimpleClusterResolver(spec, task_type="worker", task_id=1))
    assert a == b and a["cluster_spec"] == {"worker": ["h:1", "h:2"]}
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h:2", "h:1"]}, '
                                     '"task": {"type": "worker", "index": 0}}')
    c = configuration_facts(TFConfigClusterResolver())
    assert [line.split(":")[0] for line in differences([a, c])] == ["cluster resolver",
                                                                     "cluster_spec"]


def test_ps_layout_is_tasks_per_job_whatever_the_addresses():
    one = SimpleClusterResolver(ClusterSpec({"chief": ["a:1"], "ps": ["a:2"], "worker": ["a:3"]}))
    other = SimpleClusterResolver(ClusterSpec({"chief": ["b:1"], "ps": ["b:2"],
                                               "worker": ["b:3"]}))
    two_ps = SimpleClusterResolver(ClusterSpec({"chief": ["a:1"], "ps": ["a:2", "a:3"]}))
    assert layout_facts(one) == layout_facts(other) == \
        {"tasks per job": {"chief": 1, "ps": 1, "worker": 1}}
    assert differences([layout_facts(one), layout_facts(two_ps)])


# -- the digest a restore agrees on ---------------------------------------------------------------
def test_content_digest_follows_the_content_not_the_order(tmp_path):
    entries = [{"key": "a", "dtype": "<f8", "shape": [3], "sha256": "0" * 64},
               {"key": "b", "dtype": "<i4", "shape": [], "sha256": "1" * 64}]
    digest = content_digest({"entries": entries})
    assert digest == content_digest({"entries": entries[::-1]})
    changed = [dict(entries[0], sha256="2" * 64), entries[1]]
    assert digest != content_digest({"entries": changed})


# -- re-entering strategies: generated nestings never hang ----------------------------------------
def _strategies():
    return {
        "mirrored": mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        "mirrored1": mpidist.MirroredStrategy(["/cpu:0"]),
        "onedevice": mpidist.OneDeviceStrategy("/cpu:0"),
        "central": mpidist.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"]),
        "default": mpidist.get_strategy(),
    }


def _enter(op, strategy):
    if op == "scope":
        def scope(inner):
            with strategy.scope():
                return inner()
        return scope
    if op == "run":
        return lambda inner: strategy.run(lambda: inner())

    def merge(inner):
        context = mpidist.get_replica_context()
        if context is None:  # cross-replica: there is no merge_call to make (None in TF too)
            return "n/a"
        return context.merge_call(lambda _: inner())
    return merge


OPS = ["scope", "run", "merge_call"]
TARGETS = ["same", "other", "default"]
STEP = st.tuples(st.sampled_from(OPS), st.sampled_from(TARGETS))
TF_ERRORS = ("Mixing different", "Must not nest", "requires being in cross-replica",
             "Need to be inside", "merge_call", "replica context", "one strategy.run at a time")


def _outcome(name, chain):
    """Run the nesting on a thread; ``"hang"`` if it has not ended after 20 s."""
    strategies = _strategies()
    pick = {"same": strategies[name], "other": mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
            "default": strategies["default"]}
    fn = lambda: None  # noqa: E731 - the innermost call
    for op, target in reversed(chain):
        fn = (lambda enter, inner: (lambda: enter(inner)))(_enter(op, pick[target]), fn)
    out = []

    def body():
        try:
            fn()
            out.append("ok")
        except Exception as err:  # noqa: BLE001 - the outcome is what is checked
            out.append(err)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(20)  # wait-ok: a test's bound on the case
    return out[0] if out else "hang"


def _check(name, chain):
    outcome = _outcome(name, chain)
    assert outcome != "hang", f"{name} {chain} hangs"
    if outcome != "ok":
        assert isinstance(outcome, RuntimeError), (name, chain, outcome)
        assert any(text in str(outcome) for text in TF_ERRORS), (name, chain, outcome)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["mirrored", "mirrored1", "onedevice", "central", "default"]),
       st.lists(STEP, min_size=1, max_size=4).filter(lambda c: c[0][0] != "merge_call"))
def test_generated_nestings_end_with_a_result_or_tfs_error(name, chain):
    _check(name, chain)


# The class that hung before (a merge_fn running the same strategy's run again), every case.
@pytest.mark.parametrize("name,chain", [
    (name, (("run", t), ("merge_call", m), ("run", t)))
    for name, t, m in itertools.product(["mirrored", "central", "onedevice"], ["same", "other"],
                                        TARGETS)
    if not (name == "onedevice" and t == "same")])
def test_run_inside_merge_fn_of_the_same_run_raises(name, chain):
    outcome = _outcome(name, chain)
    assert isinstance(outcome, RuntimeError) and "one strategy.run at a time" in str(outcome), \
        outcome


def test_tfs_nesting_errors_stay():
    s, s2 = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]), mpidist.MirroredStrategy(["/cpu:0"])
    with s.scope(), pytest.raises(RuntimeError, match="Mixing different"):
        with s2.scope():
            pass
    with pytest.raises(RuntimeError, match="Mixing different|requires being in cross-replica"):
        s.run(lambda: s2.run(lambda: None))


# -- fit epochs that can never end ---------------------------------------------------------------
class _Model:
    def __init__(self):
        self.w = mpidist.Variable(np.zeros(2))
        self.trainable_variables = [self.w]

    def loss_and_gradients(self, x, y):
        return np.sum((x @ self.w - y) ** 2, axis=-1) * 0 + np.ones(len(x)), [np.zeros(2)]


def _data():
    return Dataset.from_tensor_slices((np.ones((8, 2)), np.ones(8))).batch(4)


def test_fit_refuses_an_infinite_dataset_without_steps_per_epoch():
    with pytest.raises(ValueError, match="When passing an infinitely repeating dataset, you "
                                         "must specify the `steps_per_epoch` argument"):
        mpidist.fit(_Model(), _data().repeat(), 2, optimizer=mpidist.optimizers.SGD(0.1),
                    verbose=0)


def test_fit_on_an_infinite_dataset_with_steps_per_epoch_runs():
    history = mpidist.fit(_Model(), _data().repeat(), 2, optimizer=mpidist.optimizers.SGD(0.1),
                          steps_per_epoch=3, verbose=0)
    assert len(history.history["loss"]) == 2


@pytest.mark.parametrize("empty", ["take0", "drop_remainder", "iterator"])
def test_fit_refuses_an_empty_dataset(empty):
    data = {"take0": lambda: _data().take(0),
            "drop_remainder": lambda: Dataset.from_tensor_slices(
                (np.ones((3, 2)), np.ones(3))).batch(4, drop_remainder=True),
            "iterator": lambda: iter([])}[empty]()  # no cardinality: found empty
    with pytest.raises(ValueError, match="Expected input data to be non-empty"):
        mpidist.fit(_Model(), data, 1, optimizer=mpidist.optimizers.SGD(0.1), verbose=0)


def test_evaluate_refuses_an_infinite_dataset():
    with pytest.raises(ValueError, match="infinitely repeating"):
        mpidist.evaluate(_Model(), _data().repeat())


def test_an_iterator_used_up_after_one_epoch_warns_and_stops():
    batches = iter([(np.ones((4, 2)), np.ones(4))] * 2)
    with pytest.warns(UserWarning, match="ran out of data"):
        history = mpidist.fit(_Model(), batches, 3, optimizer=mpidist.optimizers.SGD(0.1),
                              verbose=0)
    assert len(history.history["loss"]) == 1



@pytest.mark.parametrize("batches,steps_per_epoch,epochs", [(2, 5, 2), (3, 4, 3), (1, 2, 5)])
def test_data_shorter_than_steps_per_epoch_warns_and_stops_after_the_epoch(
        batches, steps_per_epoch, epochs):
    """tf.keras: the data ran out before steps_per_epoch steps; it warns and stops training
    after the epoch (its callbacks run) instead of running every epoch short."""
    data = Dataset.from_tensor_slices((np.ones((4 * batches, 2)), np.ones(4 * batches))).batch(4)
    optimizer = mpidist.optimizers.SGD(0.1)
    ends = []

    class Recorder(mpidist.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(epoch)

    with pytest.warns(UserWarning, match=rf"ran out of data; interrupting training after epoch 0: "
                                         rf"it gave {batches} batch\(es\), not "
                                         rf"steps_per_epoch={steps_per_epoch}.*\.repeat\(\)"):
        history = mpidist.fit(_Model(), data, epochs, optimizer=optimizer, verbose=0,
                              steps_per_epoch=steps_per_epoch, callbacks=[Recorder()])
    assert history.epoch == [0] and ends == [0]
    assert int(optimizer.iterations.numpy()) == batches


def test_steps_per_epoch_the_data_can_give_runs_every_epoch_without_a_warning():
    optimizer = mpidist.optimizers.SGD(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        history = mpidist.fit(_Model(), _data(), 3, optimizer=optimizer, verbose=0,
                              steps_per_epoch=2)
    assert history.epoch == [0, 1, 2] and int(optimizer.iterations.numpy()) == 6

# -- a strategy within one process under a multi-rank launch -------------------------------------
@pytest.mark.parametrize("make", [
    lambda: mpidist.OneDeviceStrategy("/cpu:0"),
    lambda: mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    lambda: mpidist.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"]),
], ids=["OneDevice", "Mirrored", "CentralStorage"])
def test_a_one_process_strategy_warns_once_under_a_multi_rank_launch(monkeypatch, make):
    monkeypatch.setattr(alone_warning, "_warned", [])
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.warns(UserWarning, match="MultiWorkerMirroredStrategy") as record:
        make()
        make()
    assert len([w for w in record if "MultiWorkerMirroredStrategy" in str(w.message)]) == 1


def test_fit_with_the_default_strategy_warns_under_a_multi_rank_launch(monkeypatch):
    monkeypatch.setattr(alone_warning, "_warned", [])
    monkeypatch.setenv("PMI_SIZE", "4")
    with pytest.warns(UserWarning, match="4 ranks .*MultiWorkerMirroredStrategy"):
        mpidist.fit(_Model(), _data(), 1, optimizer=mpidist.optimizers.SGD(0.1), verbose=0)


def test_no_warning_for_one_process(monkeypatch):
    monkeypatch.setattr(alone_warning, "_warned", [])
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mpidist.OneDeviceStrategy("/cpu:0")
