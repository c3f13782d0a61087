"""Several GPUs in one process: where buffers are allocated and how the streams of two devices
are ordered, checked against tests/recording_cupy.py, a recording stand-in for CuPy.

These test OUR logic (which device is current at each allocation and launch, which events each
copy waits on, which stream's pool a batch's memory belongs to); no GPU runs here, and passing
says nothing about hardware. The stand-in raises ``WrongDeviceError`` where CuPy would reject a
launch, and ``RaceError`` where two streams touch one block with no event ordering them (a
copy reading its source before the producer ran, a pool block rewritten while another stream
still reads it). The real-GPU counterparts are in tests/gpu/.
"""

import gc
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recording_cupy import install, installed, reduce_n

import mpidist
from mpidist.backend import copy_to_device, cupy_backend, empty_like_on_device, on_device_of
from mpidist.backend.transfer import Uploader
from mpidist.core.devices import DeviceSpec
from mpidist.ops import hierarchical_copy, reduction_to_one_device
from mpidist.training.fused_apply import FusedPlan
from mpidist.values.arena import Arena
from mpidist.values.containers import PerReplica

GPU = [DeviceSpec("GPU", i) for i in range(4)]


@pytest.fixture(autouse=True)
def _collect_scans_only_the_tests_objects():
    """These tests call gc.collect() so that dropped stand-in arrays hand their blocks back to
    the pool. A full collect walks every object of the process (all of pytest, Hypothesis and
    the imported modules: about 0.15 s each, 57 s for the generated chains); freezing what
    existed before the test leaves each collect only the test's own objects, where the
    dropped arrays are, so the same blocks come back."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def stand_in(monkeypatch):
    """The CuPy stand-in with two GPUs; mpidist's CuPy cache is reset after the test."""
    yield install(monkeypatch, num_devices=2)
    cupy_backend.reset()


def _on(cupy, device, values, stream=None):
    """A stand-in array of ``values`` written on ``device`` (on ``stream`` if given)."""
    with cupy.cuda.Device(device):
        if stream is None:
            return cupy.asarray(np.asarray(values))
        with stream:
            return cupy.asarray(np.asarray(values))


def _mirrored(values, devices=("/gpu:0", "/gpu:1")):
    strategy = mpidist.MirroredStrategy(list(devices))
    with strategy.scope():
        return [mpidist.Variable(np.asarray(v, np.float32)) for v in values]


# -- allocation "like x" lands on x's device ------------------------------------------------------

def test_empty_like_on_device_allocates_on_the_arrays_gpu_not_the_current_one(stand_in):
    x = _on(stand_in, 1, np.zeros(5, np.float32))
    with stand_in.cuda.Device(0):
        out = empty_like_on_device(x, shape=(3,))
    assert (out.device.id, out.shape, out.dtype) == (1, (3,), np.float32)
    assert type(empty_like_on_device(np.zeros(2))) is np.ndarray
    assert on_device_of(np.zeros(2)) is on_device_of(3.0)  # one shared no-op for host values


def test_each_arena_lives_on_its_variables_device(stand_in):
    """Failed before the fix: every arena was allocated on the current device (GPU 0), and
    moving GPU 1's variables into it launched a copy across devices (WrongDeviceError)."""
    a, b = _mirrored([np.arange(3), np.arange(4) + 10])
    for i in range(2):
        with stand_in.cuda.Device(0):  # whatever device is current
            arena = Arena([a.values[i], b.values[i]])
        assert arena.flat.device.id == i
        assert arena.empty_like().device.id == i
        np.testing.assert_array_equal(arena.flat.get(), [0, 1, 2, 10, 11, 12, 13])


def test_fused_plan_keeps_every_replicas_arenas_and_packing_on_its_gpu(stand_in):
    """Failed before the fix (arenas of GPU 1 on GPU 0; the gradient pack launched on the
    current device)."""
    w, m = _mirrored([np.ones(3), np.zeros(3)])
    plan = FusedPlan.build([w], [{"m": m}], ["m"])
    assert plan is not None and plan.num_devices == 2
    for i in range(2):
        assert plan.params[i].device.id == i
        assert plan.grads[i].device.id == i
        assert [s.device.id for s in plan.slots[i]] == [i]
    grad = _on(stand_in, 1, np.full(3, 2.0, np.float32))
    with stand_in.cuda.Device(0):
        assert plan.pack(1, [grad], exact_dtype=True)
    np.testing.assert_array_equal(plan.grads[1].get(), [2, 2, 2])


# -- copies between GPUs wait for their producer, and their source's stream waits for them ------

def _producer_event_before(copy, source_stream, produced_seq):
    return any(e.stream is source_stream and e.seq > produced_seq for e in copy.waited)


def test_cross_device_copy_waits_on_the_source_streams_producing_work(stand_in):
    """Failed before the fix: the copy ran on GPU 0's stream with no wait on GPU 1's, so it
    could read ``x`` before the kernel writing it ran (RaceError)."""
    rec = stand_in.recording
    with stand_in.cuda.Device(1):
        producer = stand_in.cuda.Stream(non_blocking=True)
    x = _on(stand_in, 1, np.arange(6.0), stream=producer)
    with stand_in.cuda.Device(1), producer:  # the source's current stream is the producer's
        y = copy_to_device(x, GPU[0])
    assert y.device.id == 0
    np.testing.assert_array_equal(y.get(), np.arange(6.0))
    (copy,) = rec.copies
    assert (copy.src_device, copy.dst_device) == (1, 0)
    produced = x._block.accesses[0][0]
    assert _producer_event_before(copy, producer, produced)


def test_cross_device_copy_orders_the_sources_next_use_after_the_copy(stand_in):
    """Failed before the fix: once ``x`` is dropped, GPU 1's pool hands its block out again at
    once, and a kernel there overwrote it while GPU 0's copy could still be reading it."""
    x = _on(stand_in, 1, np.arange(8.0))
    y = copy_to_device(x, GPU[0])
    block = x._block
    del x
    gc.collect()
    z = _on(stand_in, 1, np.ones(8))  # same size, same stream: the pool reuses the block
    assert z._block is block
    np.testing.assert_array_equal(y.get(), np.arange(8.0))


_KINDS = st.sampled_from(["null", "blocking", "non_blocking"])


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(_KINDS, min_size=4, max_size=4),
       hops=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=6))
def test_any_chain_of_copies_between_any_streams_is_ordered(kinds, hops):
    """Generated chains: each GPU's current stream is of a random kind (the default one, a
    blocking one or a non-blocking one); a value hops from GPU to GPU, sometimes from a strided
    view, each copy then rewritten by a kernel on its GPU's stream and the previous hop's value
    dropped (its block back in the pool). No access may go unordered (RaceError), and the
    values arrive intact. Failed before the fix on every chain with a hop between GPUs."""
    with installed(num_devices=4) as cupy:
        for device, kind in enumerate(kinds):
            if kind != "null":
                with cupy.cuda.Device(device):
                    cupy.cuda.Stream(non_blocking=kind == "non_blocking").use()
        value = np.arange(12.0)
        x = _on(cupy, 0, value)
        for device, strided in hops:
            src, value = (x[::2], value[::2]) if strided else (x, value)
            del x
            x = copy_to_device(src, GPU[device])
            del src
            gc.collect()
            with cupy.cuda.Device(device):
                x[...] = x * 1.0 + 0.0  # a kernel on the copy, on its GPU's current stream
        np.testing.assert_array_equal(x.get(), value)


def test_host_copies_take_no_device_path():
    a = np.arange(3.0)
    b = copy_to_device(a)
    assert type(b) is np.ndarray and b is not a


# -- the all-reduce paths that copy between GPUs ---------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4])
def test_hierarchical_copy_sum_orders_every_hop(monkeypatch, n):
    """Failed before the fix: each hop (member to main, main to main, main to the rest) read
    the source on the destination's stream with nothing ordering it after the source's sum."""
    cupy = install(monkeypatch, num_devices=n)
    try:
        monkeypatch.setattr(hierarchical_copy, "reduce_n", reduce_n)
        arrays = [_on(cupy, j, np.full(5, j + 1.0)) for j in range(n)]
        for index in range(n):  # every rotation of the main devices
            sums = hierarchical_copy.hierarchical_copy_sum(index, arrays, GPU[:n])
            assert [s.device.id for s in sums] == list(range(n))
            for s in sums:
                np.testing.assert_array_equal(s.get(), np.full(5, n * (n + 1) / 2))
        assert len(cupy.recording.copies) > 0
    finally:
        cupy_backend.reset()


def test_reduction_to_one_device_gathers_and_broadcasts_in_order(stand_in, monkeypatch):
    """Failed before the fix: gathering GPU 1's value onto GPU 0 and broadcasting the sum back
    to GPU 1 were both unordered cross-device reads (RaceError)."""
    monkeypatch.setattr(reduction_to_one_device, "reduce_n", reduce_n)
    value = PerReplica([_on(stand_in, 0, np.ones(4)), _on(stand_in, 1, np.full(4, 2.0))],
                       devices=GPU[:2])
    ops = mpidist.ReductionToOneDevice()
    got = ops.reduce_implementation(mpidist.ReduceOp.SUM, value, value, None)
    assert [v.device.id for v in got.values] == [0, 1]
    for v in got.values:
        np.testing.assert_array_equal(v.get(), np.full(4, 3.0))


def test_per_tensor_hierarchical_all_reduce_flattens_on_each_tensors_gpu(stand_in, monkeypatch):
    """Failed before the fix: with num_packs=0, a strided tensor of GPU 1 was made contiguous
    by a kernel launched on the current device, GPU 0 (WrongDeviceError)."""
    monkeypatch.setattr(hierarchical_copy, "reduce_n", reduce_n)
    bases = [_on(stand_in, i, np.arange(8.0) * (i + 1)) for i in range(2)]
    value = PerReplica([b[::2] for b in bases], devices=GPU[:2])
    ops = mpidist.HierarchicalCopyAllReduce(num_packs=0)
    (got,) = ops.batch_reduce_implementation(mpidist.ReduceOp.SUM, [(value, value)], None)
    for i, v in enumerate(got.values):
        assert v.device.id == i
        np.testing.assert_array_equal(v.get(), np.arange(0, 8.0, 2) * 3)


# -- the uploader's batches belong to the consumer's stream ------------------------------------

def _upload_in_thread(uploader, arrays, device):
    """``uploader.upload`` run by another thread, as the prefetcher runs it (its error
    re-raised here)."""
    result = {}

    def run():
        try:
            result["out"] = uploader.upload(arrays, device)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=30)  # wait-ok: a test thread that only copies
    if "error" in result:
        raise result["error"]
    assert "out" in result, "the upload thread did not finish"
    return result["out"]


@pytest.mark.parametrize("device", [0, 1])
def test_uploader_batches_are_reused_only_after_the_consumer_read_them(stand_in, device):
    """The prefetch thread uploads, the training thread reads the batch on its default stream
    and drops it, the next upload gets the same pool block. Failed before the fix: the batch
    had been allocated on the side stream, so the block went back to the side stream's free
    list and the next upload overwrote it with no wait on the consumer's read (RaceError)."""
    rec, uploader = stand_in.recording, Uploader()
    blocks = []
    for step in range(3):
        host = [np.full((2, 3), step, np.float32), np.arange(4) + step]
        batch = _upload_in_thread(uploader, host, GPU[device])
        assert [b.device.id for b in batch] == [device, device]
        blocks.append(batch[0]._block)
        with stand_in.cuda.Device(device):  # the training step reads the batch
            rec.launch("train step", reads=tuple(batch))
        np.testing.assert_array_equal(batch[0].get(), host[0])
        np.testing.assert_array_equal(batch[1].get(), host[1])
        del batch
        gc.collect()
    assert blocks[0] is blocks[1] is blocks[2]  # the pool did reuse the memory each time
    assert all(b.stream is rec.null_stream(device) for b in blocks)


def test_uploader_copy_waits_for_the_consumers_earlier_reads_on_the_same_block(stand_in):
    """The copy itself runs on the side stream after an event recorded on the consumer's
    stream (the reads of the block queued before it was dropped)."""
    uploader = Uploader()
    first = _upload_in_thread(uploader, [np.ones(16)], GPU[0])
    with stand_in.cuda.Device(0):
        stand_in.recording.launch("train step", reads=tuple(first))
    del first
    gc.collect()
    (second,) = _upload_in_thread(uploader, [np.zeros(16)], GPU[0])
    write = [a for a in second._block.accesses if a[2] == "write"][-1]
    assert write[1].non_blocking  # on the side stream: still overlapping compute
    assert write[1].waited and write[1].waited[-1].stream is stand_in.recording.null_stream(0)


def test_uploader_leaves_cpu_devices_and_device_arrays_alone(stand_in):
    host = [np.ones(2)]
    assert Uploader().upload(host, "/cpu:0")[0] is host[0]
    on_gpu = _on(stand_in, 1, np.ones(2))
    assert _upload_in_thread(Uploader(), [on_gpu], GPU[1])[0] is on_gpu


# -- the real-GPU tests' own logic, run against the stand-in ----------------------------------

_REAL_GPU_TESTS = [
    ("test_gpu_strategy", "test_arenas_and_fused_plan_live_on_each_replicas_gpu"),
    ("test_gpu_cross_device_ops", "test_copy_between_gpus_reads_the_finished_value_of_a_busy_stream"),
    ("test_gpu_cross_device_ops", "test_hierarchical_copy_all_reduce_over_every_gpu_pair_rotation"),
    ("test_gpu_input", "test_uploaded_batches_are_not_overwritten_while_the_consumer_reads_them"),
]


@pytest.mark.parametrize(("module", "name"), _REAL_GPU_TESTS)
def test_real_gpu_tests_hold_under_the_stand_in(stand_in, monkeypatch, module, name):
    """The tests/gpu placement and ordering tests, run here against the stand-in (their kernels,
    reduce_n and pack, replaced by recording ones): a check that those tests exercise the
    orderings they claim to (each failed here against the unfixed code), not a GPU run."""
    import importlib
    import sys
    from pathlib import Path

    import gpu_gate

    from mpidist.ops import in_process_all_reduce as all_reduce

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "gpu"))
    monkeypatch.setattr(hierarchical_copy, "reduce_n", reduce_n)
    monkeypatch.setattr(reduction_to_one_device, "reduce_n", reduce_n)
    monkeypatch.setattr(all_reduce, "pack", lambda tensors, out=None, layout=None:
                        stand_in.concatenate([t.reshape(-1) for t in tensors], out=out))
    # the stand-in has the GPUs the gate asks for; the gate's marker check is for real runs
    monkeypatch.setattr(gpu_gate, "need_gpus", lambda count: None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    try:
        getattr(importlib.import_module(module), name)()
    finally:
        sys.modules.pop(module, None)  # this copy saw the patched gate; monkeypatch restores
