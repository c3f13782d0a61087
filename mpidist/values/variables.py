"""``mpidist.Variable``: a named, mutable array, the counterpart of ``tf.Variable``.

Calling ``mpidist.Variable(...)`` asks the current strategy to create the variable, so inside
``MirroredStrategy.scope()`` it returns a MirroredVariable or SyncOnReadVariable, and outside
any scope a plain Variable. Variables act as arrays in NumPy code (``np.asarray(v)``, ``v * x``,
``v.numpy()``); a distributed variable then acts as the current replica's copy.
"""

import contextlib
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from mpidist.backend import array_module, as_array, copy_to_device
from mpidist.backend.traced import traced_error, traced_kind
from mpidist.core import state
from mpidist.core.devices import DeviceSpec
from mpidist.core.messages import short_repr
from mpidist.core.signatures import DType, accepts, check_call
from mpidist.errors import InvalidArgumentError
from mpidist.types import Array, VariableAggregation, VariableSynchronization
from mpidist.values.containers import DistributedValues, PerReplica
from mpidist.values.assignment import checked_update
from mpidist.values.indexed_slices import IndexedSlices, row_indices
from mpidist.values.sliced import sliced
from mpidist.values.variable_base import VariableBase, as_aggregation, as_synchronization

__all__ = ["Variable", "as_aggregation", "as_synchronization", "initial_array", "Casting",
           "Shape", "record_direct_reads", "traced_reads", "with_traced_values"]

Casting: TypeAlias = Literal["no", "equiv", "safe", "same_kind", "unsafe"]
"""NumPy's casting rules, as ``np.can_cast`` names them."""

Shape: TypeAlias = Sequence[int] | int
"""A shape as users write it: a tuple (or list) of ints, or one int for a 1-D shape."""


# Reads of a variable as a value (``w.numpy()``, ``np.asarray(w)``, ``x @ w``) while
# value_and_grad traces a loss on this thread: the autodiff library sees such a read as a
# constant, so a loss that reads a variable it differentiates loses that part of the gradient.
# Optimizer.minimize differentiates a loss that reads the variables themselves, as TF's tape
# watches them: inside ``traced_reads`` the reads that can carry a trace (operators, indexing,
# ``value()``) give the traced value that stands for the variable, and the others raise.
# The count lets a read skip the thread-local lookup when no thread is recording or tracing.
_recording = 0
_recording_lock = threading.Lock()
_reads = threading.local()


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    global _recording
    with _recording_lock:
        _recording += 1
    try:
        yield
    finally:
        with _recording_lock:
            _recording -= 1


@contextlib.contextmanager
def record_direct_reads() -> Iterator[list["Variable"]]:
    """``with record_direct_reads() as reads:`` lists the variables this thread reads as
    values inside the block (in order, repeats kept); nested blocks each see their own."""
    seen: list[Variable] = []
    outer = getattr(_reads, "seen", None)
    _reads.seen = seen
    try:
        with _counted():
            yield seen
    finally:
        _reads.seen = outer


@contextlib.contextmanager
def traced_reads(variables: Sequence["Variable"], values: Sequence[Any],
                 caller: str = "Optimizer.minimize") -> Iterator[None]:
    """Inside the block, on this thread, each of ``variables`` reads as the traced value of
    ``values`` at its position wherever a read can carry the trace (``w * x``, ``x @ w``,
    ``-w``, ``w[i]``, ``iter(w)``, ``w.value()``, ``w.read_value()``), so a loss that reads the
    variables themselves (TF's ``minimize(loss, var_list)``) is differentiated with respect to
    them. Reads that give a constant (``np.asarray(w)``, a NumPy function of ``w``,
    ``w.numpy()``, ``float(w)``) raise TypeError naming the variable and ``caller``: the
    gradient through them would be lost without a word."""
    traced = {id(v): (v, t) for v, t in zip(variables, values)}
    outer, outer_caller = getattr(_reads, "traced", None), getattr(_reads, "caller", None)
    _reads.traced = traced if outer is None else {**outer, **traced}
    _reads.caller = caller
    try:
        with _counted():
            yield
    finally:
        _reads.traced, _reads.caller = outer, outer_caller


def with_traced_values(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each variable that reads as a traced value on this thread (inside
    ``traced_reads``) replaced by that value; ``args`` itself where there is none. For an
    autodiff library's own look at a function's arguments (autodiff wires it into autograd,
    whose functions otherwise take a variable for a constant)."""
    if not _recording:
        return args
    traced = getattr(_reads, "traced", None)
    if traced is None:
        return args
    return tuple(traced[id(a)][1] if isinstance(a, Variable) and id(a) in traced else a
                 for a in args)


def _traced_or_noted(variable: "Variable") -> Any:
    """(A read while some thread records or traces.) The traced value standing for
    ``variable`` inside ``traced_reads``; else None, the read noted for
    ``record_direct_reads``."""
    traced = getattr(_reads, "traced", None)
    if traced is not None:
        entry = traced.get(id(variable))
        if entry is not None:
            return entry[1]
    seen = getattr(_reads, "seen", None)
    if seen is not None:
        seen.append(variable)
    return None


def _read(variable: "Variable") -> Any:
    """What arithmetic on ``variable`` reads: ``current_array()``, or the traced value inside
    ``traced_reads``."""
    if _recording:
        traced = _traced_or_noted(variable)
        if traced is not None:
            return traced
    return variable.current_array()


def _note_read(variable: "Variable") -> None:
    """A read that gives a constant (``numpy()``, ``__array__``, ``float()``): noted, and
    refused inside ``traced_reads`` for a variable being differentiated."""
    if _recording and _traced_or_noted(variable) is not None:
        caller = getattr(_reads, "caller", None) or "Optimizer.minimize"
        raise TypeError(
            f"{caller}: the loss read variable {variable.name!r} as a constant "
            "(np.asarray(w), a plain NumPy function of w such as np.sum(w), w.numpy(), "
            "float(w); with JAX, a jax.numpy function of w), so the gradient through that read "
            "would be lost. Use w itself (w * x, x @ w + b, w[i], autograd.numpy functions "
            "such as anp.sum(w)) or w.value() there (jnp.sum(w.value())), or pass a loss that "
            "takes the values, loss(params), as value_and_grad's loss functions do.")


class _VariableMeta(type):
    """Routes ``Variable(...)`` through the current strategy's variable creator
    (``strategy.extended.create_variable``, see ``mpidist.values.protocols``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not Variable:
            return super().__call__(*args, **kwargs)
        check_call(Variable.__init__, cls, *args, **kwargs)  # before any strategy's creator
        strategy = state.current_mode().strategy
        creator = getattr(getattr(strategy, "extended", None), "create_variable", None)
        if creator is None:  # no strategies layer loaded: nothing to ask
            return super().__call__(*args, **kwargs)
        return creator(*args, **kwargs)


def _as_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints; TypeError naming it otherwise."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if dims is None or isinstance(shape, str) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"shape must be a tuple of ints such as (3, 2), got {shape!r}.")
    return tuple(int(d) for d in dims)


def initial_array(initial_value: Any, dtype: npt.DTypeLike | None, shape: Shape | None
                  ) -> Array:
    """``initial_value`` (an array, number, nested list, Variable or a zero-argument callable
    giving one) as the array a new variable starts from, of ``dtype`` when given and checked
    against ``shape`` when given; the error names the value and the fix otherwise. Strategies
    call it once and copy the result to every replica's device."""
    if initial_value is None:
        raise ValueError("initial_value must be specified: pass an array, a number or a callable.")
    if callable(initial_value):
        initial_value = initial_value()
    if isinstance(initial_value, Variable):
        initial_value = initial_value.read_value()
    if isinstance(initial_value, PerReplica):
        initial_value.__array__()  # raises TF's message: use strategy.run / reduce
    xp = array_module(initial_value)
    try:
        arr = xp.asarray(initial_value if xp is not np else as_array(initial_value),
                         dtype=np.dtype(dtype) if dtype is not None else None)
    except ValueError as exc:  # ragged nested lists, strings that are not numbers
        raise ValueError(
            f"initial_value {short_repr(initial_value)} cannot become an array"
            + (f" of dtype {dtype}" if dtype is not None else "")
            + f" ({exc}); pass an array or a nested list of equal-length rows."
        ) from None
    if arr.dtype.kind == "O":
        raise TypeError(
            f"initial_value {short_repr(initial_value)} gives an array of Python objects; a "
            "Variable holds numbers (or strings): pass numeric values or set dtype."
        )
    if shape is not None and tuple(arr.shape) != _as_shape(shape):
        raise ValueError(
            f"initial_value has shape {tuple(arr.shape)} but shape={_as_shape(shape)} was requested."
        )
    return arr


class Variable(VariableBase, metaclass=_VariableMeta):
    """A mutable array with a name, a dtype and a device.

    Args:
        initial_value: Array, number, nested list, or a zero-argument callable returning one.
        trainable: Whether optimizers update it (default True).
        name: Name without the ``:0`` suffix (default ``"Variable"``).
        dtype: NumPy dtype to store; inferred from ``initial_value`` when None.
        synchronization: A VariableSynchronization (used by distribution strategies).
        aggregation: A VariableAggregation (used by distribution strategies).
        shape: Expected shape of ``initial_value``; checked when given.
        device: Device string to place the value on (the host when None).

    The identity (``name``, ``dtype``, ``shape``, ``device``, ``trainable``,
    ``synchronization``, ``aggregation``, ``distribute_strategy``, ``distributed_container``)
    is ``VariableBase``'s; a plain Variable holds its value here, in ``storage``.
    """

    _adopted = False  # (class default: distributed variables never adopt storage themselves)
    __array_priority__ = 100

    @accepts(name=Any, dtype=DType | None, shape=Any, device=Any, synchronization=Any,
             aggregation=Any)  # Any: left to the body's messages (the mistakes corpus)
    def __init__(self, initial_value: Any = None, trainable: bool | None = None,
                 name: str | None = None, dtype: npt.DTypeLike | None = None,
                 synchronization: VariableSynchronization | int = VariableSynchronization.AUTO,
                 aggregation: VariableAggregation | str = VariableAggregation.NONE,
                 shape: Shape | None = None, device: str | DeviceSpec | None = None) -> None:
        self._init_local(initial_value, trainable, name, dtype, synchronization, aggregation,
                         shape, device)

    def _init_local(self, initial_value: Any = None, trainable: bool | None = None,
                    name: str | None = None, dtype: npt.DTypeLike | None = None,
                    synchronization: VariableSynchronization | int = VariableSynchronization.AUTO,
                    aggregation: VariableAggregation | str = VariableAggregation.NONE,
                    shape: Shape | None = None, device: str | DeviceSpec | None = None, *,
                    distribute_strategy: Any = None) -> None:
        """``__init__``'s body, with the owning strategy (``plain`` passes it)."""
        VariableBase.__init__(  # (not super(): zero-argument super costs ~0.1 us at creation)
            self, name=f"{name}:0" if isinstance(name, str) else "Variable:0" if name is None else name,
            trainable=trainable, synchronization=synchronization, aggregation=aggregation,
            device=device, distribute_strategy=distribute_strategy,
            value=lambda placed: copy_to_device(initial_array(initial_value, dtype, shape), placed))

    @classmethod
    def plain(cls, *args: Any, distribute_strategy: Any = None, **kwargs: Any) -> "Variable":
        """A plain Variable built right here, whatever strategy is current: the current
        strategy's variable creator is not asked (``Variable(...)`` asks it, and inside a
        MirroredStrategy scope would build a MirroredVariable). Takes ``Variable``'s arguments.

        Args:
            distribute_strategy: The strategy the variable belongs to (what its
                ``distribute_strategy`` reports): OneDeviceStrategy's creator passes itself;
                None (the default) for a variable of no strategy, e.g. a checkpoint's counter.
        """
        if distribute_strategy is None:  # the common case: type's own call skips _VariableMeta
            return cast(Variable, type.__call__(cls, *args, **kwargs))
        check_call(Variable.__init__, cls, *args, **kwargs)  # __init__'s checks, then its body
        variable = cls.__new__(cls)
        variable._init_local(*args, distribute_strategy=distribute_strategy, **kwargs)
        return variable

    # -- reads ----------------------------------------------------------------------------
    def current_array(self) -> Any:
        """The array that arithmetic on this variable reads, without a copy: a plain
        variable's value (its ``storage``); for a distributed variable the current replica's
        copy in replica context, else its cross-replica value. Writing into it is not an
        assignment: use ``assign*``."""
        return self._value

    def value(self) -> Array:
        """A snapshot of the current value (an array on the variable's device)."""
        if _recording:
            traced = _traced_or_noted(self)
            if traced is not None:  # inside traced_reads: the value being differentiated
                return traced
        return self.current_array().copy()

    def read_value(self) -> Array:
        return self.value()

    def numpy(self) -> np.ndarray:
        """A host NumPy copy of the current value."""
        _note_read(self)
        return np.array(as_array(self.current_array()), copy=True)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray:
        """NumPy 2's conversion contract. ``np.array(v)`` / ``np.asarray(v)`` (``copy`` True
        or None) give a copy, as ``tf.Variable`` does: writing into the storage itself would
        bypass ``assign`` (a distributed variable's other copies, an optimizer's arena, a
        parameter server never see it). ``copy=False`` lends the storage read-only, without a
        copy, and raises ValueError where the value needs a copy to exist on the host (another
        dtype, a GPU, a parameter server, an aggregate of replicas)."""
        _note_read(self)
        arr = self.current_array()
        if copy is False:
            wanted = arr.dtype if dtype is None else np.dtype(dtype)
            if not (self._lends(arr) and array_module(arr) is np and wanted == arr.dtype):
                raise ValueError(
                    f"np.asarray(variable {self.name!r}, copy=False): the value cannot be "
                    f"lent without a copy ({self._why_copied(arr, wanted)}); use np.asarray(v) "
                    "or v.numpy(), which copy.")
            view: np.ndarray = arr.view()
            view.flags.writeable = False
            return view
        host = as_array(arr)  # a GPU value is copied to the host here: no second copy then
        return np.array(host, dtype=dtype, copy=True if host is arr else None)

    def _lends(self, arr: Any) -> bool:
        """Whether ``arr`` (from ``current_array``) is this variable's own storage, which
        ``__array__(copy=False)`` may lend read-only."""
        return arr is getattr(self, "_value", None)

    def _why_copied(self, arr: Any, dtype: np.dtype) -> str:
        if array_module(arr) is not np:
            return "it lives on a GPU"
        if dtype != arr.dtype:
            return f"dtype {dtype} was asked for and the variable holds {arr.dtype}"
        return "it is read from elsewhere (another replica, a parameter server, an aggregate)"

    def __float__(self) -> float:
        _note_read(self)
        return float(self.current_array())

    def __int__(self) -> int:
        _note_read(self)
        return int(self.current_array())

    def __index__(self) -> int:
        _note_read(self)
        return int(self.current_array())

    def __bool__(self) -> bool:
        _note_read(self)
        return bool(self.current_array())

    def __len__(self) -> int:
        return len(self.current_array())

    def __iter__(self) -> Iterator[Any]:
        return iter(_read(self))

    def __getitem__(self, key: Any) -> Any:
        """``v[key]``: the value of that part, which, as in TF, can be assigned to:
        ``v[0].assign(1.0)``, ``v[1:3].assign_add(x)`` (``mpidist.values.sliced``)."""
        if _recording:
            traced = _traced_or_noted(self)
            if traced is not None:  # inside traced_reads: a part of the traced value
                return traced[key]
        return sliced(self, key, self.current_array()[key])

    def __repr__(self) -> str:
        try:
            shown = np.array2string(self.numpy(), separator=", ")
        except Exception as exc:  # noqa: BLE001 - e.g. an ON_READ NONE variable cannot be read cross-replica
            shown = f"<unreadable: {exc}>"
        return (f"<mpidist.{type(self).__name__} {self._name!r} shape={self.shape} "
                f"dtype={self.dtype}, numpy={shown}>")

    # -- storage --------------------------------------------------------------------------
    @property
    def storage(self) -> Array:
        """The array this variable's value lives in (no copy; a view into an arena once
        ``adopt_storage`` moved it there). Writing into it writes the variable."""
        return self._value

    @property
    def storage_adopted(self) -> bool:
        """Whether ``adopt_storage`` moved the value into a buffer owned elsewhere."""
        return self._adopted

    def adopt_storage(self, view: Array) -> None:
        """Move the value into ``view`` (an array of the same shape, dtype and kind, e.g. a
        slice of an optimizer's flat arena) and keep it there: every later write goes into
        ``view`` in place, so whoever owns the buffer sees the variable's value and the
        variable sees the buffer's updates. Reads, writes, checkpoints and the public
        behaviour are unchanged. The old array is dropped (no extra copy is kept)."""
        if self._adopted:
            raise ValueError(f"Variable {self._name!r} already lives in a shared buffer.")
        old = self._value
        if type(view) is not type(old) or view.shape != old.shape or view.dtype != old.dtype:
            raise ValueError(
                f"adopt_storage: variable {self._name!r} needs a {type(old).__name__} of shape "
                f"{old.shape} and dtype {old.dtype}, got {type(view).__name__} of shape "
                f"{tuple(view.shape)} and dtype {view.dtype}.")
        array_module(old).copyto(view, old)
        self._value = view
        self._adopted = True

    # -- writes ---------------------------------------------------------------------------
    # An update is checked, then written: a distributed variable checks the value for every
    # component before it writes any, so a bad value leaves every copy as it was.
    def prepare_assignment(self, value: Any, casting: Casting = "same_kind") -> Array:
        """``value`` as an array ready to store in this variable: the same shape and a dtype
        that casts to the variable's under ``casting``. Raises TypeError / ValueError naming
        the variable and the fix otherwise; writes nothing."""
        if isinstance(value, Variable):
            value = value.current_array()
        return checked_update(value, f"variable {self._name!r}", self.shape, self.dtype,
                              self._device, casting)

    def write_prepared(self, kind: str, arr: Array) -> None:
        """Write ``arr`` (from ``prepare_assignment``) into the value in place: ``kind`` is
        ``"assign"``, ``"assign_add"`` or ``"assign_sub"``. No checks: they were made."""
        xp = array_module(self._value)
        if kind == "assign":
            xp.copyto(self._value, arr, casting="unsafe")
        elif kind == "assign_add":
            xp.add(self._value, arr, out=self._value, casting="unsafe")
        else:
            xp.subtract(self._value, arr, out=self._value, casting="unsafe")

    def _update(self, kind: str, value: Any, read_value: bool) -> Any:
        self.write_prepared(kind, self.prepare_assignment(value))
        return self.value() if read_value else None

    @accepts()
    def assign(self, value: Any, use_locking: bool | None = None, name: str | None = None,
               read_value: bool = True) -> Any:
        """Set the value; returns the new value (an array) when ``read_value``, else None."""
        return self._update("assign", value, read_value)

    @accepts()
    def assign_add(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        try:
            return self._update("assign_add", delta, read_value)
        except (TypeError, ValueError) as exc:
            raise _about(exc, "assign_add", "delta") from None

    @accepts()
    def assign_sub(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        try:
            return self._update("assign_sub", delta, read_value)
        except (TypeError, ValueError) as exc:
            raise _about(exc, "assign_sub", "delta") from None

    # -- sparse reads and updates (rows along axis 0) --------------------------------------
    def sparse_read(self, indices: Any, name: str | None = None) -> Array:
        """Rows ``indices`` of the current value (TF ``ResourceVariable.sparse_read``): an
        array of shape ``indices.shape + shape[1:]`` on the variable's device. Indices must
        lie in ``[0, shape[0])`` (InvalidArgumentError otherwise, as TF's gather)."""
        self._require_rows("sparse_read")
        current = self.current_array()
        rows = row_indices(indices, self.shape[0], f"sparse_read of variable {self.name!r}")
        xp = array_module(current)
        return xp.take(current, rows if xp is np else xp.asarray(rows), axis=0)

    def prepare_scatter(self, sparse_delta: Any, what: str = "scatter") -> tuple[np.ndarray, Array]:
        """``sparse_delta`` (an IndexedSlices) checked against this variable: returns the row
        indices flattened to 1-D and the values as ``(len(rows),) + shape[1:]`` on the
        variable's device (a scalar value is broadcast to every row). Raises TypeError /
        InvalidArgumentError naming the variable and the fix; writes nothing."""
        if not isinstance(sparse_delta, IndexedSlices):
            raise TypeError(f"sparse_delta is not IndexedSlices: {short_repr(sparse_delta)}")
        self._require_rows(what)
        if traced_kind(sparse_delta.values) is not None:
            raise traced_error(sparse_delta.values, f"Updating variable {self.name!r}",
                               "update after value_and_grad returns, from the values it returns")
        label = f"{what} of variable {self.name!r}"
        rows = row_indices(sparse_delta.indices, self.shape[0], label)
        values = as_array(sparse_delta.values, self.device_spec)
        if (values.dtype.kind in "OSUVb" and values.dtype.kind != self.dtype.kind) \
                or not np.can_cast(values.dtype, self.dtype, casting="same_kind"):
            raise TypeError(
                f"{label}: updates of dtype {values.dtype} cannot go into dtype {self.dtype}; "
                f"cast them first (e.g. np.asarray(values, dtype={self.dtype.name!r})).")
        row_shape = self.shape[1:]
        if values.shape != () and tuple(values.shape) != rows.shape + row_shape:
            raise InvalidArgumentError(
                f"{label}: must have updates.shape = indices.shape + params.shape[1:] or "
                f"updates.shape = [], got updates.shape {tuple(values.shape)}, indices.shape "
                f"{rows.shape}, params.shape {self.shape}.")
        flat = rows.reshape(-1)
        xp = array_module(values)
        values = xp.broadcast_to(values, flat.shape + row_shape) if values.shape == () \
            else values.reshape(flat.shape + row_shape)
        return flat, values

    def write_scatter(self, kind: str, rows: np.ndarray, values: Array) -> None:
        """Write prepared rows (from ``prepare_scatter``) into the value in place: ``kind`` is
        ``"scatter_add"`` (repeated rows add up), ``"scatter_sub"`` or ``"scatter_update"``
        (the last of repeated rows wins). No checks: they were made."""
        storage = self._value
        xp = array_module(storage)
        index = rows if xp is np else xp.asarray(rows)
        values = values.astype(self.dtype, copy=False)
        if kind == "scatter_add":
            xp.add.at(storage, index, values)
        elif kind == "scatter_sub":
            xp.subtract.at(storage, index, values)
        else:
            storage[index] = values

    def _require_rows(self, what: str) -> None:
        if not self.shape:
            raise ValueError(
                f"{what} needs a variable with rows (rank >= 1); variable {self.name!r} is a "
                "scalar: use assign / assign_add instead.")

    def _scatter(self, kind: str, sparse_delta: Any) -> "Variable":
        rows, values = self.prepare_scatter(sparse_delta, kind)
        if not isinstance(self, DistributedValues):
            self.write_scatter(kind, rows, values)
            return self
        # A distributed variable updates through assign*, so its aggregation rules apply to
        # the dense equivalent of the rows (one copy per replica; fine for moderate sizes).
        if kind == "scatter_update":
            dense = np.array(self.numpy(), copy=True)
            dense[rows] = as_array(values)
            self.assign(dense, read_value=False)
        else:
            delta = np.zeros(self.shape, dtype=self.dtype)
            np.add.at(delta, rows, as_array(values).astype(self.dtype, copy=False))
            getattr(self, "assign_add" if kind == "scatter_add" else "assign_sub")(
                delta, read_value=False)
        return self

    def scatter_add(self, sparse_delta: Any, use_locking: bool = False,
                    name: str | None = None) -> "Variable":
        """Add ``sparse_delta`` (an IndexedSlices) to the rows it names; repeated rows add up.
        Returns the variable (as TF). Nothing is written when the update is invalid."""
        return self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: Any, use_locking: bool = False,
                    name: str | None = None) -> "Variable":
        """Subtract ``sparse_delta`` (an IndexedSlices) from the rows it names."""
        return self._scatter("scatter_sub", sparse_delta)

    def scatter_update(self, sparse_delta: Any, use_locking: bool = False,
                       name: str | None = None) -> "Variable":
        """Set the rows ``sparse_delta`` (an IndexedSlices) names to its values."""
        return self._scatter("scatter_update", sparse_delta)

    # Variables are hashable by identity (optimizers key slots by variable).
    __hash__ = object.__hash__


def _about(exc: Exception, call: str, argument: str) -> Exception:
    """``exc`` (the shared update check's "Cannot assign ...") naming the call and argument."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{call}: argument '{argument}': {exc.args[0]}",) + exc.args[1:]
    return exc


def _binary(name: str) -> Callable[[Variable, Any], Any]:
    def method(self: Variable, other: Any) -> Any:
        mine = _read(self)
        if isinstance(other, Variable):
            other = _read(other)
        return getattr(mine, name)(other)

    method.__name__ = name
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul"):
    setattr(Variable, f"__{_name}__", _binary(f"__{_name}__"))
    setattr(Variable, f"__r{_name}__", _binary(f"__r{_name}__"))
for _name in ("lt", "le", "gt", "ge"):
    setattr(Variable, f"__{_name}__", _binary(f"__{_name}__"))


def _unary(name: str, op: Callable[[Any], Any]) -> Callable[[Variable], Any]:
    def method(self: Variable) -> Any:
        return op(_read(self))

    method.__name__ = name
    return method


for _name, _op in (("neg", operator.neg), ("pos", operator.pos), ("abs", operator.abs)):
    setattr(Variable, f"__{_name}__", _unary(f"__{_name}__", _op))
del _name, _op
