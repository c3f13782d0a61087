"""The distribution context: which strategy is current, and whether we are in replica or
cross-replica context.

The state is a stack of Modes per thread (replica threads get their own), above an optional
process-wide mode set by ``experimental_set_strategy``, above the default mode. The objects
stored here (strategies, replica contexts) are opaque to this layer.
"""

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, Literal

from mpidist.core.devices import DeviceSpec

__all__ = ["Mode", "current_mode", "push_mode", "pop_mode", "set_global_mode", "current_device",
           "device_scope", "colocation", "colocation_scope"]


@dataclasses.dataclass(frozen=True)
class Mode:
    """One entry of the context stack.

    Exactly one of ``cross_replica`` (the strategy's ``extended``) and ``replica_context`` is set.
    ``is_default`` marks the default strategy's replica mode (no ``with scope()`` active).
    The three objects belong to the strategies layer (a Strategy, its StrategyExtended, a
    ReplicaContext), hence ``Any`` here.
    """

    strategy: Any
    cross_replica: Any = None
    replica_context: Any = None
    is_default: bool = False


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[Mode] = []
        self.device: DeviceSpec | None = None
        self.colocation: Any = None  # a variable of the values layer


_local = _ThreadState()
_global_mode: Mode | None = None
_default_mode_factory: Callable[[], Mode] | None = None
# Called with the strategy each time a strategy's scope is entered: how a higher layer (the
# Keras integration) hooks in without this layer or the strategies importing it.
_scope_entry_hooks: list[Callable[[Any], None]] = []


def register_default_mode(factory: Callable[[], Mode]) -> None:
    """Install the callable giving the default Mode (done once by the strategies layer)."""
    global _default_mode_factory
    _default_mode_factory = factory


def add_scope_entry_hook(hook: Callable[[Any], None]) -> None:
    """Call ``hook(strategy)`` whenever a strategy's scope is entered (once per hook)."""
    if hook not in _scope_entry_hooks:
        _scope_entry_hooks.append(hook)


def scope_entered(strategy: Any) -> None:
    """Run the scope-entry hooks (the strategies layer calls this)."""
    for hook in _scope_entry_hooks:
        hook(strategy)


def default_mode() -> Mode:
    if _default_mode_factory is None:
        return Mode(strategy=None, is_default=True)
    return _default_mode_factory()


def current_mode() -> Mode:
    """The innermost Mode of the calling thread."""
    if _local.stack:
        return _local.stack[-1]
    if _global_mode is not None:
        return _global_mode
    return default_mode()


def push_mode(mode: Mode) -> None:
    _local.stack.append(mode)


def pop_mode(expected: Mode | None = None) -> Mode:
    """Pop the calling thread's innermost Mode, checking it is ``expected`` when given."""
    if not _local.stack:
        raise RuntimeError("Exiting a distribution scope that was never entered on this thread.")
    if expected is not None and _local.stack[-1] is not expected:
        raise RuntimeError(
            "Distribution scopes were exited out of order: exit the innermost `with` first."
        )
    return _local.stack.pop()


def thread_stack_depth() -> int:
    return len(_local.stack)


def global_mode() -> Mode | None:
    return _global_mode


def set_global_mode(mode: Mode | None) -> None:
    """Install (or with None, remove) the process-wide Mode below every thread's own stack."""
    global _global_mode
    _global_mode = mode


def current_device() -> DeviceSpec | None:
    """The device (a DeviceSpec) the calling thread places new values on, or None (host)."""
    return _local.device


class device_scope:  # noqa: N801 - used as a context manager, reads like a function
    """Context manager that makes ``device`` the calling thread's current device."""

    def __init__(self, device: DeviceSpec | None) -> None:
        self._device = device
        self._saved: DeviceSpec | None = None

    def __enter__(self) -> DeviceSpec | None:
        self._saved = _local.device
        _local.device = self._device
        return self._device

    def __exit__(self, *exc: object) -> Literal[False]:
        _local.device = self._saved
        return False


def colocation() -> Any:
    """The variable that new variables must be colocated with, or None."""
    return _local.colocation


class colocation_scope:  # noqa: N801 - used as a context manager, reads like a function
    """Context manager under which new variables take the devices of ``variable``."""

    def __init__(self, variable: Any) -> None:
        self._variable = variable
        self._saved: Any = None

    def __enter__(self) -> "colocation_scope":
        self._saved = _local.colocation
        _local.colocation = self._variable
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        _local.colocation = self._saved
        return False
