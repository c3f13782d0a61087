"""Element specs of a saved dataset as JSON (``spec_to_json`` / ``spec_from_json``), and the
checks of a spec against what a saved dataset holds: the part of ``mpidist.data.saved_format``
about element specs. Nothing is pickled and reading imports nothing: a namedtuple is found by
its class path among the modules already imported, else rebuilt as a namedtuple of the same
name and fields."""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from mpidist.core import nest
from mpidist.data.spec import TensorSpec
from mpidist.errors import InvalidArgumentError

__all__ = ["DTYPE_KINDS", "spec_to_json", "spec_from_json", "leaf_fits", "check_load_spec"]

DTYPE_KINDS = "biufcUSmM"  # numbers, bools, strings, times; no objects (no pickles)


# -- element specs as JSON ------------------------------------------------------------------

def _dtype_json(dtype: np.dtype, where: str) -> str:
    if dtype.kind not in DTYPE_KINDS or dtype.fields is not None:
        raise InvalidArgumentError(
            f"Dataset.save: {where} has dtype {dtype}, which a saved dataset cannot hold "
            "(numbers, bools, str/bytes strings and datetimes only; no Python objects). "
            "Convert it, e.g. with Dataset.map, before saving.")
    return str(dtype.str)


def _key_json(key: Any, where: str) -> list[Any]:
    if isinstance(key, str):
        return ["str", key]
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return ["int", int(key)]
    raise InvalidArgumentError(
        f"Dataset.save: {where} has the mapping key {key!r} of type {type(key).__name__}; "
        "a saved dataset's mapping keys must be str or int.")


def spec_to_json(spec: Any, where: str = "the element spec") -> Any:
    """The JSON-able description of an element spec: nests of tuples, lists, namedtuples and
    mappings whose leaves are TensorSpecs."""
    if isinstance(spec, TensorSpec):
        out: dict[str, Any] = {
            "kind": "tensor",
            "shape": None if spec.shape is None else list(spec.shape),
            "dtype": _dtype_json(spec.dtype, where),
        }
        if spec.name is not None:
            out["name"] = str(spec.name)
        return out
    if isinstance(spec, Mapping):
        # insertion order, so the loaded dict lists its keys as the saved one did
        return {"kind": "dict", "items": [
            [_key_json(k, where), spec_to_json(v, f"{where}[{k!r}]")] for k, v in spec.items()]}
    if nest.is_namedtuple(spec):
        cls = type(spec)
        return {"kind": "namedtuple", "class": f"{cls.__module__}:{cls.__qualname__}",
                "fields": list(cls._fields),
                "items": [spec_to_json(v, f"{where}.{f}") for f, v in zip(cls._fields, spec)]}
    if isinstance(spec, (tuple, list)):
        return {"kind": "tuple" if isinstance(spec, tuple) else "list",
                "items": [spec_to_json(v, f"{where}[{i}]") for i, v in enumerate(spec)]}
    raise InvalidArgumentError(
        f"Dataset.save: {where} is {type(spec).__name__} {spec!r:.80}; an element spec is a "
        "TensorSpec or a tuple, list, namedtuple or dict of them.")


def _namedtuple_class(path: str, fields: list[str]) -> Any:
    """The class at ``module:qualname`` if its module is already imported and it has these
    fields; else a namedtuple of the same name and fields (loading imports nothing)."""
    module_name, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, tuple) and list(
            getattr(obj, "_fields", ())) == fields:
        return obj
    name = qualname.rpartition(".")[2]
    return collections.namedtuple(name if name.isidentifier() else "SavedNamedTuple", fields)


def spec_from_json(data: Any) -> Any:
    """The element spec ``spec_to_json`` described; ValueError/KeyError/TypeError if malformed."""
    kind = data["kind"]
    if kind == "tensor":
        shape = data["shape"]
        if shape is not None and not all(d is None or (type(d) is int and d >= 0) for d in shape):
            raise ValueError(f"bad shape {shape!r}")
        dtype = np.dtype(data["dtype"])
        if dtype.kind not in DTYPE_KINDS:
            raise ValueError(f"bad dtype {data['dtype']!r}")
        return TensorSpec(shape, dtype, data.get("name"))
    items = data["items"]
    if kind == "dict":
        return {(str(k[1]) if k[0] == "str" else int(k[1])): spec_from_json(v) for k, v in items}
    if kind == "namedtuple":
        cls = _namedtuple_class(str(data["class"]), [str(f) for f in data["fields"]])
        return cls._make(spec_from_json(v) for v in items)
    if kind == "tuple":
        return tuple(spec_from_json(v) for v in items)
    if kind == "list":
        return [spec_from_json(v) for v in items]
    raise ValueError(f"unknown kind {kind!r}")


def leaf_fits(spec: TensorSpec, dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    """Whether one row of dtype/shape fits ``spec`` (strings of any length alike)."""
    if dtype != spec.dtype and not (dtype.kind == spec.dtype.kind and dtype.kind in "US"):
        return False
    if spec.shape is None:
        return True
    return len(shape) == len(spec.shape) and all(
        d is None or d == e for d, e in zip(spec.shape, shape))


def check_load_spec(given: Any, saved: Any, path: str) -> Any:
    """``Dataset.load``'s element_spec: the saved spec when ``given`` is None, else ``given``
    if it describes the saved elements (same structure; dtypes equal, strings of any length
    alike; each dimension equal or unknown in either), else InvalidArgumentError."""
    if given is None:
        return saved
    problem = None
    try:
        nest.assert_same_structure(given, saved)
    except (ValueError, TypeError) as e:
        problem = f"its structure differs: {e}"
    else:
        for g, s in zip(nest.flatten(given), nest.flatten(saved)):
            if not isinstance(g, TensorSpec):
                problem = f"its leaf {g!r:.60} is not a TensorSpec"
                break
            same_dtype = g.dtype == s.dtype or (g.dtype.kind == s.dtype.kind
                                                and g.dtype.kind in "US")
            shapes_fit = g.shape is None or s.shape is None or (
                len(g.shape) == len(s.shape)
                and all(a is None or b is None or a == b for a, b in zip(g.shape, s.shape)))
            if not (same_dtype and shapes_fit):
                problem = f"{g} does not describe the saved {s}"
                break
    if problem is None:
        return given
    raise InvalidArgumentError(
        f"Dataset.load: element_spec={given!r:.200} does not match the dataset saved at {path}, "
        f"whose element spec is {saved!r:.200}: {problem}. Pass element_spec=None to use the "
        "saved spec.")
