"""The selftest's adapter to the bitwise kernel checks of tests/unit/cudasim_checks.py (the
CUDA twins of mpidist.kernels against their NumPy twins): ``run_kernel_checks()`` returns
``{check: {"ok", "detail", "max_ulp"}}``.

The checks live with the tests, so they run from a source checkout only. Where the module
offers a runner of its own (``HARDWARE_RUNNERS``, tried in order) it is used; otherwise each
registered check (its ``CHECKS`` table) is called here. On a GPU the checks run on the device;
with ``NUMBA_ENABLE_CUDASIM=1`` (the CPU stand-in) in Numba's simulator.
"""

import importlib
import sys
import traceback
from pathlib import Path
from typing import Any

import mpidist

from mpidist.cli.selftest_steps import SkipStep

__all__ = ["run_kernel_checks", "checks_module", "HARDWARE_RUNNERS"]

# Names under which tests/unit/cudasim_checks.py may offer a runner returning the report.
HARDWARE_RUNNERS = ("run_checks", "run_on_hardware", "run_all_checks", "run_all")


def checks_module() -> Any:
    """tests/unit/cudasim_checks.py of the checkout this mpidist comes from; SkipStep where
    mpidist is installed without its tests."""
    root = Path(mpidist.__file__).resolve().parents[1]
    folder = root / "tests" / "unit"
    if not (folder / "cudasim_checks.py").is_file():
        raise SkipStep(f"the kernel checks are tests/unit/cudasim_checks.py of a source checkout; "
                       f"none beside {root} (run from a checkout: tests/gpu/first_contact.sh)")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module("cudasim_checks")


def _normalized(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(name): {"ok": bool(r.get("ok")), "detail": str(r.get("detail", "")),
                        "max_ulp": r.get("max_ulp")} for name, r in report.items()}


def run_kernel_checks() -> dict[str, dict[str, Any]]:
    """Every check's result (see the module)."""
    module = checks_module()
    for name in HARDWARE_RUNNERS:
        runner = getattr(module, name, None)
        if callable(runner):
            return _normalized(runner())
    results: dict[str, dict[str, Any]] = {}
    for name, check in module.CHECKS.items():
        try:
            check()
        except Exception:  # noqa: BLE001 - every failure goes into the report
            results[name] = {"ok": False, "detail": traceback.format_exc(limit=6),
                             "max_ulp": None}
        else:
            results[name] = {"ok": True, "detail": "", "max_ulp": 0}
    return results
