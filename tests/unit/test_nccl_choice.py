"""NCCL across ranks is chosen only where it can run (issue 23, finding 3), and NCCL sums every
dtype it has a type for (complex as its float components) and refuses the others by name.

Tests of OUR logic with stand-ins: simulated per-rank facts for the decision, a recording
stand-in for ``cupy.cuda.nccl`` for the dtype codes. Nothing here ran on a GPU; the same
decision across real MPI ranks is tests/mpi/test_nccl_choice_on_ranks.py.
"""

import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpidist.backend import cupy_backend
from mpidist.comm import nccl as nccl_mod
from mpidist.comm.nccl_choice import choose_nccl, gpu_identity, rank_facts, shared_gpus
from mpidist.comm.options import CommunicationImplementation as Impl
from mpidist.errors import InvalidArgumentError

from recording_cupy import stand_in  # noqa: F401 - the fixture

WHAT = "MultiWorkerMirroredStrategy()"

# -- the decision, from simulated facts ----------------------------------------------------------

# A rank: its node and the GPU NCCL would drive there (a UUID is unique everywhere: node "").
gpus = st.one_of(st.tuples(st.just(""), st.sampled_from(["GPU-a", "GPU-b", "GPU-c"])),
                 st.tuples(st.sampled_from(["n0", "n1"]), st.sampled_from(["GPU 0", "GPU 1"])))
jobs = st.lists(gpus, min_size=2, max_size=6)


def facts(identities, loads=True):
    return [rank_facts(True, loads, tuple(i)) for i in identities]


@given(jobs)
def test_auto_takes_nccl_exactly_when_no_two_ranks_share_a_gpu(identities):
    use, why = choose_nccl(WHAT, Impl.AUTO, facts(identities))
    distinct = len(set(identities)) == len(identities)
    assert use is distinct
    if not distinct:
        assert "share" in why


@given(jobs)
def test_requested_nccl_on_shared_gpus_names_the_ranks_and_the_fix(identities):
    everyone = facts(identities)
    shared = shared_gpus(everyone)
    if not shared:
        assert choose_nccl(WHAT, Impl.NCCL, everyone) == (True, choose_nccl(
            WHAT, Impl.AUTO, everyone)[1])
        return
    with pytest.raises(InvalidArgumentError) as err:
        choose_nccl(WHAT, Impl.NCCL, everyone)
    message = str(err.value)
    for (where, name), ranks in shared.items():
        assert name in message and (not where or where in message)
        assert ", ".join(str(r) for r in ranks) in message
    assert "CommunicationImplementation.RING" in message and "CUDA_VISIBLE_DEVICES" in message


@given(jobs)
def test_every_rank_decides_alike(identities):
    # Each rank decides from the same gathered list: the answer cannot depend on who asks.
    everyone = facts(identities)
    answers = {choose_nccl(WHAT, Impl.AUTO, list(everyone)) for _ in identities}
    assert len(answers) == 1


def test_ring_cpu_replicas_and_one_rank_never_take_nccl():
    two = facts([("", "GPU-a"), ("", "GPU-b")])
    assert choose_nccl(WHAT, Impl.RING, two)[0] is False
    assert choose_nccl(WHAT, Impl.NCCL, two[:1])[0] is False
    mixed = [two[0], rank_facts(False, False, None)]
    use, why = choose_nccl(WHAT, Impl.NCCL, mixed)  # TF falls back to RING for CPU values
    assert use is False and "rank 1 has CPU replicas" in why


def test_nccl_missing_on_a_rank_falls_back_under_auto_and_is_named_when_requested():
    everyone = [rank_facts(True, True, ("", "GPU-a")), rank_facts(True, False, None)]
    use, why = choose_nccl(WHAT, Impl.AUTO, everyone)
    assert use is False and "rank 1" in why
    with pytest.raises(InvalidArgumentError, match=r"NCCL cannot be loaded on rank 1"):
        choose_nccl(WHAT, Impl.NCCL, everyone)


# -- the GPU's identity --------------------------------------------------------------------------

def test_identity_is_the_uuid_where_cupy_gives_one(stand_in, monkeypatch):  # noqa: F811
    uuid = bytes(range(16))
    monkeypatch.setattr(stand_in.cuda.runtime, "getDeviceProperties",
                        lambda i: {"uuid": uuid}, raising=False)
    assert gpu_identity(1, "n0") == ("", "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")


def test_identity_falls_back_to_the_pci_bus_id_then_the_visible_index(stand_in, monkeypatch):  # noqa: F811
    monkeypatch.setattr(stand_in.cuda.Device, "pci_bus_id", "0000:3b:00.0", raising=False)
    assert gpu_identity(0, "n0") == ("n0", "PCI 0000:3b:00.0")
    monkeypatch.delattr(stand_in.cuda.Device, "pci_bus_id")
    # Two ranks that each see "their" GPU 0 through CUDA_VISIBLE_DEVICES drive different GPUs.
    a = gpu_identity(0, "n0", {"CUDA_VISIBLE_DEVICES": "2"})
    b = gpu_identity(0, "n0", {"CUDA_VISIBLE_DEVICES": "3"})
    assert a != b and "GPU 2" in a[1]
    assert gpu_identity(1, "n0", {"CUDA_VISIBLE_DEVICES": "5,7"})[1].startswith("GPU 7")
    assert gpu_identity(1, "n0", {}) == ("n0", "GPU 1")
    assert gpu_identity(1, "n0", {}) != gpu_identity(1, "n1", {})


# -- the dtype table, with a recording stand-in for cupy.cuda.nccl ------------------------------

_CODES = {"NCCL_INT8": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_UINT32": 3, "NCCL_INT64": 4,
          "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_FLOAT32": 7, "NCCL_FLOAT64": 8,
          "NCCL_BFLOAT16": 9}
_NAMES = {code: name for name, code in _CODES.items()}


def fake_nccl(calls):
    class Communicator:
        def __init__(self, *args):
            pass

        @staticmethod
        def initAll(devices):
            return [Communicator() for _ in devices]

        def allReduce(self, send, recv, count, dtype, op, stream):
            calls.append((_NAMES[dtype], count))

        def abort(self):
            pass

    return types.SimpleNamespace(NcclCommunicator=Communicator, NCCL_SUM=0, groupStart=lambda: None,
                                 groupEnd=lambda: None, get_unique_id=lambda: b"id",
                                 get_version=lambda: 22105, available=True, **_CODES)


@pytest.fixture
def nccl_calls(stand_in, monkeypatch):  # noqa: F811
    calls = []
    monkeypatch.setattr(nccl_mod, "_state", {"module": fake_nccl(calls), "error": None,
                                             "checked": True})
    monkeypatch.setattr(cupy_backend, "get_cupy", lambda: stand_in)
    return calls


ALL_DTYPES = sorted({np.dtype(t) for t in np.sctypeDict.values()} - {np.dtype("V")}, key=str)
EXPECTED = {"float16": ("NCCL_FLOAT16", 1), "float32": ("NCCL_FLOAT32", 1),
            "float64": ("NCCL_FLOAT64", 1), "int8": ("NCCL_INT8", 1),
            "uint8": ("NCCL_UINT8", 1), "int32": ("NCCL_INT32", 1), "uint32": ("NCCL_UINT32", 1),
            "int64": ("NCCL_INT64", 1), "uint64": ("NCCL_UINT64", 1),
            "complex64": ("NCCL_FLOAT32", 2), "complex128": ("NCCL_FLOAT64", 2)}


class _OneRank:
    rank, size = 0, 1

    def all_gather_object(self, obj):
        return [obj]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_both_groups_pass_nccl_the_one_table_s_type_or_refuse_by_name(dtype, stand_in, nccl_calls):  # noqa: F811
    expected = EXPECTED.get(dtype.name)
    with stand_in.cuda.Device(1):
        buf = stand_in.empty((5,), dtype)  # (CuPy has no arrays of some: our check is first)
    rank_group = nccl_mod.RankNcclGroup(_OneRank(), 1)
    local = nccl_mod.LocalNcclGroup([0, 1])
    if expected is None:
        with pytest.raises(TypeError, match=rf"NCCL cannot all-reduce arrays of dtype {dtype.name}:"
                                            r".*Cast the values first.*RING"):
            nccl_mod.nccl_dtype(dtype)
        with pytest.raises(TypeError, match=dtype.name):
            rank_group.all_reduce_sum(buf)
        with pytest.raises(TypeError, match=dtype.name):
            local.all_reduce_sum([buf, buf], [buf, buf])
        assert nccl_calls == [] and not nccl_mod.nccl_can_reduce(dtype)
        return
    rank_group.all_reduce_sum(buf)
    with stand_in.cuda.Device(0):
        other = stand_in.empty((5,), dtype)
    local.all_reduce_sum([other, buf], [other, buf])
    name, per_element = expected
    assert nccl_calls == [(name, 5 * per_element)] * 3
    assert nccl_mod.nccl_can_reduce(dtype)


def test_complex_as_float_components_is_the_componentwise_sum():
    # What NCCL does with the float view of complex buffers, done in NumPy: exact.
    rng = np.random.default_rng(0)
    ranks = [(rng.standard_normal(7) + 1j * rng.standard_normal(7)).astype(np.complex64)
             for _ in range(3)]
    summed_view = np.sum([r.view(np.float32) for r in ranks], axis=0, dtype=np.float32)
    expected = ranks[0].copy()
    for r in ranks[1:]:
        expected += r
    np.testing.assert_array_equal(summed_view.view(np.complex64), expected)


def test_a_buffer_on_another_gpu_than_the_group_s_is_refused_by_name(stand_in, nccl_calls):  # noqa: F811
    group = nccl_mod.RankNcclGroup(_OneRank(), 0)
    with stand_in.cuda.Device(1):
        buf = stand_in.zeros((3,), np.float32)
    with pytest.raises(ValueError, match="buf is on GPU 1, but this rank's NCCL communicator "
                                         "drives GPU 0"):
        group.all_reduce_sum(buf)
    assert nccl_calls == []


def test_nccl_version_reads_the_binding(nccl_calls):
    assert nccl_mod.nccl_version() == "2.21.5"
