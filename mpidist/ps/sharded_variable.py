"""``ShardedVariable``: one large variable kept as several Variables cut along axis 0 (TF's
``sharded_variable.ShardedVariable``, spec 9.4).

``ParameterServerStrategy`` with a ``variable_partitioner`` returns one, with its shards spread
over the parameter servers. It reads as the concatenation of its shards, splits updates by
shard, routes row reads and row updates to the shards that hold the rows, and is saved in a
checkpoint as one full-shape array (restorable with any number of shards).

Only public Variable methods are used on the shards (``numpy``, ``assign*``,
``prepare_assignment``, ``sparse_read``, ``scatter_*``, ``prepare_scatter``), so the shards
may be plain Variables, parameter-server variables, or any other Variable.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mpidist.backend import as_array
from mpidist.core.sharding import row_offsets
from mpidist.errors import InvalidArgumentError
from mpidist.types import Array
from mpidist.values.containers import DistributedValues
from mpidist.values.indexed_slices import IndexedSlices, row_indices
from mpidist.values.variable_base import ArrayIdentity
from mpidist.values.variables import Variable

__all__ = ["ShardedVariable"]


class ShardedVariable(ArrayIdentity):
    """Variables that are shards, along axis 0, of one larger variable.

    Args:
        variables: A non-empty list of Variables of one dtype whose shapes agree beyond axis 0,
            in row order.
        name: The container's name (default ``"ShardedVariable"``, as TF); the checkpoint key
            comes from where it is tracked, not from this name.

    ``name``, ``dtype``, ``shape`` (the shards' rows added up, then the shared trailing
    dimensions) and ``ndim`` are ``ArrayIdentity``'s, as every variable's.
    Reads (``np.asarray(sv)``, ``numpy``, ``read_value``, ``value``) concatenate the shards.
    ``assign*`` check the whole value first, then update shard by shard. ``sparse_read`` and
    ``scatter_*`` touch only the shards holding the rows named. Any row split works; TF's
    "div" split (``core.sharding.div_split_rows``) is what ParameterServerStrategy makes.
    Iterating yields the shards (as TF); there is no ``len()`` (TF has none either).
    """

    def __init__(self, variables: Sequence[Variable], name: str = "ShardedVariable") -> None:
        if (not isinstance(variables, Sequence) or isinstance(variables, str) or not variables
                or any(not isinstance(v, Variable) for v in variables)):
            raise TypeError(
                "Argument `variables` should be a non-empty list of `variables.Variable`s. "
                f"Received {variables!r}")
        distributed = [type(v).__name__ for v in variables if isinstance(v, DistributedValues)]
        if distributed:  # a shard is written in place, one copy (a replica's would diverge)
            raise TypeError(
                "Argument `variables` should hold one copy each (as ParameterServerStrategy "
                f"creates them), got {', '.join(distributed)}: create the shards outside a "
                "MirroredStrategy scope.")
        dtypes = [v.dtype for v in variables]
        if len(set(dtypes)) > 1:
            raise ValueError(
                "All elements in argument `variables` must have the same dtype. Received "
                f"dtypes: [{', '.join(str(d) for d in dtypes)}]")
        shapes = [tuple(v.shape) for v in variables]
        if any(not s for s in shapes):
            raise ValueError(
                "All elements in argument `variables` must have rank >= 1 (shards are cut "
                f"along axis 0). Received shapes: {shapes}")
        if len({s[1:] for s in shapes}) > 1:
            raise ValueError(
                "All elements in argument `variables` must have the same shapes except for the "
                f"first axis. Received shapes: {shapes}")
        if not isinstance(name, str):
            raise TypeError(f"ShardedVariable name must be a string, got {name!r}.")
        self._variables = tuple(variables)
        self._name = name
        self._dtype = np.dtype(dtypes[0])
        self._rows = [s[0] for s in shapes]
        self._offsets = np.asarray(row_offsets(self._rows), dtype=np.int64)
        self._shape = (sum(self._rows),) + shapes[0][1:]

    # -- identity -------------------------------------------------------------------------
    @property
    def variables(self) -> tuple[Variable, ...]:
        """The shards, in row order."""
        return self._variables

    @property
    def trainable(self) -> bool:
        return self._variables[0].trainable

    @property
    def distribute_strategy(self) -> Any:
        """The strategy of the shards (the first shard's, as TF)."""
        return self._variables[0].distribute_strategy

    @property
    def shard_rows(self) -> tuple[int, ...]:
        """Rows held by each shard."""
        return tuple(self._rows)

    # -- reads ----------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The full value, as one host array (the shards concatenated along axis 0)."""
        return np.concatenate([np.asarray(v.numpy()) for v in self._variables], axis=0)

    def value(self) -> np.ndarray:
        return self.numpy()

    def read_value(self) -> np.ndarray:
        return self.numpy()

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray:
        if copy is False:  # NumPy 2's contract: the shards' concatenation is always a copy
            raise ValueError(
                f"np.asarray(ShardedVariable {self.name!r}, copy=False): its value is the "
                "concatenation of its shards, which is always a new array; use np.asarray(v).")
        value = self.numpy()
        return value if dtype is None else value.astype(dtype, copy=False)

    def __iter__(self) -> Iterator[Variable]:
        """The shards (TF's ``ShardedVariable.__iter__``)."""
        return iter(self._variables)

    def __getitem__(self, key: Any) -> Any:
        """Indexing as on the full value; one row (an int first index) reads one shard only."""
        first = key[0] if isinstance(key, tuple) and key else key
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            row = int(first) + (self._shape[0] if first < 0 else 0)
            if not 0 <= row < self._shape[0]:
                raise IndexError(
                    f"ShardedVariable: slice index {int(first)} of dimension 0 out of bounds.")
            shard = int(np.searchsorted(self._offsets, row, side="right")) - 1
            local = row - int(self._offsets[shard])
            rest = key[1:] if isinstance(key, tuple) else ()
            return np.asarray(as_array(self._variables[shard].sparse_read([local])))[0][rest]
        return self.numpy()[key]

    def __repr__(self) -> str:
        try:
            shown = np.array2string(self.numpy(), separator=", ")
        except Exception as exc:  # noqa: BLE001 - a shard that cannot be read here
            shown = f"<unreadable: {exc}>"
        return (f"<mpidist.ShardedVariable {self._name!r} shape={self._shape} dtype={self._dtype} "
                f"shards={[tuple(v.shape) for v in self._variables]}, numpy={shown}>")

    # -- dense updates --------------------------------------------------------------------
    def _split(self, value: Any, what: str) -> list[Array]:
        """``value`` cut into the shards' parts, each checked by its shard; raises before any
        shard is written."""
        if isinstance(value, (ShardedVariable, Variable)):
            value = value.numpy()
        arr = as_array(value)
        if tuple(arr.shape) != self._shape:
            raise ValueError(
                f"Cannot {what} a value of shape {tuple(arr.shape)} to ShardedVariable "
                f"{self._name!r} of shape {self._shape}: the shapes must match exactly.")
        bounds = list(self._offsets) + [self._shape[0]]
        return [v.prepare_assignment(arr[bounds[i]:bounds[i + 1]])
                for i, v in enumerate(self._variables)]

    def assign(self, value: Any, use_locking: bool | None = None, name: str | None = None,
               read_value: bool = True) -> "ShardedVariable":
        """Set the full value: each shard gets its rows. Returns this ShardedVariable (as TF)."""
        for shard, part in zip(self._variables, self._split(value, "assign")):
            shard.assign(part, read_value=read_value)
        return self

    def assign_add(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> "ShardedVariable":
        for shard, part in zip(self._variables, self._split(delta, "assign_add")):
            shard.assign_add(part, read_value=read_value)
        return self

    def assign_sub(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> "ShardedVariable":
        for shard, part in zip(self._variables, self._split(delta, "assign_sub")):
            shard.assign_sub(part, read_value=read_value)
        return self

    # -- rows -----------------------------------------------------------------------------
    def _locate(self, rows: np.ndarray) -> np.ndarray:
        """The shard holding each global row (rows already checked in range)."""
        return np.searchsorted(self._offsets, rows, side="right") - 1

    def sparse_read(self, indices: Any, name: str | None = None) -> np.ndarray:
        """Rows ``indices`` of the full value, shape ``indices.shape + shape[1:]``, in the
        order asked (one ``sparse_read`` per shard touched; TF's own method returns them
        grouped by shard instead, a quirk not kept). Out-of-range rows are TF's
        InvalidArgumentError."""
        rows = row_indices(indices, self._shape[0],
                           f"sparse_read of ShardedVariable {self._name!r}")
        flat = rows.reshape(-1)
        out = np.empty(flat.shape + self._shape[1:], dtype=self._dtype)
        shard_of = self._locate(flat)
        for shard in np.unique(shard_of):
            where = np.flatnonzero(shard_of == shard)
            local = flat[where] - self._offsets[shard]
            out[where] = np.asarray(as_array(self._variables[shard].sparse_read(local)))
        return out.reshape(rows.shape + self._shape[1:])

    def _scatter(self, kind: str, sparse_delta: Any) -> "ShardedVariable":
        if not isinstance(sparse_delta, IndexedSlices):
            raise TypeError(f"sparse_delta is not IndexedSlices: {sparse_delta!r}")
        label = f"{kind} of ShardedVariable {self._name!r}"
        rows = row_indices(sparse_delta.indices, self._shape[0], label)
        values = as_array(sparse_delta.values)
        row_shape = self._shape[1:]
        if values.shape != () and tuple(values.shape) != rows.shape + row_shape:
            raise InvalidArgumentError(
                f"{label}: must have updates.shape = indices.shape + params.shape[1:] or "
                f"updates.shape = [], got updates.shape {tuple(values.shape)}, indices.shape "
                f"{rows.shape}, params.shape {self._shape}.")
        flat = rows.reshape(-1)
        values = np.broadcast_to(values, flat.shape + row_shape) if values.shape == () \
            else values.reshape(flat.shape + row_shape)
        shard_of = self._locate(flat)
        parts = []
        for shard in np.unique(shard_of):
            where = np.flatnonzero(shard_of == shard)
            part = IndexedSlices(values[where], flat[where] - self._offsets[shard])
            variable = self._variables[shard]
            variable.prepare_scatter(part, label)  # every shard checks its part first
            parts.append((variable, part))
        for variable, part in parts:
            getattr(variable, kind)(part)
        return self

    def scatter_add(self, sparse_delta: Any, use_locking: bool = False,
                    name: str | None = None) -> "ShardedVariable":
        """Add ``sparse_delta`` (an IndexedSlices of global rows) to the shards holding them;
        repeated rows add up. Returns this ShardedVariable."""
        return self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: Any, use_locking: bool = False,
                    name: str | None = None) -> "ShardedVariable":
        """Subtract ``sparse_delta`` (an IndexedSlices of global rows) from its rows."""
        return self._scatter("scatter_sub", sparse_delta)

    def scatter_update(self, sparse_delta: Any, use_locking: bool = False,
                       name: str | None = None) -> "ShardedVariable":
        """Set the rows ``sparse_delta`` (an IndexedSlices of global rows) names."""
        return self._scatter("scatter_update", sparse_delta)
