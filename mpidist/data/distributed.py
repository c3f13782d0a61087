"""Distributed datasets and iterators: a worker's input split into per-replica batches.

``distribute_dataset`` (behind ``strategy.experimental_distribute_dataset``) and
``distribute_from_function`` (behind ``strategy.distribute_datasets_from_function``) build a
``DistributedDataset``; iterating it gives, per step, one batch per local replica as a PerReplica
(a plain array with one local replica), in the element's structure.

End of data is agreed across workers: before each step every worker says whether it still has
input (one tiny MAX all-reduce), so a worker that runs out early hands its replicas empty
batches while the others finish, and every worker stops at the same step. No rank ever waits in
a collective that another rank will not reach. The agreement is skipped only where every worker
proved, when the distributed dataset was made, the same number of steps (``agreement``): DATA
sharding of in-memory sources, or lists, of the same length everywhere.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from mpidist.backend.transfer import Uploader
from mpidist.core import nest, state
from mpidist.core.user_calls import user_call
from mpidist.data import rebatch
from mpidist.data.agreement import agree
from mpidist.data.background import iterate_in_background
from mpidist.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    IterationContext,
    file_count,
    file_shard_units,
    find_file_reader,
    has_shard_hints,
    order_units,
    iterate,
    source_row_count,
    source_units,
    static_batch_size,
)
from mpidist.data.inputs import check_dataset_fn, check_input, describe, is_one_shot
from mpidist.data.options import (
    AutoShardPolicy,
    InputContext,
    InputOptions,
    InputReplicationMode,
    Options,
)
from mpidist.data.spec import PerReplicaSpec, TensorSpec, empty_like_spec
from mpidist.errors import InvalidArgumentError, OutOfRangeError
from mpidist.logs import get_logger
from mpidist.values.containers import PerReplica

if TYPE_CHECKING:
    from mpidist.comm.communicator import Communicator
    from mpidist.core.devices import DeviceSpec
    from mpidist.data.element import Element, Leaves, Step, Structure

# One step as the distributed iterator hands it on: each local replica's leaves (None once the
# input has ended), and whether this worker still had data.
_Filled: TypeAlias = "tuple[list[Leaves] | None, bool]"

__all__ = ["InputWorkers", "DistributedDataset", "DistributedIterator", "Optional",
           "distribute_dataset", "distribute_from_function", "epoch_iterator"]

log = get_logger("mpidist.data")


@dataclasses.dataclass(frozen=True)
class InputWorkers:
    """What a strategy tells the input layer about where batches go."""

    devices: tuple[DeviceSpec, ...]  # this worker's replica devices (DeviceSpecs), in local replica order
    num_workers: int = 1
    worker_index: int = 0
    num_replicas_in_sync: int = 1
    comm: Communicator | None = None  # the Communicator that agrees end of data and seeds (multi-worker)
    timeout_seconds: float | None = None
    per_replica_allowed: bool = False  # PER_REPLICA pipelines (MirroredStrategy only)
    uniform: bool = True  # every worker has the same number of replicas

    @property
    def replicas_per_worker(self) -> int:
        return len(self.devices)

    @property
    def multi_worker(self) -> bool:
        return self.comm is not None and self.num_workers > 1


def _check_options(options: InputOptions | None) -> InputOptions:
    if options is None:
        return InputOptions()
    if not isinstance(options, InputOptions):
        hint = ""
        if isinstance(options, Options):
            hint = (" mpidist.data.Options (such as the auto-shard policy) belong to the dataset: "
                    "set them with dataset.with_options(options).")
        raise TypeError(
            f"options must be an mpidist.InputOptions, got {describe(options)}.{hint}")
    return options


def _check_not_distributed(value: object, api: str) -> None:
    if isinstance(value, DistributedDataset):
        raise TypeError(
            f"{api} was given a DistributedDataset, which is already distributed over the "
            "replicas: iterate it directly, or pass the mpidist.data.Dataset it was made from.")


def distribute_dataset(dataset: Dataset | Iterable[Element], workers: InputWorkers,
                       options: InputOptions | None = None) -> DistributedDataset:
    """``experimental_distribute_dataset``: split each global batch over all replicas."""
    api = "experimental_distribute_dataset"
    options = _check_options(options)
    _check_not_distributed(dataset, api)
    if options.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
        raise NotImplementedError(
            "InputReplicationMode.PER_REPLICA is only supported in "
            "`distribute_datasets_from_function`.")
    n = workers.num_replicas_in_sync
    if not workers.uniform:
        raise ValueError(
            "experimental_distribute_dataset needs the same number of replicas on every worker "
            f"(this job has {n} replicas over {workers.num_workers} workers, this worker has "
            f"{workers.replicas_per_worker}). Use distribute_datasets_from_function, or give "
            "every rank the same devices.")
    if isinstance(dataset, Dataset):
        spec = dataset.element_spec
        _check_components(spec, api)
        for leaf in nest.flatten(spec):
            if leaf.shape == ():
                raise ValueError(
                    f"The dataset's elements are scalars (element_spec {spec}), so there is no "
                    f"batch to split across {n} replicas. Call dataset.batch(global_batch_size) "
                    "before experimental_distribute_dataset.")
        policy = dataset.options().experimental_distribute.auto_shard_policy
        static_batch = static_batch_size(dataset)
        if static_batch is None:
            static_batch = nest.flatten(spec)[0].batch_dim
    else:
        check_input(dataset, api)
        spec, policy, static_batch = None, AutoShardPolicy.AUTO, None
    sharding = _sharding(dataset, policy, workers) if isinstance(dataset, Dataset) else _Sharding()
    # the policy asked for, which every worker must share; AUTO may resolve differently where
    # the workers' files differ, which the file agreement names
    asked, policy = policy, sharding.policy if isinstance(dataset, Dataset) else policy
    balanced = policy in (AutoShardPolicy.OFF, AutoShardPolicy.FILE, AutoShardPolicy.HINT)
    cardinality = _cardinality(dataset)
    # With the legacy split every worker reads its batches in the same order; their number is
    # known in advance for an in-memory source or a list. Where every worker claims the same
    # number, the per-step end-of-data agreement can be skipped (checked in ``agree``).
    steps, rows = None, None
    if not balanced and isinstance(dataset, Dataset):
        rows = source_row_count(dataset)
        steps = cardinality if rows is not None and cardinality != UNKNOWN_CARDINALITY else None
    elif not balanced and isinstance(dataset, list):
        steps = rows = len(dataset)
    # Sharding by DATA keeps each worker's share of its own pipeline's batches: the workers
    # must build the same sequence (compared, not assumed).
    order = order_units(dataset) if isinstance(dataset, Dataset) and \
        policy is AutoShardPolicy.DATA else None
    agreed = agree(workers, api, steps, rows, split=sharding.split, split_by=asked.name,
                   order=order, auto_shard_policy=asked.name)
    passes = _Passes(dataset, api)

    def local_steps(iteration: int) -> Iterator[Step]:
        passes.start()
        batches = _iterate(dataset, sharding.context(iteration, agreed.seed))
        if balanced:
            return rebatch.balanced_steps(batches, workers, static_batch)
        return rebatch.legacy_steps(batches, workers)

    replica_spec = None
    if spec is not None:
        sub = None
        if static_batch is not None and nest.flatten(spec)[0].batch_dim == static_batch \
                and static_batch % n == 0:
            sub = static_batch // n
        replica_spec = nest.map_structure(lambda s: s.with_batch_size(sub), spec)
    if balanced and workers.num_workers > 1 and cardinality >= 0:
        cardinality = UNKNOWN_CARDINALITY
    if workers.multi_worker and not agreed.same_steps and cardinality >= 0:
        # The longest worker's pipeline decides: known where every worker proved its length.
        cardinality = UNKNOWN_CARDINALITY if agreed.steps is None else agreed.steps
    log.info("distributing a dataset: auto-shard policy %s, %s split over %d replica(s) of "
             "%d worker(s)%s; end-of-data agreement %s", policy.name,
             "balanced" if balanced else "ceil", n, workers.num_workers,
             sharding.describe(),
             "per step" if workers.multi_worker and not agreed.same_steps else "not needed")
    return DistributedDataset(local_steps, workers, options, [replica_spec] * workers.replicas_per_worker,
                              cardinality, agree_end=workers.multi_worker and not agreed.same_steps)


def distribute_from_function(dataset_fn: Callable[[InputContext], Dataset | Iterable[Element]],
                             workers: InputWorkers,
                             options: InputOptions | None = None) -> DistributedDataset:
    """``distribute_datasets_from_function``: ``dataset_fn(InputContext)`` builds each input
    pipeline, already batched per replica; nothing is rebatched or sharded."""
    api = "distribute_datasets_from_function"
    options = _check_options(options)
    check_dataset_fn(dataset_fn)
    n, r = workers.num_replicas_in_sync, workers.replicas_per_worker
    per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    if per_replica and not workers.per_replica_allowed:
        raise NotImplementedError(
            "InputReplicationMode.PER_REPLICA is only supported in "
            "`distribute_datasets_from_function` of mpidist.MirroredStrategy")
    if per_replica:
        pipelines = [dataset_fn(InputContext(n, i, n)) for i in range(r)]
    else:
        pipelines = [dataset_fn(InputContext(workers.num_workers, workers.worker_index, n))]
    for p in pipelines:
        _check_not_distributed(p, api)
        if isinstance(p, Dataset):
            _check_components(p.element_spec, api)
            if workers.num_workers > 1 and has_shard_hints(p):
                raise InvalidArgumentError(
                    f"{api}: the dataset dataset_fn returned has a shard(SHARD_HINT, "
                    "SHARD_HINT) placeholder, but nothing auto-shards these datasets: shard "
                    "them with input_context.num_input_pipelines and "
                    "input_context.input_pipeline_id.")
        else:
            check_input(p, api, per_replica=True)
    agreed = agree(workers, api)
    passes = [_Passes(p, api) for p in pipelines]

    def local_steps(iteration: int) -> Iterator[Step]:
        for p in passes:
            p.start()
        streams = [_iterate(p, IterationContext(iteration, agreed.seed)) for p in pipelines]
        if per_replica:
            return rebatch.per_replica_steps(streams)
        return rebatch.per_worker_steps(streams[0], r)

    specs = [p.element_spec if isinstance(p, Dataset) else None for p in pipelines]
    if not per_replica:
        specs = specs * r
    cards = [_cardinality(p) for p in pipelines]
    if any(c == INFINITE_CARDINALITY for c in cards):
        cardinality = INFINITE_CARDINALITY
    elif any(c < 0 for c in cards):
        cardinality = UNKNOWN_CARDINALITY
    else:
        cardinality = max(cards) if per_replica else -(-cards[0] // r)
    if workers.multi_worker and cardinality >= 0:
        cardinality = UNKNOWN_CARDINALITY  # other workers' pipelines may be longer
    return DistributedDataset(local_steps, workers, options, specs, cardinality,
                              agree_end=workers.multi_worker)


@dataclasses.dataclass(frozen=True)
class _Sharding:
    """How one worker's pass over a dataset is sharded: the policy in effect (AUTO resolved)
    and the shard each IterationContext carries."""

    policy: AutoShardPolicy = AutoShardPolicy.AUTO
    file_shard: tuple[int, int, Dataset] | None = None  # (num_workers, worker_index, the reader node)
    source_shard: tuple[int, int] | None = None  # (num_workers, worker_index) at the chain's source
    shard_hint: tuple[int, int] = (1, 0)
    # what FILE sharding splits (file names, or the source's elements), which every worker
    # must list alike; None where only reading would tell
    split: tuple[str, ...] | None = None

    def context(self, iteration: int, seed: int) -> IterationContext:
        return IterationContext(iteration, seed, self.source_shard, self.file_shard,
                                self.shard_hint)

    def describe(self) -> str:
        if self.file_shard is not None:
            return f", files {self.file_shard[1]}::{self.file_shard[0]} of the reader"
        if self.source_shard is not None:
            return f", source elements {self.source_shard[1]}::{self.source_shard[0]}"
        return ""


def _sharding(dataset: Dataset, policy: AutoShardPolicy, workers: InputWorkers) -> _Sharding:
    """TF's auto-shard rules (spec 7.2). FILE: the first reader found walking up from the
    output reads only this worker's files (fewer files than workers is TF's error); a pipeline
    that reads no files has its source elements sharded instead (an mpidist extension: TF
    raises). AUTO: FILE where a reader is found with at least one file per worker, else DATA.
    HINT: ``shard(SHARD_HINT, SHARD_HINT)`` becomes ``shard(num_workers, worker_index)``."""
    W, w = workers.num_workers, workers.worker_index  # noqa: N806 - the spec's W
    if policy is AutoShardPolicy.HINT:
        return _Sharding(policy, shard_hint=(W, w))
    if W > 1 and has_shard_hints(dataset):
        raise InvalidArgumentError(
            "The dataset has a shard(SHARD_HINT, SHARD_HINT) placeholder, which only "
            f"AutoShardPolicy.HINT fills in, but its policy is {policy.name}: set "
            "options.experimental_distribute.auto_shard_policy = AutoShardPolicy.HINT, or "
            "shard by numbers.")
    if policy not in (AutoShardPolicy.AUTO, AutoShardPolicy.FILE):
        return _Sharding(policy)
    reader = find_file_reader(dataset)
    count = file_count(reader) if reader is not None else None
    if policy is AutoShardPolicy.AUTO:
        if reader is None or (count is not None and count < W):
            if reader is None:
                return _Sharding(AutoShardPolicy.DATA)
            log.info("AUTO sharding: the dataset has %d file(s) for %d workers; sharding "
                     "by DATA instead of FILE", count, W)
            # the workers still compare their lists: one that found fewer files must not
            # fall back to DATA alone
            return _Sharding(AutoShardPolicy.DATA, split=file_shard_units(reader) if W > 1 else None)
        policy = AutoShardPolicy.FILE
    if W == 1:
        return _Sharding(policy)
    if reader is None:
        count = source_row_count(dataset)
    if count is not None and count < W:
        raise InvalidArgumentError(
            f"Could not apply FILE based sharding: the dataset only has {count} file(s), "
            f"which is not enough for the required {W} shards/workers. Use "
            "AutoShardPolicy.DATA or OFF, or split the data into at least one file per "
            "worker." + ("" if reader is not None else " (This dataset reads no files, so "
                         "mpidist shards its source dataset's elements as files.)"))
    if reader is None:
        listed = source_units(dataset)
        split = listed if listed is not None or count is None else (f"{count} source element(s)",)
        return _Sharding(policy, source_shard=(W, w), split=split)
    return _Sharding(policy, file_shard=(W, w, reader), split=file_shard_units(reader))


class _Passes:
    """Counts the passes over a one-shot input (a generator, an iterator): a second pass would
    silently continue where the first stopped, or give nothing, so it is an error."""

    def __init__(self, source: object, api: str) -> None:
        self._one_shot, self._api, self._started = is_one_shot(source), api, False

    def start(self) -> None:
        if self._one_shot and self._started:
            raise RuntimeError(
                f"The input given to {self._api} is a one-shot iterator (a generator object, "
                "say), already iterated once: another pass would start where the last one "
                "stopped. Pass a list of batches, or mpidist.data.Dataset.from_generator(gen) "
                "(which calls gen() again on each pass).")
        self._started = True


def _is_scalar(leaf: Any) -> bool:
    return leaf.shape == () if isinstance(leaf, TensorSpec) else np.ndim(leaf) == 0


def _check_components(spec: Structure, api: str) -> None:
    if not nest.flatten(spec):
        raise ValueError(
            f"{api}: the dataset's elements have no components (element_spec {spec!r}), so "
            "there is no batch to hand to the replicas. Give each element at least one array.")


def _iterate(source: Dataset | Iterable[Element], ctx: IterationContext) -> Iterator[Element]:
    return iterate(source, ctx) if isinstance(source, Dataset) else iter(source)


def _cardinality(source: Any) -> int:
    if isinstance(source, Dataset):
        return source.cardinality()
    try:
        return len(source)
    except TypeError:
        return UNKNOWN_CARDINALITY


class DistributedDataset:
    """A dataset distributed over replicas (``tf.distribute.DistributedDataset``): iterate it,
    ask its ``element_spec`` or ``cardinality()``. Each ``iter()`` is a new pass over the data
    (a new epoch: reshuffling shuffles draw a new order)."""

    def __init__(self, local_steps: Callable[[int], Iterator[Step]], workers: InputWorkers,
                 options: InputOptions, replica_specs: Sequence[Structure], cardinality: int,
                 agree_end: bool) -> None:
        self._local_steps = local_steps
        self._agree_end = agree_end
        self._workers = workers
        self._options = options
        self._replica_specs = replica_specs
        self._cardinality = cardinality
        self._iterations = itertools.count()
        self._element_spec = _wrap_specs(replica_specs)

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self)

    @property
    def element_spec(self) -> Structure:
        """The spec of one step: a PerReplicaSpec per leaf with several local replicas, else the
        replica's spec (None where the input's spec is not known in advance)."""
        return self._element_spec

    def cardinality(self) -> int:
        """The number of steps per pass, or INFINITE_CARDINALITY (-1) / UNKNOWN_CARDINALITY (-2)."""
        return self._cardinality

    def __len__(self) -> int:
        raise TypeError(
            "A DistributedDataset has no len(); use cardinality() for the number of steps.")

    def reduce(self, initial_state: object, reduce_func: Callable[..., Any]) -> Any:
        raise ValueError(
            "DistributedDataset.reduce is not supported: its elements are PerReplica values, "
            "which cannot be combined outside a replica context. Iterate it and combine the "
            "steps with strategy.run and strategy.reduce.")


def _wrap_specs(replica_specs: Sequence[Structure]) -> Structure:
    if any(s is None for s in replica_specs):
        return None
    if len(replica_specs) == 1:
        return replica_specs[0]
    flats = [nest.flatten(s) for s in replica_specs]
    return nest.pack_sequence_as(replica_specs[0], [PerReplicaSpec(*leaves) for leaves in zip(*flats)])


class DistributedIterator:
    """Steps of a DistributedDataset (``tf.distribute.DistributedIterator``).

    ``next(it)`` / ``it.get_next()`` give the next step; at the end ``next`` raises
    StopIteration and ``get_next`` raises ``mpidist.errors.OutOfRangeError``.
    ``get_next_as_optional()`` returns an ``Optional`` instead of raising.
    """

    def __init__(self, dataset: DistributedDataset, epoch: int | None = None) -> None:
        self._dataset = dataset
        workers = dataset._workers
        self._workers = workers
        self._done = False
        self._spec = dataset._element_spec
        # Per replica, the flat leaves an empty batch is shaped after (a spec until data comes).
        specs = dataset._replica_specs
        self._templates: list[Leaves | None] = [None if t is None else nest.flatten(t) for t in specs]
        self._structure = next((t for t in specs if t is not None), None)
        options = dataset._options
        epoch = next(dataset._iterations) if epoch is None else epoch
        steps: Iterator[_Filled] = self._filled(dataset._local_steps(epoch))
        gpus = any(d.is_gpu for d in workers.devices)
        self._uploader = Uploader() if gpus and options.experimental_fetch_to_device else None
        if self._uploader is not None:
            steps = ((parts and self._place(parts), has_data) for parts, has_data in steps)
            if options.experimental_per_replica_buffer_size:
                steps = iterate_in_background(steps,
                                              options.experimental_per_replica_buffer_size)
        self._steps = steps

    @property
    def element_spec(self) -> Structure:
        return self._dataset.element_spec

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Element:
        try:
            return self.get_next()
        except OutOfRangeError:
            raise StopIteration from None

    def get_next(self) -> Element:
        """The next step's batches; OutOfRangeError once no replica of any worker has data."""
        value = self.get_next_as_optional()
        if not value.has_value():
            raise OutOfRangeError("End of sequence")
        return value.get_value()

    def get_next_as_optional(self) -> Optional:
        """The next step as an ``Optional``, empty once no replica of any worker has data."""
        mode = state.current_mode()
        if mode.replica_context is not None and not mode.is_default:
            raise ValueError(
                "next(iterator) should be called from outside of replica_fn. e.g. "
                "strategy.run(replica_fn, args=(next(iterator),))")
        if self._done:
            return Optional(None, self._spec)
        parts, has_data = next(self._steps)
        if self._dataset._agree_end:
            flag = np.array([1 if has_data else 0], dtype=np.int32)
            # One label for next(), get_next() and get_next_as_optional(): ranks may mix them.
            with user_call("DistributedIterator.get_next"):
                self._workers.comm.all_reduce(  # type: ignore[union-attr]  # agree_end: a comm
                    flag, "max", timeout=self._workers.timeout_seconds)
            has_data = bool(flag[0])
        if not has_data:
            self._done = True
            return Optional(None, self._spec)
        if parts is None:  # this worker is out of data, others are not
            parts = [self._empty(i) for i in range(self._workers.replicas_per_worker)]
            parts = self._place(parts) if self._uploader is not None else parts
        return Optional(self._wrap(parts), self._spec)

    # -- internals ----------------------------------------------------------------------------
    def _filled(self, raw: Iterator[Step]) -> Iterator[_Filled]:
        """Endless (parts, has_data) steps, parts being each replica's flat leaves: a replica
        without an element gets an empty batch shaped like the last element it saw (or its
        spec); once the input has ended every step is (None, False)."""
        for structure, parts in raw:
            self._structure = structure
            for i, leaves in enumerate(parts):
                if leaves is None:
                    parts[i] = self._empty(i)
                else:
                    self._templates[i] = leaves
            yield parts, True  # type: ignore[misc]  # every None was filled above
        while True:
            yield None, False

    def _empty(self, index: int) -> Leaves:
        template = self._templates[index]
        if template is None:
            raise ValueError(
                f"Local replica {index} has no batch this step and its input never produced one, "
                "so the shape of an empty batch is unknown. Give an mpidist.data.Dataset (its "
                "element_spec tells the shape) instead of a plain iterable.")
        if any(_is_scalar(leaf) for leaf in template):
            raise ValueError(
                f"Local replica {index} has no element this step, and the elements are scalars, "
                "which have no empty batch to stand in. Batch the dataset per replica: "
                "dataset.batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH)).")
        if isinstance(template[0], TensorSpec):
            return nest.flatten(empty_like_spec(template))
        return [leaf[0:0] for leaf in template]

    def _place(self, parts: Sequence[Leaves]) -> list[Leaves]:
        """Each replica's leaves copied to its device (GPU replicas only)."""
        return [self._uploader.upload(leaves, device)  # type: ignore[union-attr]  # GPU replicas: set
                for leaves, device in zip(parts, self._workers.devices)]

    def _wrap(self, parts: Sequence[Leaves]) -> Element:
        structure = self._structure
        if len(parts) == 1:
            leaves = parts[0]
        else:
            devices = self._workers.devices
            leaves = [PerReplica(components, devices) for components in zip(*parts)]
        return nest.pack_sequence_as(structure, leaves) if nest.is_nested(structure) else leaves[0]


def epoch_iterator(data: DistributedDataset | Dataset, epoch: int) -> Iterator[Element]:
    """An iterator over pass number ``epoch`` of ``data`` (a DistributedDataset or a Dataset):
    what its ``epoch``-th ``iter()`` gives, so a resumed job sees the same shuffles it would
    have seen running through."""
    if isinstance(data, DistributedDataset):
        return DistributedIterator(data, epoch)
    return iterate(data, IterationContext(iteration=epoch))


class Optional:
    """A value that may be absent (``tf.experimental.Optional``)."""

    __slots__ = ("_value", "_has_value", "_element_spec")

    def __init__(self, value: Element, element_spec: Structure = None) -> None:
        self._value, self._has_value = value, value is not None
        self._element_spec = element_spec

    @staticmethod
    def empty(element_spec: Structure = None) -> Optional:
        return Optional(None, element_spec)

    @staticmethod
    def from_value(value: Element) -> Optional:
        return Optional(value)

    def has_value(self) -> bool:
        return self._has_value

    def get_value(self) -> Element:
        if not self._has_value:
            raise InvalidArgumentError("The optional does not have a value.")
        return self._value

    @property
    def element_spec(self) -> Structure:
        return self._element_spec

    def __repr__(self) -> str:
        return f"Optional(has_value={self._has_value})"
