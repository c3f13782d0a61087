"""A two-weight linear model with its own backward pass, for tests that need any valid model
for ``mpidist.fit`` / ``evaluate`` (its predictions are (N, 1) against (N,) labels)."""

import numpy as np

import mpidist


class LinearModel:
    def __init__(self):
        self.w = mpidist.Variable(np.zeros((2, 1)), name="w")
        self.trainable_variables = [self.w]

    def loss_and_gradients(self, x, y):
        err = x @ np.asarray(self.w) - y.reshape(-1, 1)
        return err[:, 0] ** 2, [2 * x.T @ err / len(x)]

    def predict(self, x):
        return x @ np.asarray(self.w)


def linear_job(strategy, rows, coefficients, batch=8):
    """``(model, optimizer, dataset)`` for ``mpidist.fit`` under ``strategy``: a LinearModel
    and SGD(0.05) made in its scope, and ``rows`` seeded normal examples whose targets are
    ``x @ coefficients``, in batches of ``batch``."""
    from mpidist.data import Dataset

    with strategy.scope():
        model = LinearModel()
        optimizer = mpidist.optimizers.SGD(0.05)
    x = np.random.default_rng(0).standard_normal((rows, 2))
    return model, optimizer, Dataset.from_tensor_slices((x, x @ np.asarray(coefficients))).batch(
        batch)
