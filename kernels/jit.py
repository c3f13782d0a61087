"""Numba's compiling decorators, typed: ``njit(**options)`` and ``cuda_jit``.

Numba's decorators are untyped, which would make every kernel they decorate untyped to mypy.
These wrappers call them with the same options and return what they return (the same
dispatcher objects, with the same caching); only the types they declare are new. Numba is
imported on first use, so importing a kernels module still imports no Numba.

The kernels modules import this one relatively (``from .jit import njit``): mypy checks
kernels/ as the package ``kernels`` and sees the typed wrappers, while ``mpidist.kernels.*``
names are Any to it (pyproject.toml, [tool.mypy]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar, cast

__all__ = ["njit", "cuda_jit", "CudaKernel"]

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")


class CudaKernel(Protocol[P]):
    """What ``cuda.jit`` returns: a kernel launched as ``kernel[blocks, threads, stream](*args)``."""

    def __getitem__(self, config: tuple[Any, ...]) -> Callable[P, None]: ...


def njit(**options: Any) -> Callable[[F], F]:
    """``numba.njit(**options)``: the decorated function compiles on first call; its dispatcher
    is called with the function's own arguments."""
    from numba import njit as numba_njit  # noqa: PLC0415 - Numba on first use only

    decorator = numba_njit(**options)

    def decorate(fn: F) -> F:
        return cast(F, decorator(fn))

    return decorate


def cuda_jit(fn: Callable[P, None]) -> CudaKernel[P]:
    """``numba.cuda.jit`` with no options (a kernel, not a device function); under
    ``NUMBA_ENABLE_CUDASIM=1`` the simulator's, as Numba decides at its import."""
    from numba import cuda  # noqa: PLC0415 - Numba on first use only

    return cast("CudaKernel[P]", cuda.jit(fn))
