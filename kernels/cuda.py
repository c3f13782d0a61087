"""CUDA twins of the fused kernels (Numba ``cuda.jit``), same contracts as ``kernels.cpu``.

Each kernel is a grid-stride loop over 1-D arrays, launched on the caller's stream. float16 is
native here (no bit views); its sums accumulate in float64 and round once, as on the CPU, so
both twins give the same bits. Under ``NUMBA_ENABLE_CUDASIM=1`` the same source runs in
Numba's simulator, which is how CI checks these kernels without a GPU.
"""

import sys

import numpy as np
from numba import cuda

__all__ = ["reduce_into", "reduce_half_into", "pack_chunk", "unpack_chunk", "cast_into",
           "launch_config", "stream_of"]

THREADS = 256
MAX_BLOCKS = 1024


def launch_config(n):
    """(blocks, threads) for a grid-stride loop over ``n`` elements."""
    return max(1, min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)), THREADS


@cuda.jit
def _reduce_sum(out, bufs):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.size:
        acc = bufs[0][i]
        for k in range(1, len(bufs)):
            acc += bufs[k][i]
        out[i] = acc
        i += stride


@cuda.jit
def _reduce_mean(out, bufs, divisor):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.size:
        acc = bufs[0][i]
        for k in range(1, len(bufs)):
            acc += bufs[k][i]
        out[i] = acc / divisor
        i += stride


@cuda.jit
def _reduce_half(out, bufs, divisor):
    # divisor 1.0 for SUM: dividing by one is exact, and one kernel serves both ops.
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < out.size:
        acc = np.float64(bufs[0][i])
        for k in range(1, len(bufs)):
            acc += np.float64(bufs[k][i])
        out[i] = acc / divisor
        i += stride


# Pack and unpack take a fixed-width tuple of tensors (padded); blockIdx.y picks the tensor,
# the x dimension strides over its elements. The assignment casts (e.g. float32 <-> float16).
@cuda.jit
def _pack(flat, srcs, starts, count):
    t = cuda.blockIdx.y
    if t < count:
        src = srcs[t]
        base = starts[t]
        i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
        while i < src.size:
            flat[base + i] = src[i]
            i += cuda.blockDim.x * cuda.gridDim.x


@cuda.jit
def _unpack(flat, dsts, starts, count):
    t = cuda.blockIdx.y
    if t < count:
        dst = dsts[t]
        base = starts[t]
        i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
        while i < dst.size:
            dst[i] = flat[base + i]
            i += cuda.blockDim.x * cuda.gridDim.x


@cuda.jit
def _cast(dst, src):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < dst.size:
        dst[i] = src[i]
        i += stride


def stream_of(array):
    """The caller's stream for ``array``: CuPy's current stream for CuPy arrays, else 0."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        return cuda.external_stream(cupy.cuda.get_current_stream().ptr)
    return 0


def reduce_into(out, bufs, divisor, stream=0):
    blocks, threads = launch_config(out.size)
    if divisor:
        _reduce_mean[blocks, threads, stream](out, bufs, out.dtype.type(divisor))
    else:
        _reduce_sum[blocks, threads, stream](out, bufs)


def reduce_half_into(out, bufs, divisor, stream=0):
    blocks, threads = launch_config(out.size)
    _reduce_half[blocks, threads, stream](out, bufs, float(divisor or 1))


def _chunk_grid(sizes):
    blocks, threads = launch_config(max(sizes) if sizes else 0)
    return (blocks, len(sizes)), threads


def pack_chunk(flat, srcs, starts, count, sizes, stream=0):
    grid, threads = _chunk_grid(sizes)
    _pack[grid, threads, stream](flat, srcs, starts, count)


def unpack_chunk(flat, dsts, starts, count, sizes, stream=0):
    grid, threads = _chunk_grid(sizes)
    _unpack[grid, threads, stream](flat, dsts, starts, count)


def cast_into(dst, src, stream=0):
    blocks, threads = launch_config(dst.size)
    _cast[blocks, threads, stream](dst, src)
