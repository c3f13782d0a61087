"""The MPI thread level mpidist asks for: MPIDIST_MPI_THREAD_LEVEL (default serialized), never
below the program's own choice. Each case runs in a fresh interpreter that imports mpi4py's
package but never starts MPI (mpi4py.rc is read only at ``from mpi4py import MPI``): 11 Python
launches, so a scenario; Config's reading of the setting is tests/unit/test_mpi_thread_level.py."""

import os
import subprocess
import sys

import pytest

PROGRAM = """
import mpi4py
{before}
from mpidist.comm.mpi import _request_thread_level
_request_thread_level()
print(mpi4py.rc.thread_level)
"""


def chosen(before="", **env):
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MPIDIST_MPI_THREAD_LEVEL", "MPI4PY_RC_THREAD_LEVEL")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", PROGRAM.format(before=before)], env=environ,
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def test_default_is_serialized():
    assert chosen() == "serialized"


@pytest.mark.parametrize("level", ["single", "funneled", "serialized", "multiple"])
def test_the_setting_picks_the_level(level):
    assert chosen(MPIDIST_MPI_THREAD_LEVEL=level) == level


def test_default_leaves_mpi4pys_choice():
    assert chosen(MPIDIST_MPI_THREAD_LEVEL="default") == "multiple"


def test_a_higher_level_chosen_by_the_program_wins():
    assert chosen("mpi4py.rc.thread_level = 'multiple'") == "multiple"
    assert chosen(MPI4PY_RC_THREAD_LEVEL="multiple") == "multiple"


def test_a_lower_level_chosen_by_the_program_gives_way_to_what_mpidist_needs():
    assert chosen("mpi4py.rc.thread_level = 'funneled'") == "serialized"
    assert chosen("mpi4py.rc.thread_level = 'funneled'",
                  MPIDIST_MPI_THREAD_LEVEL="single") == "funneled"
