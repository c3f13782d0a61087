"""What a BackupAndRestore directory holds, in one line for a log: ``DIR (step K)``.

The batch scripts print it when a job ends without finishing (``mpidist backup DIR``), so the
log says which step a resubmission will resume after. It reads the directory's newest
checkpoint (checksums verified) and never changes anything.
"""

from __future__ import annotations

import os

from mpidist.training.checkpoint_format import read_checkpoint_file, read_state

__all__ = ["describe_backup", "ITERATIONS_KEY"]

ITERATIONS_KEY = "optimizer/iterations"  # the optimizer's step count: the global step


def describe_backup(directory: str | os.PathLike[str]) -> str:
    """``DIR (step K)``, where K is the training step the backup resumes after;
    ``DIR (a backup of unknown step)`` where its newest checkpoint cannot be read; ``DIR (no
    backup)`` where there is none."""
    directory = os.fspath(directory)
    try:
        state = read_state(directory)
    except ValueError:  # a damaged state file: the checkpoint files may still be there
        return f"{directory} (a backup of unknown step)"
    if state is None or state.latest is None:
        return f"{directory} (no backup)"
    try:
        _, arrays = read_checkpoint_file(state.latest)
    except (OSError, ValueError):
        return f"{directory} (a backup of unknown step)"
    if ITERATIONS_KEY not in arrays:  # not a BackupAndRestore checkpoint
        return f"{directory} (a backup of unknown step)"
    return f"{directory} (step {int(arrays[ITERATIONS_KEY])})"
