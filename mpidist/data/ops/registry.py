"""Builders of the transformations of ``mpidist.data.ops``, by method name.

``mpidist.data.base`` (the ``Dataset`` class) looks a builder up here instead of importing the
module that defines it (that module imports ``base`` for the ``Dataset`` base class; importing
it back would be a cycle). ``mpidist.data`` imports every op module, which registers its builders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpidist.data.dataset import Dataset

__all__ = ["register", "operation"]

_BUILDERS: dict[str, Callable[..., Dataset]] = {}


def register(name: str, builder: Callable[..., Dataset]) -> None:
    """Make ``builder(*args)`` the node ``Dataset.<name>`` builds."""
    _BUILDERS[name] = builder


def operation(name: str) -> Callable[..., Dataset]:
    """The builder registered under ``name``; a RuntimeError names the module to import when
    none is (``mpidist.data.base`` imported by itself, never through ``mpidist.data``)."""
    try:
        return _BUILDERS[name]
    except KeyError:
        raise RuntimeError(
            f"Dataset.{name} is not available: its module in mpidist.data.ops was not imported. "
            "Import mpidist.data (which imports every operation) first.") from None
