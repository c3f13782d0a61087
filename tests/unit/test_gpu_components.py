"""``mpidist info``'s GPU stack (mpidist.cli.gpu_components), component by component.

No GPU here: the driver's answers come from a stand-in for ``cupy.cuda.runtime`` (a test of
how we read and judge them, not of a driver)."""

import importlib.metadata
import types

import pytest

from mpidist.backend import cupy_backend
from mpidist.cli import gpu_components as gc
from mpidist.comm import nccl


def stand_in_cupy(driver, runtime, gpus=1):
    runtime_module = types.SimpleNamespace(driverGetVersion=lambda: driver,
                                           runtimeGetVersion=lambda: runtime,
                                           getDeviceCount=lambda: gpus)
    return types.SimpleNamespace(__version__="14.0.0",
                                 cuda=types.SimpleNamespace(runtime=runtime_module))


@pytest.fixture
def with_cupy(monkeypatch):
    def install(cupy, nccl_module=None):
        monkeypatch.setattr(cupy_backend, "get_cupy", lambda: cupy)
        monkeypatch.setattr(cupy_backend, "gpu_count",
                            lambda: cupy.cuda.runtime.getDeviceCount() if cupy else 0)
        monkeypatch.setattr(nccl, "nccl_module", lambda: nccl_module)
        monkeypatch.setattr(nccl, "nccl_unavailable_reason", lambda: "libnccl.so.2 not found")
        return {c["name"]: c for c in gc.gpu_components()}
    return install


def test_every_component_is_reported_in_order_with_a_status():
    components = gc.gpu_components()
    assert tuple(c["name"] for c in components) == gc.COMPONENTS
    for c in components:
        assert c["status"] in ("ok", "missing", "error")
        assert (c["fix"] is None) == (c["status"] == "ok"), c


def test_without_cupy_the_fix_names_both_cuda_extras(with_cupy):
    found = with_cupy(None)
    assert found["driver"]["status"] == "missing"
    assert "CuPy is needed" in found["driver"]["detail"]
    for name in ("cupy", "nccl"):
        assert found[name]["status"] == "missing"
        assert "mpidist[cuda13]" in found[name]["fix"] and "mpidist[cuda12]" in found[name]["fix"]


@pytest.mark.parametrize("driver, runtime, extra", [(13000, 13000, "cuda13"),
                                                    (12080, 12040, "cuda12")])
def test_the_driver_picks_the_extra_that_brings_what_is_missing(with_cupy, driver, runtime,
                                                                extra):
    found = with_cupy(stand_in_cupy(driver, runtime))
    assert found["driver"]["status"] == "ok"
    assert found["driver"]["version"] == f"{driver // 1000}.{driver % 1000 // 10}"
    assert "1 GPU(s) visible" in found["driver"]["detail"]
    assert found["cupy"]["status"] == "ok"
    assert found["nccl"]["status"] == "missing"
    assert "libnccl.so.2 not found" in found["nccl"]["detail"]
    assert found["nccl"]["fix"] == f"pip install 'mpidist[{extra}]'"


def test_a_runtime_newer_than_the_driver_is_an_error_with_the_matching_extra(with_cupy):
    found = with_cupy(stand_in_cupy(12020, 13000))
    assert found["driver"]["status"] == "error"
    assert "newer than the driver" in found["driver"]["detail"]
    assert found["driver"]["fix"] == "pip install 'mpidist[cuda12]'"


def test_a_driver_that_does_not_answer_is_missing(with_cupy):
    def fail():
        raise RuntimeError("cudaErrorInsufficientDriver")
    cupy = stand_in_cupy(0, 0)
    cupy.cuda.runtime.driverGetVersion = fail
    found = with_cupy(cupy)
    assert found["driver"]["status"] == "missing"
    assert "cudaErrorInsufficientDriver" in found["driver"]["detail"]
    assert "NVIDIA driver" in found["driver"]["fix"]


def test_nccl_version_codes_of_both_eras(with_cupy):
    for code, text in ((23203, "2.32.3"), (2708, "2.7.8")):
        module = types.SimpleNamespace(get_version=lambda code=code: code)
        found = with_cupy(stand_in_cupy(13000, 13000), nccl_module=module)
        assert found["nccl"] == {**found["nccl"], "status": "ok", "version": text}


def test_numba_cuda_reports_nvvm_or_the_extra():
    [numba_cuda] = [c for c in gc.gpu_components() if c["name"] == "numba-cuda"]
    try:
        importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        assert numba_cuda["status"] == "missing" and "cuda1" in numba_cuda["fix"]
    else:  # the test extra installs numba-cuda[cu13]: its NVVM loads without a GPU
        assert numba_cuda["status"] == "ok" and numba_cuda["detail"].startswith("NVVM ")


@pytest.mark.parametrize("major", [12, 13])
def test_each_cuda_extra_brings_the_whole_stack_for_its_cuda_major(major):
    """What `mpidist info` would otherwise report missing on a pip-only GPU node."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    requirements = project["project"]["optional-dependencies"][f"cuda{major}"]
    names = {r.split(">")[0].split("=")[0].strip() for r in requirements}
    assert names == {f"cupy-cuda{major}x", f"numba-cuda[cu{major}]", f"nvidia-nccl-cu{major}",
                     f"jax[cuda{major}]"}, requirements
    assert gc.cuda_extra(major) == f"pip install 'mpidist[cuda{major}]'"
