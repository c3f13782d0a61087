"""CUDA twins of ``kernels.optimizers`` (grid-stride ``cuda.jit`` loops, same arithmetic as the
CPU twins, element by element). Imported only when device arrays are updated; under
``NUMBA_ENABLE_CUDASIM=1`` the same source runs in Numba's simulator."""

import math

from numba import cuda

__all__ = ["sgd", "sgd_momentum", "adam"]


@cuda.jit
def sgd(w, g, lr):
    i = cuda.grid(1)
    while i < w.size:
        w[i] = w[i] - lr * g[i]
        i += cuda.gridsize(1)


@cuda.jit
def sgd_momentum(w, g, m, lr, momentum, nesterov):
    i = cuda.grid(1)
    while i < w.size:
        gi = g[i]
        mi = momentum * m[i] - lr * gi
        m[i] = mi
        if nesterov:
            w[i] = w[i] + (momentum * mi - lr * gi)
        else:
            w[i] = w[i] + mi
        i += cuda.gridsize(1)


@cuda.jit
def adam(w, g, m, v, vhat, alpha, one_minus_b1, one_minus_b2, eps, amsgrad):
    i = cuda.grid(1)
    while i < w.size:
        gi = g[i]
        mi = m[i] + (gi - m[i]) * one_minus_b1
        vi = v[i] + (gi * gi - v[i]) * one_minus_b2
        m[i] = mi
        v[i] = vi
        if amsgrad:
            h = vhat[i]
            if h > vi or h != h:
                vi = h
            vhat[i] = vi
        w[i] = w[i] - mi * alpha / (math.sqrt(vi) + eps)
        i += cuda.gridsize(1)
