"""Fused optimizer updates: one pass over a whole flat arena of parameters, gradients and slots.

Each update is written element by element in exactly the order of operations of the NumPy
per-variable code it replaces (``mpidist.training.optimizers``), in the arrays' own dtype, so
the results are bit-identical: every product and sum is rounded to the dtype as NumPy rounds
it (no fast-math, so no fused multiply-add contraction). Scalars arrive already cast to the
arrays' dtype by the caller (``w.dtype.type(lr)``, as the NumPy code casts them).

CPU twins are Numba ``njit`` loops; CUDA twins are grid-stride ``cuda.jit`` kernels with the
same arithmetic, chosen by where the arrays live. Importing this module compiles nothing.
"""

import numpy as np

__all__ = ["sgd_update", "sgd_momentum_update", "adam_update", "FUSED_DTYPES"]

# The float dtypes the fused updates handle; other variables keep the per-variable path.
FUSED_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float64)))

_cpu = None
_cuda = None


def _cpu_kernels():
    global _cpu
    if _cpu is None:
        from numba import njit  # noqa: PLC0415 - compile on first use only

        opts = {"cache": True, "nogil": True, "boundscheck": False}

        @njit(**opts)
        def sgd(w, g, lr):
            for i in range(w.size):
                w[i] = w[i] - lr * g[i]

        @njit(**opts)
        def sgd_momentum(w, g, m, lr, momentum, nesterov):
            for i in range(w.size):
                gi = g[i]
                mi = momentum * m[i] - lr * gi
                m[i] = mi
                if nesterov:
                    w[i] = w[i] + (momentum * mi - lr * gi)
                else:
                    w[i] = w[i] + mi

        @njit(**opts)
        def adam(w, g, m, v, vhat, alpha, one_minus_b1, one_minus_b2, eps, amsgrad):
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


def _cuda_kernels():
    global _cuda
    if _cuda is None:
        from mpidist.kernels import optimizers_cuda as k  # noqa: PLC0415 - device arrays only

        _cuda = (k.sgd, k.sgd_momentum, k.adam)
    return _cuda


def _launch(index, w, *args):
    """Run kernel ``index`` of the twin matching where ``w`` lives."""
    if isinstance(w, np.ndarray):
        return _cpu_kernels()[index](w, *args)
    from mpidist.kernels.cuda import launch_config, stream_of  # noqa: PLC0415

    blocks, threads = launch_config(w.size)
    return _cuda_kernels()[index][blocks, threads, stream_of(w)](w, *args)


def _check(w, *others):
    for a in others:
        if a.shape != w.shape or a.dtype != w.dtype:
            raise ValueError(
                f"fused update: every buffer must match the parameters' shape {w.shape} and "
                f"dtype {w.dtype}; got shape {a.shape}, dtype {a.dtype}.")
    if w.ndim != 1 or w.dtype not in FUSED_DTYPES:
        raise ValueError(f"fused update: 1-D float32/float64 buffers only, got {w.dtype} "
                         f"of shape {w.shape}.")


def sgd_update(w, g, lr):
    """``w -= lr * g`` in place (lr already in w's dtype)."""
    _check(w, g)
    _launch(0, w, g, lr)


def sgd_momentum_update(w, g, m, lr, momentum, nesterov):
    """Keras's momentum rule in place: ``m = momentum * m - lr * g``; ``w += m``, or with
    Nesterov ``w += momentum * m - lr * g`` (with the new ``m``)."""
    _check(w, g, m)
    _launch(1, w, g, m, lr, momentum, bool(nesterov))


def adam_update(w, g, m, v, vhat, alpha, one_minus_b1, one_minus_b2, eps):
    """Keras's Adam rule in place; ``vhat`` is the AMSGrad maximum, or None without it.
    ``alpha`` is ``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)``, cast to the dtype."""
    amsgrad = vhat is not None
    _check(w, g, m, v, *((vhat,) if amsgrad else ()))
    _launch(2, w, g, m, v, vhat if amsgrad else m, alpha, one_minus_b1, one_minus_b2, eps,
            amsgrad)
