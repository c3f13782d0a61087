"""CommunicationOptions and CommunicationImplementation: how cross-worker collectives run.

The names, defaults, validation and ``merge`` rule are TensorFlow's
(``tf.distribute.experimental.CommunicationOptions``); RING means the MPI library's
collectives, NCCL means NCCL across ranks for GPU all-reduces.
"""

from __future__ import annotations

import enum
import numbers

__all__ = ["CommunicationImplementation", "CollectiveCommunication", "CommunicationOptions",
           "CollectiveHints"]


class CommunicationImplementation(enum.Enum):
    """Which library carries cross-worker collectives.

    AUTO lets mpidist choose (NCCL for GPU all-reduce where it loads, else RING); RING is the
    MPI library's collectives; NCCL is NCCL across ranks for GPU all-reduces (all-gather,
    broadcast and CPU values fall back to RING, as in TF).
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


CollectiveCommunication = CommunicationImplementation  # TF's deprecated alias


def _as_implementation(implementation: CommunicationImplementation | str
                       ) -> CommunicationImplementation:
    if isinstance(implementation, CommunicationImplementation):
        return implementation
    if isinstance(implementation, str):
        name = implementation.upper()
        try:
            return CommunicationImplementation(name)
        except ValueError:
            raise ValueError(f"{name!r} is not a valid CommunicationImplementation") from None
    raise ValueError(
        "Argument `implementation` must be instance of "
        "`mpidist.experimental.CommunicationImplementation`."
    )


class CommunicationOptions:
    """Options for cross-worker collectives (``tf.distribute.experimental.CommunicationOptions``).

    Args:
        bytes_per_pack: Gradients of one ``batch_reduce`` travel in packs of about this many
            bytes (greedy, in order: a pack is closed once it is larger). 0 lets the strategy
            choose (see ``DEFAULT_BYTES_PER_PACK`` in the collective ops).
        timeout_seconds: A collective that has not completed after this many seconds raises
            ``mpidist.errors.DeadlineExceededError`` naming the ranks that never arrived. None
            takes the default deadline, ``MPIDIST_COLLECTIVE_TIMEOUT`` (600 s unless set);
            unlike TF, there is no wait without limit (docs/semantics.md, "Deadlines").
        implementation: A CommunicationImplementation or its name in any case.
    """

    __slots__ = ("bytes_per_pack", "timeout_seconds", "implementation")
    bytes_per_pack: int
    timeout_seconds: float | None
    implementation: CommunicationImplementation

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 implementation: CommunicationImplementation | str =
                 CommunicationImplementation.AUTO) -> None:
        if isinstance(bytes_per_pack, bool) or not isinstance(bytes_per_pack, numbers.Integral):
            raise ValueError(
                f"Argument `bytes_per_pack` must be an integer >= 0, Received {bytes_per_pack!r}.")
        if bytes_per_pack < 0:
            raise ValueError(f"Argument `bytes_per_pack` must be >=0, Received {bytes_per_pack}.")
        if timeout_seconds is not None and (
                isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, numbers.Real)
                or not 0 < timeout_seconds < float("inf")):
            raise ValueError(
                "Argument `timeout_seconds` must be None (the default deadline, "
                "MPIDIST_COLLECTIVE_TIMEOUT) or a finite positive number of seconds, "
                f"Received {timeout_seconds!r}. To wait longer, give a larger number."
            )
        self.bytes_per_pack = int(bytes_per_pack)
        self.timeout_seconds = None if timeout_seconds is None else float(timeout_seconds)
        self.implementation = _as_implementation(implementation)

    def merge(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """A copy of these options with every non-default field of ``options`` taking over."""
        merged = CommunicationOptions(self.bytes_per_pack, self.timeout_seconds, self.implementation)
        if options is None:
            return merged
        if not isinstance(options, CommunicationOptions):
            raise ValueError(
                "options must be an instance of mpidist.experimental.CommunicationOptions, got "
                f"{options!r}."
            )
        if options.bytes_per_pack != 0:
            merged.bytes_per_pack = options.bytes_per_pack
        if options.timeout_seconds is not None:
            merged.timeout_seconds = options.timeout_seconds
        if options.implementation is not CommunicationImplementation.AUTO:
            merged.implementation = options.implementation
        return merged

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommunicationOptions):
            return NotImplemented
        return (self.bytes_per_pack, self.timeout_seconds, self.implementation) == \
            (other.bytes_per_pack, other.timeout_seconds, other.implementation)

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable

    def __repr__(self) -> str:
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, "
                f"timeout_seconds={self.timeout_seconds}, implementation={self.implementation.name})")


def CollectiveHints(bytes_per_pack: int = 0,  # noqa: N802 - TF's name
                    timeout_seconds: float | None = None) -> CommunicationOptions:
    """Deprecated TF spelling: the same options object, with the default implementation."""
    return CommunicationOptions(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds)
