"""Which public call of the user's is running: the label that collectives carry.

A user never calls ``all_gather(dtype=uint8)``; they call ``Checkpoint.save``. Public calls
that issue collectives wrap their work in ``with user_call("Checkpoint.save", **fields):`` and
every collective issued inside is labelled with the chain of such calls. The labels make the
cross-rank fingerprint and its mismatch message speak the user's language, and the keyword
fields (the user's reduce op, axis, ...) join the fingerprint, so ranks that disagree on them
get an error instead of answers that differ from rank to rank.

The chain is per thread; replica threads adopt their caller's chain (``adopt``).
"""

import functools
import threading
from collections.abc import Callable, Hashable
from types import TracebackType
from typing import Literal, ParamSpec, TypeAlias, TypeVar

__all__ = ["user_call", "labelled", "current_calls", "current_label", "adopt", "describe_calls",
           "Call", "Calls"]

Call: TypeAlias = tuple[str, tuple[tuple[str, Hashable], ...]]
"""One public call: its name and its keyword fields, ``(name, ((field, value), ...))``."""

Calls: TypeAlias = tuple[Call, ...]
"""A chain of public calls, outermost first."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _Chain(threading.local):
    def __init__(self) -> None:
        self.calls: Calls = ()


_chain = _Chain()


class user_call:  # noqa: N801 - used as a context manager, reads like ``with``-able function
    """``with user_call(name, **fields):`` labels the collectives issued inside.

    ``fields`` must be small hashable values (strings, numbers, None, tuples of them): they are
    compared across ranks.
    """

    __slots__ = ("_entry", "_outer")

    def __init__(self, name: str, **fields: Hashable) -> None:
        self._entry: Call = (name, tuple(fields.items()))

    def __enter__(self) -> "user_call":
        self._outer = _chain.calls
        _chain.calls = self._outer + (self._entry,)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        _chain.calls = self._outer
        return False


def labelled(name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator: the whole function runs under ``user_call(name)``."""
    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with user_call(name):
                return fn(*args, **kwargs)
        return wrapper
    return decorate


def current_calls() -> Calls:
    """The calling thread's chain: a tuple of ``(name, ((field, value), ...))``, outermost first."""
    return _chain.calls


def current_label() -> str:
    """``"fit > Optimizer.apply_gradients"``: the chain's names, or "" outside any public call."""
    return describe_calls(_chain.calls, with_fields=False)


def describe_calls(calls: Calls, with_fields: bool = True) -> str:
    """A chain as text, e.g. ``Strategy.reduce(reduce_op=SUM, axis=None)``."""
    parts = []
    for name, fields in calls:
        if with_fields and fields:
            name = f"{name}({', '.join(f'{k}={v}' for k, v in fields)})"
        parts.append(name)
    return " > ".join(parts)


class adopt:  # noqa: N801
    """``with adopt(chain):`` runs a replica thread's work under its caller's chain."""

    __slots__ = ("_calls", "_outer")

    def __init__(self, calls: Calls) -> None:
        self._calls = calls

    def __enter__(self) -> "adopt":
        self._outer = _chain.calls
        _chain.calls = self._calls
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        _chain.calls = self._outer
        return False
