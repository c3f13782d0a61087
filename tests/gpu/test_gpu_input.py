"""Distributed input on GPU replicas: batches land on each replica's device (prefetched on a side
stream ahead of use by default), stay on the host with ``experimental_fetch_to_device=False``,
and hold the same numbers as the CPU split. Skipped where no GPU is visible
(MPIDIST_TEST_GPU=1: fail)."""

import threading

import numpy as np
import pytest

import mpidist
from mpidist.backend import num_gpus
from mpidist.data import Dataset

from gpu_gate import need_gpus as _need_gpus


def _strategy():
    _need_gpus(1)
    return mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(num_gpus())])


@pytest.mark.parametrize("buffer_size", [0, 1, 3])
def test_batches_are_on_each_replica_device_with_the_cpu_numbers(buffer_size):
    s = _strategy()
    import cupy

    n = s.num_replicas_in_sync
    x = np.arange(7 * n * 5, dtype=np.float32).reshape(7 * n, 5)
    options = mpidist.InputOptions(experimental_per_replica_buffer_size=buffer_size)
    dist = s.experimental_distribute_dataset(Dataset.from_tensor_slices(x).batch(2 * n + 1), options)
    reference = mpidist.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    expected = reference.experimental_distribute_dataset(
        Dataset.from_tensor_slices(x).batch(2 * n + 1))
    for got, want in zip(dist, expected, strict=True):
        parts = s.experimental_local_results(got)
        wants = reference.experimental_local_results(want)
        for i, (part, host) in enumerate(zip(parts, wants)):
            assert isinstance(part, cupy.ndarray)
            assert part.device.id == i
            np.testing.assert_array_equal(cupy.asnumpy(part), host)


def test_fetch_to_device_false_keeps_batches_on_the_host():
    s = _strategy()
    options = mpidist.InputOptions(experimental_fetch_to_device=False)
    for batch in s.experimental_distribute_dataset(Dataset.range(8).batch(4), options):
        assert all(isinstance(p, np.ndarray) for p in s.experimental_local_results(batch))


def test_prefetcher_runs_ahead_and_stops_when_abandoned():
    s = _strategy()
    it = iter(s.experimental_distribute_dataset(Dataset.range(64).batch(4)))
    next(it)
    assert any(t.name == "mpidist-prefetch" for t in threading.enumerate())
    del it
    import gc
    import time

    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.name == "mpidist-prefetch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the prefetch thread outlived its iterator"
        time.sleep(0.05)


def test_training_sum_on_gpus_matches_numpy():
    s = _strategy()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((45, 3))
    total = np.zeros(3)
    for batch in s.experimental_distribute_dataset(Dataset.from_tensor_slices(x).batch(8)):
        total += np.asarray(s.reduce("SUM", s.run(lambda b: b.sum(axis=0), args=(batch,)), axis=None))
    np.testing.assert_allclose(total, x.sum(axis=0), rtol=1e-12)


def test_uploaded_batches_are_not_overwritten_while_the_consumer_reads_them():
    """Real CuPy, 1+ GPU: the consumer queues a long read of each batch on the default stream
    and drops it at once; the next upload, which gets the same pool memory, must not overwrite
    it before that read ran (the batches come from the consumer stream's pool, and the side
    stream waits on it). Each step's result must be its own batch's sum."""
    _need_gpus(1)
    import cupy

    from mpidist.backend.transfer import Uploader

    uploader, results, n = Uploader(), [], 1 << 20
    with cupy.cuda.Device(0):
        for step in range(20):
            (batch,) = uploader.upload([np.full(n, step, np.float32)], "/gpu:0")
            acc = cupy.zeros(n, cupy.float32)
            for _ in range(50):  # a slow read of the batch, queued, not waited for
                acc += batch
            results.append(acc[:8])
            del batch, acc
        got = [float(cupy.asnumpy(r)[0]) for r in results]
    assert got == [50.0 * step for step in range(20)]
