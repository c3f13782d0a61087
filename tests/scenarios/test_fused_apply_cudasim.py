"""The fused optimizer kernels' CUDA twins (mpidist.kernels.optimizers: SGD, SGD with momentum
and Nesterov, Adam and AMSGrad, float32 and float64) give the CPU twins' exact bits under
Numba's CUDA simulator. The simulator must be on before Numba is imported, so the check runs in
a Python process of its own: a scenario. The CPU twins against NumPy are
tests/unit/test_fused_apply.py."""

import os
import subprocess
import sys

_CUDASIM_SCRIPT = r"""
import numpy as np
from numba import cuda
from mpidist.kernels import optimizers as K
rng = np.random.default_rng(5)
for dtype in (np.float32, np.float64):
    t = np.dtype(dtype).type
    w, g, m = (rng.standard_normal(300).astype(dtype) for _ in range(3))
    v, vh = (np.abs(rng.standard_normal(300)).astype(dtype) for _ in range(2))
    for nesterov in (False, True):
        hw, hm = w.copy(), m.copy()
        K.sgd_momentum_update(hw, g, hm, t(0.01), t(0.9), nesterov)
        dw, dm = cuda.to_device(w), cuda.to_device(m)
        K.sgd_momentum_update(dw, cuda.to_device(g), dm, t(0.01), t(0.9), nesterov)
        assert np.array_equal(dw.copy_to_host(), hw) and np.array_equal(dm.copy_to_host(), hm)
    hw = w.copy(); K.sgd_update(hw, g, t(0.01))
    dw = cuda.to_device(w); K.sgd_update(dw, cuda.to_device(g), t(0.01))
    assert np.array_equal(dw.copy_to_host(), hw)
    for ams in (False, True):
        args = (t(0.003), t(0.1), t(0.001), t(1e-7))
        h = [a.copy() for a in (w, m, v, vh)]
        K.adam_update(h[0], g, h[1], h[2], h[3] if ams else None, *args)
        d = [cuda.to_device(a) for a in (w, m, v, vh)]
        K.adam_update(d[0], cuda.to_device(g), d[1], d[2], d[3] if ams else None, *args)
        for a, b in zip(d, h):
            assert np.array_equal(a.copy_to_host(), b), (dtype, ams)
print("CUDASIM-FUSED-OK")
"""


def test_cuda_twins_match_cpu_twins_under_the_simulator():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, "-c", _CUDASIM_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "CUDASIM-FUSED-OK" in proc.stdout
