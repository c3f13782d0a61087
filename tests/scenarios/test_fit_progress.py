"""mpidist.fit's progress display, in a Python process of its own training with
tests/unit/test_fit.py's ``train``: one line per epoch when the output is not a terminal,
nothing at verbose=0, tqdm's bar on a terminal (a pty). Each test launches Python, so they are
scenarios; fit itself is tests/unit/test_fit.py."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

UNIT = Path(__file__).resolve().parents[1] / "unit"


# -- progress display ---------------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_fit import train
    from replicas import mirrored
    train(mirrored(2), epochs=2, verbose={verbose!r})
""")


def _run_script(verbose, tty):
    code = SCRIPT.format(tests=str(UNIT), verbose=verbose)
    if not tty:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout + proc.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=follower, stdout=follower,
                            stderr=follower, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_epoch_lines_when_not_a_terminal():
    out = _run_script("auto", tty=False)
    assert out.count("Epoch 1/2 - loss: ") == 1 and out.count("Epoch 2/2 - loss: ") == 1
    assert "step/s" not in out and "it/s" not in out
    assert _run_script(0, tty=False) == ""


def test_progress_bar_on_a_terminal():
    out = _run_script(1, tty=True)
    assert "Epoch 1/2" in out and "Epoch 2/2" in out
    assert "4/4" in out and "step" in out  # tqdm's counter over the epoch's 4 steps
