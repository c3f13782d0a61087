"""The distribution context: which strategy is current, and whether we are in replica or
cross-replica context.

The state is a stack of Modes per thread (replica threads get their own), above an optional
process-wide mode set by ``experimental_set_strategy``, above the default mode. The objects
stored here (strategies, replica contexts) are opaque to this layer.
"""

import dataclasses
import threading

__all__ = ["Mode", "current_mode", "push_mode", "pop_mode", "set_global_mode", "current_device",
           "device_scope", "colocation", "colocation_scope"]


@dataclasses.dataclass(frozen=True)
class Mode:
    """One entry of the context stack.

    Exactly one of ``cross_replica`` (the strategy's ``extended``) and ``replica_context`` is set.
    ``is_default`` marks the default strategy's replica mode (no ``with scope()`` active).
    """

    strategy: object
    cross_replica: object = None
    replica_context: object = None
    is_default: bool = False


class _ThreadState(threading.local):
    def __init__(self):
        self.stack = []
        self.device = None
        self.colocation = None


_local = _ThreadState()
_global_mode = None
_default_mode_factory = None


def register_default_mode(factory):
    """Install the callable giving the default Mode (done once by the strategies layer)."""
    global _default_mode_factory
    _default_mode_factory = factory


def default_mode():
    if _default_mode_factory is None:
        return Mode(strategy=None, is_default=True)
    return _default_mode_factory()


def current_mode():
    """The innermost Mode of the calling thread."""
    if _local.stack:
        return _local.stack[-1]
    if _global_mode is not None:
        return _global_mode
    return default_mode()


def push_mode(mode):
    _local.stack.append(mode)


def pop_mode(expected=None):
    """Pop the calling thread's innermost Mode, checking it is ``expected`` when given."""
    if not _local.stack:
        raise RuntimeError("Exiting a distribution scope that was never entered on this thread.")
    if expected is not None and _local.stack[-1] is not expected:
        raise RuntimeError(
            "Distribution scopes were exited out of order: exit the innermost `with` first."
        )
    return _local.stack.pop()


def thread_stack_depth():
    return len(_local.stack)


def global_mode():
    return _global_mode


def set_global_mode(mode):
    """Install (or with None, remove) the process-wide Mode below every thread's own stack."""
    global _global_mode
    _global_mode = mode


def current_device():
    """The device (a DeviceSpec) the calling thread places new values on, or None (host)."""
    return _local.device


class device_scope:
    """Context manager that makes ``device`` the calling thread's current device."""

    def __init__(self, device):
        self._device = device
        self._saved = None

    def __enter__(self):
        self._saved = _local.device
        _local.device = self._device
        return self._device

    def __exit__(self, *exc):
        _local.device = self._saved
        return False


def colocation():
    """The variable that new variables must be colocated with, or None."""
    return _local.colocation


class colocation_scope:
    """Context manager under which new variables take the devices of ``variable``."""

    def __init__(self, variable):
        self._variable = variable
        self._saved = None

    def __enter__(self):
        self._saved = _local.colocation
        _local.colocation = self._variable
        return self

    def __exit__(self, *exc):
        _local.colocation = self._saved
        return False
