"""``PSVariable``: a ``mpidist.Variable`` whose value lives on a parameter server.

The object is a handle (id, ps task, name, shape, dtype, ...): reads are requests, updates are
requests applied atomically on the server. ``read_value=True`` (the default, as TF) waits for
the new value; ``read_value=False`` posts the update and returns at once (the worker fences its
posted updates before it reports a closure done). Pickled, a PSVariable travels as its handle,
never its value; on the receiving rank there is one object per variable, so identity (and
dictionaries keyed by variable, like optimizer slots) survives across closures.

``cache_variable_reads()`` (TF's ``distribute_utils.cache_variable_reads``, ps-design.md §2.2):
inside its scope each variable is read from its server once; later reads in the scope return
that value (a copy), and the scope's own writes to a variable make its next read go to the
server again.
"""

import contextlib
import dataclasses
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mpidist.core.signatures import accepts
from mpidist.ps.client import PSClient, current_client
from mpidist.ps.wire import Op, pack_dtype
from mpidist.types import Array, VariableAggregation
from mpidist.values.variable_base import VariableBase
from mpidist.values.variables import Variable

__all__ = ["VariableHandle", "PSVariable", "attach_variable", "read_variables",
           "cache_variable_reads"]

_cache = threading.local()  # per thread: the scope's depth and {(client, var_id): value}


@contextlib.contextmanager
def cache_variable_reads() -> Iterator[None]:
    """A scope in which each parameter-server variable is read from its server once (TF's
    ``cache_variable_reads``): a step that reads the same weights several times pays one round
    trip per variable. Values other workers write meanwhile are not seen until the scope ends
    (or until this thread writes the variable: its own writes drop the cached value). Scopes
    nest (the outermost owns the cache); each thread has its own. Variables of other
    strategies are read as usual.

    Example, in a scheduled function::

        with mpidist.experimental.cache_variable_reads():
            for x in batches:
                loss += np.mean((x @ w + b) ** 2)     # w and b fetched once
    """
    depth = getattr(_cache, "depth", 0)
    if depth == 0:
        _cache.values = {}
    _cache.depth = depth + 1
    try:
        yield
    finally:
        _cache.depth = depth
        if depth == 0:
            _cache.values = None


def _read_cache() -> dict[tuple[int, int], np.ndarray] | None:
    """The active scope's cache on this thread, or None outside ``cache_variable_reads``."""
    return getattr(_cache, "values", None)

_UPDATE_OPS = {"assign": Op.ASSIGN, "assign_add": Op.ASSIGN_ADD, "assign_sub": Op.ASSIGN_SUB}
_SCATTER_OPS = {"scatter_add": Op.SCATTER_ADD, "scatter_sub": Op.SCATTER_SUB,
                "scatter_update": Op.SCATTER_UPDATE}
_OPTIMIZER_OPS = {"sgd": Op.APPLY_SGD, "momentum": Op.APPLY_MOMENTUM, "adam": Op.APPLY_ADAM}


@dataclasses.dataclass(frozen=True)
class VariableHandle:
    """What identifies a variable on a parameter server, on every rank."""

    var_id: int
    ps_rank: int
    ps_task: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    trainable: bool
    synchronization: int
    aggregation: int


_VARIABLES = "mpidist.values.variables:Variable | mpidist.ps.sharded_variable:ShardedVariable"


@accepts(variables=Iterable[_VARIABLES])  # type: ignore[valid-type]  # accepts reads the string
def read_variables(variables: Any) -> list[np.ndarray]:
    """The values of ``variables`` (PSVariables, ShardedVariables, or any variables), read with
    one request per parameter server, all sent before any reply is awaited: a model's 100 small
    variables cost a few large reads instead of 100 round trips. Other variables are read the
    usual way."""
    variables = list(variables)
    cache = _read_cache()
    groups: dict[tuple[int, int], list[PSVariable]] = {}
    for var in variables:
        for leaf in (var,) if isinstance(var, Variable) else getattr(var, "variables", (var,)):
            if type(leaf) is PSVariable and (cache is None or leaf._cache_key not in cache):
                groups.setdefault((id(leaf._client), leaf._handle.ps_rank), []).append(leaf)
    pending = []
    for (_, ps_rank), group in groups.items():
        client = group[0]._client
        ids = np.array([v._handle.var_id for v in group], np.int64)
        pending.append((client, ps_rank, group, client.send(ps_rank, Op.READ_MANY, 0, ids=ids)))
    values: dict[int, np.ndarray] = {}
    for client, ps_rank, group, tag in pending:
        raw = client.reply(ps_rank, tag, what=f"reading {len(group)} variables")
        raw = raw if raw is not None else np.empty(0, np.uint8)  # all of them empty
        offset = 0
        for var in group:
            values[id(var)] = np.frombuffer(raw, var.dtype, var.size, offset).reshape(var.shape)
            offset += var.size * var.dtype.itemsize
            if cache is not None:
                cache[var._cache_key] = values[id(var)].copy()

    def value(leaf: Any) -> np.ndarray:
        got = values.get(id(leaf))
        return got if got is not None else np.asarray(leaf.read_value())

    return [value(var) if isinstance(var, Variable) else
            np.concatenate([value(s) for s in var.variables]) if hasattr(var, "variables")
            else value(var) for var in variables]


def attach_variable(handle: VariableHandle) -> "PSVariable":
    """The variable object of ``handle`` on this rank (made on first sight, then reused)."""
    client = current_client()
    proxy = client.proxies.get(handle.var_id)
    if proxy is None:
        proxy = client.proxies[handle.var_id] = PSVariable(client, handle, strategy=None)
    return proxy


class PSVariable(Variable):
    """A variable held by a parameter server (``device`` is ``/job:ps/replica:0/task:K/...``)."""

    def __init__(self, client: PSClient, handle: VariableHandle, strategy: Any) -> None:
        # The identity is the handle's; Variable.__init__ is not called: the value lives on the
        # parameter server.
        VariableBase.__init__(
            self, name=handle.name, dtype=handle.dtype, shape=handle.shape,
            device=client.roles.device_name("ps", handle.ps_task), trainable=handle.trainable,
            synchronization=handle.synchronization, aggregation=VariableAggregation(handle.aggregation),
            distribute_strategy=strategy)
        self._client = client
        self._handle = handle
        self._known: tuple[int, np.ndarray] | None = None  # (closure, value its update returned)
        self._cache_key = (id(client), handle.var_id)

    @classmethod
    def create(cls, client: PSClient, handle: VariableHandle, initial: np.ndarray,
               strategy: Any) -> "PSVariable":
        """Create ``handle``'s variable on its server with value ``initial`` and return it."""
        initial = np.ascontiguousarray(initial, dtype=np.dtype(handle.dtype))
        client.request(handle.ps_rank, Op.CREATE, handle.var_id, ids=np.array(handle.shape, np.int64),
                       data=initial, extra=pack_dtype(initial.dtype),
                       what=f"creating variable {handle.name!r}")
        variable = cls(client, handle, strategy)
        client.proxies[handle.var_id] = variable
        return variable

    def __reduce__(self) -> tuple[Any, tuple[VariableHandle]]:
        return attach_variable, (self._handle,)

    # -- identity -------------------------------------------------------------------------
    @property
    def handle(self) -> VariableHandle:
        return self._handle

    # -- reads ----------------------------------------------------------------------------
    def _what(self, action: str) -> str:
        return f"{action} variable {self._name!r}"

    def current_array(self) -> np.ndarray:
        """The value, read from its server now (a fresh host array). Inside a scheduled
        function, right after an update of this variable that returned its value
        (``read_value=True``), that value is returned without a round trip: as if the read ran
        on the server together with the update, which TF's placement of both on the ps makes
        the usual case too."""
        known = self._known
        if known is not None and known[0] == self._client.closure:
            return known[1].copy()
        cache = _read_cache()
        if cache is not None:
            cached = cache.get(self._cache_key)
            if cached is not None:
                return cached.copy()
        handle = self._handle
        out = self._client.request(handle.ps_rank, Op.READ, handle.var_id, dtype=self._dtype,
                                   shape=self._shape, what=self._what("reading"))
        out = out if out is not None else np.empty(self._shape, self._dtype)
        if cache is not None:
            cache[self._cache_key] = out.copy()
        return out

    def _forget_cached(self) -> None:
        """This thread wrote the variable: its next read in a cache scope goes to the server."""
        cache = _read_cache()
        if cache is not None:
            cache.pop(self._cache_key, None)

    def value(self) -> Array:
        return self.current_array()

    def numpy(self) -> np.ndarray:
        return self.current_array()

    @property
    def storage(self) -> Array:
        raise TypeError(f"Variable {self._name!r} lives on parameter server "
                        f"{self.device}: it has no local storage; read it with read_value().")

    def adopt_storage(self, view: Array) -> None:
        raise TypeError(f"Variable {self._name!r} lives on a parameter server and cannot move "
                        "into a local buffer.")

    # -- writes ---------------------------------------------------------------------------
    def _send_update(self, op: int, value: Any, read_value: bool, ids: Any = None) -> Any:
        handle = self._handle
        client = self._client
        data = np.ascontiguousarray(value, dtype=self._dtype)
        self._known = None
        self._forget_cached()
        if not read_value:
            client.send(handle.ps_rank, op, handle.var_id, ids=ids, data=data, reply=False)
            return None
        new = client.request(handle.ps_rank, op, handle.var_id, ids=ids, data=data,
                             dtype=self._dtype, shape=self._shape, what=self._what("updating"))
        assert new is not None  # an update always answers with the new value
        if client.closure:
            self._known = (client.closure, new)
        return new.copy() if client.closure else new

    def write_prepared(self, kind: str, arr: Array) -> None:
        self._send_update(_UPDATE_OPS[kind], arr, read_value=False)

    def _update(self, kind: str, value: Any, read_value: bool) -> Any:
        return self._send_update(_UPDATE_OPS[kind], self.prepare_assignment(value), read_value)

    def sparse_read(self, indices: Any, name: str | None = None) -> np.ndarray:
        """Rows ``indices`` of the value, gathered on the server (only those rows travel)."""
        ids = self._row_ids(indices)
        handle = self._handle
        out = self._client.request(handle.ps_rank, Op.GATHER, handle.var_id, ids=ids.reshape(-1),
                                   dtype=self._dtype, shape=(ids.size, *self._shape[1:]),
                                   what=self._what("gathering rows of"))
        rows = out if out is not None else np.empty((0, *self._shape[1:]), self._dtype)
        return rows.reshape(ids.shape + self._shape[1:])

    def _row_ids(self, indices: Any) -> np.ndarray:
        ids = np.asarray(indices)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Row indices of variable {self._name!r} must be integers, got "
                            f"dtype {ids.dtype}.")
        if not self._shape:
            raise ValueError(f"Variable {self._name!r} is a scalar: it has no rows to index.")
        bad = ids[(ids < 0) | (ids >= self._shape[0])]
        if bad.size:
            raise IndexError(f"Row index {int(bad.reshape(-1)[0])} is out of range for variable "
                             f"{self._name!r} with {self._shape[0]} rows (valid: 0..{self._shape[0] - 1}).")
        return ids.astype(np.int64, copy=False)

    def _scatter(self, kind: str, sparse_delta: Any) -> "PSVariable":
        self._known = None
        self._forget_cached()
        ids = self._row_ids(sparse_delta.indices).reshape(-1)
        values = np.asarray(sparse_delta.values)
        expected = (ids.size, *self._shape[1:])
        if values.shape != expected:
            raise ValueError(f"{kind} on variable {self._name!r}: values of shape {values.shape} do "
                             f"not match {ids.size} indices (expected shape {expected}).")
        if not np.can_cast(values.dtype, self._dtype, casting="same_kind"):
            raise TypeError(f"{kind} on variable {self._name!r}: values of dtype {values.dtype} "
                            f"cannot update a {self._dtype} variable; cast them first.")
        handle = self._handle
        self._client.send(handle.ps_rank, _SCATTER_OPS[kind], handle.var_id, ids=ids,
                          data=np.ascontiguousarray(values, dtype=self._dtype), reply=False)
        return self

    def scatter_add(self, sparse_delta: Any, use_locking: bool = False, name: str | None = None
                    ) -> "PSVariable":
        return self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: Any, use_locking: bool = False, name: str | None = None
                    ) -> "PSVariable":
        return self._scatter("scatter_sub", sparse_delta)

    def scatter_update(self, sparse_delta: Any, use_locking: bool = False,
                       name: str | None = None) -> "PSVariable":
        return self._scatter("scatter_update", sparse_delta)

    # -- optimizer updates, applied where the variable lives ---------------------------------
    def apply_optimizer_update(self, rule: str, gradient: Any, params: tuple[float, ...],
                               slots: tuple["PSVariable", ...] = ()) -> None:
        """Post one fused optimizer update (``rule``: ``sgd``, ``momentum`` or ``adam``) of
        this variable with ``gradient``; ``slots`` must live on the same server."""
        handle = self._handle
        for slot in slots:
            if slot.handle.ps_rank != handle.ps_rank:
                raise ValueError(f"Slot {slot.name!r} of variable {self._name!r} lives on another "
                                 "parameter server; slots are created with colocate_vars_with.")
        # np.require keeps a scalar's shape () (ascontiguousarray makes it (1,)).
        grad = np.require(np.asarray(gradient, dtype=self._dtype), requirements="C")
        if grad.shape != self._shape:
            raise ValueError(f"Gradient of shape {grad.shape} for variable {self._name!r} of shape "
                             f"{self._shape}.")
        ids = np.array([s.handle.var_id for s in slots], np.int64)
        self._known = None
        self._forget_cached()
        for slot in slots:
            slot._forget_cached()
        self._client.send(handle.ps_rank, _OPTIMIZER_OPS[rule], handle.var_id, params=params,
                          ids=ids, data=grad, reply=False)
