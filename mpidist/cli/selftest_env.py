"""The environment part of ``mpidist selftest --gpu``'s report: what this node has for the GPU
paths (Python, NumPy, CuPy, Numba and numba-cuda with its NVVM, NCCL, the driver and runtime,
the GPUs, mpi4py and the MPI library, CUDA-aware MPI, JAX and its backend), and for each
missing piece the pip command that brings it.

Run in a process of its own by the selftest (``python -m mpidist.cli.selftest_env``), under a
timeout, because loading CuPy, NVVM, MPI or JAX can hang or crash on a broken node; it prints
one line ``SELFTEST-ENV: {json}``. The GPU stack's components come from
``mpidist.cli.gpu_components`` (the same ones ``mpidist info`` shows).
"""

import importlib.metadata
import json
import os
import platform
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["MARKER", "collect", "main", "PACKAGES"]

MARKER = "SELFTEST-ENV: "

# distribution names, first installed wins (a CuPy wheel has one name per CUDA major)
PACKAGES: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "numba": ("numba",),
    "numba-cuda": ("numba-cuda",),
    "nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12"),
    "mpi4py": ("mpi4py",),
    "mpich": ("mpich",),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "jax-cuda-plugin": ("jax-cuda13-plugin", "jax-cuda12-plugin"),
    "autograd": ("autograd",),
}
# What brings a missing package (the cuda extra brings the GPU stack: mpidist.cli.gpu_components)
FIXES: dict[str, str] = {
    "mpi4py": "pip install 'mpidist[mpi]' (or mpi4py built against the site MPI)",
    "autograd": "pip install 'mpidist[autograd]' (or: tests/gpu/first_contact.sh installs the "
                "wheel from wheels/)",
    "jax": "pip install 'mpidist[jax]' (with the cuda13 extra for its CUDA plugin)",
}


def _installed(names: tuple[str, ...]) -> dict[str, Any]:
    for name in names:
        try:
            return {"dist": name, "version": importlib.metadata.version(name)}
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"dist": None, "version": None}


def _guarded(what: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``what()``, or its error as ``{"error": ...}``: one broken library never hides the rest."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return what()
    except Exception as exc:  # noqa: BLE001 - the report names every failure
        return {"error": f"{type(exc).__name__}: {exc}"}


def _gpus() -> dict[str, Any]:
    from mpidist.backend import cupy_backend  # noqa: PLC0415 - imports CuPy

    cupy = cupy_backend.get_cupy()
    count = cupy_backend.gpu_count() if cupy is not None else 0
    facts: dict[str, Any] = {"count": int(count), "names": [], "reason": None}
    if not count:
        facts["reason"] = cupy_backend.unavailable_reason()
        return facts
    runtime = cupy.cuda.runtime
    for index in range(count):
        props = runtime.getDeviceProperties(index)
        name = props.get("name", b"")
        name = name.decode() if isinstance(name, bytes) else str(name)
        facts["names"].append(f"{name} (sm_{props.get('major')}{props.get('minor')}, "
                              f"{props.get('totalGlobalMem', 0) / 2**30:.1f} GiB)")
    driver, rt = int(runtime.driverGetVersion()), int(runtime.runtimeGetVersion())
    facts["driver_cuda"] = f"{driver // 1000}.{driver % 1000 // 10}"
    facts["runtime_cuda"] = f"{rt // 1000}.{rt % 1000 // 10}"
    return facts


def _nvvm() -> dict[str, Any]:
    from numba.cuda.cudadrv import nvvm  # noqa: PLC0415 - loads libNVVM only

    version = nvvm.NVVM().get_version()
    return {"found": True, "version": ".".join(map(str, version))}


def _mpi() -> dict[str, Any]:
    from mpidist.comm.cuda_aware import cuda_aware_mpi  # noqa: PLC0415 - starts MPI
    from mpidist.comm.mpi import mpi_module  # noqa: PLC0415

    mpi = mpi_module()
    library = mpi.Get_library_version().strip().splitlines()
    aware, how = cuda_aware_mpi()
    return {"library": " ".join(library[0].split()) if library else "",
            "standard": "%d.%d" % mpi.Get_version(),
            "loaded_from": _loaded("libmpi"), "cuda_aware": aware, "cuda_aware_how": how}


def _loaded(name: str) -> str | None:
    """The file of the shared library ``name`` this process mapped (Linux), else None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith(name):
                    return path
    except OSError:
        pass
    return None


def _jax() -> dict[str, Any]:
    from mpidist.training.autodiff import jax_module  # noqa: PLC0415 - imports JAX

    jax = jax_module()
    return {"version": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()]}


def _components() -> dict[str, Any]:
    from mpidist.cli.gpu_components import gpu_components  # noqa: PLC0415 - imports CuPy

    return {"list": gpu_components()}


def collect() -> dict[str, Any]:
    """Every fact of the environment section (see docs/testing.md, "The first-contact report")."""
    packages = {key: _installed(names) for key, names in PACKAGES.items()}
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "packages": packages,
        "gpus": _guarded(_gpus),
        "nvvm": _guarded(_nvvm),
        "mpi": _guarded(_mpi),
        "jax": _guarded(_jax) if packages["jax"]["version"] else {"error": "not installed"},
        "components": _guarded(_components).get("list", []),
        "variables": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "CUDA_HOME",
                                                  "NUMBA_CUDA_DRIVER", "MPIDIST_GPU_AWARE_MPI",
                                                  "XLA_PYTHON_CLIENT_PREALLOCATE")
                      if k in os.environ},
    }
    missing = [{"what": c["name"], "detail": c.get("detail", ""), "fix": c["fix"]}
               for c in env["components"] if c.get("status") != "ok" and c.get("fix")]
    missing += [{"what": key, "detail": "not installed", "fix": fix} for key, fix in FIXES.items()
                if packages[key]["version"] is None and key not in {m["what"] for m in missing}]
    env["missing"] = missing
    return env


def main() -> int:
    try:
        facts = collect()
    except Exception:  # noqa: BLE001 - a report with the traceback beats no report
        facts = {"error": traceback.format_exc(limit=8)}
    print(MARKER + json.dumps(facts, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
