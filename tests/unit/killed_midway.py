"""Killing a Python program with SIGKILL in the middle of something (a write, a save): what a
time limit's KILL or a lost node does. For the tests that check what such a death leaves."""

import subprocess
import sys
import time


def kill_when_it_says(code, marker, linger=0.1):
    """Run ``code`` in a new interpreter, SIGKILL it ``linger`` s after it prints ``marker``."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        said = proc.stdout.readline().strip()
        assert said == marker, f"the program said {said!r} before {marker!r}"
        time.sleep(linger)
    finally:
        proc.kill()
        proc.wait(timeout=30)  # wait-ok: a killed process ends at once
