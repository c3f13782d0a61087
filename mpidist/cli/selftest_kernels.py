"""The selftest's adapter to the bitwise kernel checks (the CUDA twins of mpidist.kernels
against their NumPy twins): ``run_kernel_checks()`` returns ``{check: {"ok", "detail",
"max_ulp"}}``.

The checks are ``mpidist.kernels.bitwise_checks.run_checks()``. Where an mpidist without it is
run, the older home of the checks is used: tests/unit/cudasim_checks.py of the checkout (its
``CHECKS`` table, each check called here). On a GPU the checks run on the device; with
``NUMBA_ENABLE_CUDASIM=1`` (the CPU stand-in) in Numba's simulator.
"""

import importlib
import sys
import traceback
from pathlib import Path
from typing import Any

import mpidist

from mpidist.cli.selftest_skip import SkipStep

__all__ = ["run_kernel_checks", "checks_module"]


def checks_module() -> Any:
    """The module holding the checks (see the module); SkipStep where there is none."""
    try:
        return importlib.import_module("mpidist.kernels.bitwise_checks")
    except ImportError:
        pass
    root = Path(mpidist.__file__).resolve().parents[1]
    folder = root / "tests" / "unit"
    if not (folder / "cudasim_checks.py").is_file():
        raise SkipStep(f"this mpidist has no mpidist.kernels.bitwise_checks and no checkout "
                       f"beside {root} with tests/unit/cudasim_checks.py")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module("cudasim_checks")


def _normalized(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(name): {"ok": bool(r.get("ok")), "detail": str(r.get("detail", "")),
                        "max_ulp": r.get("max_ulp")} for name, r in report.items()}


def run_kernel_checks() -> dict[str, dict[str, Any]]:
    """Every check's result (see the module)."""
    module = checks_module()
    runner = getattr(module, "run_checks", None)
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
