"""Exceptions raised by mpidist.

Where TensorFlow raises a Python builtin, mpidist raises the same builtin. Where TensorFlow raises
one of its own error types, mpidist has a class of the same name that subclasses the closest
builtin, so ``except ValueError`` and ``except mpidist.errors.InvalidArgumentError`` both work.
"""

__all__ = [
    "MpidistError",
    "InvalidArgumentError",
    "OutOfRangeError",
    "DeadlineExceededError",
    "UnavailableError",
    "CancelledError",
    "AbortedError",
    "NotFoundError",
    "DataLossError",
]


class MpidistError(Exception):
    """Base class of every error type defined by mpidist."""


class InvalidArgumentError(MpidistError, ValueError):
    """An argument has an unusable value, e.g. arrays whose shapes cannot be combined."""


class OutOfRangeError(MpidistError, IndexError):
    """An iterator or dataset has no more elements."""


class DeadlineExceededError(MpidistError, TimeoutError):
    """A collective operation did not complete within its timeout."""


class UnavailableError(MpidistError, ConnectionError):
    """A peer (rank, device or service) cannot be reached."""


class CancelledError(MpidistError, RuntimeError):
    """An operation was cancelled, usually because another rank or replica failed."""


class AbortedError(MpidistError, RuntimeError):
    """An operation was aborted by the runtime, e.g. a closure on a worker that failed (the
    coordinator runs it again elsewhere)."""


class NotFoundError(MpidistError, FileNotFoundError):
    """A file or other named entity does not exist, e.g. a file an input pipeline was told to
    read."""


class DataLossError(MpidistError, OSError):
    """A file holds less or other data than its header promises: truncated or corrupted."""
