"""The train, test and predict functions of a Keras model under a strategy with several replicas.

Keras's own JAX step is one jitted function of the whole batch. Under a strategy each replica
runs the model on its share of the batch, and what must be global is summed across replicas:

* train: a jitted function per replica returns, packed in one flat buffer, its gradient of the
  mean loss weighted by its rows, the change it made to the float non-trainable variables
  (BatchNormalization's moving statistics), the change it made to the metrics' variables, and
  its row count. The buffers of the local replicas are added, the sum crosses the ranks in one
  checked, bounded all-reduce (the strategy's communicator), and a second jitted function
  divides the gradient by the global row count (the gradient of the mean loss over the global
  batch, exactly, even when the shares are uneven), applies the optimizer, adds the mean
  non-trainable change (TF's MEAN aggregation of mirrored variables) and the summed metric
  change (TF's SUM aggregation of metric variables), and computes the logs from the now global
  metric state. Every rank ends the step with the same weights and the same logs.
* test: the same without gradients.
* predict: each replica predicts its share; the outputs are gathered in replica order.

Shares follow TF: a global batch of B rows gives replica k rows ``[k*c, min((k+1)*c, B))`` with
``c = ceil(B / num_replicas)`` (tf.distribute's rebatch of array input); a batch that is already
this worker's (an mpidist Dataset distributed by the strategy) is split the same way among the
worker's local replicas. A replica whose share is empty contributes zeros.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from keras import tree

from mpidist.errors import InvalidArgumentError
from mpidist.keras.keras_api import (StatelessScope, call_takes_training,
                                     unpack_x_y_sample_weight,
                                     update_metrics_variables)

__all__ = ["GLOBAL_BATCHES", "LOCAL_BATCHES", "ReplicaSteps"]

GLOBAL_BATCHES = "global"  # every rank yields the same global batch; each replica takes a share
LOCAL_BATCHES = "local"    # each rank yields its own rows (already sharded across workers)


def _rows(data: Any) -> int:
    x, _, _ = unpack_x_y_sample_weight(data)
    first = next(leaf for leaf in tree.flatten(x) if leaf is not None)
    return int(first.shape[0])


def _take(data: Any, lo: int, hi: int) -> Any:
    return tree.map_structure(lambda a: None if a is None else a[lo:hi], data)


def _bounds(rows: int, parts: int, index: int) -> tuple[int, int]:
    """Rows of part ``index`` when ``rows`` are cut into ``parts`` of ``ceil(rows/parts)``."""
    size = -(-rows // parts)
    lo = min(index * size, rows)
    return lo, min(lo + size, rows)


def _flat(arrays: Sequence[Any], dtype: Any) -> list[Any]:
    return [jnp.ravel(a).astype(dtype) for a in arrays]


def _size(arrays: Sequence[Any]) -> int:
    return sum(int(np.prod(a.shape, dtype=np.int64)) for a in arrays)


def _unflat(buffer: Any, start: int, likes: Sequence[Any]) -> tuple[list[Any], int]:
    out = []
    for like in likes:
        size = int(np.prod(like.shape, dtype=np.int64))
        out.append(buffer[start:start + size].reshape(like.shape).astype(like.dtype))
        start += size
    return out, start


class ReplicaSteps:
    """The step functions of one compiled model under one strategy (several replicas).

    Args:
        model: The Keras model (JAX backend), compiled.
        communicator: The strategy's communicator, or None for a strategy in one process.
        replica_ids: The global ids of this worker's replicas, in order.
        num_replicas: ``num_replicas_in_sync``.
        input_mode: A callable giving ``GLOBAL_BATCHES`` or ``LOCAL_BATCHES`` for the data of
            ``"train"``, ``"test"`` or ``"predict"`` (set by fit/evaluate/predict per call).
        first_batch_check: A callable ``(kind) -> bool`` that says (once) whether to check that
            every rank holds the same first global batch.
    """

    def __init__(self, model: Any, communicator: Any, replica_ids: Sequence[int],
                 num_replicas: int, input_mode: Callable[[str], str],
                 first_batch_check: Callable[[str], bool]) -> None:
        self._model = model
        self._comm = communicator
        self._replica_ids = tuple(replica_ids)
        self._num_replicas = num_replicas
        self._input_mode = input_mode
        self._first_batch_check = first_batch_check
        self._jitted: dict[str, Any] = {}

    # -- shares ---------------------------------------------------------------------------
    def _shares(self, kind: str, data: Any) -> list[tuple[Any, int]]:
        """This worker's replicas' shares of ``data``: (share, rows) per local replica."""
        rows = _rows(data)
        if self._input_mode(kind) == GLOBAL_BATCHES:
            if self._comm is not None and self._first_batch_check(kind):
                self._check_same_batch(kind, data)
            bounds = [_bounds(rows, self._num_replicas, r) for r in self._replica_ids]
        else:
            local = len(self._replica_ids)
            bounds = [_bounds(rows, local, i) for i in range(local)]
        return [(_take(data, lo, hi), hi - lo) for lo, hi in bounds]

    def _check_same_batch(self, kind: str, data: Any) -> None:
        """Every rank must hold the same global batch: compare a checksum of the first one."""
        digest = 0
        for leaf in tree.flatten(data):
            if leaf is not None:
                array = np.ascontiguousarray(np.asarray(leaf))
                digest = zlib.crc32(repr((array.shape, array.dtype.str)).encode(), digest)
                digest = zlib.crc32(array.tobytes(), digest)
        digests = self._comm.all_gather_object(digest)
        differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
        if differing:
            method = {"train": "fit", "test": "evaluate", "predict": "predict"}[kind]
            raise InvalidArgumentError(
                f"model.{method}(): the first global batch of rank(s) {differing} differs from "
                "rank 0's. With arrays (or any input that is not an mpidist Dataset) each rank "
                "must give the same data in the same order: every global batch is split across "
                "all replicas, as tf.distribute does. Give every rank the same arrays (and the "
                "same shuffle), or give each rank's own data as an mpidist.data.Dataset, which "
                "the strategy shards across workers.")

    # -- the shared all-reduce ------------------------------------------------------------
    def _sum_across_replicas(self, packs: list[Any], size: int, dtype: Any) -> Any:
        """Add this worker's replicas' buffers, then all ranks' (one checked all-reduce)."""
        live = [p for p in packs if p is not None]
        if not live:
            local = np.zeros(size, dtype)
        else:
            total = live[0]
            for p in live[1:]:
                total = total + p
            local = np.asarray(total)
        if self._comm is None:
            return local
        out = np.empty_like(local)
        self._comm.all_reduce(out, send=np.ascontiguousarray(local))
        return out

    # -- train ----------------------------------------------------------------------------
    def _train_parts(self, trainable: Sequence[Any], non_trainable: Sequence[Any],
                     metrics: Sequence[Any]) -> tuple[Any, Any, list[int], int, Any]:
        model = self._model
        float_nt = [i for i, v in enumerate(non_trainable)
                    if jnp.issubdtype(v.dtype, jnp.floating)]
        dtype = jnp.result_type(jnp.float32, *[v.dtype for v in trainable])
        grad_size = _size(trainable)
        nt_size = _size([non_trainable[i] for i in float_nt])
        size = grad_size + nt_size + _size(metrics) + 1  # the last element: the rows
        num_replicas = self._num_replicas

        def replica_part(trainable: Any, non_trainable: Any, optimizer_variables: Any,
                         metrics_variables: Any, data: Any) -> Any:
            x, y, sample_weight = unpack_x_y_sample_weight(data)
            grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
            (_, aux), grads = grad_fn(trainable, non_trainable, metrics_variables, x, y,
                                      sample_weight, training=True,
                                      optimizer_variables=optimizer_variables)
            loss, y_pred, new_nt, new_metrics = aux
            _, new_metrics = update_metrics_variables(model, new_metrics, loss, x, y, y_pred,
                                                      sample_weight)
            # Packed as they are: left to itself, XLA on CPU fuses the gradients' matrix
            # products into the concatenation and runs them as plain loops (measured 10x
            # slower for a 784-1024-10 MLP).
            grads, new_nt, new_metrics = jax.lax.optimization_barrier(  # type: ignore[no-untyped-call]
                (grads, new_nt, new_metrics))
            rows = jnp.asarray(_rows(data), dtype)
            pack = jnp.concatenate(
                _flat([g * rows for g in grads], dtype)
                + _flat([new_nt[i] - non_trainable[i] for i in float_nt], dtype)
                + _flat([n - o for n, o in zip(new_metrics, metrics_variables)], dtype)
                + [rows[None]])
            return pack, new_nt

        def apply(trainable: Any, non_trainable: Any, optimizer_variables: Any,
                  metrics_variables: Any, summed: Any) -> Any:
            grads, _ = _unflat(summed[:grad_size] / summed[-1], 0, trainable)
            nt_change, _ = _unflat(summed[grad_size:grad_size + nt_size] / num_replicas, 0,
                                   [non_trainable[i] for i in float_nt])
            metric_change, _ = _unflat(summed, grad_size + nt_size, metrics_variables)
            non_trainable = list(non_trainable)
            for i, change in zip(float_nt, nt_change):
                non_trainable[i] = non_trainable[i] + change
            trainable, optimizer_variables = model.optimizer.stateless_apply(
                optimizer_variables, grads, trainable)
            metrics_variables = [m + c for m, c in zip(metrics_variables, metric_change)]
            logs = _metric_logs(model, metrics_variables)
            return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

        # The weights, optimizer and metric state are donated, as Keras's own step donates its
        # state: the update writes in place instead of allocating the model anew each step.
        return (jax.jit(replica_part), jax.jit(apply, donate_argnums=(0, 2, 3)), float_nt,
                size, dtype)

    def train_function(self, state: Any, iterator: Iterator[Any]) -> Any:
        """Keras's ``train_function(state, iterator) -> (logs, state)``."""
        return self._steps("train", self._train_step, state, iterator)

    def _train_step(self, state: Any, data: Any) -> Any:
        trainable, non_trainable, optimizer_variables, metrics = state
        if "train" not in self._jitted:
            self._jitted["train"] = self._train_parts(trainable, non_trainable, metrics)
        replica_part, apply, float_nt, size, dtype = self._jitted["train"]
        packs: list[Any] = []
        kept_nt = None
        for share, rows in self._shares("train", data):
            if rows == 0:
                packs.append(None)
                continue
            pack, new_nt = replica_part(trainable, non_trainable, optimizer_variables, metrics,
                                        share)
            packs.append(pack)
            if kept_nt is None:
                kept_nt = new_nt
        summed = self._sum_across_replicas(packs, size, dtype)
        # Non-float state (random seeds) is each replica's own; the first local one is kept.
        if kept_nt is not None:
            floats = set(float_nt)
            non_trainable = [old if i in floats else new
                             for i, (old, new) in enumerate(zip(non_trainable, kept_nt))]
        return apply(trainable, non_trainable, optimizer_variables, metrics, summed)

    # -- test -----------------------------------------------------------------------------
    def _test_parts(self, metrics: Sequence[Any]) -> tuple[Any, Any, int, Any]:
        model = self._model
        dtype = jnp.result_type(jnp.float32, *[v.dtype for v in metrics])
        size = _size(metrics)

        def replica_part(trainable: Any, non_trainable: Any, metrics_variables: Any,
                         data: Any) -> Any:
            x, y, sample_weight = unpack_x_y_sample_weight(data)
            _, aux = model.compute_loss_and_updates(trainable, non_trainable,
                                                    metrics_variables, x, y, sample_weight,
                                                    training=False)
            loss, y_pred, _, new_metrics = aux
            _, new_metrics = update_metrics_variables(model, new_metrics, loss, x, y, y_pred,
                                                      sample_weight)
            return jnp.concatenate(
                _flat([n - o for n, o in zip(new_metrics, metrics_variables)], dtype))

        def apply(metrics_variables: Any, summed: Any) -> Any:
            change, _ = _unflat(summed, 0, metrics_variables)
            metrics_variables = [m + c for m, c in zip(metrics_variables, change)]
            return _metric_logs(model, metrics_variables), metrics_variables

        return jax.jit(replica_part), jax.jit(apply, donate_argnums=0), size, dtype

    def test_function(self, state: Any, iterator: Iterator[Any]) -> Any:
        return self._steps("test", self._test_step, state, iterator)

    def _test_step(self, state: Any, data: Any) -> Any:
        trainable, non_trainable, metrics = state
        if "test" not in self._jitted:
            self._jitted["test"] = self._test_parts(metrics)
        replica_part, apply, size, dtype = self._jitted["test"]
        packs = [replica_part(trainable, non_trainable, metrics, share) if rows else None
                 for share, rows in self._shares("test", data)]
        logs, metrics = apply(metrics, self._sum_across_replicas(packs, size, dtype))
        return logs, (trainable, non_trainable, metrics)

    # -- predict --------------------------------------------------------------------------
    def predict_function(self, state: Any, iterator: Iterator[Any]) -> Any:
        outputs = []
        for data in self._batches(iterator):
            outputs.append(self._predict_step(state, data))
        joined = tree.map_structure(lambda *parts: np.concatenate(parts), *outputs) \
            if len(outputs) > 1 else outputs[0]
        return joined, state

    def _predict_step(self, state: Any, data: Any) -> Any:
        trainable, non_trainable = state
        if "predict" not in self._jitted:
            model = self._model

            def replica_part(trainable: Any, non_trainable: Any, x: Any) -> Any:
                kwargs = {"training": False} if call_takes_training(model) else {}
                outputs, _ = model.stateless_call(trainable, non_trainable, x, **kwargs)
                return outputs

            self._jitted["predict"] = jax.jit(replica_part)
        replica_part = self._jitted["predict"]
        parts = []
        for share, _ in self._shares("predict", data):
            x, _, _ = unpack_x_y_sample_weight(share)
            parts.append(replica_part(trainable, non_trainable, x))
        local = tree.map_structure(lambda *p: np.concatenate([np.asarray(a) for a in p]),
                                   *parts)
        if self._comm is None:
            return local
        return tree.map_structure(self._comm.all_gather, local)

    # -- steps_per_execution --------------------------------------------------------------
    def _batches(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """The batches of one execution: ``steps_per_execution`` of them, fewer at the end."""
        yield next(iterator)
        for _ in range(self._model.steps_per_execution - 1):
            try:
                yield next(iterator)
            except StopIteration:
                return

    def _steps(self, kind: str, step: Callable[[Any, Any], Any], state: Any,
               iterator: Iterator[Any]) -> Any:
        logs = None
        for data in self._batches(iterator):
            logs, state = step(state, data)
        return logs, state


def _metric_logs(model: Any, metrics_variables: Sequence[Any]) -> Any:
    """The model's metric results computed from ``metrics_variables`` (inside a jit)."""
    with StatelessScope(state_mapping=list(zip(model.metrics_variables, metrics_variables))):
        return model.get_metrics_result()
