"""``mpidist.IndexedSlices``: a sparse set of rows of an array (``tf.IndexedSlices``).

What ``Variable.scatter_*`` take: ``values[i]`` belongs to row ``indices[i]`` of an array of
shape ``dense_shape``. Also the row-index checks every sparse operation shares
(``Variable.sparse_read``, ``scatter_*``, ``ShardedVariable``, ``mpidist.nn.embedding_lookup``).
"""

import dataclasses
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from mpidist.backend import as_array, is_array
from mpidist.errors import InvalidArgumentError
from mpidist.types import Array

__all__ = ["IndexedSlices", "row_indices"]


def _as_array(x: Any) -> Array:
    """Lists and numbers become NumPy arrays; arrays (and values being differentiated, which
    the update then refuses with its own message) stay as they are."""
    if is_array(x) or not isinstance(x, (list, tuple, int, float, complex, np.generic)):
        return x
    return np.asarray(x)


@dataclasses.dataclass(frozen=True, eq=False)
class IndexedSlices:
    """Rows ``values`` of a dense array of shape ``dense_shape``, at rows ``indices``.

    Args:
        values: Array of shape ``indices.shape + dense_shape[1:]``.
        indices: Integer array: the row of each slice of ``values``.
        dense_shape: The dense array's shape, or None when unknown.
    """

    values: Any
    indices: Any
    dense_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _as_array(self.values))
        object.__setattr__(self, "indices", _as_array(self.indices))
        if self.dense_shape is not None:
            dense = np.asarray(as_array(self.dense_shape))
            if dense.ndim != 1 or dense.size == 0 or dense.dtype.kind not in "iu":
                raise TypeError(
                    f"IndexedSlices: dense_shape must be a sequence of ints such as (5, 2), got "
                    f"{self.dense_shape!r}.")
            object.__setattr__(self, "dense_shape", tuple(int(d) for d in dense))

    @property
    def dtype(self) -> np.dtype:
        """The dtype of ``values``."""
        return cast(np.dtype[Any], self.values.dtype)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """``dense_shape`` (the shape of the dense array these rows belong to)."""
        return self.dense_shape

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray:
        """The dense array (zeros where no row is given; repeated rows add up), as
        ``tf.convert_to_tensor`` gives it. Needs ``dense_shape``."""
        if self.dense_shape is None:
            raise ValueError(
                "IndexedSlices without dense_shape cannot become a dense array: pass "
                "dense_shape=(rows, ...) when creating it.")
        values = np.asarray(as_array(self.values))
        dense = np.zeros(self.dense_shape, dtype=values.dtype)
        rows = row_indices(self.indices, self.dense_shape[0], "IndexedSlices")
        np.add.at(dense, rows.reshape(-1), values.reshape((-1,) + self.dense_shape[1:]))
        return dense if dtype is None else dense.astype(dtype)

    def __repr__(self) -> str:
        indices = np.array2string(np.asarray(as_array(self.indices)), separator=", ",
                                  threshold=20)
        return (f"IndexedSlices(indices={indices}, values shape={tuple(self.values.shape)}, "
                f"dense_shape={self.dense_shape})")


def row_indices(indices: Any, num_rows: int, what: str) -> np.ndarray:
    """``indices`` as an int64 host array of the same shape, each in ``[0, num_rows)``.

    TypeError for non-integer indices; InvalidArgumentError (TF's words:
    ``indices[1] = 7 is not in [0, 5)``) for the first one out of range, negative ones
    included (they do not count from the end, as in TF). ``what`` names the operation.
    """
    arr = np.asarray(as_array(indices))
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise TypeError(
            f"{what}: indices must be integers, got dtype {arr.dtype} ({arr!r}); pass an int "
            "array such as np.array([0, 2]).")
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < 0) | (arr >= num_rows)
    if bad.any():
        position = np.unravel_index(int(np.argmax(bad)), arr.shape)
        label = f"indices[{','.join(str(int(p)) for p in position)}]" if arr.ndim else "indices"
        raise InvalidArgumentError(
            f"{label} = {int(arr[position])} is not in [0, {num_rows}) ({what}): "
            + (f"pass row indices from 0 to {num_rows - 1}." if num_rows else "there are no rows."))
    return arr
