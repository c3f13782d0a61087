"""Values traced by an autodiff library (autograd's boxes, JAX's tracers), told apart from
arrays without importing either library.

Inside ``mpidist.autodiff.value_and_grad`` the loss function sees its parameters as traced
values: autograd wraps NumPy arrays in ``ArrayBox``es, JAX passes ``Tracer``s. Code that takes
arrays (the loss helpers, the metrics) asks ``traced_kind`` first and then computes with the
library's own array namespace (``namespace_of``), so the trace is not broken.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Literal

__all__ = ["traced_kind", "namespace_of", "untraced", "traced_error"]


def traced_kind(x: object) -> Literal["autograd", "jax"] | None:
    """``"autograd"`` or ``"jax"`` for a value traced by that library, else None."""
    module = type(x).__module__
    if module.startswith("autograd."):
        tracer = sys.modules.get("autograd.tracer")
        return "autograd" if tracer is not None and isinstance(x, tracer.Box) else None
    if module.startswith("jax"):
        jax = sys.modules.get("jax")
        return "jax" if jax is not None and isinstance(x, jax.core.Tracer) else None
    return None


def namespace_of(x: object) -> ModuleType | None:
    """The array module to compute on ``x`` with, keeping its trace: ``autograd.numpy`` for an
    autograd box, ``jax.numpy`` for a JAX tracer or array; None for anything else (use
    ``backend.array_module``)."""
    kind = traced_kind(x)
    if kind == "autograd":
        return sys.modules["autograd.numpy"]
    if kind == "jax" or type(x).__module__.startswith("jax"):
        import jax.numpy  # noqa: PLC0415 - only when the value already came from JAX

        return jax.numpy
    return None


def untraced(x: Any, what: str) -> Any:
    """The value ``x`` stands for, without its trace (autograd), for code that only reads it
    (a metric's update). A JAX tracer has no value of its own while it is traced: TypeError
    saying how to get the value out instead. ``x`` itself when it is not traced."""
    kind = traced_kind(x)
    if kind is None:
        return x
    if kind == "autograd":
        return sys.modules["autograd.tracer"].getval(x)
    raise traced_error(x, what, "return it from the loss function as auxiliary output "
                       "(value_and_grad(..., has_aux=True)) and use that value after "
                       "value_and_grad returns")


def traced_error(x: object, what: str, fix: str) -> TypeError:
    """The TypeError for a traced value given where only a plain array can go."""
    kind = traced_kind(x) or "an autodiff library"
    return TypeError(
        f"{what} got a value traced by {kind} ({type(x).__name__}), which only exists while "
        f"mpidist.autodiff.value_and_grad differentiates the loss function: {fix}.")
