"""Fusion buffers: many tensors packed into one flat buffer by an offsets table and back,
optionally casting on the way (float32 -> float16 for compressed transfers), plus a pool of
persistent flat buffers reused across calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpidist.kernels.arrays import (
    check_out,
    cpu_kernels,
    cuda_kernels,
    empty_like_family,
    flat_device,
    flat_host,
    is_device_array,
)
from mpidist.kernels.layout import FusionLayout

__all__ = ["pack", "reduce_pack", "unpack", "cast", "BufferPool"]

_CHUNK = 8  # tensors per kernel launch; must equal kernels.cpu.CHUNK
_SUPPORTED_KINDS = "fiu"


def _check_dtype(dtype: Any, what: str) -> Any:
    dtype = np.dtype(dtype)
    if dtype.kind not in _SUPPORTED_KINDS:
        raise ValueError(
            f"{what} has dtype {dtype}; fusion buffers hold integer or floating-point data only."
        )
    return dtype


def _host_mode(src_dtype: Any, dst_dtype: Any) -> Any:
    """CPU copy mode: 0 same representation kind, 1 into float16 bits, 2 out of float16 bits."""
    src_half, dst_half = src_dtype == np.float16, dst_dtype == np.float16
    if src_half == dst_half:
        return 0
    return 1 if dst_half else 2


def _source_dtype(tensors: Any) -> Any:
    dtype = np.dtype(tensors[0].dtype)
    for i, t in enumerate(tensors):
        if t.dtype != dtype:
            raise ValueError(
                f"pack: tensor {i} has dtype {np.dtype(t.dtype)} but tensor 0 has dtype {dtype}; "
                "a fusion buffer holds one dtype: pack each dtype separately."
            )
    return _check_dtype(dtype, "pack: the tensors")


def _chunks(arrays: Any, starts: Any, pad: Any) -> Any:
    """(tuple of CHUNK arrays, tuple of CHUNK starts, real count) per launch."""
    for i in range(0, len(arrays), _CHUNK):
        part = arrays[i:i + _CHUNK]
        count = len(part)
        yield (tuple(part) + (pad,) * (_CHUNK - count),
               tuple(starts[i:i + _CHUNK]) + (0,) * (_CHUNK - count), count)


def _same_type_tuple(arrays: Any) -> Any:
    # Numba's tuples must hold one array type: read-only arrays differ from writable ones.
    if all(a.flags.writeable for a in arrays):
        return arrays
    views = []
    for a in arrays:
        v = a.view()
        v.flags.writeable = False
        views.append(v)
    return views


def pack(tensors: Any, out: Any = None, dtype: Any = None, layout: Any = None) -> Any:
    """Copy ``tensors`` end to end into one flat buffer, casting to ``dtype`` on the way.

    Args:
        tensors: Sequence of arrays of one dtype, all on the host or all on one GPU; any shapes,
            zero-size ones included. Non-contiguous host arrays are read through a copy.
        out: The flat buffer to fill (1-D, ``layout.total`` long, C-contiguous), e.g. one from a
            BufferPool; None allocates one next to the tensors.
        dtype: The buffer's dtype (default: the tensors'); a different float dtype casts.
        layout: The tensors' FusionLayout when the caller has it cached.

    Returns:
        The flat buffer.
    """
    tensors = list(tensors)
    layout = layout if layout is not None else FusionLayout.of(tensors)
    if len(layout) != len(tensors):
        raise ValueError(f"pack: the layout describes {len(layout)} tensors, got {len(tensors)}.")
    if not tensors:
        if dtype is None and out is None:
            raise ValueError("pack: no tensors and no dtype: pass dtype= to pack an empty list.")
        return out if out is not None else np.empty(0, dtype)
    src_dtype = _source_dtype(tensors)
    dst_dtype = _check_dtype(dtype if dtype is not None else (out.dtype if out is not None
                                                                else src_dtype), "pack: dtype")
    for i, (t, shape) in enumerate(zip(tensors, layout.shapes)):
        if t.shape != shape and tuple(t.shape) != shape:
            raise ValueError(f"pack: tensor {i} has shape {tuple(t.shape)}; the layout says {shape}.")
    if out is None:
        out = empty_like_family(tensors[0], (layout.total,), dst_dtype)
    else:
        check_out(out, (layout.total,), dst_dtype)
    if is_device_array(tensors[0]):
        _pack_device(tensors, out, layout)
    else:
        cpu = cpu_kernels()
        mode = _host_mode(src_dtype, dst_dtype)
        flat = out.view(np.uint16) if dst_dtype == np.float16 else out
        sources = _same_type_tuple([flat_host(t) for t in tensors])
        pad = sources[0][:0]
        for srcs, starts, count in _chunks(sources, layout.starts, pad):
            cpu.pack_chunk(flat, srcs, starts, count, mode)
    return out


def reduce_pack(replicas: Any, layout: Any, divisor: Any = None, out: Any = None) -> Any:
    """Reduce each tensor's replicas straight into one flat buffer: pack and N-way reduce in
    one pass, for host replicas (virtual CPU devices share memory, so nothing needs copying).

    Args:
        replicas: One sequence per tensor of its N replica arrays (host, one dtype, one shape
            per tensor); ``layout`` lays the tensors out.
        divisor: Divide each sum by this count (MEAN on float data), or None.
        out: The flat result buffer (``layout.total`` long), or None for a new one.

    Returns:
        The flat buffer holding every tensor's reduction at its offset.
    """
    if len(replicas) != len(layout):
        raise ValueError(f"reduce_pack: the layout describes {len(layout)} tensors, got {len(replicas)}.")
    if not replicas:
        raise ValueError("reduce_pack needs at least one tensor.")
    dtype = np.dtype(replicas[0][0].dtype)
    if dtype not in ("float32", "float64", "int32", "int64") or (divisor and dtype.kind == "i"):
        raise ValueError(
            f"reduce_pack works on float32/float64 and integer SUM, not {dtype}"
            f"{' MEAN' if divisor else ''}; use pack() per replica and reduce_n() instead."
        )
    n = len(replicas[0])
    ndarray = np.ndarray
    if n == 1 and not divisor:
        return _pack_single_replica(replicas, layout, dtype, out)
    flats = []
    for k, group in enumerate(replicas):
        shape = layout.shapes[k]
        flat = []
        for a in group:
            if type(a) is not ndarray or a.dtype != dtype or a.shape != shape:
                _reject_replica(a, k, shape, dtype)
            flat.append(a if a.ndim == 1 and a.flags.c_contiguous else flat_host(a))
        if len(flat) != n:
            raise ValueError(f"reduce_pack: tensor {k} has {len(flat)} replicas, tensor 0 has {n}.")
        flats.append(tuple(_same_type_tuple(flat)))
    if out is None:
        out = np.empty(layout.total, dtype)
    else:
        check_out(out, (layout.total,), dtype)
    cpu = cpu_kernels()
    pad = (flats[0][0][:0],) * n
    for srcs, starts, count in _chunks(flats, layout.starts, pad):
        cpu.reduce_pack_chunk(out, srcs, starts, count, divisor or 0)
    return out


def _pack_single_replica(replicas: Any, layout: Any, dtype: Any, out: Any) -> Any:
    """One replica: the "reduce" is a pack, and one concatenate call beats the chunked kernel
    launches for the many small tensors of a model."""
    ndarray = np.ndarray
    flats = []
    for k, group in enumerate(replicas):
        if len(group) != 1:
            raise ValueError(f"reduce_pack: tensor {k} has {len(group)} replicas, tensor 0 has 1.")
        a = group[0]
        if type(a) is not ndarray or a.dtype != dtype or a.shape != layout.shapes[k]:
            _reject_replica(a, k, layout.shapes[k], dtype)
        flats.append(a.reshape(-1))
    if out is None:
        out = np.empty(layout.total, dtype)
    else:
        check_out(out, (layout.total,), dtype)
    np.concatenate(flats, out=out)
    return out


def _reject_replica(a: Any, k: Any, shape: Any, dtype: Any) -> None:
    if is_device_array(a):
        raise ValueError("reduce_pack takes host arrays; on GPUs use pack() and reduce_n().")
    if np.dtype(getattr(a, "dtype", object)) != dtype or tuple(a.shape) != shape:
        raise ValueError(
            f"reduce_pack: tensor {k} has a replica of shape {tuple(a.shape)} and dtype {a.dtype}; "
            f"the layout says {shape} and the batch dtype is {dtype}."
        )
    if not isinstance(a, np.ndarray):
        raise ValueError(f"reduce_pack: tensor {k} has a replica that is not an array: {type(a)}.")


def unpack(flat: Any, layout: Any, out: Any = None, dtype: Any = None) -> Any:
    """The tensors of ``layout`` read back out of ``flat``.

    Without ``out`` and without a cast the results are views into ``flat`` (no copy: they
    change when ``flat`` does); otherwise they are written into ``out`` (or new arrays of
    ``dtype``), casting from the buffer's dtype.

    Returns:
        A list of arrays shaped as ``layout.shapes``.
    """
    if tuple(flat.shape) != (layout.total,):
        raise ValueError(
            f"unpack: the flat buffer has shape {tuple(flat.shape)} but the layout needs "
            f"({layout.total},)."
        )
    src_dtype = _check_dtype(flat.dtype, "unpack: the flat buffer")
    if out is None and (dtype is None or np.dtype(dtype) == src_dtype):
        return layout.views(flat)
    if out is None:
        dst_dtype = _check_dtype(dtype, "unpack: dtype")
        out = [empty_like_family(flat, shape, dst_dtype) for shape in layout.shapes]
    else:
        out = list(out)
        if len(out) != len(layout):
            raise ValueError(f"unpack: {len(layout)} tensors in the layout, {len(out)} in out.")
        dst_dtype = _check_dtype(out[0].dtype if out else src_dtype, "unpack: out")
        for i, (o, shape) in enumerate(zip(out, layout.shapes)):
            check_out(o, shape, dst_dtype, what=f"out[{i}]")
    if not out:
        return out
    if is_device_array(flat):
        _unpack_device(flat, out, layout)
    else:
        cpu = cpu_kernels()
        mode = _host_mode(src_dtype, dst_dtype)
        source = flat.view(np.uint16) if src_dtype == np.float16 else flat
        targets = [flat_host(o) for o in out]
        for dsts, starts, count in _chunks(targets, layout.starts, targets[0][:0]):
            cpu.unpack_chunk(source, dsts, starts, count, mode)
    return out


def cast(x: Any, dtype: Any, out: Any = None) -> Any:
    """``x`` converted to ``dtype`` by the kernel of its device (float16 rounding: to nearest
    even, as NumPy)."""
    dst_dtype = _check_dtype(dtype, "cast: dtype")
    src_dtype = _check_dtype(x.dtype, "cast: the input")
    if out is None:
        out = empty_like_family(x, x.shape, dst_dtype)
    else:
        check_out(out, x.shape, dst_dtype)
    if is_device_array(x):
        cuda = cuda_kernels()
        with cuda.on_device_of(x) as stream:
            cuda.cast_into(flat_device(out, "out"), flat_device(x, "input"), stream)
    else:
        dst = out.reshape(-1)
        cpu_kernels().cast_into(dst.view(np.uint16) if dst_dtype == np.float16 else dst,
                                flat_host(x), _host_mode(src_dtype, dst_dtype))
    return out


def _pack_device(tensors: Any, out: Any, layout: Any) -> None:
    cuda = cuda_kernels()
    with cuda.on_device_of(tensors[0]) as stream:
        flat = flat_device(out, "out")
        sources = [flat_device(t, f"tensor {i}") for i, t in enumerate(tensors)]
        for srcs, starts, count in _chunks(sources, layout.starts, sources[0][:0]):
            cuda.pack_chunk(flat, srcs, starts, count, [s.size for s in srcs[:count]], stream)


def _unpack_device(flat: Any, out: Any, layout: Any) -> None:
    cuda = cuda_kernels()
    with cuda.on_device_of(flat) as stream:
        source = flat_device(flat, "flat buffer")
        targets = [flat_device(o, f"out[{i}]") for i, o in enumerate(out)]
        for dsts, starts, count in _chunks(targets, layout.starts, targets[0][:0]):
            cuda.unpack_chunk(source, dsts, starts, count, [d.size for d in dsts[:count]], stream)


class BufferPool:
    """Persistent flat buffers, one per (place, dtype, length), reused across calls.

    ``get`` hands back the same array for the same key every time, so a caller that packs the
    same tensors each step allocates once. A pool is not shared between threads: each caller
    that runs concurrently keeps its own (CrossDeviceOps hold one per instance under a lock).
    """

    def __init__(self) -> None:
        self._buffers: dict[Any, Any] = {}

    def get(self, like: Any, length: Any, dtype: Any, slot: Any = 0) -> Any:
        """The pooled buffer of ``length`` elements of ``dtype`` where ``like`` lives.

        ``slot`` tells apart several buffers of one size needed at once (e.g. one per replica).
        """
        dtype = np.dtype(dtype)
        place = _place_of(like)
        key = (place, dtype, int(length), slot)
        buf = self._buffers.get(key)
        if buf is None:
            buf = empty_like_family(like, (int(length),), dtype)
            self._buffers[key] = buf
        return buf

    def clear(self) -> None:
        self._buffers.clear()

    @property
    def nbytes(self) -> Any:
        return sum(int(b.nbytes) for b in self._buffers.values())

    def __len__(self) -> int:
        return len(self._buffers)


def _place_of(x: Any) -> Any:
    if not is_device_array(x):
        return ("host", -1)
    device: Any = getattr(x, "device", None)
    return ("gpu", int(device.id) if hasattr(device, "id") else 0)
