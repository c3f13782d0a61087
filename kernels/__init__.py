"""Compute kernels for local reductions, shipped as ``mpidist.kernels``.

Pure array functions with no MPI and no distribution logic: they take buffers and write buffers.
Importing this package compiles nothing.
"""

from mpidist.kernels.reduce import reduce_n

__all__ = ["reduce_n"]
