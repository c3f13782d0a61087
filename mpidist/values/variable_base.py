"""``VariableBase``: the identity every variable kind shares, checked and set in one place.

A variable's identity is its name, dtype, shape, device, trainability, synchronization,
aggregation and the strategy that owns it. Every kind (a plain ``Variable``, a Mirrored or
SyncOnRead variable, an AggregatingVariable, a parameter-server variable) initialises through
``VariableBase.__init__`` and inherits the properties declared here; the kinds differ only in
where the value lives and how reads and writes reach it.
"""

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mpidist.core.devices import DeviceSpec, parse_device
from mpidist.core.tf_names import tf_name_hints
from mpidist.types import Array, VariableAggregation, VariableSynchronization

if TYPE_CHECKING:
    from mpidist.values.distributed_variables import DistributedVariable

__all__ = ["ArrayIdentity", "VariableBase", "as_aggregation", "as_synchronization"]

_HOST_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
# Read once: an enum member read through its class costs ~150 ns on Python 3.11, and every
# variable's creation reads these.
_AUTO, _ON_READ = VariableSynchronization.AUTO, VariableSynchronization.ON_READ
_NO_AGGREGATION = VariableAggregation.NONE


def as_synchronization(value: VariableSynchronization | int) -> VariableSynchronization:
    try:
        return VariableSynchronization(value) if not isinstance(value, VariableSynchronization) else value
    except ValueError:
        raise ValueError(
            f"Invalid variable synchronization mode: {value!r}; use one of "
            f"{[m.name for m in VariableSynchronization]} from mpidist.VariableSynchronization."
        ) from None


def as_aggregation(value: VariableAggregation | str) -> VariableAggregation:
    if isinstance(value, VariableAggregation):
        return value
    if isinstance(value, str) and value.upper() in VariableAggregation.__members__:
        return VariableAggregation[value.upper()]
    raise ValueError(
        f"Invalid variable aggregation mode: {value!r} for variable; use one of "
        f"{[m.name for m in VariableAggregation]} from mpidist.VariableAggregation."
    )


class ArrayIdentity:
    """``name``, ``dtype``, ``shape`` and ``ndim`` of a named value that acts as an array: every
    variable (``VariableBase``) and a ShardedVariable (not a Variable, as in TF) declare them
    here; their initialisers set the fields."""

    _name: str
    _dtype: np.dtype
    _shape: tuple[int, ...]

    @property
    def name(self) -> str:
        """The name: a variable's carries TF's ``:0`` suffix (a distributed variable's is its
        primary copy's, ``"w:0"``; the others are ``"w/replica_1:0"``, ...)."""
        return self._name

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the value (fixed at creation)."""
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        """``len(shape)``."""
        return len(self._shape)


@tf_name_hints("Variable")
class VariableBase(ArrayIdentity):
    """The identity of a variable, whatever its kind.

    Keyword-only arguments of the initialiser (checked here, once, in this order, before any
    value is made):

    Args:
        like: Another variable whose name, dtype, shape, device, trainable and
            synchronization this one takes (a distributed variable's primary copy, the
            variable an AggregatingVariable wraps); arguments given explicitly win.
        name: The full name, with its ``:0`` suffix; TypeError when not a string.
        dtype, shape: The value's; not given when ``value`` makes the value.
        device: A device string or DeviceSpec, or None for host memory (ValueError /
            TypeError from ``parse_device`` otherwise).
        trainable: Whether optimizers update it; None: all but ON_READ variables.
        synchronization: A VariableSynchronization (or its int); AUTO when None.
        aggregation: A VariableAggregation (or its name); NONE when None.
        distribute_strategy: The strategy that owns it (``distribute_strategy``), or None.
        value: For a kind that holds its value here (a plain ``Variable``): a function of the
            checked device that makes the value on that device (host memory for None). It is
            called once every argument passed (so a user's ``initial_value`` callable runs
            only then, as TF); the result is the variable's storage (``_value``) and gives
            dtype and shape.

    Attributes:
        distributed_container: The MirroredVariable / SyncOnReadVariable this variable is one
            component of (it sets this when it is built), else None. A plain attribute, not a
            property: ``regroup`` reads it for every value a replica returns.
    """

    _device: DeviceSpec | None
    _trainable: bool
    _synchronization: VariableSynchronization
    _aggregation: VariableAggregation
    _distribute_strategy: Any
    _value: Array  # set only for a kind that holds its value here (``value``)

    def __init__(self, *, like: "VariableBase | None" = None, name: Any = None,
                 dtype: npt.DTypeLike | None = None, shape: Sequence[int] | None = None,
                 device: str | DeviceSpec | None = None, trainable: bool | None = None,
                 synchronization: VariableSynchronization | int | None = None,
                 aggregation: VariableAggregation | str | None = None,
                 distribute_strategy: Any = None,
                 value: Callable[[DeviceSpec | None], Array] | None = None) -> None:
        if like is not None:
            name = like._name if name is None else name
            dtype = like._dtype if dtype is None else dtype
            shape = like._shape if shape is None else shape
            device = like._device if device is None else device
            trainable = like._trainable if trainable is None else trainable
            synchronization = like._synchronization if synchronization is None else synchronization
        # (an enum member given, the usual case, skips the call: creation is timed)
        if type(synchronization) is not VariableSynchronization:
            synchronization = as_synchronization(_AUTO if synchronization is None else synchronization)
        if type(aggregation) is not VariableAggregation:
            aggregation = as_aggregation(_NO_AGGREGATION if aggregation is None else aggregation)
        if not isinstance(name, str):
            raise TypeError(f"Variable name must be a string, got {name!r}.")
        placed = parse_device(device) if device is not None else None
        if value is not None:
            self._value = value(placed)
            dtype, shape = self._value.dtype, self._value.shape
        elif dtype is None or shape is None:
            raise TypeError("VariableBase needs dtype and shape, a value, or a variable `like`.")
        self._name = name
        self._dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self._shape = shape if type(shape) is tuple else tuple(shape)
        self._device = placed
        self._trainable = (
            synchronization is not _ON_READ if trainable is None
            else bool(trainable))
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._distribute_strategy = distribute_strategy
        self.distributed_container: DistributedVariable | None = None

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def device(self) -> str:
        """Fully qualified device name, e.g. ``/job:localhost/replica:0/task:0/device:CPU:0``."""
        return _HOST_DEVICE if self._device is None else str(self._device)

    @property
    def device_spec(self) -> DeviceSpec | None:
        """The DeviceSpec this variable's value lives on (``device`` is its string form), or
        None for a value in host memory that was given no device."""
        return self._device

    @property
    def trainable(self) -> bool:
        """TF's flag: whether the variable is meant to be trained (the creator's choice;
        by default every variable but an ON_READ one)."""
        return self._trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        """When the copies agree: ON_WRITE for a MirroredVariable, ON_READ for a
        SyncOnReadVariable; on a variable with one copy (plain, AggregatingVariable,
        parameter server) the value it was created with, which changes nothing there."""
        return self._synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        """How the replicas' values combine: their updates (MirroredVariable,
        AggregatingVariable) or, read across replicas, their copies (SyncOnReadVariable)."""
        return self._aggregation

    @property
    def distribute_strategy(self) -> Any:
        """The strategy whose scope created this variable (OneDeviceStrategy's, a distributed
        variable's, an AggregatingVariable's, a parameter-server variable's), else None: made
        outside every scope, one component of a distributed variable, or built with
        ``Variable.plain`` for no strategy."""
        return self._distribute_strategy
