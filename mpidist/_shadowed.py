"""The error for a source checkout's ``mpidist/`` folder imported in place of the installed
package: the checkout's ``kernels/`` becomes ``mpidist.kernels`` only when it is installed, so
without this the first import of a kernel fails with ``No module named 'mpidist.kernels'``,
which names neither the cause nor the fix."""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, distribution

__all__ = ["shadowed_checkout_error"]


def _installed_elsewhere(found: str) -> str | None:
    """Where pip installed mpidist, if that is not ``found``."""
    try:
        location = str(distribution("mpidist").locate_file("mpidist"))
    except PackageNotFoundError:
        return None
    return None if os.path.realpath(location) == os.path.realpath(found) else location


def shadowed_checkout_error(init_file: str) -> ImportError:
    """An ImportError naming the interpreter, the mpidist it found, and the fix."""
    found = os.path.dirname(os.path.abspath(init_file))
    checkout = os.path.dirname(found)
    installed = _installed_elsewhere(found)
    also = f"; the installed mpidist is at {installed}" if installed else \
        "; no installed mpidist was found for this interpreter"
    return ImportError(
        f"{sys.executable} imported mpidist from {found}, a source checkout (its sys.path "
        f"entry comes before the installed package{also}). A checkout's kernels/ folder becomes "
        f"mpidist.kernels only when installed, so this copy cannot run. Run from outside "
        f"{checkout} (or without it on PYTHONPATH), or install the checkout: "
        f"{sys.executable} -m pip install -e {checkout}")
