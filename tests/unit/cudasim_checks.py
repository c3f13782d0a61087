"""The bitwise checks of the CUDA twins (``mpidist.kernels.bitwise_checks``) as a script:

    NUMBA_ENABLE_CUDASIM=1 python tests/unit/cudasim_checks.py    # Numba's CUDA simulator
    python tests/unit/cudasim_checks.py                            # a GPU (skips none: exit 2 without one)

tests/scenarios/test_kernels_cudasim.py runs it in a process of its own under the simulator (which must be
switched on before Numba is first imported), and test_kernels_gpu.py on a GPU. It prints one
line per check (with the max ulp difference of a failing one) and a last line
``CUDASIM-REPORT: {json}`` mapping every check name to ``{"ok", "detail", "max_ulp"}``.
"""

import sys

from mpidist.kernels.bitwise_checks import MARKER, check_names, main

__all__ = ["MARKER", "check_names", "main"]

if __name__ == "__main__":
    sys.exit(main())
