"""CuPy, imported on first use only; ``available()`` tells whether GPUs can be driven."""

from __future__ import annotations

import sys
from typing import Any, TypeGuard, cast

__all__ = ["available", "get_cupy", "is_cupy_array", "gpu_count", "reset"]

# "checked": bool, "module": the cupy module or None, "error": why CuPy cannot be used, or None.
_state: dict[str, Any] = {"checked": False, "module": None, "error": None}


def get_cupy() -> Any:
    """The cupy module, or None when CuPy is not installed or finds no CUDA runtime (``Any``:
    CuPy has no type information)."""
    if not _state["checked"]:
        _state["checked"] = True
        try:
            import cupy  # noqa: PLC0415 - lazy on purpose: importing CuPy initialises CUDA

            _state["module"] = cupy
        except Exception as exc:  # noqa: BLE001 - ImportError, or CUDA libraries that fail to load
            _state["error"] = exc
    return _state["module"]


def reset() -> None:
    """Forget the cached import, so that the next ``get_cupy`` imports ``cupy`` again (tests
    that put a stand-in in ``sys.modules`` call this before and after)."""
    _state.update(checked=False, module=None, error=None)


def is_cupy_array(x: object) -> TypeGuard[Any]:
    # TypeGuard: inside ``if is_cupy_array(x)`` x is a cupy.ndarray, i.e. Any (CuPy is untyped),
    # not the numpy half of ``mpidist.types.Array``.
    # A CuPy array can only exist if cupy was imported by someone: avoid importing it here.
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def gpu_count() -> int:
    cupy = get_cupy()
    if cupy is None:
        return 0
    try:
        return cast(int, cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver, or no device visible
        _state["error"] = exc
        return 0


def available() -> bool:
    return gpu_count() > 0


def unavailable_reason() -> str:
    err = _state["error"]
    if err is None and get_cupy() is None:
        return "CuPy is not installed (pip install 'mpidist[cuda12]')"
    return f"{type(err).__name__}: {err}" if err is not None else "no GPU is visible"
