"""Every unit test starts and ends with no globally set strategy and no scope entered."""

from strategy_isolation import _no_global_strategy  # noqa: F401  (autouse for every unit test)
