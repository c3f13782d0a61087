"""Whether the MPI library reads and writes GPU memory (CUDA-aware MPI), found out once.

Handing a device pointer to an MPI library that is not CUDA-aware is a crash inside MPI (it
reads the address as host memory), so device buffers go to MPI only where the library says it
is CUDA-aware; elsewhere they travel through host memory (``comm.device_buffers``). The mpich
wheel from PyPI is not CUDA-aware.

How it is found out, first answer wins:

1. ``MPIDIST_GPU_AWARE_MPI=1`` / ``=0``: the user's word (for a library that misreports).
2. ``MPIX_Query_cuda_support()`` of the loaded MPI library (Open MPI's CUDA extension; MPICH
   4.1 and later): the runtime's own answer, which also reflects ``MPIR_CVAR_ENABLE_GPU=0``.
   mpi4py does not wrap it, so it is called through ctypes on the library mpi4py loaded.
3. By the library's version string (``MPI.Get_library_version()``): Open MPI's
   ``ompi_info`` parameter ``mpi_built_with_cuda_support``; MVAPICH2 with ``MV2_USE_CUDA=1``;
   an MPICH without the query that was configured without CUDA.
4. Otherwise unknown (None): device buffers are staged through the host, the safe way.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from mpidist.config import get_config
from mpidist.logs import get_logger

__all__ = ["cuda_aware_mpi", "describe", "detect_cuda_awareness", "query_cuda_support", "reset"]

log = get_logger("mpidist.comm")

OVERRIDE = "MPIDIST_GPU_AWARE_MPI"
_cached: dict[str, tuple[bool | None, str]] = {}


def cuda_aware_mpi() -> tuple[bool | None, str]:
    """``(aware, how)``: True/False when known, None when it cannot be told, and how that was
    determined (one line, for ``mpidist info`` and the log). Computed once per process."""
    found = _cached.get("answer")
    if found is None:
        from mpidist.comm.mpi import mpi_module  # noqa: PLC0415 - MPI only when asked

        config = get_config()
        override = config.gpu_aware_mpi if OVERRIDE in config.set_variables else None
        found = _cached["answer"] = detect_cuda_awareness(
            mpi_module().Get_library_version(), os.environ, query_cuda_support, _ompi_info,
            override)
    return found


def reset() -> None:
    """Forget the cached answer (tests)."""
    _cached.clear()


def detect_cuda_awareness(library: str, environ: Mapping[str, str],
                          query: Callable[[], int | None],
                          ompi_info: Callable[[], str | None], override: bool | None = None
                          ) -> tuple[bool | None, str]:
    """The decision of ``cuda_aware_mpi`` from its inputs: the MPI library's version string,
    the environment, the runtime query (None where the library has none), the output of
    ``ompi_info --parsable --all`` (None where it cannot be run) and the user's
    ``MPIDIST_GPU_AWARE_MPI`` (None where unset)."""
    if override is not None:
        return override, f"{OVERRIDE}={int(override)} (set by the user)"
    answer = query()
    if answer is not None:
        return bool(answer), f"MPIX_Query_cuda_support() of the MPI library returned {answer}"
    first = library.strip().splitlines()[0] if library.strip() else "an unnamed MPI library"
    if "Open MPI" in library:
        text = ompi_info()
        if text is not None:
            for line in text.splitlines():
                if "mpi_built_with_cuda_support:value:" in line:
                    built = line.rsplit(":", 1)[1].strip().lower() == "true"
                    return built, f"ompi_info: mpi_built_with_cuda_support is {str(built).lower()}"
        return None, f"{first}: ompi_info could not tell whether it was built with CUDA"
    if "MVAPICH" in library:
        use_cuda = environ.get("MV2_USE_CUDA", "0").strip() == "1"
        return use_cuda, f"{first}: MV2_USE_CUDA is {'1' if use_cuda else 'not 1'}"
    if "MPICH" in library:
        if environ.get("MPIR_CVAR_ENABLE_GPU", "").strip() == "0":
            return False, f"{first}: MPIR_CVAR_ENABLE_GPU=0"
        configure = next((line for line in library.splitlines() if "configure" in line), "")
        if "cuda" not in configure.lower():
            return False, f"{first}: configured without CUDA (no MPIX_Query_cuda_support)"
        return None, f"{first}: configured with CUDA, but without a runtime query"
    return None, f"{first}: no way known to ask whether it is CUDA-aware"


def query_cuda_support() -> int | None:
    """``MPIX_Query_cuda_support()`` of the MPI library this process loaded, or None where it
    has no such function (or the library cannot be found)."""
    for path in _loaded_mpi_libraries():
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        function = getattr(library, "MPIX_Query_cuda_support", None)
        if function is not None:
            function.restype = ctypes.c_int
            return int(function())
    return None


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (Linux), libmpi first."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    except OSError:
        return []
    return sorted(paths, key=lambda p: (os.path.basename(p).startswith("libmpi_"), p))


def _ompi_info() -> str | None:
    path = shutil.which("ompi_info")
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--parsable", "--all"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout


def describe(answer: tuple[bool | None, str]) -> str:
    """One line for a log or report: what happens to device buffers, and why."""
    aware, how = answer
    if aware:
        return f"the MPI library is CUDA-aware ({how}): device buffers go to MPI as they are"
    state = "is not CUDA-aware" if aware is False else "may not be CUDA-aware"
    return (f"the MPI library {state} ({how}): device buffers travel through host memory "
            f"(set {OVERRIDE}=1 if it is CUDA-aware)")
