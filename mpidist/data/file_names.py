"""File names as input pipelines take them: glob patterns expanded the way
``tf.data.Dataset.list_files`` does, and file arguments checked before anything is read.

Nothing here knows about datasets; ``mpidist.data.dataset`` and the readers build on it.
"""

from __future__ import annotations

import glob
import os

import numpy as np

from mpidist.errors import InvalidArgumentError, NotFoundError

__all__ = ["match_patterns", "file_name", "file_list", "require_file"]


def file_name(value: object, what: str) -> str:
    """One file name as a str: a str, bytes, os.PathLike or NumPy string scalar."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bytes, np.bytes_)):
        return os.fsdecode(bytes(value))
    if isinstance(value, (str, np.str_)):
        return str(value)
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)  # a str, whether its __fspath__ gives str or bytes
    raise TypeError(f"{what} must be a file name (a str, bytes or os.PathLike), got "
                    f"{type(value).__name__} {value!r:.80}.")


def file_list(value: object, what: str) -> tuple[str, ...]:
    """One file name or a list / tuple / 1-D array of them, as a tuple of str (at least one)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    names = [value] if not isinstance(value, (list, tuple)) else list(value)
    if not names:
        raise InvalidArgumentError(f"{what} is empty: give at least one file name.")
    return tuple(file_name(v, what) for v in names)


def match_patterns(file_pattern: object) -> list[str]:
    """The files matching ``file_pattern`` (a glob pattern or a list of them), sorted, each once.

    As in TensorFlow, a pattern that matches nothing is an error naming it (rather than an
    empty dataset that would train on nothing): every pattern given must match a file.
    """
    patterns = file_list(file_pattern, "list_files: file_pattern")
    found: set[str] = set()
    for pattern in patterns:
        matches = [m for m in glob.glob(os.path.expanduser(pattern)) if not os.path.isdir(m)]
        if not matches:
            raise InvalidArgumentError(
                f"No files matched pattern: {pattern} (list_files' file_pattern; working directory "
                f"{os.getcwd()}). Check the path, or use an absolute one.")
        found.update(matches)
    return sorted(found)


def require_file(path: str, reader: str) -> str:
    """``path`` if it is a readable regular file, else TF's NotFoundError naming it."""
    if not os.path.exists(path):
        raise NotFoundError(f"{reader}: {path}: No such file or directory.")
    if os.path.isdir(path):
        raise InvalidArgumentError(f"{reader}: {path} is a directory, not a file.")
    return path
