"""``v[key]`` of a variable: the value of that part, which can be assigned to, as in TF.

TF's ``v[0].assign(1.0)`` and ``v[1:3].assign(x)`` write one part of a variable (TF's sliced
assignment); here ``assign_add`` and ``assign_sub`` do too. ``Variable.__getitem__`` returns the
part's value as a NumPy scalar or array of a subclass that carries these three methods, bound
to the variable and the key, and is the plain value everywhere else: it is an instance of the
plain type (``np.float64``, ``np.ndarray``), arithmetic and NumPy functions of it return plain
values, and it pickles as the plain value. A value on a GPU (CuPy) is returned plain.

An update of a part goes through the variable's own update, so every rule of the variable
holds (its dtype and shape checks, its aggregation and synchronization, every replica's copy,
an optimizer's arena, a parameter server): ``assign`` computes the whole new value with the
part replaced and calls ``variable.assign``; ``assign_add`` / ``assign_sub`` call the
variable's with a change that is zero outside the part (-0.0 for an add, so that every element
outside the part keeps its exact bits). Inside ``strategy.run`` an ``assign`` of a variable
whose replicas' updates are combined by SUM or MEAN is refused: the whole new values would be
combined, changing the elements outside the part too.
"""

from typing import Any

import numpy as np

from mpidist.backend import array_module
from mpidist.core import state
from mpidist.core.messages import short_repr
from mpidist.types import VariableAggregation, VariableSynchronization
from mpidist.values.assignment import checked_update

__all__ = ["sliced", "update_part", "SlicedArray"]

_COMBINED = (VariableAggregation.SUM, VariableAggregation.MEAN)


class _PartUpdates:
    """The updates of a part of a variable (a mixin of the sliced value classes). The link,
    ``(variable, key)``, is the instance attribute ``_part_of``; a value derived from a part
    (a view, copy or reshape of it) has none."""

    __slots__ = ()

    def assign(self, value: Any, use_locking: bool | None = None, name: str | None = None,
               read_value: bool = True) -> Any:
        """Write ``value`` (of this part's shape) into this part of the variable; returns the
        variable's new value when ``read_value``, as ``Variable.assign``."""
        variable, key = _link(self, "assign")
        return update_part(variable, key, "assign", value, read_value)

    def assign_add(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        """Add ``delta`` (of this part's shape) to this part of the variable."""
        variable, key = _link(self, "assign_add")
        return update_part(variable, key, "assign_add", delta, read_value)

    def assign_sub(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        """Subtract ``delta`` (of this part's shape) from this part of the variable."""
        variable, key = _link(self, "assign_sub")
        return update_part(variable, key, "assign_sub", delta, read_value)


def _link(part: Any, method: str) -> tuple[Any, Any]:
    link = getattr(part, "_part_of", None)
    if link is None:
        raise AttributeError(
            f"'{type(part).__name__}' object cannot {method}: it was computed from v[index] of "
            "a variable (a view, copy or reshape of it), and is no longer that part of the "
            f"variable. Update the variable itself: v[index].{method}(value).")
    return link  # type: ignore[no-any-return]


def _plain(x: Any) -> Any:
    return x.view(np.ndarray) if isinstance(x, SlicedArray) else x


def _plain_all(x: Any) -> Any:
    if isinstance(x, SlicedArray):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain_all(item) for item in x)
    if isinstance(x, dict):
        return {k: _plain_all(v) for k, v in x.items()}
    return x


# The NumPy type comes first among the bases: NumPy then takes an instance for its own type
# (np.asarray of a scalar subclass listed after a mixin gives an object array).
class SlicedArray(np.ndarray, _PartUpdates):
    """A part of a variable as a NumPy array: ``v[1:3]``. What NumPy computes from it
    (ufuncs, reductions, NumPy functions) is a plain ``np.ndarray``; it pickles as one (the
    link to the variable stays in this process)."""

    __slots__ = ("_part_of",)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(map(_plain, out))
        return getattr(ufunc, method)(*map(_plain, inputs), **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return func(*_plain_all(args), **_plain_all(kwargs))

    def __repr__(self) -> str:
        return repr(self.view(np.ndarray))

    def __reduce__(self) -> Any:
        return self.view(np.ndarray).__reduce__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.view(np.ndarray).__reduce_ex__(protocol)


def _scalar_repr(self: Any) -> str:
    return repr(np.asarray(self)[()])  # the plain scalar's: np.uint8(1), not Sliceduint8(1)


# The type of a value read from a variable -> the class of its parts: a NumPy scalar type's
# subclass with _PartUpdates (NumPy pickles its instances as the plain scalar); _ZERO_D for a
# scalar type whose instances NumPy does not let a subclass make (np.bool_ and datetime64 give
# their own, shared instances): such a part is a 0-d SlicedArray; None: returned plain.
_ZERO_D, _UNSEEN = object(), object()
_PART_CLASSES: dict[type, Any] = {np.ndarray: SlicedArray}


def _part_class(kind: type, value: Any) -> Any:
    cls: Any
    if not issubclass(kind, np.generic):
        cls = None
    else:
        try:
            cls = type(f"Sliced{kind.__name__}", (kind, _PartUpdates),
                       {"__module__": __name__, "__slots__": ("_part_of",),
                        "__repr__": _scalar_repr})
            if type(cls(value)) is not cls:
                cls = _ZERO_D
        except (TypeError, ValueError):
            cls = _ZERO_D
    _PART_CLASSES[kind] = cls
    return cls


def sliced(variable: Any, key: Any, value: Any) -> Any:
    """``value`` (``variable``'s value indexed by ``key``) as a part of ``variable`` that can be
    assigned to; a value that is neither a NumPy array nor a NumPy scalar (a CuPy array) is
    returned as it is."""
    kind = type(value)
    cls = _PART_CLASSES.get(kind, _UNSEEN)
    if cls is _UNSEEN:
        cls = _part_class(kind, value)
    if cls is None:
        return value
    if cls is SlicedArray:
        part = value.view(SlicedArray)
    elif cls is _ZERO_D:
        part = np.asarray(value).view(SlicedArray)
    else:
        part = cls(value)
    part._part_of = (variable, key)
    return part


def update_part(variable: Any, key: Any, kind: str, value: Any, read_value: bool) -> Any:
    """``variable[key].<kind>(value)``: checked (nothing is written when the value does not
    fit the part), then applied through ``variable``'s own ``assign`` / ``assign_add`` /
    ``assign_sub`` (see the module docstring)."""
    target = f"part {key_text(key)} of variable {variable.name!r}"
    if kind == "assign":
        _refuse_combined_assign(variable, key)
    current = variable.current_array()  # what this context reads: a replica its own copy
    arr = checked_update(value, target, tuple(current[key].shape), variable.dtype,
                         variable.device_spec)
    xp = array_module(current)
    if kind == "assign":
        new = xp.array(current, copy=True)
        new[key] = arr
        return variable.assign(new, read_value=read_value)
    # x + (-0.0) and x - 0.0 are x, bit for bit (-0.0 and NaN included)
    change = xp.full_like(current, -0.0) if kind == "assign_add" else xp.zeros_like(current)
    change[key] = arr
    update = variable.assign_add if kind == "assign_add" else variable.assign_sub
    return update(change, read_value=read_value)


def _refuse_combined_assign(variable: Any, key: Any) -> None:
    """ValueError where ``variable.assign`` of the whole new value would combine the
    replicas' values (SUM or MEAN, in replica context, over several replicas): the elements
    outside the part would be summed, or averaged with rounding, too."""
    mode = state.current_mode()
    if mode.is_default or mode.replica_context is None \
            or variable.synchronization is VariableSynchronization.ON_READ \
            or variable.aggregation not in _COMBINED:
        return
    strategy = variable.distribute_strategy
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return
    shown = key_text(key)
    raise ValueError(
        f"v{shown}.assign(...) of variable {variable.name!r} inside strategy.run: its "
        f"aggregation {variable.aggregation.name} combines the replicas' new values of the "
        f"whole variable, so the elements outside {shown} would be "
        f"{'summed' if variable.aggregation is VariableAggregation.SUM else 'averaged'} too. "
        f"Assign the part in cross-replica context (outside strategy.run, or in a merge_call), "
        f"or add the change, v{shown}.assign_add(delta), which combines only the change.")


def key_text(key: Any) -> str:
    """``key`` as it was written between brackets: ``[1:3]``, ``[0, ...]``."""
    parts = key if isinstance(key, tuple) else (key,)
    return "[" + ", ".join(map(_one_key, parts)) + "]"


def _one_key(k: Any) -> str:
    if isinstance(k, slice):
        text = ("" if k.start is None else str(k.start)) + ":" + (
            "" if k.stop is None else str(k.stop))
        return text + ("" if k.step is None else f":{k.step}")
    if k is Ellipsis:
        return "..."
    if k is None:
        return "None"
    if isinstance(k, (int, np.integer)):
        return str(int(k))
    return short_repr(k, 40)
