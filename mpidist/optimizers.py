"""``mpidist.optimizers``: optimizers whose ``apply_gradients`` works under every strategy."""

from mpidist.training.optimizers import SGD, Adam, Optimizer

__all__ = ["Adam", "Optimizer", "SGD"]
