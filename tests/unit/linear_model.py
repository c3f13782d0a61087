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
