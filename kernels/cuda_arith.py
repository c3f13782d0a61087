"""The arithmetic of the CUDA kernels that promise the CPU twins' bits: one explicitly rounded
operation per ``+ - * /`` and ``sqrt``, per dtype.

NVVM contracts a multiply that feeds an add into one fused multiply-add (one rounding where
NumPy rounds twice) whenever the PTX leaves it free to: plain ``mul.f32``/``add.f32`` may be
fused by NVVM and by ptxas, and ``cuda.jit`` has no switch against it. libdevice's ``*_rn``
intrinsics emit ``mul.rn``/``add.rn``/``sub.rn``/``div.rn``/``sqrt.rn``, which the PTX ISA
forbids fusing ("an explicit rounding modifier ... disables contraction"). So a kernel that
writes every operation through ``ops_for(dtype)`` (and nothing else: no helper device
functions, see ``ops_for``) rounds each one to the dtype, in the order
written, as the CPU twin (LLVM without fast-math) and NumPy do. tests/scenarios/test_kernels_compiled.py
checks the compiled PTX and SASS of every such kernel for that.

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) libdevice's functions are stubs that
return None, so there the ops are NumPy scalar operations of the dtype, which round as IEEE
does: the simulator checks the order of operations, the compile check the rounding.
"""

from __future__ import annotations

import functools
import operator
from collections import namedtuple
from typing import Any

import numpy as np
from numba import config

__all__ = ["Ops", "ops_for", "ROUNDED_DTYPES"]

Ops = namedtuple("Ops", "add mul div sqrt")

ROUNDED_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float64)))


@functools.cache
def ops_for(dtype: Any) -> Any:
    """The ``Ops(add, mul, div, sqrt)`` a kernel of ``dtype`` calls: round-to-nearest
    intrinsics for float32/float64, the plain (wrapping) operators for integers (their results
    are exact modulo 2**bits, nothing to round; ``div``/``sqrt`` are None).

    A difference is written ``add(a, -b)``: negation is exact, so it is ``a - b`` bit for bit
    (libdevice has no ``dsub_rn``, and a helper device function would need a GPU to compile:
    ``cuda.jit(device=True)`` asks the driver for the compute capability)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return Ops(operator.add, operator.mul, None, None)
    if dtype not in ROUNDED_DTYPES:
        raise ValueError(f"ops_for: no rounded arithmetic for dtype {dtype}; float32, float64 and "
                         "integer dtypes have it (float16 data is summed in float64).")
    if config.ENABLE_CUDASIM:  # type: ignore[attr-defined]  # set at run time, not in the stubs
        return _numpy_ops(dtype.type)
    from numba.cuda import libdevice as ld  # noqa: PLC0415 - the real CUDA target only

    if dtype == np.float32:
        return Ops(ld.fadd_rn, ld.fmul_rn, ld.fdiv_rn, ld.fsqrt_rn)
    return Ops(ld.dadd_rn, ld.dmul_rn, ld.ddiv_rn, ld.dsqrt_rn)


def _numpy_ops(t: Any) -> Any:
    """The simulator's stand-ins: one NumPy operation in dtype ``t``, rounded once as IEEE."""

    def add(a: Any, b: Any) -> Any:
        return t(a) + t(b)

    def mul(a: Any, b: Any) -> Any:
        return t(a) * t(b)

    def div(a: Any, b: Any) -> Any:
        return t(a) / t(b)

    def sqrt(a: Any) -> Any:
        return np.sqrt(t(a))

    return Ops(add, mul, div, sqrt)
