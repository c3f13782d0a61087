"""mpidist: TensorFlow's tf.distribute programming model for NumPy / CuPy, over MPI.

Write a step once; run it on one CPU, on the GPUs of one machine or on many MPI ranks by
changing only the strategy object. Importing mpidist initialises nothing: no MPI, no CUDA,
no kernel compilation.
"""

import importlib.util as _importlib_util

if _importlib_util.find_spec("mpidist.kernels") is None:  # before anything fails on it
    from mpidist._shadowed import shadowed_checkout_error

    raise shadowed_checkout_error(__file__)

import sys as _sys

# ``python -m mpidist.guard``, the per-rank supervisor beside every rank of a job, needs only the
# standard library and mpidist.launch: it does not load the library (43 MB and 0.5 s per rank).
_GUARD_PROCESS = any(a == "-m" and b == "mpidist.guard"
                     for a, b in zip(_sys.orig_argv, _sys.orig_argv[1:]))

if not _GUARD_PROCESS:
    from mpidist import (autodiff, callbacks, cluster_resolver, data, errors, experimental, metrics, nn,
                         optimizers, train)
    from mpidist.core.function import function
    from mpidist.data.distributed import DistributedDataset, DistributedIterator
    from mpidist.data.options import InputContext, InputOptions, InputReplicationMode, RunOptions
    from mpidist.ops.in_process_all_reduce import (AllReduceCrossDeviceOps, HierarchicalCopyAllReduce,
                                                   NcclAllReduce)
    from mpidist.ops.cross_device_ops import CrossDeviceOps
    from mpidist.ops.reduction_to_one_device import ReductionToOneDevice
    from mpidist.strategies.context import (
        get_replica_context,
        get_strategy,
        has_strategy,
        in_cross_replica_context,
    )
    from mpidist.strategies.default import get_default_strategy as _get_default_strategy
    from mpidist.strategies.mirrored import MirroredStrategy
    from mpidist.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy
    from mpidist.strategies.one_device import OneDeviceStrategy
    from mpidist.strategies.replica_context import ReplicaContext
    from mpidist.strategies.strategy import Strategy, StrategyExtended, experimental_set_strategy
    from mpidist.types import ReduceOp, VariableAggregation, VariableSynchronization
    from mpidist.values.containers import DistributedValues, Mirrored, PerReplica, ValueContext
    from mpidist.values.distributed_variables import (
        DistributedVariable,
        MirroredVariable,
        SyncOnReadVariable,
    )
    from mpidist.training.fit import evaluate, fit
    from mpidist.ps.service import Server
    from mpidist.experimental import coordinator
    from mpidist.training.losses import get_loss_reduction
    from mpidist.values.indexed_slices import IndexedSlices
    from mpidist.values.variables import Variable
    from mpidist.core import state as _state
    from mpidist.keras import install_if_keras_imported as _install_keras
    from mpidist.keras import prefer_jax_backend as _prefer_jax_backend

    _prefer_jax_backend()  # Keras's own default backend is TensorFlow (docs/keras.md)
    _state.add_scope_entry_hook(_install_keras)

__version__ = "0.1.0"

__all__ = [
    "AllReduceCrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "IndexedSlices",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "NcclAllReduce",
    "CrossDeviceOps",
    "DistributedDataset",
    "DistributedIterator",
    "DistributedValues",
    "DistributedVariable",
    "Mirrored",
    "MirroredStrategy",
    "MirroredVariable",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "RunOptions",
    "Strategy",
    "StrategyExtended",
    "SyncOnReadVariable",
    "ValueContext",
    "Server",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "callbacks",
    "coordinator",
    "cluster_resolver",
    "data",
    "errors",
    "evaluate",
    "experimental",
    "experimental_set_strategy",
    "fit",
    "function",
    "get_loss_reduction",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "metrics",
    "io",
    "autodiff",
    "nn",
    "optimizers",
    "train",
]

if not _GUARD_PROCESS:
    del _get_default_strategy


def __getattr__(name: str) -> object:
    """``mpidist.io`` (TFRecord files, ``tf.train.Example`` parsing) on first use, as
    ``tf.io`` is reached: it loads protobuf, which ``import mpidist`` need not pay for."""
    if name == "io":
        import importlib  # noqa: PLC0415

        return importlib.import_module("mpidist.io")
    raise AttributeError(f"module 'mpidist' has no attribute {name!r}")
