"""The replica-thread runner of MirroredStrategy after Ctrl-C: a real SIGINT while a replica
still runs, in a Python process of its own (a scenario); the runner's other failures are
tests/unit/test_replica_threads.py."""

import signal
import subprocess
import sys
import textwrap


def test_interrupted_run_leaves_the_strategy_usable():
    """Ctrl-C (a real SIGINT) while a replica is still running: the next run must not queue
    behind the stuck replica thread (it would hang), and the stuck replica, when it wakes, must
    not touch the new run."""
    script = textwrap.dedent("""
        import os, signal, threading, numpy as np, mpidist
        s = mpidist.MirroredStrategy(["/cpu:0", "/cpu:1"])
        gate = threading.Event()
        def slow():
            if mpidist.get_replica_context().replica_id_in_sync_group == 1:
                gate.wait(120)
            return mpidist.get_replica_context().merge_call(lambda st: 1)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            s.run(slow)
        except KeyboardInterrupt:
            print("interrupted")
        rid = lambda: mpidist.get_replica_context().replica_id_in_sync_group
        print("sum", s.reduce("SUM", s.run(lambda: np.float64(rid() + 1)), None))
        gate.set()
    """)
    # SIGINT back to its default in the child: one started in the background of a shell without
    # job control (CI under `cmd &`) inherits it ignored, and the Ctrl-C would never arrive.
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["interrupted", "sum", "3.0"]
