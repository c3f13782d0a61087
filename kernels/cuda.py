"""CUDA twins of the fused kernels (Numba ``cuda.jit``), same contracts as ``kernels.cpu``.

Each kernel is a grid-stride loop over 1-D arrays, launched in the array's device context on
that device's current CuPy stream (``on_device_of``). The kernels give the CPU twins' bits:
float sums and quotients go through ``cuda_arith.ops_for`` (round-to-nearest intrinsics, so
nothing can be fused into an FMA; tests/scenarios/test_kernels_compiled.py checks the PTX and SASS),
float16 sums accumulate in float64 and round once, as on the CPU, and every conversion is the
one NumPy's ``astype`` makes (float16 to integer truncates, through float32). Kernels are built
per dtype on first use. Under ``NUMBA_ENABLE_CUDASIM=1`` the same source runs in Numba's
simulator, which is how CI checks their logic without a GPU.
"""

from __future__ import annotations

# mypy reads the @cuda.jit bodies below as host Python: numba's stubs type cuda.grid and
# cuda.blockDim/threadIdx as host-side objects, hence the `type: ignore`s on those lines
# (comments only: Numba compiles the same bytecode).

import contextlib
import functools
import sys
from typing import Any

import numpy as np
from numba import cuda, types
from numba.np.numpy_support import from_dtype

from mpidist.kernels.cpu import CHUNK  # tensors per pack/unpack launch, as fusion launches them
from mpidist.kernels.cuda_arith import ops_for

from .jit import cuda_jit  # typed cuda.jit; relative, so mypy sees it (kernels/jit.py)

__all__ = ["reduce_into", "reduce_half_into", "pack_chunk", "unpack_chunk", "cast_into",
           "launch_config", "launch", "on_device_of", "compile_targets"]

THREADS = 256
MAX_BLOCKS = 1024
_HALF = np.dtype(np.float16)


def launch_config(n: Any) -> Any:
    """(blocks, threads) for a grid-stride loop over ``n`` elements."""
    return max(1, min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)), THREADS


def launch(kernel: Any, config: Any, stream: Any, *args: Any) -> None:
    """Every launch of this package goes through here: ``kernel[blocks, threads, stream](*args)``."""
    blocks, threads = config
    kernel[blocks, threads, stream](*args)


@contextlib.contextmanager
def on_device_of(array: Any) -> Any:
    """Make ``array``'s GPU current, for Numba and for CuPy, while the block runs; yields the
    stream to launch on: that device's current CuPy stream for CuPy arrays, else Numba's
    default stream (0). Launches on another device's context would fail or, worse, run there."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        device_id = int(array.device.id)
        with cupy.cuda.Device(device_id), cuda.gpus[device_id]:
            yield cuda.external_stream(cupy.cuda.get_current_stream().ptr)
        return
    device_id = _numba_device_id(array)
    if device_id is None:
        yield 0
        return
    with cuda.gpus[device_id]:
        yield 0


def _numba_device_id(array: Any) -> Any:
    """The GPU of a Numba device array (from its memory's context), or None where it has none
    (the simulator's arrays)."""
    context = getattr(getattr(array, "gpu_data", None), "context", None)
    device = getattr(context, "device", None)
    device_id = getattr(device, "id", None)
    return int(device_id) if device_id is not None else None


# -- kernels, built per dtype ---------------------------------------------------------------------

@functools.cache
def _reduce_kernels(dtype: Any) -> Any:
    """(sum, mean) over a tuple of equally long 1-D buffers of ``dtype`` (not float16)."""
    add, _, div, _ = ops_for(dtype)

    @cuda_jit
    def reduce_sum(out: Any, bufs: Any) -> None:
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        stride = cuda.gridsize(1)
        while i < out.size:
            acc = bufs[0][i]
            for k in range(1, len(bufs)):
                acc = add(acc, bufs[k][i])
            out[i] = acc
            i += stride

    @cuda_jit
    def reduce_mean(out: Any, bufs: Any, divisor: Any) -> None:
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        stride = cuda.gridsize(1)
        while i < out.size:
            acc = bufs[0][i]
            for k in range(1, len(bufs)):
                acc = add(acc, bufs[k][i])
            out[i] = div(acc, divisor)
            i += stride

    return reduce_sum, reduce_mean


@functools.cache
def _reduce_half_kernel() -> Any:
    add, _, div, _ = ops_for(np.float64)

    @cuda_jit
    def reduce_half(out: Any, bufs: Any, divisor: Any) -> None:
        # float16 -> float64 is exact, the float64 sum of a few halves too; the one rounding
        # is the store (cvt.rn.f16.f64), as the CPU twin's. Divisor 1.0 for SUM (exact).
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        stride = cuda.gridsize(1)
        while i < out.size:
            acc = np.float64(bufs[0][i])
            for k in range(1, len(bufs)):
                acc = add(acc, np.float64(bufs[k][i]))
            out[i] = div(acc, divisor)
            i += stride

    return reduce_half


def _through_float32(dst_dtype: Any, src_dtype: Any) -> Any:
    """Whether elements convert through float32: float16 -> integer would compile to cvt.rni
    (round to nearest) where NumPy truncates; float16 -> float32 is exact and float32 ->
    integer truncates (cvt.rzi). Every other pair converts as NumPy's ``astype`` directly."""
    return np.dtype(src_dtype) == _HALF and np.dtype(dst_dtype).kind in "iu"


@functools.cache
def _copy_kernels(dst_dtype: Any, src_dtype: Any) -> Any:
    """(pack, unpack, cast) storing ``src_dtype`` elements into ``dst_dtype`` arrays."""
    # A compile-time constant: Numba prunes the branch not taken (no helper device function,
    # which would need a GPU to compile; see cuda_arith.ops_for).
    through_float32 = _through_float32(dst_dtype, src_dtype)

    # Pack and unpack take a fixed-width tuple of tensors (padded); blockIdx.y picks the tensor,
    # the x dimension strides over its elements.
    @cuda_jit
    def pack(flat: Any, srcs: Any, starts: Any, count: Any) -> None:
        t = cuda.blockIdx.y
        if t < count:
            src = srcs[t]
            base = starts[t]
            i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x  # type: ignore[operator]
            while i < src.size:
                if through_float32:
                    flat[base + i] = np.float32(src[i])
                else:
                    flat[base + i] = src[i]
                i += cuda.blockDim.x * cuda.gridDim.x  # type: ignore[operator]

    @cuda_jit
    def unpack(flat: Any, dsts: Any, starts: Any, count: Any) -> None:
        t = cuda.blockIdx.y
        if t < count:
            dst = dsts[t]
            base = starts[t]
            i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x  # type: ignore[operator]
            while i < dst.size:
                if through_float32:
                    dst[i] = np.float32(flat[base + i])
                else:
                    dst[i] = flat[base + i]
                i += cuda.blockDim.x * cuda.gridDim.x  # type: ignore[operator]

    @cuda_jit
    def cast(dst: Any, src: Any) -> None:
        i = cuda.grid(1)  # type: ignore[call-arg, var-annotated]  # device code (stubs: host API)
        stride = cuda.gridsize(1)
        while i < dst.size:
            if through_float32:
                dst[i] = np.float32(src[i])
            else:
                dst[i] = src[i]
            i += stride

    return pack, unpack, cast


# -- launches --------------------------------------------------------------------------------------

def reduce_into(out: Any, bufs: Any, divisor: Any, stream: Any = 0) -> None:
    reduce_sum, reduce_mean = _reduce_kernels(np.dtype(out.dtype))
    if divisor:
        launch(reduce_mean, launch_config(out.size), stream, out, bufs, out.dtype.type(divisor))
    else:
        launch(reduce_sum, launch_config(out.size), stream, out, bufs)


def reduce_half_into(out: Any, bufs: Any, divisor: Any, stream: Any = 0) -> None:
    launch(_reduce_half_kernel(), launch_config(out.size), stream, out, bufs, float(divisor or 1))


def _chunk_grid(sizes: Any) -> Any:
    blocks, threads = launch_config(max(sizes) if sizes else 0)
    return (blocks, len(sizes)), threads


def pack_chunk(flat: Any, srcs: Any, starts: Any, count: Any, sizes: Any, stream: Any = 0) -> None:
    pack = _copy_kernels(np.dtype(flat.dtype), np.dtype(srcs[0].dtype))[0]
    launch(pack, _chunk_grid(sizes), stream, flat, srcs, starts, count)


def unpack_chunk(flat: Any, dsts: Any, starts: Any, count: Any, sizes: Any, stream: Any = 0) -> None:
    unpack = _copy_kernels(np.dtype(dsts[0].dtype), np.dtype(flat.dtype))[1]
    launch(unpack, _chunk_grid(sizes), stream, flat, dsts, starts, count)


def cast_into(dst: Any, src: Any, stream: Any = 0) -> None:
    cast = _copy_kernels(np.dtype(dst.dtype), np.dtype(src.dtype))[2]
    launch(cast, launch_config(dst.size), stream, dst, src)


# -- what the compile check compiles ----------------------------------------------------------------

REDUCE_DTYPES = ("float16", "float32", "float64", "int32", "int64")
# Pack/unpack run within one dtype, or between float32/float64 and float16 (compressed
# transfers); cast runs between any two of the kernel dtypes.
PACK_PAIRS = tuple((d, d) for d in ("float16", "float32", "float64", "int32", "int64", "uint8")) + (
    ("float16", "float32"), ("float16", "float64"), ("float32", "float16"), ("float64", "float16"))
CAST_DTYPES = ("float16", "float32", "float64", "int32", "int64")
REDUCE_WIDTH = 2  # replicas per reduce in the compiled signatures (the loop body is the same)


def _arr(dtype: Any) -> Any:
    return types.Array(from_dtype(np.dtype(dtype)), 1, "C")


def compile_targets() -> Any:
    """(name, kernel, argument types) of every kernel here as it is launched, for the compile
    check (kernels/compiled.py). All of them promise the CPU twins' bits."""
    for name in REDUCE_DTYPES:
        a = _arr(name)
        bufs = types.UniTuple(a, REDUCE_WIDTH)
        if name == "float16":
            yield "reduce_half[float16]", _reduce_half_kernel(), (a, bufs, types.float64)
            continue
        reduce_sum, reduce_mean = _reduce_kernels(np.dtype(name))
        yield f"reduce_sum[{name}]", reduce_sum, (a, bufs)
        if name.startswith("float"):
            yield f"reduce_mean[{name}]", reduce_mean, (a, bufs, from_dtype(np.dtype(name)))
    starts = types.UniTuple(types.int64, CHUNK)
    for dst, src in PACK_PAIRS:
        pack, unpack, _ = _copy_kernels(np.dtype(dst), np.dtype(src))
        yield f"pack[{src}->{dst}]", pack, (_arr(dst), types.UniTuple(_arr(src), CHUNK), starts,
                                            types.int64)
        yield f"unpack[{src}->{dst}]", unpack, (_arr(src), types.UniTuple(_arr(dst), CHUNK),
                                                starts, types.int64)
    for dst in CAST_DTYPES:
        for src in CAST_DTYPES:
            if dst != src:
                yield f"cast[{src}->{dst}]", _copy_kernels(np.dtype(dst), np.dtype(src))[2], (
                    _arr(dst), _arr(src))
