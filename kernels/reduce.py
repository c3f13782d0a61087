"""N-way element-wise reduction of equally shaped buffers."""

__all__ = ["reduce_n"]


def reduce_n(buffers, out=None, divisor=None, xp=None):
    """Sum ``buffers`` element-wise into ``out`` and optionally divide by ``divisor``.

    Args:
        buffers: Non-empty sequence of arrays of one shape (NumPy, or CuPy on one device).
        out: Result array of that shape, or None to allocate one. May not alias a buffer but the first.
        divisor: Applied after the sum by true division (``N`` for MEAN), or None.
        xp: The array module of the buffers; NumPy when None.

    Returns:
        ``out`` (a new float64 array when an integer sum is divided, as true division gives).
    """
    if xp is None:
        import numpy as xp  # noqa: PLC0415 - the common case, resolved lazily for CuPy callers
    if not buffers:
        raise ValueError("reduce_n needs at least one buffer to reduce.")
    first = buffers[0]
    for i, b in enumerate(buffers[1:], start=1):
        if b.shape != first.shape:
            raise ValueError(
                f"reduce_n: buffer {i} has shape {tuple(b.shape)} but buffer 0 has shape "
                f"{tuple(first.shape)}; all buffers must have one shape."
            )
    dtype = xp.result_type(*buffers)
    if out is None:
        out = xp.array(first, dtype=dtype, copy=True)
    elif out is not first:
        xp.copyto(out, first, casting="unsafe")
    for b in buffers[1:]:
        xp.add(out, b, out=out, casting="unsafe")
    if divisor is not None:
        if out.dtype.kind in "iub":
            out = xp.true_divide(out, divisor)
        else:
            xp.true_divide(out, divisor, out=out, casting="unsafe")
    return out
