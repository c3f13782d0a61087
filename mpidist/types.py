"""Names shared by every layer: reduction operators, variable policies, and the ``Array`` alias
that annotations use for a replica's value."""

import enum
from typing import TYPE_CHECKING, Any, TypeAlias

__all__ = ["Array", "ReduceOp", "VariableAggregation", "VariableSynchronization"]

if TYPE_CHECKING:
    import cupy
    import numpy

    Array: TypeAlias = numpy.ndarray[Any, Any] | cupy.ndarray
else:
    Array = Any
"""An array on some device: a ``numpy.ndarray`` on the host, a ``cupy.ndarray`` on a GPU.

To a type checker ``Array`` is the union ``numpy.ndarray | cupy.ndarray``. CuPy ships no type
information (mypy's config lists it under ``ignore_missing_imports``), so its half of the union is
``Any``: a value *passed* as an Array is never refused (a user's list, scalar or CuPy array needs
no cast), while a value *used* as an Array is checked against ``numpy.ndarray`` as well (a
misspelt attribute, a wrong method's arguments, an Array returned where a ``float`` is declared).
A Protocol (shape, dtype, ndim) was the other choice: it checks less inside mpidist (no
arithmetic, no indexing without restating NumPy's API) and refuses array-likes at the call sites.

At run time ``Array`` is ``Any``: NumPy stays out of this bottom module's imports, and
``mpidist.core.signatures.accepts`` reads an ``Array`` annotation as "no check", as before."""


class ReduceOp(enum.Enum):
    """How values from several replicas are combined.

    ``ReduceOp("sum")`` and ``ReduceOp("Mean")`` work: strings are matched case-insensitively.
    """

    SUM = "SUM"
    MEAN = "MEAN"

    # Enum's own __hash__ is Python code (hash of the name), paid at every dict lookup keyed by
    # an op, several per collective. Members are singletons compared by identity, so the
    # identity hash agrees with equality.
    __hash__ = object.__hash__

    @classmethod
    def _missing_(cls, value: object) -> "ReduceOp | None":
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        return None

    @classmethod
    def from_variable_aggregation(cls, aggregation: "VariableAggregation | int") -> "ReduceOp":
        """The ReduceOp that implements ``aggregation`` (SUM or MEAN); ValueError otherwise."""
        aggregation = VariableAggregation(aggregation)
        if aggregation is VariableAggregation.SUM:
            return cls.SUM
        if aggregation is VariableAggregation.MEAN:
            return cls.MEAN
        raise ValueError(
            f"Could not convert from `mpidist.VariableAggregation` {aggregation} to "
            "`mpidist.ReduceOp` type: only SUM and MEAN aggregations are reductions. "
            "Create the variable with aggregation=SUM or MEAN to read it in cross-replica context."
        )


def as_reduce_op(reduce_op: "ReduceOp | str") -> ReduceOp:
    """Convert a ReduceOp or a string such as ``"sum"`` to a ReduceOp.

    Raises:
        ValueError: ``reduce_op`` is a string naming no ReduceOp (``'MAX' is not a valid ReduceOp``).
        TypeError: ``reduce_op`` is neither a ReduceOp nor a string.
    """
    known = _KNOWN_SPELLINGS.get(reduce_op) if type(reduce_op) in (str, ReduceOp) else None
    if known is not None:  # the hot path: ReduceOp.SUM, "SUM", "sum", ...
        return known
    if isinstance(reduce_op, ReduceOp):
        return reduce_op
    if isinstance(reduce_op, str):
        try:
            return ReduceOp(reduce_op.upper())
        except ValueError:
            raise ValueError(
                f"{reduce_op.upper()!r} is not a valid ReduceOp; use one of "
                f"{[m.value for m in ReduceOp]} (any case) or mpidist.ReduceOp.SUM / MEAN."
            ) from None
    raise TypeError(
        f"Expected `reduce_op` to be a `mpidist.ReduceOp` or a string, not: {reduce_op!r}"
    )


# Every ReduceOp under the spellings users write: itself, its value, its value in lower case.
_KNOWN_SPELLINGS = {spelling: op for op in ReduceOp for spelling in (op, op.value, op.value.lower())}


class VariableSynchronization(enum.Enum):
    """When a distributed variable's copies are brought into agreement."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3


class VariableAggregation(enum.Enum):
    """How per-replica updates (ON_WRITE) or per-replica values (ON_READ) are combined."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3
