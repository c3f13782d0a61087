"""What went wrong inside a traced loss function, in the user's terms.

While ``mpidist.autodiff.value_and_grad`` differentiates a loss, the loss sees traced values
(autograd's ``ArrayBox``, JAX's tracers) instead of arrays, and the first thing it does to one
that only an array allows fails deep inside autograd, JAX or NumPy (``float() argument must be
... not 'ArrayBox'``, ``setting an array element with a sequence``). ``explain`` recognizes the
families of those errors by exception class and message, not by user program, and says what a
traced value is, what the loss did to it, where, and the fix; ``value_and_grad`` raises that,
with the library's error as ``__cause__``. ``unused_warning`` is the warning for variables the
loss never used (their gradient is exactly zero).
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Iterable

import numpy as np

__all__ = ["TracedValueError", "UnusedVariableWarning", "explain", "unused_message"]


class TracedValueError(TypeError, ValueError):
    """The loss function did to a traced value what only a concrete array allows. A TypeError
    and a ValueError, as the errors it explains were one or the other."""


class UnusedVariableWarning(RuntimeWarning):
    """The loss function does not depend on some of the variables it is differentiated with
    respect to: their gradients are exactly zero and the optimizer will not move them."""


_WHAT = {
    "autograd": "autograd ArrayBoxes, wrappers around NumPy arrays that record each operation",
    "jax": "JAX tracers, abstract arrays (a shape and a dtype, no numbers) that record each "
           "operation",
}
_NUMPY = {"autograd": "autograd.numpy (import autograd.numpy as anp)",
          "jax": "jax.numpy (import jax.numpy as jnp)"}

# Each family: what the loss did, and the fix (``{np}``: the backend's array module).
_FAMILIES = {
    "number": (
        "converted a traced value to a Python number (float(x), int(x), x.item(), "
        "range(int(x)), or a NumPy scalar conversion)",
        "keep it an array: compute with {np} instead of Python numbers; to look at the value, "
        "return it as auxiliary output (value_and_grad(..., has_aux=True)) and read it after "
        "value_and_grad returns; to change a dtype use x.astype(...)"),
    "bool": (
        "used a traced value as a Python bool (if x > 0:, while, and / or, assert)",
        "choose with array functions instead of Python control flow: jnp.where(cond, a, b), "
        "or jax.lax.cond / jax.lax.while_loop"),
    "inplace": (
        "wrote into a traced value in place (x[i] = v, x += v on it)",
        "build a new array instead: with JAX, x = x.at[i].set(v); with autograd, assemble it "
        "with anp.concatenate / anp.stack / anp.where from the pieces"),
    "at_assign": (
        "assigned through x.at[...] (x.at[i] = v); .at[] returns an updater, not a view",
        "write x = x.at[i].set(v) (or .add, .multiply, ...): it returns the updated array"),
    "buffer": (
        "stored a traced value in a NumPy array (buf[i] = x into a preallocated buffer, "
        "np.array([x, y]), buf += x)",
        "collect the pieces in a Python list and join them with {np} (stack, concatenate); a "
        "NumPy buffer can only hold numbers, and the numbers do not exist while tracing"),
    "to_numpy": (
        "turned a traced value into a NumPy array (np.asarray(x), np.array(x), or a plain "
        "numpy function such as np.tanh(x), np.dot(x, w), np.sum(x) applied to it)",
        "write the loss with {np} (jnp.tanh, jnp.dot, jnp.sum, ...), which traces"),
    "jax_in_autograd": (
        "gave autograd's traced values to JAX (jax.numpy functions or x.at[...] in a loss "
        "differentiated with backend='autograd')",
        "write the loss with autograd.numpy, or differentiate it with backend='jax'"),
    "autograd_in_jax": (
        "gave JAX's traced values to autograd.numpy (a loss differentiated with backend='jax')",
        "write the loss with jax.numpy, or differentiate it with backend='autograd'"),
    "numpy_method": (
        "called .numpy() on a traced value: the loss's params are arrays (the variables' "
        "values, traced), not Variables",
        "use params[i] itself as the array"),
    "method": (
        "called a method that the backend's traced arrays do not have",
        "use the {np} function of the same name (anp.copy(x), ...) or keep the computation in "
        "{np}"),
    "integer_loss": (
        "returned an integer loss (a count, an argmax, a comparison), which has no gradient",
        "compute the loss in floating point"),
    "leaked": (
        "kept a traced value after its trace ended (in a global, a list, self.attr) and used "
        "it in a later call",
        "return it from the loss function as auxiliary output (has_aux=True) and keep that "
        "value instead"),
}

_BOX = r"(ArrayBox|SequenceBox|\w*Tracer)"
# (exception class names on the error's MRO, message pattern, family), first match wins.
_RULES = [
    ({"TracerArrayConversionError"}, None, "to_numpy"),
    ({"TracerBoolConversionError"}, None, "bool"),
    ({"TracerIntegerConversionError", "ConcretizationTypeError"}, None, "number"),
    ({"UnexpectedTracerError"}, None, "leaked"),
    ({"TypeError"}, r"not a valid JAX type", "jax_in_autograd"),
    ({"AttributeError"}, r"'ArrayBox' object has no attribute 'at'", "jax_in_autograd"),
    ({"TypeError", "ValueError"}, r"(jax|Jax|JAX|Tracer).*ArrayBox|ArrayBox.*(jax|Tracer)",
     "jax_in_autograd"),
    ({"TypeError", "ValueError", "AttributeError", "NotImplementedError"},
     r"VJP of .* not defined|Can't differentiate w\.r\.t\. type .*Tracer", "autograd_in_jax"),
    ({"TypeError"}, r"argument must be .*not '" + _BOX + "'", "number"),
    ({"AttributeError"}, r"'ArrayBox' object has no attribute '(item|tolist|__float__|__int__)'",
     "number"),
    ({"AttributeError"}, r"'ArrayBox' object has no attribute '__setitem__'", "inplace"),
    ({"TypeError"}, r"immutable|does not support (in-place )?item assignment", "inplace"),
    ({"AttributeError"}, r"'_IndexUpdate(Helper|Ref)' object has no attribute '__setitem__'",
     "at_assign"),
    ({"TypeError"}, r"NotImplemented from __array_ufunc__.*ArrayBox", "buffer"),
    ({"ValueError", "TypeError"}, r"setting an array element with a sequence", "buffer"),
    ({"AttributeError"}, _BOX + r"'? (object )?has no attribute '?numpy", "numpy_method"),
    ({"AttributeError"}, _BOX + r"'? (object )?has no attribute", "method"),
    ({"TypeError"}, r"grad requires real-valued outputs", "integer_loss"),
]


def explain(err: BaseException, backend: str) -> TracedValueError | None:
    """The TracedValueError that explains ``err`` (raised by the loss while ``backend``
    traced it), or None when ``err`` is not one of the families above (the user's own bug,
    or an mpidist error that already says what to do)."""
    if isinstance(err, TracedValueError) or type(err).__module__.startswith("mpidist") \
            or _raised_by_mpidist(err):
        return None
    names = {c.__name__ for c in type(err).__mro__}
    text = str(err)
    family = next((family for classes, pattern, family in _RULES if names & classes and (
        pattern is None or re.search(pattern, text, re.S))), None)
    if family is None:
        return None
    did, fix = _FAMILIES[family]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return TracedValueError(
        f"value_and_grad(backend={backend!r}): the loss function {did}{_where(err)}. Inside "
        f"value_and_grad the loss's params, and everything computed from them, are traced "
        f"values ({_WHAT[backend]}) so that {backend} can compute the gradient: they hold no "
        f"numbers to take out and cannot be written into. Fix: {fix.format(np=_NUMPY[backend])}. "
        f"({type(err).__name__}: {first[:300]})")


def unused_message(unused_names: Iterable[str], read_directly: Iterable[str]) -> str:
    """The UnusedVariableWarning's text: ``unused_names`` have exactly-zero gradients because
    the loss does not depend on them; ``read_directly`` (a subset, or other differentiated
    variables) were read as values inside the loss instead of through ``params``."""
    parts = []
    if unused_names:
        parts.append(
            f"the loss function does not depend on variable(s) {_names(unused_names)}: "
            "their gradients are exactly zero and the optimizer will not change them")
    if read_directly:
        parts.append(
            f"the loss read variable(s) {_names(read_directly)} directly (w, w.numpy(), "
            "np.asarray(w) or w.read_value() inside the loss), which the autodiff library takes "
            "as a constant, so the gradient through that read is missing; use the loss "
            "function's params argument instead (params[i], in the order of the variables)")
    else:
        parts.append("use them through the params argument, or leave them out of the "
                     "variables differentiated (e.g. create them with trainable=False)")
    return "value_and_grad: " + "; ".join(parts) + "."


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


_MPIDIST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARIES = (os.path.dirname(np.__file__) + os.sep, _MPIDIST_DIR)


def _raised_by_mpidist(err: BaseException) -> bool:
    """Whether mpidist's own code raised ``err`` (its messages already say what to do)."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_MPIDIST_DIR)


def _where(err: BaseException) -> str:
    """`` at file:line (code)`` of the innermost frame of user code in ``err``'s traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    for frame in reversed(frames):
        name = frame.filename
        if name.startswith(_LIBRARIES) or f"{os.sep}site-packages{os.sep}" in name \
                or name.startswith("<"):
            continue
        code = f" ({frame.line.strip()})" if frame.line else ""
        return f", at {os.path.basename(name)}:{frame.lineno}{code}"
    return ""
