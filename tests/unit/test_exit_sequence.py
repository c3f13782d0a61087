"""A rank's exit sequence: steps run by phase (abort, meet, leave, depart, end) whatever order
they were added in, after the program's own atexit handlers; a step that fails is reported and
the rest still run; a step added during the sequence to a later phase runs in it. Checked in a
fresh interpreter, whose real exit runs the sequence."""

import random
import subprocess
import sys
import textwrap

import pytest

from mpidist.comm.exit_sequence import PHASES, at_exit

PROGRAM = textwrap.dedent("""
    import atexit, random, sys
    from mpidist.comm.exit_sequence import PHASES, at_exit

    order = [(phase, i) for phase in PHASES for i in range(3)]
    random.Random(int(sys.argv[1])).shuffle(order)
    for phase, i in order:
        at_exit(phase, lambda phase=phase, i=i: print(phase, i, flush=True))

    def fail():
        raise OSError("the peer is gone")

    at_exit("leave", fail)
    at_exit("meet", lambda: at_exit("end", lambda: print("added during meet", flush=True)))
    atexit.register(lambda: print("program's handler", flush=True))
""")


@pytest.mark.parametrize("seed", range(4))
def test_steps_run_by_phase_after_the_programs_handlers(seed):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(seed)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "program's handler"
    phases = [line.split()[0] for line in lines[1:] if line.split()[0] in PHASES]
    assert phases == sorted(phases, key=PHASES.index), lines
    assert len(phases) == 3 * len(PHASES)
    added = [(phase, i) for phase in PHASES for i in range(3)]
    random.Random(seed).shuffle(added)  # the program's order of at_exit calls
    for phase in PHASES:  # within a phase, in the order added
        ran = [int(line.split()[1]) for line in lines if line.split()[0] == phase]
        assert ran == [i for p, i in added if p == phase], (phase, lines)
    assert lines[-1] == "added during meet"
    assert "(leave) failed: OSError: the peer is gone" in done.stderr, done.stderr


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match=r"phase must be one of \('abort', 'meet', 'leave', "
                                         r"'depart', 'end'\), got 'finalize'"):
        at_exit("finalize", lambda: None)
