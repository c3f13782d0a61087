"""CPU twins of the fused kernels, compiled by Numba on first use (and cached on disk).

Every kernel works on 1-D C-contiguous arrays; ``mpidist.kernels.api`` flattens and checks
before calling. Numba has no float16 arrays, so float16 data arrives viewed as uint16 and the
``*_half`` kernels convert bits in registers (round to nearest even, like NumPy).

Reductions work block by block: a block of the output stays in L1 cache while every input
adds into it, so memory sees one read per input and one write per output (the fused pass),
while each inner loop is a plain vectorisable ``a + b``.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np
from numba import prange

from .jit import njit  # typed numba.njit; relative, so mypy sees it (kernels/jit.py)

__all__ = ["reduce_into", "reduce_half_into", "reduce_pack_chunk", "pack_chunk", "unpack_chunk", "cast_into",
           "PARALLEL_MIN_BYTES", "BLOCK", "CHUNK"]

BLOCK = 4096  # elements per cache block
# Below this many bytes moved, waking the thread pool costs more than it saves (measured on
# the 2-core CI machine: the parallel kernel breaks even between 256 KiB and 1 MiB).
PARALLEL_MIN_BYTES = 1 << 20
# On fewer than 4 cores a busy neighbour (another rank, a replica thread) stalls the thread
# pool's barrier: measured 50x slower than serial at 4 MiB under load on 2 cores. Serial there.
PARALLEL = (os.cpu_count() or 1) >= 4
_OPTS: dict[str, Any] = {"cache": True, "nogil": True, "boundscheck": False}
# Numba's workqueue threading layer aborts the process on concurrent parallel launches from
# several threads (replica threads may reduce at once); serialise the parallel kernels.
_parallel_lock = threading.Lock()


# -- float16 bits <-> float64 ------------------------------------------------------------------
@njit(inline="always", **_OPTS)
def half_to_float(h: Any) -> Any:
    h = np.int64(h)
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0:
        value = mantissa * 5.9604644775390625e-08  # 2**-24: zero and subnormals
    elif exponent == 31:
        value = math.inf if mantissa == 0 else math.nan
    else:
        value = (1024 + mantissa) * 2.0 ** (exponent - 25)
    return -value if h & 0x8000 else value


@njit(inline="always", **_OPTS)
def float_to_half(x: Any) -> Any:
    if x != x:
        return np.uint16(0x7E00)
    sign = 0x8000 if (x < 0 or (x == 0 and math.copysign(1.0, x) < 0)) else 0
    a = abs(x)
    if a >= 65520.0:  # halfway between 65504 (largest half) and 2**16 rounds up to inf
        return np.uint16(sign | 0x7C00)
    if a < 6.103515625e-05:  # below 2**-14: subnormal, quantum 2**-24
        return np.uint16(sign | int(np.rint(a * 16777216.0)))
    fraction, exponent = math.frexp(a)  # a = fraction * 2**exponent, fraction in [0.5, 1)
    mantissa = int(np.rint((fraction * 2.0 - 1.0) * 1024.0))  # may carry into the exponent
    return np.uint16(sign | (((exponent - 1 + 15) << 10) + mantissa))


# -- N-way reduce --------------------------------------------------------------------------------
@njit(inline="always", **_OPTS)
def _reduce_block(out: Any, bufs: Any, start: Any, stop: Any, divisor: Any) -> None:
    # Unsigned indices spare Numba's negative-index wraparound, so LLVM vectorises the loops.
    m = stop - start
    block = out[start:stop]
    first = bufs[0][start:stop]
    for i in range(m):
        block[np.uintp(i)] = first[np.uintp(i)]
    for k in range(1, len(bufs)):
        src = bufs[k][start:stop]
        for i in range(m):
            block[np.uintp(i)] += src[np.uintp(i)]
    if divisor != 0:
        for i in range(m):
            block[np.uintp(i)] = block[np.uintp(i)] / divisor


@njit(**_OPTS)
def _reduce_serial(out: Any, bufs: Any, divisor: Any) -> None:
    for start in range(0, out.size, BLOCK):
        _reduce_block(out, bufs, start, min(start + BLOCK, out.size), divisor)


@njit(parallel=True, **_OPTS)
def _reduce_parallel(out: Any, bufs: Any, divisor: Any) -> None:
    nblocks = (out.size + BLOCK - 1) // BLOCK
    for b in prange(nblocks):
        start = b * BLOCK
        _reduce_block(out, bufs, start, min(start + BLOCK, out.size), divisor)


@njit(inline="always", **_OPTS)
def _reduce_half_block(out: Any, bufs: Any, start: Any, stop: Any, divisor: Any, acc: Any) -> None:
    for i in range(start, stop):
        acc[i - start] = half_to_float(bufs[0][i])
    for k in range(1, len(bufs)):
        src = bufs[k]
        for i in range(start, stop):
            acc[i - start] += half_to_float(src[i])
    for i in range(start, stop):
        # float64 holds the sum of float16 values exactly: one rounding, at the end.
        value = acc[i - start] / divisor if divisor != 0 else acc[i - start]
        out[i] = float_to_half(value)


@njit(**_OPTS)
def _reduce_half_serial(out: Any, bufs: Any, divisor: Any) -> None:
    acc = np.empty(BLOCK, np.float64)
    for start in range(0, out.size, BLOCK):
        _reduce_half_block(out, bufs, start, min(start + BLOCK, out.size), divisor, acc)


@njit(parallel=True, **_OPTS)
def _reduce_half_parallel(out: Any, bufs: Any, divisor: Any) -> None:
    nblocks = (out.size + BLOCK - 1) // BLOCK
    for b in prange(nblocks):
        acc = np.empty(BLOCK, np.float64)
        start = b * BLOCK
        _reduce_half_block(out, bufs, start, min(start + BLOCK, out.size), divisor, acc)


def _launch(serial: Any, parallel: Any, out: Any, bufs: Any, divisor: Any) -> None:
    if PARALLEL and out.nbytes * (len(bufs) + 1) >= PARALLEL_MIN_BYTES:
        with _parallel_lock:
            parallel(out, bufs, divisor)
    else:
        serial(out, bufs, divisor)


def reduce_into(out: Any, bufs: Any, divisor: Any) -> None:
    """``out = sum(bufs) [/ divisor]`` for float32/64 and integer data (divisor 0: none)."""
    _launch(_reduce_serial, _reduce_parallel, out, bufs, out.dtype.type(divisor))


def reduce_half_into(out: Any, bufs: Any, divisor: Any) -> None:
    """The float16 reduce on uint16 views: exact float64 sum, one rounding to float16."""
    _launch(_reduce_half_serial, _reduce_half_parallel, out, bufs, float(divisor))


# -- pack / unpack / cast ------------------------------------------------------------------------
# Tensors travel in fixed-width tuples (padded with an empty array) so that one compiled
# kernel serves any number of tensors: Numba specialises on the tuple's length.
CHUNK = 8


@njit(inline="always", **_OPTS)
def _copy(dst: Any, dst_start: Any, src: Any, src_start: Any, count: Any, mode: Any) -> None:
    # mode 0: same kind; 1: float -> float16 bits; 2: float16 bits -> float
    d = dst[dst_start:dst_start + count]
    s = src[src_start:src_start + count]
    if mode == 0:
        for i in range(count):
            d[np.uintp(i)] = s[np.uintp(i)]
    elif mode == 1:
        for i in range(count):
            d[np.uintp(i)] = float_to_half(np.float64(s[np.uintp(i)]))
    else:
        for i in range(count):
            d[np.uintp(i)] = half_to_float(s[np.uintp(i)])


@njit(**_OPTS)
def _reduce_pack_chunk(flat: Any, srcs: Any, starts: Any, count: Any, divisor: Any) -> None:
    for t in range(count):
        bufs = srcs[t]
        m = bufs[0].size
        block = flat[starts[t]:starts[t] + m]
        first = bufs[0]
        for i in range(m):
            block[np.uintp(i)] = first[np.uintp(i)]
        for k in range(1, len(bufs)):
            src = bufs[k]
            for i in range(m):
                block[np.uintp(i)] += src[np.uintp(i)]
        if divisor != 0:
            for i in range(m):
                block[np.uintp(i)] = block[np.uintp(i)] / divisor


def reduce_pack_chunk(flat: Any, srcs: Any, starts: Any, count: Any, divisor: Any) -> None:
    """Reduce each tensor's replicas (``srcs[t]``, a tuple of N arrays) straight into ``flat`` at
    ``starts[t]``: the pack and the reduce in one pass, for replicas that share host memory."""
    _reduce_pack_chunk(flat, srcs, starts, count, flat.dtype.type(divisor))


@njit(**_OPTS)
def _pack_chunk(flat: Any, srcs: Any, starts: Any, count: Any, mode: Any) -> None:
    for t in range(count):
        src = srcs[t]
        _copy(flat, starts[t], src, 0, src.size, mode)


@njit(**_OPTS)
def _unpack_chunk(flat: Any, dsts: Any, starts: Any, count: Any, mode: Any) -> None:
    for t in range(count):
        dst = dsts[t]
        _copy(dst, 0, flat, starts[t], dst.size, mode)


@njit(**_OPTS)
def _cast(dst: Any, src: Any, mode: Any) -> None:
    _copy(dst, 0, src, 0, src.size, mode)


def pack_chunk(flat: Any, srcs: Any, starts: Any, count: Any, mode: Any) -> None:
    """Copy ``srcs[:count]`` into ``flat`` at ``starts`` (mode: 0 same kind, 1 to float16 bits)."""
    _pack_chunk(flat, srcs, starts, count, mode)


def unpack_chunk(flat: Any, dsts: Any, starts: Any, count: Any, mode: Any) -> None:
    """Copy ``flat`` at ``starts`` into ``dsts[:count]`` (mode: 0 same kind, 2 from float16 bits)."""
    _unpack_chunk(flat, dsts, starts, count, mode)


def cast_into(dst: Any, src: Any, mode: Any) -> None:
    """``dst[:] = src`` with a dtype cast (mode as for pack_chunk / unpack_chunk)."""
    _cast(dst, src, mode)
