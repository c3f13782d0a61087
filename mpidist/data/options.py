"""The small value types of input distribution: dataset options (auto-shard policy) and the
``tf.distribute`` input types (InputOptions, InputReplicationMode, InputContext, RunOptions)."""

from __future__ import annotations

import collections
import enum
import numbers
from collections.abc import Sequence

from mpidist.core.sharding import per_replica_batch_size
from mpidist.core.signatures import accepts

__all__ = [
    "AutoShardPolicy",
    "DistributeOptions",
    "Options",
    "InputReplicationMode",
    "InputOptions",
    "InputContext",
    "RunOptions",
]


class AutoShardPolicy(enum.IntEnum):
    """How ``experimental_distribute_dataset`` splits a dataset across workers (section 7.2).

    AUTO: FILE where the pipeline reads files with at least one file per worker, else DATA.
    FILE: each worker reads its own files (the sorted file names ``w, w + W, ...`` of the first
    reader found walking up from the output); a pipeline without a reader has its *source*
    elements sharded instead. DATA: every worker reads everything and keeps its sub-batches of
    each global batch. OFF: no sharding; every worker reads the whole dataset. HINT:
    ``shard(SHARD_HINT, SHARD_HINT)`` placeholders become ``shard(num_workers, worker_index)``.
    """

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


class DistributeOptions:
    """``options.experimental_distribute``: the auto-shard policy (``num_devices`` is TF's
    unused-here knob, kept for code that sets it)."""

    __slots__ = ("_auto_shard_policy", "num_devices")

    def __init__(self) -> None:
        self._auto_shard_policy: AutoShardPolicy | None = None
        self.num_devices: int | None = None

    def __setattr__(self, name: str, value: object) -> None:
        if name not in ("_auto_shard_policy", "num_devices", "auto_shard_policy"):
            raise _unknown_option(self, name, ("auto_shard_policy", "num_devices"))
        object.__setattr__(self, name, value)

    @property
    def auto_shard_policy(self) -> AutoShardPolicy:
        return AutoShardPolicy.AUTO if self._auto_shard_policy is None else self._auto_shard_policy

    @auto_shard_policy.setter
    def auto_shard_policy(self, policy: AutoShardPolicy) -> None:
        if not isinstance(policy, AutoShardPolicy):
            raise TypeError(
                f"auto_shard_policy must be an mpidist.data.experimental.AutoShardPolicy "
                f"(AUTO, FILE, DATA, OFF or HINT), got {policy!r}.")
        self._auto_shard_policy = policy


def _unknown_option(options: object, name: str, known: Sequence[str]) -> ValueError:
    # A misspelt option that was silently stored would leave the setting the user meant at its
    # default. tf.data raises AttributeError here; a ValueError (a bad argument, with the
    # fields there are) keeps AttributeError for Python's own meaning.
    where = ""
    if name == "auto_shard_policy" and isinstance(options, Options):
        where = " It lives in options.experimental_distribute.auto_shard_policy."
    return ValueError(
        f"Cannot set the option {name!r} on {type(options).__name__}: it has only "
        f"{', '.join(known)}.{where}")


class Options:
    """``tf.data.Options``: settings that apply to a whole dataset (``dataset.with_options``)."""

    __slots__ = ("experimental_distribute", "deterministic")

    def __init__(self) -> None:
        self.experimental_distribute = DistributeOptions()
        self.deterministic: bool | None = None

    def __setattr__(self, name: str, value: object) -> None:
        if name not in Options.__slots__:
            raise _unknown_option(self, name, Options.__slots__)
        if name == "experimental_distribute" and not isinstance(value, DistributeOptions):
            raise TypeError(
                f"experimental_distribute must be a DistributeOptions, got {value!r}; set its "
                "fields instead (options.experimental_distribute.auto_shard_policy = ...).")
        if name == "deterministic" and value is not None and not isinstance(value, bool):
            raise TypeError(f"deterministic must be True, False or None, got {value!r}.")
        object.__setattr__(self, name, value)

    @accepts(other="Options")
    def merge(self, other: Options) -> Options:
        """These options with every field that ``other`` sets taking precedence."""
        merged = Options()
        for source in (self, other):
            if source.experimental_distribute._auto_shard_policy is not None:
                merged.experimental_distribute._auto_shard_policy = (
                    source.experimental_distribute._auto_shard_policy)
            if source.experimental_distribute.num_devices is not None:
                merged.experimental_distribute.num_devices = source.experimental_distribute.num_devices
            if source.deterministic is not None:
                merged.deterministic = source.deterministic
        return merged

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Options)
                and self.experimental_distribute.auto_shard_policy
                == other.experimental_distribute.auto_shard_policy
                and self.deterministic == other.deterministic)

    __hash__ = None  # type: ignore[assignment]  # unhashable: Python's idiom, which mypy rejects

    def __repr__(self) -> str:
        return (f"Options(auto_shard_policy={self.experimental_distribute.auto_shard_policy.name}, "
                f"deterministic={self.deterministic})")


class InputReplicationMode(enum.Enum):
    """One input pipeline per worker (PER_WORKER) or per replica (PER_REPLICA)."""

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


# The tuple's type name is the public class's (repr shows it), which mypy's name-match rejects.
_InputOptionsBase = collections.namedtuple("InputOptions", [  # type: ignore[name-match]
    "experimental_fetch_to_device",
    "experimental_replication_mode",
    "experimental_place_dataset_on_device",
    "experimental_per_replica_buffer_size",
])


class InputOptions(_InputOptionsBase):
    """How distributed input is placed (``tf.distribute.InputOptions``, section 7.4).

    Args:
        experimental_fetch_to_device: copy each replica's batch to its device ahead of use
            (None means True). False leaves batches in host memory.
        experimental_replication_mode: ``InputReplicationMode.PER_WORKER`` (default) or
            ``PER_REPLICA`` (``distribute_datasets_from_function`` of MirroredStrategy only).
        experimental_place_dataset_on_device: accepted for compatibility; needs PER_REPLICA and
            ``experimental_fetch_to_device=False``. Pipelines always run on the host.
        experimental_per_replica_buffer_size: how many steps are copied to the devices ahead of
            use (0 copies on demand).
    """

    __slots__ = ()

    def __new__(cls, experimental_fetch_to_device: bool | None = None,
                experimental_replication_mode: InputReplicationMode | str = InputReplicationMode.PER_WORKER,
                experimental_place_dataset_on_device: bool = False,
                experimental_per_replica_buffer_size: int = 1) -> InputOptions:
        if experimental_fetch_to_device is None:
            experimental_fetch_to_device = True
        for name, flag in (("experimental_fetch_to_device", experimental_fetch_to_device),
                           ("experimental_place_dataset_on_device",
                            experimental_place_dataset_on_device)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r} of type "
                                f"{type(flag).__name__}.")
        try:
            experimental_replication_mode = InputReplicationMode(experimental_replication_mode)
        except ValueError:
            raise ValueError(
                f"experimental_replication_mode must be an mpidist.InputReplicationMode, got "
                f"{experimental_replication_mode!r}."
            ) from None
        size = experimental_per_replica_buffer_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"experimental_per_replica_buffer_size must be an int >= 0 (0 disables "
                f"prefetching to the device), got {size!r}."
            )
        if (experimental_place_dataset_on_device
                and experimental_replication_mode is not InputReplicationMode.PER_REPLICA):
            raise ValueError(
                "When `experimental_place_dataset_on_device` is set for dataset placement, you "
                "must also specify `PER_REPLICA` for the replication mode"
            )
        if (experimental_place_dataset_on_device and experimental_fetch_to_device
                and experimental_replication_mode is InputReplicationMode.PER_REPLICA):
            raise ValueError(
                "`experimental_place_dataset_on_device` can not be set to True when "
                "experimental_fetch_to_device is True and replication mode is set to "
                "`PER_REPLICA`"
            )
        return super().__new__(cls, bool(experimental_fetch_to_device),
                               experimental_replication_mode,
                               bool(experimental_place_dataset_on_device), size)


class InputContext:
    """What ``distribute_datasets_from_function`` tells ``dataset_fn``: which input pipeline it
    builds, out of how many, and how many replicas consume the global batch."""

    __slots__ = ("_num_input_pipelines", "_input_pipeline_id", "_num_replicas_in_sync")

    def __init__(self, num_input_pipelines: int = 1, input_pipeline_id: int = 0,
                 num_replicas_in_sync: int = 1) -> None:
        for name, value, least in (("num_input_pipelines", num_input_pipelines, 1),
                                   ("input_pipeline_id", input_pipeline_id, 0),
                                   ("num_replicas_in_sync", num_replicas_in_sync, 1)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"InputContext's {name} must be an int >= {least}, got {value!r}.")
        if input_pipeline_id >= num_input_pipelines:
            raise ValueError(
                f"InputContext's input_pipeline_id must be below num_input_pipelines "
                f"({num_input_pipelines}), got {input_pipeline_id}.")
        self._num_input_pipelines = num_input_pipelines
        self._input_pipeline_id = input_pipeline_id
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size // num_replicas_in_sync``; ValueError if it does not divide."""
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, numbers.Integral):
            raise TypeError(
                f"global_batch_size must be an int, got {global_batch_size!r} of type "
                f"{type(global_batch_size).__name__}.")
        if global_batch_size <= 0:
            raise ValueError(f"global_batch_size must be greater than zero, got {global_batch_size}.")
        return per_replica_batch_size(int(global_batch_size), self._num_replicas_in_sync)

    def __str__(self) -> str:
        return (f"mpidist.InputContext(input pipeline id {self._input_pipeline_id}, "
                f"total: {self._num_input_pipelines})")

    __repr__ = __str__


class RunOptions(collections.namedtuple("RunOptions", [
        "experimental_enable_dynamic_batch_size",
        "experimental_bucketizing_dynamic_shape",
        "experimental_xla_options"])):
    """``tf.distribute.RunOptions``: TPU-only knobs in TF; accepted and ignored by ``run``."""

    __slots__ = ()

    def __new__(cls, experimental_enable_dynamic_batch_size: bool = True,
                experimental_bucketizing_dynamic_shape: bool = False,
                experimental_xla_options: object = None) -> RunOptions:
        return super().__new__(cls, experimental_enable_dynamic_batch_size,
                               experimental_bucketizing_dynamic_shape, experimental_xla_options)
