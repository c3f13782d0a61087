"""The GPU stack of this process, component by component, for ``mpidist info`` and the selftest.

Each component reports ``{"name", "status", "version", "detail", "fix"}``: status ``ok``,
``missing`` (not installed, or its library cannot be loaded) or ``error`` (installed but
broken); ``fix`` is the command that brings a missing one. Nothing here needs a GPU: with none,
the driver is reported missing and the rest as installed or not.
"""

import importlib.metadata
import warnings
from typing import Any

from mpidist.backend import cupy_backend

__all__ = ["gpu_components", "cuda_extra", "COMPONENTS"]

COMPONENTS = ("driver", "cupy", "nccl", "numba-cuda", "cuda-aware-mpi", "jax")

_CUPY_WHEELS = ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy")
_JAX_PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")


def _installed(*names: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the first of ``names`` installed, without importing it."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _component(name: str, status: str, version: str | None = None, detail: str = "",
               fix: str | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "version": version, "detail": detail, "fix": fix}


def _cuda_version(code: int) -> str:
    """CUDA's integer version (12040) as text (12.4)."""
    return f"{code // 1000}.{code % 1000 // 10}"


def cuda_extra(driver_major: int | None) -> str:
    """The pip command that installs the GPU stack matching a driver of CUDA ``driver_major``."""
    if driver_major in (12, 13):
        return f"pip install 'mpidist[cuda{driver_major}]'"
    return ("pip install 'mpidist[cuda13]' (or 'mpidist[cuda12]': the CUDA major version "
            "nvidia-smi shows)")


def _driver(cupy: Any) -> tuple[dict[str, Any], int | None]:
    if cupy is None:
        return _component("driver", "missing", detail="not asked: CuPy is needed to ask the "
                          "driver", fix=cuda_extra(None)), None
    try:
        driver = int(cupy.cuda.runtime.driverGetVersion())
        runtime = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001 - no driver (CUDARuntimeError), or a broken one
        return _component("driver", "missing", detail=f"{type(exc).__name__}: {exc}",
                          fix="install the NVIDIA driver on this node (or run on a GPU node)"), None
    if driver == 0:
        return _component("driver", "missing", detail="no NVIDIA driver is loaded",
                          fix="install the NVIDIA driver on this node (or run on a GPU node)"), None
    count = cupy_backend.gpu_count()
    detail = f"CUDA {_cuda_version(driver)} driver, CuPy's runtime CUDA {_cuda_version(runtime)}, " \
             f"{count} GPU(s) visible"
    status = "ok"
    if runtime // 1000 > driver // 1000:
        status, detail = "error", detail + ": the runtime is newer than the driver supports"
    return _component("driver", status, _cuda_version(driver), detail,
                      None if status == "ok" else cuda_extra(driver // 1000)), driver // 1000


def _cupy(cupy: Any, fix: str) -> dict[str, Any]:
    wheel = _installed(*_CUPY_WHEELS)
    if wheel is None and cupy is not None:  # a source build, or a module on PYTHONPATH
        wheel = ("cupy", str(getattr(cupy, "__version__", "unknown")))
    if wheel is None:
        return _component("cupy", "missing", fix=fix)
    if cupy is None:
        return _component("cupy", "error", wheel[1],
                          f"{wheel[0]} is installed but does not load: "
                          f"{cupy_backend.unavailable_reason()}", fix)
    return _component("cupy", "ok", wheel[1], wheel[0])


def _nccl(cupy: Any, fix: str) -> dict[str, Any]:
    from mpidist.comm import nccl  # noqa: PLC0415 - loads CuPy's NCCL binding

    wheel = _installed("nvidia-nccl-cu13", "nvidia-nccl-cu12")
    source = f" ({wheel[0]} {wheel[1]})" if wheel else ""
    if cupy is None:
        return _component("nccl", "missing", detail="used through CuPy, which is missing" + source,
                          fix=fix)
    version = nccl.nccl_version()
    if version is None:
        return _component("nccl", "missing", detail=nccl.nccl_unavailable_reason() + source,
                          fix=fix)
    return _component("nccl", "ok", version, "loaded through CuPy" + source)


def _numba_cuda(fix: str) -> dict[str, Any]:
    """numba-cuda and its NVVM: without NVVM no kernel of mpidist.kernels compiles for a GPU."""
    wheel = _installed("numba-cuda")
    if wheel is None:
        return _component("numba-cuda", "missing",
                          detail="numba's built-in CUDA target finds NVVM only through conda, "
                                 "CUDA_HOME or a system CUDA toolkit", fix=fix)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from numba.cuda.cudadrv import nvvm  # noqa: PLC0415 - loads libNVVM only

            version = nvvm.NVVM().get_version()
    except Exception as exc:  # noqa: BLE001 - NVVM library missing or unloadable
        return _component("numba-cuda", "error", wheel[1],
                          f"NVVM cannot be loaded: {type(exc).__name__}: {exc}", fix)
    return _component("numba-cuda", "ok", wheel[1], f"NVVM {'.'.join(map(str, version))}")


def _cuda_aware_mpi() -> dict[str, Any]:
    from mpidist.comm.cuda_aware import cuda_aware_mpi  # noqa: PLC0415 - initialises MPI

    aware, how = cuda_aware_mpi()
    if aware:
        return _component("cuda-aware-mpi", "ok", detail=how)
    return _component("cuda-aware-mpi", "missing", detail=how + ": device buffers are staged "
                      "through host memory", fix="load a CUDA-aware MPI (the site's Open MPI or "
                      "MPICH built with CUDA) and build mpi4py against it (pip install "
                      "--no-binary=mpi4py mpi4py); MPIDIST_GPU_AWARE_MPI=1 where it is and "
                      "cannot say so")


def _jax(fix: str, gpus: int) -> dict[str, Any]:
    jax = _installed("jax")
    if jax is None:
        return _component("jax", "missing", detail="autodiff of GPU replicas needs JAX", fix=fix)
    plugin = _installed(*_JAX_PLUGINS)
    if plugin is None:
        return _component("jax", "missing", jax[1],
                          "JAX is installed without its CUDA plugin: it computes on the CPU",
                          fix)
    detail = f"{plugin[0]} {plugin[1]}"
    if not gpus:
        return _component("jax", "ok", jax[1], detail + "; backend not started (no GPU visible)")
    try:
        from mpidist.training.autodiff import jax_module  # noqa: PLC0415 - imports JAX

        backend = jax_module().default_backend()
    except Exception as exc:  # noqa: BLE001 - a plugin that fails to initialise
        return _component("jax", "error", jax[1], f"{detail}: {type(exc).__name__}: {exc}", fix)
    status = "ok" if backend in ("gpu", "cuda") else "error"
    return _component("jax", status, jax[1], f"{detail}; backend {backend}",
                      None if status == "ok" else fix)


def gpu_components() -> list[dict[str, Any]]:
    """Every component of ``COMPONENTS``, in that order, as this process finds it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cupy = cupy_backend.get_cupy()
    driver, major = _driver(cupy)
    fix = cuda_extra(major)
    gpus = cupy_backend.gpu_count() if cupy is not None else 0
    return [driver, _cupy(cupy, fix), _nccl(cupy, fix), _numba_cuda(fix), _cuda_aware_mpi(),
            _jax(fix, gpus)]

