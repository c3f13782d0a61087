"""``mpidist.nn``: loss scaling for synchronous training and embedding lookups (``tf.nn``
counterparts)."""

from typing import Any

import numpy as np

from mpidist.backend import array_module, as_array, is_array
from mpidist.core.signatures import ArrayLike, accepts
from mpidist.ps.sharded_variable import ShardedVariable
from mpidist.training.losses import compute_average_loss, scale_regularization_loss
from mpidist.values.indexed_slices import row_indices
from mpidist.values.variables import Variable

__all__ = ["compute_average_loss", "embedding_lookup", "scale_regularization_loss"]


@accepts(ids=ArrayLike)
def embedding_lookup(params: Any, ids: Any, max_norm: float | None = None,
                     name: str | None = None) -> Any:
    """Rows ``ids`` of ``params`` (``tf.nn.embedding_lookup``): shape ``ids.shape +
    params.shape[1:]``.

    Args:
        params: A ShardedVariable (each id read from the shard holding its row: one
            ``sparse_read`` per shard touched), a Variable, a list of Variables taken as shards
            in row order (TF's "div" partition strategy), an array, or a list of arrays.
        ids: Integer array of any shape, each in ``[0, rows)``; an id out of range is TF's
            InvalidArgumentError naming it and the range.
        max_norm: When given, each looked-up embedding whose L2 norm exceeds it is scaled
            down to that norm.
    """
    if isinstance(params, (list, tuple)):
        if not params:
            raise ValueError("Length of params is currently 0. Need at least one param.")
        if all(isinstance(p, Variable) for p in params):
            params = params[0] if len(params) == 1 else ShardedVariable(list(params))
        else:
            params = np.concatenate([np.asarray(p) for p in params], axis=0)
    if isinstance(params, (ShardedVariable, Variable)):
        if not params.shape:
            raise ValueError(f"embedding_lookup needs params with rows (rank >= 1); "
                             f"{params.name!r} is a scalar.")
        result = params.sparse_read(ids)
    else:
        table = params if is_array(params) else as_array(params)
        if table.ndim == 0:
            raise ValueError("embedding_lookup needs params with rows (rank >= 1), got a scalar.")
        rows = row_indices(ids, table.shape[0], "embedding_lookup")
        xp = array_module(table)
        result = xp.take(table, rows if xp is np else xp.asarray(rows), axis=0)
    if max_norm is not None:
        result = _clip_rows(result, np.ndim(as_array(ids)), max_norm)
    return result


def _clip_rows(embeddings: Any, ids_rank: int, max_norm: float) -> Any:
    """Each embedding (the axes after the ids' own) scaled to L2 norm ``max_norm`` at most."""
    xp = array_module(embeddings)
    axes = tuple(range(ids_rank, embeddings.ndim))
    norms = xp.sqrt(xp.sum(embeddings * embeddings, axis=axes, keepdims=True))
    scaled = embeddings * max_norm / xp.maximum(norms, max_norm)
    return scaled.astype(embeddings.dtype, copy=False)
