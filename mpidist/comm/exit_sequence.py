"""How a rank leaves at the end of its program: one exit sequence, in a fixed order.

Several parts of mpidist act when a program ends, and their order matters. Left to ``atexit``
they would run in the reverse order of their registration, which follows the order in which
the program happened to build things. Here each step names its phase, and the phases run in
this order, once, from one ``atexit`` handler:

1. ``abort``: end the job now, with a report (a rank whose meeting of all ranks never
   completed: MPI cannot finalize with a collective pending).
2. ``meet``: the collective farewells. Each communicator's exit meeting (ranks that ran a
   different number of collectives meet here instead of leaving a peer waiting), a
   parameter-server chief's shutdown of its job.
3. ``leave``: goodbyes to the peers that watch this rank for a death. After the last
   collective: a rank that said goodbye sooner could die unseen inside one.
4. ``depart``: a rank that never met the others tells them it has left.
5. ``end``: leave without MPI_Finalize where a step asked for it (a rank of the job is lost,
   and MPI_Finalize would wait for it forever); else mpi4py's MPI_Finalize follows, after
   every Python ``atexit`` handler.

Steps of one phase run in the order they were added. The handler is registered when this
module is first imported (``import mpidist`` does not import it; building anything that
talks to other ranks does), so the program's own ``atexit`` handlers, registered later, run
before it: a collective in one of them still meets the other ranks.
"""

import atexit
import sys
import threading
from collections.abc import Callable

__all__ = ["PHASES", "at_exit", "run_exit_sequence"]

PHASES = ("abort", "meet", "leave", "depart", "end")

_steps: dict[str, list[Callable[[], None]]] = {phase: [] for phase in PHASES}
_lock = threading.Lock()
_ran = threading.Event()


def at_exit(phase: str, step: Callable[[], None]) -> None:
    """Run ``step()`` in ``phase`` of this rank's exit sequence (one of ``PHASES``)."""
    if phase not in _steps:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}.")
    with _lock:
        _steps[phase].append(step)


def run_exit_sequence() -> None:
    """Run every step, phase by phase (once: a second call does nothing). A step that raises
    is reported on stderr and the sequence goes on: the goodbyes and the end must still come.
    A step may end the process (``os._exit``, MPI_Abort): the later ones then never run."""
    if _ran.is_set():
        return
    _ran.set()
    for phase in PHASES:
        with _lock:
            steps = list(_steps[phase])
        for step in steps:
            try:
                step()
            except Exception as err:  # noqa: BLE001 - the remaining steps must still run
                sys.stderr.write(f"[mpidist] the exit step {getattr(step, '__qualname__', step)} "
                                 f"({phase}) failed: {type(err).__name__}: {err}\n")


atexit.register(run_exit_sequence)
