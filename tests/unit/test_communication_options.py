"""CommunicationOptions / CommunicationImplementation (spec 6.7), the launch check, and the
pure pieces of the communicator: fingerprints, mismatch fields, pack ranges."""

import numpy as np
import pytest

import mpidist
from mpidist.comm.collective_call import CollectiveCall
from mpidist.comm.failure_reports import differing_fields
from mpidist.comm.mpi import check_launch, launcher_world_size
from mpidist.experimental import (
    CollectiveCommunication,
    CollectiveHints,
    CommunicationImplementation,
    CommunicationOptions,
)
from mpidist.kernels.layout import FusionLayout
from mpidist.ops.collective_all_reduce import DEFAULT_BYTES_PER_PACK, _pack_ranges

AUTO, RING, NCCL = (CommunicationImplementation.AUTO, CommunicationImplementation.RING,
                    CommunicationImplementation.NCCL)


def test_defaults():
    o = CommunicationOptions()
    assert (o.bytes_per_pack, o.timeout_seconds, o.implementation) == (0, None, AUTO)


def test_negative_bytes_per_pack_is_rejected_with_tf_message():
    with pytest.raises(ValueError, match=r"Argument `bytes_per_pack` must be >=0, Received -1\."):
        CommunicationOptions(bytes_per_pack=-1)


@pytest.mark.parametrize("name,expected", [("nccl", NCCL), ("Ring", RING), ("AUTO", AUTO)])
def test_implementation_strings_are_upper_cased(name, expected):
    assert CommunicationOptions(implementation=name).implementation is expected


def test_unknown_implementation_string():
    with pytest.raises(ValueError, match="'FOO' is not a valid CommunicationImplementation"):
        CommunicationOptions(implementation="foo")


@pytest.mark.parametrize("bad", [1, None, 2.5, object()])
def test_non_enum_implementation(bad):
    with pytest.raises(ValueError, match="Argument `implementation` must be instance of"):
        CommunicationOptions(implementation=bad)


@pytest.mark.parametrize("bad", [0, -1.0, "5", True, float("inf"), float("nan")])
def test_bad_timeout(bad):
    with pytest.raises(ValueError, match="timeout_seconds"):
        CommunicationOptions(timeout_seconds=bad)


@pytest.mark.parametrize("bad", [1.5, "10", True])
def test_bad_bytes_per_pack_type(bad):
    with pytest.raises(ValueError, match="bytes_per_pack"):
        CommunicationOptions(bytes_per_pack=bad)


def test_merge_takes_the_non_default_fields_of_the_argument():
    a = CommunicationOptions(10, 5.0, RING)
    merged = a.merge(CommunicationOptions(0, None, NCCL))
    assert (merged.bytes_per_pack, merged.timeout_seconds, merged.implementation) == (10, 5.0, NCCL)
    assert (a.bytes_per_pack, a.timeout_seconds, a.implementation) == (10, 5.0, RING)  # unchanged
    merged = a.merge(CommunicationOptions(7, 1.5))
    assert (merged.bytes_per_pack, merged.timeout_seconds, merged.implementation) == (7, 1.5, RING)
    assert a.merge(None) == a and a.merge(None) is not a


def test_merge_rejects_other_types():
    with pytest.raises(ValueError, match="CommunicationOptions"):
        CommunicationOptions().merge({"bytes_per_pack": 1})


def test_deprecated_spellings():
    assert CollectiveCommunication is CommunicationImplementation
    hints = CollectiveHints(bytes_per_pack=32, timeout_seconds=3)
    assert hints == CommunicationOptions(32, 3.0, AUTO)
    assert mpidist.experimental.CommunicationOptions is CommunicationOptions


def test_strategy_argument_types_are_checked_before_mpi_starts():
    with pytest.raises(ValueError, match="communication_options must be an instance of "
                                         "mpidist.experimental.CommunicationOptions"):
        mpidist.MultiWorkerMirroredStrategy(communication_options=CommunicationOptions)


# -- the launch check -----------------------------------------------------------------------
@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"PMI_SIZE": "4"}, ("PMI_SIZE", 4)),
    ({"SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2"}, ("SLURM_STEP_NUM_TASKS", 2)),
    ({"OMPI_COMM_WORLD_SIZE": "3"}, ("OMPI_COMM_WORLD_SIZE", 3)),
    ({"PMI_SIZE": "x"}, None),
])
def test_launcher_world_size(env, expected):
    assert launcher_world_size(env) == expected


def test_singleton_ranks_fail_loudly_with_the_fix():
    with pytest.raises(RuntimeError) as info:
        check_launch(1, {"SLURM_NTASKS": "4"})
    text = str(info.value)
    assert "started 4 tasks (SLURM_NTASKS=4)" in text
    assert "every task is running alone" in text and "srun --mpi=pmix" in text


def test_other_size_mismatch_names_both_sizes():
    with pytest.raises(RuntimeError, match=r"announced 4 tasks \(PMI_SIZE=4\) but MPI reports a "
                                           r"world of size 2"):
        check_launch(2, {"PMI_SIZE": "4"})


@pytest.mark.parametrize("size,env", [(4, {"PMI_SIZE": "4"}), (1, {}), (3, {"SLURM_NTASKS": "1"})])
def test_matching_or_unannounced_launches_pass(size, env):
    check_launch(size, env)  # mpirun inside a 1-task Slurm allocation may start more ranks


# -- fingerprints and mismatch reports ------------------------------------------------------
def test_fingerprint_separates_every_field_and_the_sequence_number():
    base = CollectiveCall("all_reduce", op="sum", dtype="float32", shape=(4,))
    variants = [CollectiveCall("all_reduce", op="max", dtype="float32", shape=(4,)),
                CollectiveCall("all_reduce", op="sum", dtype="float64", shape=(4,)),
                CollectiveCall("all_reduce", op="sum", dtype="float32", shape=(5,)),
                CollectiveCall("broadcast", op="sum", dtype="float32", shape=(4,))]
    fps = {base.fingerprint(3)} | {v.fingerprint(3) for v in variants} | {base.fingerprint(4)}
    assert len(fps) == 6
    assert base.fingerprint(3) == CollectiveCall("all_reduce", op="sum", dtype="float32",
                                                 shape=(4,)).fingerprint(3)
    assert base.describe() == "all_reduce(op=sum, dtype=float32, shape=[4])"


def test_differing_fields_are_named():
    a = (5, "all_reduce", (("op", "sum"), ("dtype", "float32"), ("shape", (4,))), ())
    b = (5, "all_reduce", (("op", "sum"), ("dtype", "float32"), ("shape", (5,))), ())
    c = (6, "broadcast", (("root", 0),), ())
    assert differing_fields([a, b]) == ["shape"]
    assert differing_fields([a, c]) == ["sequence number", "operation"]


def test_differing_public_calls_and_their_arguments_are_named_first():
    fields = (("op", "sum"), ("dtype", "float32"), ("shape", (4,)))
    reduce_sum = (("Strategy.reduce", (("reduce_op", "SUM"), ("axis", None))),)
    reduce_mean = (("Strategy.reduce", (("reduce_op", "MEAN"), ("axis", None))),)
    save = (("Checkpoint.save", ()),)
    assert differing_fields([(5, "all_reduce", fields, reduce_sum),
                              (5, "all_reduce", fields, reduce_mean)]) == [
        "Strategy.reduce's argument reduce_op"]
    assert differing_fields([(5, "all_reduce", fields, save),
                              (5, "finalize", (), ())]) == [
        "the public call (Checkpoint.save vs the end of the program)", "operation"]
    nested = (("fit", ()), ("ReplicaContext.all_reduce", (("reduce_op", "SUM"),)))
    assert differing_fields([(5, "all_reduce", fields, nested),
                              (5, "all_reduce", fields, reduce_sum)]) == [
        "the public call (Strategy.reduce vs fit > ReplicaContext.all_reduce)"]


def test_collective_call_describes_the_public_call_and_fingerprints_its_arguments():
    from mpidist.core.user_calls import current_label, user_call

    with user_call("Strategy.reduce", reduce_op="SUM", axis=None):
        assert current_label() == "Strategy.reduce"
        summed = CollectiveCall("all_reduce", op="sum", dtype="float32", shape=(4,))
    with user_call("Strategy.reduce", reduce_op="MEAN", axis=None):
        averaged = CollectiveCall("all_reduce", op="sum", dtype="float32", shape=(4,))
    bare = CollectiveCall("all_reduce", op="sum", dtype="float32", shape=(4,))
    assert current_label() == ""
    assert summed.describe() == (
        "all_reduce(op=sum, dtype=float32, shape=[4]) in Strategy.reduce(reduce_op=SUM, axis=None)")
    assert bare.describe() == "all_reduce(op=sum, dtype=float32, shape=[4])"
    assert len({summed.fingerprint(3), averaged.fingerprint(3), bare.fingerprint(3)}) == 3
    assert CollectiveCall("finalize").describe() == "finalize() at the end of the program"


# -- packing ---------------------------------------------------------------------------------
def test_pack_ranges_follow_tfs_reversed_greedy_grouping():
    layout = FusionLayout([(10,), (20,), (5,), (30,), (1,)])  # float32: 40, 80, 20, 120, 4 bytes
    # Grouped last tensor first: bytes (4, 120, 20, 80, 40) in 100-byte packs.
    ranges = _pack_ranges(layout, 4, 100)
    covered = sorted(ranges)
    assert covered[0][0] == 0 and covered[-1][1] == layout.total
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    assert _pack_ranges(layout, 4, 1) == [(65, 66), (35, 65), (30, 35), (10, 30), (0, 10)]
    assert _pack_ranges(layout, 4, 0) == [(0, 66)]  # 0: the default, far above 264 bytes
    assert DEFAULT_BYTES_PER_PACK == 32 * 1024 * 1024


def test_pack_ranges_of_a_large_model_respect_the_default():
    layout = FusionLayout([(4 * 1024 * 1024,)] * 20)  # 20 x 16 MiB float32
    ranges = _pack_ranges(layout, 4, 0)
    sizes = [hi - lo for lo, hi in ranges]
    assert sum(sizes) == layout.total
    assert all(s * 4 <= DEFAULT_BYTES_PER_PACK + 16 * 1024 * 1024 for s in sizes)
    assert len(ranges) == 7  # greedy: a pack closes once it holds more than 32 MiB (3 tensors)
    assert np.all(np.diff([lo for lo, _ in ranges]) < 0)


def test_a_process_manager_that_agrees_with_mpi_wins_over_slurm_counts():
    check_launch(2, {"SLURM_NTASKS": "4", "PMI_SIZE": "2"})
    check_launch(2, {"SLURM_STEP_NUM_TASKS": "8", "OMPI_COMM_WORLD_SIZE": "2"})
    with pytest.raises(RuntimeError, match="every task is running alone"):
        check_launch(1, {"SLURM_STEP_NUM_TASKS": "8", "PMI_SIZE": "8"})
