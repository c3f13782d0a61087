"""CUDA twins of ``kernels.optimizers``: grid-stride ``cuda.jit`` loops with the CPU twins'
arithmetic, element by element, bit for bit.

Every product, sum, difference (``add(a, -b)``), quotient and square root goes through ``cuda_arith.ops_for``
(libdevice's round-to-nearest intrinsics), in exactly the CPU twin's order of operations: the
compiler may not fuse a multiply into an add (FMA), so each operation rounds to the dtype as
NumPy's does. Each formula is written once, in ``_build``; ``kernels_for(dtype)`` builds the
float32 and float64 sets from it. Imported only when device arrays are updated; under
``NUMBA_ENABLE_CUDASIM=1`` the same source runs in Numba's simulator.
"""

from __future__ import annotations

# mypy reads the @cuda.jit bodies below as host Python: numba's stubs type cuda.grid and
# cuda.blockDim/threadIdx as host-side objects, hence the `type: ignore`s on those lines
# (comments only: Numba compiles the same bytecode).

import functools
from collections import namedtuple
from typing import Any

import numpy as np
from numba import cuda, types
from numba.np.numpy_support import from_dtype

from mpidist.kernels.cuda_arith import ROUNDED_DTYPES, ops_for

from .jit import cuda_jit  # typed cuda.jit; relative, so mypy sees it (kernels/jit.py)

__all__ = ["OptimizerKernels", "kernels_for", "compile_targets"]

OptimizerKernels = namedtuple("OptimizerKernels", "sgd sgd_momentum adam")


@functools.cache
def kernels_for(dtype: Any) -> Any:
    """The ``OptimizerKernels`` for 1-D arrays of ``dtype`` (float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype not in ROUNDED_DTYPES:
        raise ValueError(f"optimizer kernels: float32 or float64 only, got {dtype}.")
    return _build(ops_for(dtype))


def _build(ops: Any) -> Any:
    add, mul, div, sqrt = ops  # a - b is add(a, -b): negation is exact

    @cuda_jit
    def sgd(w: Any, g: Any, lr: Any) -> None:
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        while i < w.size:
            w[i] = add(w[i], -mul(lr, g[i]))  # w - lr * g
            i += cuda.gridsize(1)

    @cuda_jit
    def sgd_momentum(w: Any, g: Any, m: Any, lr: Any, momentum: Any, nesterov: Any) -> None:
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        while i < w.size:
            gi = g[i]
            mi = add(mul(momentum, m[i]), -mul(lr, gi))  # momentum * m - lr * g
            m[i] = mi
            if nesterov:
                w[i] = add(w[i], add(mul(momentum, mi), -mul(lr, gi)))  # w + (momentum*m - lr*g)
            else:
                w[i] = add(w[i], mi)
            i += cuda.gridsize(1)

    @cuda_jit
    def adam(w: Any, g: Any, m: Any, v: Any, vhat: Any, alpha: Any, one_minus_b1: Any,
             one_minus_b2: Any, eps: Any, amsgrad: Any) -> None:
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        while i < w.size:
            gi = g[i]
            mi = add(m[i], mul(add(gi, -m[i]), one_minus_b1))  # m + (g - m) * (1 - b1)
            vi = add(v[i], mul(add(mul(gi, gi), -v[i]), one_minus_b2))  # v + (g*g - v) * (1 - b2)
            m[i] = mi
            v[i] = vi
            if amsgrad:
                h = vhat[i]
                if h > vi or h != h:  # np.maximum: the larger, NaN if either is NaN
                    vi = h
                vhat[i] = vi
            # w - m * alpha / (sqrt(v) + eps)
            w[i] = add(w[i], -div(mul(mi, alpha), add(sqrt(vi), eps)))
            i += cuda.gridsize(1)

    return OptimizerKernels(sgd, sgd_momentum, adam)


def compile_targets() -> Any:
    """(name, kernel, argument types) of every optimizer kernel as it is launched: for the
    compile check (kernels/compiled.py). Every one promises the CPU twin's bits."""
    for dtype in sorted(ROUNDED_DTYPES, key=str):
        k = kernels_for(dtype)
        arr = types.Array(from_dtype(dtype), 1, "C")
        s = from_dtype(dtype)
        yield f"sgd[{dtype}]", k.sgd, (arr, arr, s)
        yield f"sgd_momentum[{dtype}]", k.sgd_momentum, (arr, arr, arr, s, s, types.boolean)
        yield f"adam[{dtype}]", k.adam, (arr,) * 5 + (s,) * 4 + (types.boolean,)
