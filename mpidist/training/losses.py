"""Loss scaling for synchronous training (``tf.nn.compute_average_loss`` and friends, spec 10).

Replicas' gradients are *summed* across replicas, so each replica's loss must be its share of the
global mean: the sum of its per-example losses divided by the GLOBAL batch size.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpidist.backend import array_module
from mpidist.backend.traced import namespace_of
from mpidist.core.messages import short_repr
from mpidist.errors import InvalidArgumentError
from mpidist.strategies.context import get_strategy, has_strategy, in_cross_replica_context
from mpidist.types import Array, ReduceOp
from mpidist.values.containers import DistributedValues

__all__ = ["compute_average_loss", "scale_regularization_loss", "get_loss_reduction",
           "match_label_shapes", "check_per_example"]


def check_per_example(per_example: Array, y: Array, source: str) -> None:
    """ValueError unless ``per_example`` (the losses a model's ``source`` returned for labels
    ``y``) has one row per example: another count, or an ``(N, N)`` block from ``(N,)`` or
    ``(N, 1)`` labels (predictions ``(N, 1)`` minus labels ``(N,)`` broadcast to every pair),
    would make ``fit`` and ``evaluate`` average the wrong numbers. Shapes only: no data is
    read."""
    shape = tuple(getattr(per_example, "shape", ()))
    label_shape = tuple(getattr(y, "shape", ()))
    if not shape or not label_shape:
        return
    rows = label_shape[0]
    if shape[0] != rows:
        raise ValueError(
            f"{source} returned per-example losses of shape {shape} for a batch of {rows} "
            f"examples (y of shape {label_shape}); return one loss per example, shape "
            f"({rows},).")
    if len(shape) >= 2 and rows > 1 and shape[1] == rows and label_shape[1:] in ((), (1,)):
        raise ValueError(
            f"{source} returned per-example losses of shape {shape} for labels of shape "
            f"{label_shape}: predictions and labels of different ranks (e.g. ({rows}, 1) and "
            f"({rows},)) were broadcast against each other, comparing every prediction with "
            "every label. Make their shapes equal first (e.g. predictions[:, 0], or "
            "y.reshape(-1, 1)).")


def match_label_shapes(y_true: Array, y_pred: Array, where: str,
                       shown_pred_shape: Sequence[int] | None = None, note: str = ""
                       ) -> tuple[Array, Array]:
    """``(y_true, y_pred)`` with the same shape, or a ValueError naming both shapes.

    As Keras' ``squeeze_or_expand_to_same_rank``, a trailing dimension of 1 on the side with
    one more dimension is dropped (labels ``(N, 1)`` against predictions ``(N,)``, or the
    reverse); any other difference is an error instead of NumPy broadcasting, which would
    compare every label with every prediction (``(N,)`` against ``(N, 2)`` gives ``(N, 2)``,
    and ``(N,)`` against ``(1, N)`` gives ``(N, N)``) and average the wrong numbers. Works on
    NumPy, CuPy and traced arrays. ``where`` names the caller in the message;
    ``shown_pred_shape`` is the shape the user gave, where ``y_pred`` was derived from it, and
    ``note`` says how."""
    t, p = y_true, y_pred
    if t.ndim == p.ndim + 1 and t.shape[-1] == 1:
        t = t.reshape(t.shape[:-1])
    elif p.ndim == t.ndim + 1 and p.shape[-1] == 1:
        p = p.reshape(p.shape[:-1])
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(
            f"{where}: y_true of shape {tuple(y_true.shape)} and y_pred of shape "
            f"{tuple(y_pred.shape if shown_pred_shape is None else shown_pred_shape)} are not "
            f"compatible{note}{_broadcast_note(t.shape, p.shape)}. The shapes must be equal, up "
            "to one trailing dimension of 1 (as in Keras); reshape the labels or the "
            "predictions (e.g. y.reshape(-1, 1) or predictions[:, 0]).")
    return t, p


def _broadcast_note(a: Sequence[int], b: Sequence[int]) -> str:
    try:
        joint = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        return ""
    return f" (NumPy would broadcast them to {joint} and compare every pair)"


def _as_loss_array(per_example_loss: Any, what: str = "per_example_loss") -> tuple[Any, Array]:
    if isinstance(per_example_loss, DistributedValues):
        raise TypeError(
            f"{what} is a {type(per_example_loss).__name__}: compute the loss inside "
            "strategy.run, where each replica passes its own array."
        )
    traced = namespace_of(per_example_loss)
    if traced is not None:  # inside value_and_grad: compute with the tracing library
        kind = np.dtype(per_example_loss.dtype).kind
        if kind != "f":
            raise TypeError(
                f"{what} must be a float array to be differentiated, got dtype "
                f"{per_example_loss.dtype}; compute the loss in floating point.")
        return traced, per_example_loss
    xp = array_module(per_example_loss)
    loss = xp.asarray(per_example_loss, dtype=object if per_example_loss is None else None)
    if loss.dtype.kind not in "iuf":
        raise TypeError(
            f"{what} must hold real numbers (float or integer), got {short_repr(per_example_loss)} "
            f"of dtype {loss.dtype}; pass a float array."
        )
    if not np.issubdtype(loss.dtype, np.floating):
        loss = loss.astype(np.float64)  # a mean of integers is not an integer
    return xp, loss



def _weights_like(xp: Any, weights: Any, loss: Array) -> Array:
    """``sample_weight`` shaped to multiply ``loss``: per-example weights gain trailing axes, a
    trailing axis of 1 is squeezed, scalars broadcast."""
    w = xp.asarray(weights)
    if w.dtype.kind not in "iuf":
        raise TypeError(
            f"sample_weight must hold real numbers, got {short_repr(weights)} of dtype {w.dtype}; "
            "pass one float weight per example or a scalar.")
    w = w.astype(loss.dtype, copy=False)
    if w.ndim == loss.ndim + 1 and w.shape[-1] == 1:
        w = w.reshape(w.shape[:-1])
    if 0 < w.ndim < loss.ndim:
        w = w.reshape(w.shape + (1,) * (loss.ndim - w.ndim))
    try:
        # the weights broadcast to the losses, never the reverse (an (N, N) weight would
        # silently turn N losses into N * N)
        fits = np.broadcast_shapes(w.shape, loss.shape) == tuple(loss.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"sample_weight of shape {tuple(w.shape)} cannot be broadcast to per_example_loss of "
            f"shape {tuple(loss.shape)}; give one weight per example (shape "
            f"({loss.shape[0]},)) or a scalar.")
    return w


def compute_average_loss(per_example_loss: Array, sample_weight: Any = None,
                         global_batch_size: Any = None) -> Array:
    """This replica's share of the global mean loss: ``sum(per_example_loss * sample_weight) /
    global_batch_size``.

    Args:
        per_example_loss: losses with the batch as the first dimension (rank >= 1). NumPy or
            CuPy; integers are taken as float64.
        sample_weight: optional weights, one per example (or a scalar, or the loss's shape).
        global_batch_size: the number of examples in the step over all replicas. When None,
            ``per_example_loss.shape[0] * num_replicas_in_sync`` (only right when every replica
            has a full batch), and then it must be called in replica context.

    Returns a 0-d array of the loss's dtype; 0 when ``global_batch_size`` is 0.
    """
    xp, loss = _as_loss_array(per_example_loss)
    if loss.ndim < 1:
        raise ValueError(
            "Invalid value passed for `per_example_loss`. Expected a tensor with at least rank 1. "
            f"Received per_example_loss={per_example_loss} with rank 0")
    if sample_weight is not None:
        loss = loss * _weights_like(xp, sample_weight, loss)
    if global_batch_size is None:
        if has_strategy() and in_cross_replica_context():
            raise RuntimeError(
                "You are calling `compute_average_loss` in cross replica context, while it was "
                "expected to be called in replica context.")
        global_batch_size = loss.shape[0] * get_strategy().num_replicas_in_sync
    integer_array = hasattr(global_batch_size, "dtype") \
        and np.issubdtype(global_batch_size.dtype, np.integer) and np.ndim(global_batch_size) == 0
    if (isinstance(global_batch_size, bool) or not isinstance(global_batch_size, numbers.Integral)) \
            and not integer_array:
        raise TypeError(
            f"global_batch_size must be an integer. Got {global_batch_size!r}; pass the number "
            "of examples in the global batch as an int.")
    global_batch_size = int(global_batch_size)
    if global_batch_size < 0:
        raise InvalidArgumentError(
            f"global_batch_size must be non-negative. Got {global_batch_size}.")
    _check_rows_fit(int(loss.shape[0]), global_batch_size)
    total = xp.sum(loss)
    if global_batch_size == 0:
        return xp.zeros((), dtype=loss.dtype)
    return (total / loss.dtype.type(global_batch_size)).astype(loss.dtype)


def _check_rows_fit(rows: int, global_batch_size: int) -> None:
    """A ``global_batch_size`` smaller than the rows one replica received is surely wrong (the
    loss would no longer be a mean: each example would weigh more than 1/N); more rows than an
    even share of it, under several replicas, is most likely the per-replica batch size given
    for the global one (every gradient then comes out num_replicas_in_sync times too large).
    0 is TF's "no examples" case (the loss is 0), left alone."""
    if global_batch_size == 0:
        return
    if rows > global_batch_size:
        raise ValueError(
            f"compute_average_loss: global_batch_size={global_batch_size} but this replica alone "
            f"received {rows} examples (per_example_loss has {rows} rows), so the global batch "
            "has at least that many; pass the number of examples in the step over all replicas "
            "(the per-replica batch size times strategy.num_replicas_in_sync), or leave "
            "global_batch_size=None inside strategy.run.")
    replicas = get_strategy().num_replicas_in_sync
    share = -(-global_batch_size // replicas)
    if replicas > 1 and rows > share:
        warnings.warn(
            f"compute_average_loss: this replica received {rows} examples but "
            f"global_batch_size={global_batch_size} over {replicas} replicas is at most {share} "
            f"per replica; global_batch_size looks like the per-replica batch size, which makes "
            f"every gradient {replicas} times too large. Pass the global batch size (e.g. "
            f"{rows * replicas}).", RuntimeWarning, stacklevel=3)


def scale_regularization_loss(regularization_loss: Array) -> Array:
    """This replica's share of a regularization loss: ``sum(loss) / num_replicas_in_sync``, so
    that the sum over replicas counts it once."""
    if has_strategy() and in_cross_replica_context():
        raise RuntimeError(
            "You are calling `scale_regularization_loss` in cross replica context, while it was "
            "expected to be called in replica context.")
    xp, loss = _as_loss_array(regularization_loss, "regularization_loss")
    return (xp.sum(loss) / loss.dtype.type(get_strategy().num_replicas_in_sync)).astype(loss.dtype)


def get_loss_reduction() -> ReduceOp:
    """How replicas' losses combine: always ``ReduceOp.SUM`` (TF2 semantics: each replica's loss
    is already scaled by the global batch size)."""
    return ReduceOp.SUM
