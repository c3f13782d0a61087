"""``mpidist.autodiff``: gradients of a loss written in array code, from autograd (NumPy) or
JAX, under every strategy (docs/autodiff.md)."""

from mpidist.training.autodiff import (BACKENDS, TracedValueError, UnusedVariableWarning,
                                       value_and_grad)

__all__ = ["BACKENDS", "TracedValueError", "UnusedVariableWarning", "value_and_grad"]
