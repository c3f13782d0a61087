"""The default strategy: what is in effect when no strategy's scope is entered (one replica,
no distribution)."""

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from mpidist.core import state
from mpidist.core.signatures import NonEmpty, accepts
from mpidist.data.inputs import check_dataset_fn, check_input
from mpidist.data.options import InputContext, InputOptions
from mpidist.ops.destinations import Destinations
from mpidist.strategies.context import has_strategy
from mpidist.strategies.replica_context import DefaultReplicaContext, ReplicaContext
from mpidist.strategies.single_replica import SingleReplicaExtended
from mpidist.strategies.strategy import Strategy
from mpidist.values.distributed_variables import is_distributed_variable
from mpidist.values.variables import Variable

__all__ = ["get_default_strategy"]


class _DefaultScope:
    def __init__(self, strategy: Strategy) -> None:
        self._strategy = strategy

    def __enter__(self) -> Strategy:
        if has_strategy():
            raise RuntimeError(
                "Must not nest mpidist.Strategy scopes: the default strategy's scope cannot be "
                "entered inside another strategy's scope."
            )
        return self._strategy

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


class _DefaultDistributionStrategy(Strategy):
    is_default = True
    _instance: "_DefaultDistributionStrategy | None" = None

    def __init__(self) -> None:
        if _DefaultDistributionStrategy._instance is not None:
            raise RuntimeError(
                "Should only create a single instance of _DefaultDistributionStrategy: use "
                "mpidist.get_strategy() outside any scope to get it."
            )
        super().__init__(_DefaultExtended(self))
        _DefaultDistributionStrategy._instance = self

    def scope(self) -> _DefaultScope:
        return _DefaultScope(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> "_DefaultDistributionStrategy":
        raise RuntimeError("Should only create a single instance of _DefaultDistributionStrategy")


class _DefaultExtended(SingleReplicaExtended):
    def __init__(self, container_strategy: Strategy) -> None:
        super().__init__(container_strategy, devices=())

    @property
    def _num_replicas_in_sync(self) -> int:
        return 1

    @property
    def worker_devices(self) -> tuple[str, ...]:
        raise RuntimeError("worker_devices() method unsupported by default mpidist.Strategy.")

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        raise RuntimeError("parameter_devices() method unsupported by default mpidist.Strategy.")

    @accepts(var_list=Annotated[Sequence[Variable], NonEmpty()])
    def non_slot_devices(self, var_list: Sequence[Variable]) -> Variable:
        return min(var_list, key=lambda v: v.name)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> Any:
        with ReplicaContext(self._container_strategy(), replica_id_in_sync_group=0):
            return fn(*args, **kwargs)

    def broadcast_to(self, tensor: Any, destinations: Destinations | None) -> Any:
        if destinations is None:
            return tensor
        raise NotImplementedError(
            "TODO: the default strategy has a single device; call broadcast_to with destinations=None."
        )

    def _experimental_distribute_dataset(self, dataset: Any, options: InputOptions | None
                                         ) -> Any:
        check_input(dataset, "experimental_distribute_dataset")  # a bare array is misread here too
        return dataset  # one replica, no device to fetch to: the dataset as it is

    def _distribute_datasets_from_function(self, dataset_fn: Callable[[InputContext], Any],
                                           options: InputOptions | None) -> Any:
        check_dataset_fn(dataset_fn)  # as every other strategy does
        return dataset_fn(InputContext())

    def variable_created_in_scope(self, v: object) -> bool:
        return not is_distributed_variable(v)

    def read_var(self, v: Any) -> Any:
        return v.value() if isinstance(v, Variable) else v


_DEFAULT = _DefaultDistributionStrategy()
_DEFAULT_REPLICA_CONTEXT = DefaultReplicaContext(_DEFAULT, replica_id_in_sync_group=0)
_DEFAULT_MODE = state.Mode(_DEFAULT, cross_replica=None, replica_context=_DEFAULT_REPLICA_CONTEXT,
                           is_default=True)
state.register_default_mode(lambda: _DEFAULT_MODE)


def get_default_strategy() -> Strategy:
    return _DEFAULT
