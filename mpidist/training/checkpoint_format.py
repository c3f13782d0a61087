"""The checkpoint file format: a zip of ``.npy`` members that loads without unpickling, written
atomically, and the directory's JSON state file (latest and kept checkpoints).

Files are published through mpidist.core.durable (write, fsync, one atomic rename).

A checkpoint file holds ``manifest.npy`` (UTF-8 JSON: format name and version, save counter,
and per key the member, dtype, shape and SHA-256 of the bytes) and one ``t<i>.npy`` per value.
Reading checks every member's header and size against the manifest, accepts only bool /
integer / float / complex dtypes and verifies every checksum before returning anything.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from mpidist.core.durable import write_file
from mpidist.errors import InvalidArgumentError

__all__ = ["FORMAT_VERSION", "STATE_FILENAME", "State", "latest_checkpoint", "path_argument",
           "read_checkpoint_file", "read_state", "write_checkpoint_file", "write_state"]

FORMAT_NAME = "mpidist-checkpoint"
FORMAT_VERSION = 1
STATE_FILENAME = "checkpoint"
STATE_FORMAT = "mpidist-checkpoint-state"

_MANIFEST_MEMBER = "manifest.npy"
_MEMBER_NAME = re.compile(r"t[0-9]+\.npy")
_DTYPE_STR = re.compile(r"[<>|=][biufc][0-9]{1,2}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def path_argument(value: object, name: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a path (a str or os.PathLike), got {value!r} of type "
            f"{type(value).__name__}; pass e.g. '/tmp/training/ckpt'."
        )
    if not value:
        raise ValueError(f"{name} must not be empty; pass a path such as '/tmp/training/ckpt'.")
    return value


def _digest(arr: np.ndarray[Any, Any]) -> str:
    # numpy's stubs declare the buffer protocol for Python >= 3.12 only (mypy checks 3.11)
    return hashlib.sha256(arr.reshape(-1).view(np.uint8)).hexdigest()  # type: ignore[arg-type]


def _write_member(zf: zipfile.ZipFile, name: str, arr: np.ndarray[Any, Any]) -> None:
    with zf.open(name, "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, arr, allow_pickle=False)


def write_checkpoint_file(path: str, entries: Sequence[tuple[str, np.ndarray[Any, Any]]],
                          save_counter: int) -> None:
    """``entries``: ``[(key, contiguous host array)]``."""
    manifest: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
                "save_counter": int(save_counter), "entries": []}
    for i, (key, arr) in enumerate(entries):
        manifest["entries"].append({"key": key, "member": f"t{i}.npy", "dtype": arr.dtype.str,
                                    "shape": list(arr.shape), "sha256": _digest(arr)})
    manifest_bytes = np.frombuffer(json.dumps(manifest).encode("utf-8"), dtype=np.uint8)

    def write(f: Any) -> None:  # a StagedFile: zipfile needs only its file methods
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            _write_member(zf, _MANIFEST_MEMBER, manifest_bytes)
            for entry, (_, arr) in zip(manifest["entries"], entries):
                _write_member(zf, entry["member"], arr)

    write_file(path, write, f"Saving checkpoint {path!r}")


class _Corrupt(Exception):
    """What is wrong inside a checkpoint file (turned into InvalidArgumentError)."""


def _readinto(fh: Any, arr: np.ndarray[Any, Any]) -> None:  # fh: a zipfile.ZipExtFile
    view = memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # as in _digest
    pos = 0
    while pos < len(view):
        n = fh.readinto(view[pos:])
        if not n:
            raise _Corrupt(f"its data ends after {pos} of {len(view)} bytes")
        pos += n


def _read_member(zf: zipfile.ZipFile, name: str, dtype: np.dtype[Any],
                 shape: tuple[int, ...] | None = None) -> np.ndarray[Any, Any]:
    """The array of ``.npy`` member ``name``; its header must say ``dtype`` (and ``shape``)."""
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise _Corrupt(f"member {name!r} is missing") from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise _Corrupt(f"member {name!r} is compressed (method {info.compress_type})")
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            header_shape, fortran, header_dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            header_shape, fortran, header_dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise _Corrupt(f"member {name!r} has .npy format version {version}")
        if header_dtype != dtype or fortran or (shape is not None and tuple(header_shape) != shape):
            raise _Corrupt(
                f"member {name!r} holds dtype {header_dtype} shape {tuple(header_shape)}"
                f"{' (Fortran order)' if fortran else ''} where the manifest says dtype {dtype}"
                f"{'' if shape is None else f' shape {shape}'}"
            )
        nbytes = int(np.prod(header_shape, dtype=np.int64)) * dtype.itemsize
        if info.file_size != fh.tell() + nbytes:
            raise _Corrupt(f"member {name!r} has {info.file_size - fh.tell()} data bytes, "
                           f"expected {nbytes}")
        arr = np.empty(tuple(header_shape), dtype=dtype)
        _readinto(fh, arr)
        if fh.read(1):
            raise _Corrupt(f"member {name!r} is longer than its header says")
    return arr


def _parse_manifest(raw: np.ndarray[Any, Any]) -> dict[str, Any]:
    try:
        manifest = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Corrupt(f"its manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise _Corrupt("its manifest does not describe an mpidist checkpoint")
    return manifest


def _check_version(path: str, manifest: dict[str, Any]) -> None:
    version = manifest.get("version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) \
            and version > FORMAT_VERSION
        raise InvalidArgumentError(
            f"Checkpoint file {path!r} has format version {version!r}, but this mpidist reads "
            f"version {FORMAT_VERSION} only: "
            + ("it was written by a newer mpidist; upgrade mpidist to restore it."
               if newer else "the file is corrupt; restore an earlier checkpoint.")
        )


def _entries(manifest: dict[str, Any]
             ) -> list[tuple[str, str, np.dtype[Any], tuple[int, ...], str]]:
    """``[(key, member, dtype, shape, sha256)]`` from the manifest, each field checked."""
    checked: list[tuple[str, str, np.dtype[Any], tuple[int, ...], str]] = []
    keys: set[str] = set()
    members: set[str] = set()
    for entry in manifest["entries"]:
        key, member, dtype, sha = entry["key"], entry["member"], entry["dtype"], entry["sha256"]
        shape = tuple(entry["shape"])
        if not isinstance(key, str) or key in keys or member in members \
                or not _MEMBER_NAME.fullmatch(member) or not _SHA256.fullmatch(sha) \
                or not all(type(d) is int and d >= 0 for d in shape):
            raise _Corrupt(f"its manifest entry for key {key!r} is malformed")
        if not _DTYPE_STR.fullmatch(dtype):
            raise _Corrupt(f"key {key!r} has dtype {dtype!r}: only bool, integer, float and "
                           "complex arrays are accepted")
        keys.add(key)
        members.add(member)
        checked.append((key, member, np.dtype(dtype), shape, sha))
    return checked


def _nearby(path: str) -> str:
    """What the directory of a missing ``path`` holds that the user may have meant."""
    directory = os.path.dirname(path) or os.curdir
    if not os.path.isdir(directory):
        return f" The directory {directory!r} does not exist."
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n != STATE_FILENAME and not n.startswith(".")
                       and os.path.isfile(os.path.join(directory, n)))
    except OSError:
        return ""
    base = os.path.basename(path)
    numbered = [n for n in names if n.startswith(base + "-")]
    close = numbered or difflib.get_close_matches(base, names, n=5)
    if not close:
        return ""
    hint = (f" save({base!r}) writes {base!r} + '-<n>'." if numbered else "")
    return f" Files in {directory!r} with similar names: {', '.join(map(repr, close[:5]))}.{hint}"


def read_checkpoint_file(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    """``(manifest, {key: array})`` of the checkpoint at ``path``, every checksum verified."""
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"Checkpoint path {path!r} is a directory; pass a checkpoint's path, e.g. "
            "mpidist.train.latest_checkpoint(directory)."
        )
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the `with` below
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(
            f"No checkpoint file at {path!r}; pass a path returned by save() / write(), or "
            f"mpidist.train.latest_checkpoint(directory).{_nearby(path)}"
        ) from None
    try:
        with f, zipfile.ZipFile(f) as zf:
            manifest = _parse_manifest(_read_member(zf, _MANIFEST_MEMBER, np.dtype(np.uint8)))
            _check_version(path, manifest)
            arrays: dict[str, np.ndarray[Any, Any]] = {}
            for key, member, dtype, shape, sha in _entries(manifest):
                arr = _read_member(zf, member, dtype, shape)
                if _digest(arr) != sha:
                    raise _Corrupt(f"the bytes of key {key!r} do not match their checksum")
                arrays[key] = arr
    except InvalidArgumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to parse the bytes: a damaged file
        detail = str(exc) if isinstance(exc, _Corrupt) else f"{type(exc).__name__}: {exc}"
        raise InvalidArgumentError(
            f"Checkpoint file {path!r} is truncated or corrupt: {detail}. Nothing was restored; "
            "restore an earlier checkpoint (CheckpointManager.checkpoints lists the kept ones)."
        ) from None
    return manifest, arrays


# -- The state file (TF's "checkpoint" file) ----------------------------------------------------
def _state_path(directory: str) -> str:
    return os.path.join(directory, STATE_FILENAME)


def _relative(directory: str, path: str) -> str:
    if os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory):
        return os.path.basename(path)
    return os.path.abspath(path)


def write_state(directory: str, latest: str | None, paths: Iterable[str],
                timestamps: Iterable[float]) -> None:
    doc = {"format": STATE_FORMAT, "version": 1,
           "latest_checkpoint": None if latest is None else _relative(directory, latest),
           "all_checkpoints": [_relative(directory, p) for p in paths],
           "all_checkpoint_timestamps": [float(t) for t in timestamps]}
    data = (json.dumps(doc, indent=1) + "\n").encode("utf-8")
    write_file(_state_path(directory), lambda f: f.write(data),
               f"Recording the checkpoint state of {directory!r}")


class State(NamedTuple):
    """A state file's contents, its paths joined onto the directory."""

    latest: str | None
    paths: list[str]
    timestamps: list[float]


def read_state(directory: str) -> State | None:
    """The directory's state (paths joined onto ``directory``), or None without a state file."""
    path = _state_path(directory)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
        if doc["format"] != STATE_FORMAT:
            raise ValueError("it is not an mpidist checkpoint state file")
        latest, names = doc["latest_checkpoint"], list(doc["all_checkpoints"])
        stamps = [float(t) for t in doc.get("all_checkpoint_timestamps", [])]
        if not all(isinstance(n, str) for n in names + [latest or ""]):
            raise ValueError("a checkpoint name is not a string")
    except (ValueError, TypeError, KeyError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise InvalidArgumentError(
            f"The checkpoint state file {path!r} is corrupt ({type(exc).__name__}: {exc}). The "
            "checkpoint files are not affected: delete the state file and restore a checkpoint "
            "by its path."
        ) from None
    if len(stamps) != len(names):
        stamps = [0.0] * len(names)
    return State(None if latest is None else os.path.join(directory, latest),
                  [os.path.join(directory, n) for n in names], stamps)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The path of the newest checkpoint recorded in ``checkpoint_dir``'s state file, or None
    when there is none (no directory, no state file, or none of its files is there).

    Where the state's latest file is gone but an older one it lists is there, that one is
    returned, with a RuntimeWarning (TensorFlow returns None: the run would start afresh)."""
    checkpoint_dir = path_argument(checkpoint_dir, "checkpoint_dir")
    found = read_state(checkpoint_dir)
    if found is None or found.latest is None:
        return None
    if os.path.isfile(found.latest):
        return found.latest
    for path in reversed(found.paths):
        if os.path.isfile(path):
            warnings.warn(
                f"latest_checkpoint: the state in {checkpoint_dir!r} names {found.latest!r}, "
                f"which is gone; returning {path!r}, the newest of the others it lists.",
                RuntimeWarning, stacklevel=2)
            return path
    return None
