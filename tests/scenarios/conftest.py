"""The slow scenarios: multi-second end-to-end runs, subprocess launches, compile checks and
long generated sweeps, moved out of tests/unit so that the fast subset (``pytest tests/unit``)
stays fast. Plain ``pytest`` runs them (tests/conftest.py marks them ``scenario``).

They use the unit tests' helper modules (tests/unit on sys.path) and keep their rule: every
test starts and ends with no globally set strategy."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from strategy_isolation import _no_global_strategy  # noqa: F401  (autouse here too)
