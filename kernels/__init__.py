"""Compute kernels for local reductions and fusion buffers, shipped as ``mpidist.kernels``.

Pure array functions with no MPI and no distribution logic: they take buffers and write
buffers. Each has a CPU twin (Numba ``njit``) and a CUDA twin (Numba ``cuda.jit``) with the same
contract, chosen by where the arrays live. Importing this package compiles nothing and does
not import Numba; the first call of a kernel does.
"""

from mpidist.kernels.arrays import KERNEL_DTYPES
from mpidist.kernels.fusion import BufferPool, cast, pack, reduce_pack, unpack
from mpidist.kernels.layout import FusionLayout, group_by_size, split_sizes
from mpidist.kernels.reduce import reduce_n

__all__ = ["KERNEL_DTYPES", "reduce_n", "pack", "reduce_pack", "unpack", "cast", "BufferPool",
           "FusionLayout", "split_sizes",
           "group_by_size"]
