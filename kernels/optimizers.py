"""Fused optimizer updates: one pass over a whole flat arena of parameters, gradients and slots.

Each update is written element by element in exactly the order of operations of the NumPy
per-variable code it replaces (``mpidist.training.optimizers``), in the arrays' own dtype, so
the results are bit-identical: every product and sum is rounded to the dtype as NumPy rounds
it. Scalars arrive already cast to the arrays' dtype by the caller (``w.dtype.type(lr)``, as
the NumPy code casts them).

CPU twins are Numba ``njit`` loops (LLVM without fast-math never fuses a multiply-add); CUDA
twins are grid-stride ``cuda.jit`` kernels (``optimizers_cuda``) that write every operation as
an explicitly rounded libdevice intrinsic, since NVVM would otherwise fuse them into FMAs; the
compile check (tests/scenarios/test_kernels_compiled.py) fails on any FMA in their PTX or SASS. The
twin is chosen by where the arrays live. Importing this module compiles nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .jit import njit  # typed numba.njit (imports Numba on first use); relative, for mypy

__all__ = ["sgd_update", "sgd_momentum_update", "adam_update", "FUSED_DTYPES"]

# The float dtypes the fused updates handle; other variables keep the per-variable path.
FUSED_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float64)))

_cpu = None


def _cpu_kernels() -> Any:
    global _cpu
    if _cpu is None:
        opts: dict[str, Any] = {"cache": True, "nogil": True, "boundscheck": False}

        @njit(**opts)
        def sgd(w: Any, g: Any, lr: Any) -> None:
            for i in range(w.size):
                w[i] = w[i] - lr * g[i]

        @njit(**opts)
        def sgd_momentum(w: Any, g: Any, m: Any, lr: Any, momentum: Any, nesterov: Any) -> None:
            for i in range(w.size):
                gi = g[i]
                mi = momentum * m[i] - lr * gi
                m[i] = mi
                if nesterov:
                    w[i] = w[i] + (momentum * mi - lr * gi)
                else:
                    w[i] = w[i] + mi

        @njit(**opts)
        def adam(w: Any, g: Any, m: Any, v: Any, vhat: Any, alpha: Any, one_minus_b1: Any,
                 one_minus_b2: Any, eps: Any, amsgrad: Any) -> None:
            for i in range(w.size):
                gi = g[i]
                mi = m[i] + (gi - m[i]) * one_minus_b1
                vi = v[i] + (gi * gi - v[i]) * one_minus_b2
                m[i] = mi
                v[i] = vi
                if amsgrad:
                    h = vhat[i]
                    if h > vi or h != h:  # np.maximum: the larger, NaN if either is NaN
                        vi = h
                    vhat[i] = vi
                w[i] = w[i] - mi * alpha / (np.sqrt(vi) + eps)

        _cpu = (sgd, sgd_momentum, adam)
    return _cpu


def _launch(index: Any, w: Any, *args: Any) -> Any:
    """Run kernel ``index`` of the twin matching where ``w`` lives (on w's GPU and stream)."""
    if isinstance(w, np.ndarray):
        return _cpu_kernels()[index](w, *args)
    from mpidist.kernels import cuda  # noqa: PLC0415 - device arrays only
    from mpidist.kernels.arrays import flat_device, is_device_array  # noqa: PLC0415
    from mpidist.kernels.optimizers_cuda import kernels_for  # noqa: PLC0415

    kernel = kernels_for(w.dtype)[index]
    with cuda.on_device_of(w) as stream:
        # Numba's own conversion of a CuPy argument would synchronize its stream per array.
        arrays = [flat_device(a) if is_device_array(a) else a for a in (w, *args)]
        cuda.launch(kernel, cuda.launch_config(w.size), stream, *arrays)


def _check(w: Any, *others: Any) -> None:
    for a in others:
        if a.shape != w.shape or a.dtype != w.dtype:
            raise ValueError(
                f"fused update: every buffer must match the parameters' shape {w.shape} and "
                f"dtype {w.dtype}; got shape {a.shape}, dtype {a.dtype}.")
    if w.ndim != 1 or w.dtype not in FUSED_DTYPES:
        raise ValueError(f"fused update: 1-D float32/float64 buffers only, got {w.dtype} "
                         f"of shape {w.shape}.")


def sgd_update(w: Any, g: Any, lr: Any) -> None:
    """``w -= lr * g`` in place (lr already in w's dtype)."""
    _check(w, g)
    _launch(0, w, g, lr)


def sgd_momentum_update(w: Any, g: Any, m: Any, lr: Any, momentum: Any, nesterov: Any) -> None:
    """Keras's momentum rule in place: ``m = momentum * m - lr * g``; ``w += m``, or with
    Nesterov ``w += momentum * m - lr * g`` (with the new ``m``)."""
    _check(w, g, m)
    _launch(1, w, g, m, lr, momentum, bool(nesterov))


def adam_update(w: Any, g: Any, m: Any, v: Any, vhat: Any, alpha: Any, one_minus_b1: Any,
                one_minus_b2: Any, eps: Any) -> None:
    """Keras's Adam rule in place; ``vhat`` is the AMSGrad maximum, or None without it.
    ``alpha`` is ``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)``, cast to the dtype."""
    amsgrad = vhat is not None
    _check(w, g, m, v, *((vhat,) if amsgrad else ()))
    _launch(2, w, g, m, v, vhat if amsgrad else m, alpha, one_minus_b1, one_minus_b2, eps,
            amsgrad)
