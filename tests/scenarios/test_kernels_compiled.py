"""Every CUDA kernel of mpidist.kernels compiled for sm_80 and sm_90 without a GPU (numba-cuda's
NVVM, nvJitLink, nvdisasm: the `test` extra brings them), and checked in PTX and SASS: no FMA
where the CPU twins' bits are promised, no float->int rounding where NumPy truncates, no spills
in the hot kernels (kernels/compiled.py; docs/testing.md, "CUDA kernels compiled without a GPU").

The report (registers, spills, compile times per kernel and arch) is written to
$MPIDIST_KERNEL_REPORT, or kernel-report.json in pytest's temporary directory; its table is
printed (pytest -s, or -rA shows it).
"""

import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

def _missing(module):
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # its parent package is absent
        return True


_MISSING = [m for m in ("numba_cuda", "cuda.bindings.nvjitlink", "cuda.pathfinder") if _missing(m)]
if not _MISSING:
    from cuda.pathfinder import find_nvidia_binary_utility

    if find_nvidia_binary_utility("nvdisasm") is None:
        _MISSING.append("nvdisasm")
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"needs numba-cuda[cu13] and nvidia-cuda-nvdisasm (missing: {_MISSING}): "
                           "pip install -e '.[test]'")

if not _MISSING:
    from numba import cuda  # the old-style kernels below refer to it as a global

    from mpidist.kernels import compiled


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rep = compiled.build_report()
    path = Path(os.environ.get("MPIDIST_KERNEL_REPORT")
                or tmp_path_factory.mktemp("kernels") / "kernel-report.json")
    path.write_text(json.dumps(rep, indent=1))
    print(f"\n{compiled.table(rep)}\nreport: {path}")
    return rep


def test_every_launched_kernel_is_compiled_for_each_arch(report):
    names = [name for name, *_ in compiled.targets()]
    assert len(names) == len(set(names)) and len(names) >= 50
    for arch in ("sm_80", "sm_90"):
        got = [k["kernel"] for k in report["kernels"] if k["arch"] == arch]
        assert got == names, arch
    for k in report["kernels"]:
        assert k["entry"] and k["sass_found"], k["kernel"]
        assert isinstance(k["registers"], int) and 0 < k["registers"] <= 255, k
        assert k["ptx_seconds"] > 0


def test_no_fma_no_rounding_conversion_no_spill(report):
    assert compiled.problems(report) == []


def test_compiling_needs_no_driver(report):
    assert report["driver_loaded"] is False


# -- the checker fails on what it is for -----------------------------------------------------

def _old_sgd(w, g, lr):  # the kernel as it was before issue 23: NVVM fuses this into FFMA
    i = cuda.grid(1)
    while i < w.size:
        w[i] = w[i] - lr * g[i]
        i += cuda.gridsize(1)


def _old_adam(w, g, m, v, alpha, one_minus_b1, one_minus_b2, eps):  # the old way: fma.rn.f32
    i = cuda.grid(1)
    while i < w.size:
        gi = g[i]
        mi = m[i] + (gi - m[i]) * one_minus_b1
        vi = v[i] + (gi * gi - v[i]) * one_minus_b2
        m[i] = mi
        v[i] = vi
        w[i] = w[i] - mi * alpha / (math.sqrt(vi) + eps)
        i += cuda.gridsize(1)


def _old_cast(dst, src):  # float16 -> int32 directly: cvt.rni (NumPy truncates)
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def _arr(dtype):
    from numba import types
    from numba.np.numpy_support import from_dtype

    return types.Array(from_dtype(np.dtype(dtype)), 1, "C")


@pytest.fixture(scope="module")
def old_report():
    from numba import types

    f32 = _arr("float32")
    kernels = [("old_sgd", _old_sgd, (f32, f32, types.float32), True),
               ("old_adam", _old_adam, (f32,) * 4 + (types.float32,) * 4, True),
               ("old_cast", _old_cast, (_arr("int32"), _arr("float16")), False)]
    return compiled.build_report(kernels=kernels)


def test_checker_flags_the_old_kernels(old_report):
    found = compiled.problems(old_report)
    for arch in ("sm_80", "sm_90"):
        assert any(p.startswith(f"old_sgd on {arch}: PTX a compiler may fuse") for p in found), found
        assert any(p.startswith(f"old_sgd on {arch}: FMA in the SASS") for p in found), found
        assert any(p.startswith(f"old_adam on {arch}: PTX") and "fma.rn.f32" in p
                   for p in found), found
        assert any(p.startswith(f"old_cast on {arch}: float -> integer rounds to nearest")
                   for p in found), found
