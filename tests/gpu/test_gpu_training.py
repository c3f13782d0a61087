"""The digits example trained on GPU replicas (CuPy arrays end to end: inputs prefetched to the
devices, forward/backward, the fused all-reduce, the optimizer and the metrics) gives the CPU
run's accuracy and weights. Skipped where no GPU is visible (MPIDIST_TEST_GPU=1: fail)."""

import sys
from pathlib import Path

import numpy as np

import mpidist
from mpidist.backend import num_gpus

from gpu_gate import need_gpus as _need_gpus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


def test_digits_on_gpus_matches_the_cpu_run():
    _need_gpus(1)
    import digits_mlp

    ref_accuracy, ref_weights, _ = digits_mlp.run("one-device", 1, "fit", epochs=3)
    train, test = digits_mlp.load_digits()
    strategy = mpidist.MirroredStrategy([f"/gpu:{i}" for i in range(num_gpus())])
    with strategy.scope():
        model = digits_mlp.MLP()
        optimizer = mpidist.optimizers.SGD(0.1, momentum=0.9)
        accuracy = mpidist.metrics.SparseCategoricalAccuracy()
    mpidist.fit(model, digits_mlp.train_dataset(*train), epochs=3, optimizer=optimizer,
                strategy=strategy, metrics=[accuracy], verbose=0)
    logs = mpidist.evaluate(model, mpidist.data.Dataset.from_tensor_slices(test).batch(64),
                            strategy=strategy, metrics=[accuracy])
    assert logs["sparse_categorical_accuracy"] == ref_accuracy
    for variable, want in zip(model.trainable_variables, ref_weights):
        got = variable.numpy()
        got = got.get() if hasattr(got, "get") else np.asarray(got)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
