"""Launching a Python program under MPI for tests, with a hard timeout.

The launcher is the mpiexec that the ``mpich`` wheel put next to the interpreter (or the
first one on PATH). MPICH's ``gforker`` process manager is preferred when present: it starts
ranks by fork and listens on nothing but loopback; the netmods are pinned to ``lo`` too, so a
test job sends no byte off this machine.

``launch(..., nodes=2)`` simulates a job on several nodes on this one machine: MPICH's Hydra
with ``-launcher fork -hosts n0,n1 -ppn N/nodes`` starts one proxy per named host (by fork, so
the names need no resolving), and MPI shares memory only among the ranks of one proxy, so the
job sees two nodes (Split_type(COMM_TYPE_SHARED) gives two groups) talking through the netmod.

``mpmd_launch([(n1, argv1), (n2, argv2), ...], ...)`` starts several programs as one job
(``mpiexec -n n1 python argv1 : -n n2 python argv2 ...``: one MPI_COMM_WORLD, ranks in the order
given), with the same environment and timeout.
"""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from mpidist.launch.leftovers import clear_stale

LOOPBACK_ENV = {
    "HYDRA_IFACE": "lo",
    "UCX_NET_DEVICES": "lo",
    "UCX_TLS": "tcp,self,sm",
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": "lo",
    "MPIR_CVAR_CH4_NETMOD": "ofi",
}


def _launcher(names, fallback):
    """The first of ``names`` next to this interpreter (the mpich wheel's), else ``fallback``
    on PATH, else None."""
    bindir = Path(sys.executable).parent
    for name in names:
        candidate = bindir / name
        if candidate.exists():
            return str(candidate)
    return shutil.which(fallback)


def find_mpiexec():
    """Path of the launcher, or None if there is none."""
    return _launcher(("mpiexec.gforker", "mpiexec"), "mpiexec")


def find_hydra():
    """Path of MPICH's Hydra launcher (which can simulate several nodes), or None."""
    return _launcher(("mpiexec.hydra", "mpiexec"), "mpiexec.hydra")


def launch(nprocs, argv, timeout, extra_env=None, nodes=1):
    """Run ``argv`` (a Python program's arguments after the interpreter) on ``nprocs`` ranks,
    spread evenly over ``nodes`` simulated nodes.

    Returns ``(returncode, output)``; a launch still running after ``timeout`` seconds is killed
    with its whole process group and reported with returncode None.
    """
    mpiexec = find_mpiexec() if nodes == 1 else find_hydra()
    if mpiexec is None:
        raise RuntimeError(
            "No mpiexec found: install the MPI extra (pip install -e '.[test]') or put your "
            "MPI's mpiexec on PATH."
        )
    if nodes == 1:
        cmd = [mpiexec, "-n", str(nprocs), sys.executable, *argv]
    else:
        if nprocs % nodes:
            raise ValueError(f"{nprocs} ranks do not spread evenly over {nodes} nodes")
        hosts = ",".join(f"n{i}" for i in range(nodes))
        cmd = [mpiexec, "-launcher", "fork", "-hosts", hosts, "-ppn", str(nprocs // nodes),
               "-n", str(nprocs), sys.executable, *argv]
    return _run_job(cmd, timeout, extra_env)


def mpmd_launch(apps, timeout, extra_env=None, mpiexec=None, launcher_args=()):
    """Run several programs as one MPI job: ``apps`` is ``[(nprocs, argv), ...]``, each
    ``argv`` a Python program's arguments after the interpreter; the ranks are numbered in the
    order of ``apps``. ``mpiexec`` is the launcher (``find_mpiexec()`` by default; gforker and
    Hydra both take the ``:`` form); ``launcher_args`` go before the first program (e.g.
    Hydra's ``-disable-auto-cleanup``).

    Returns ``(returncode, output)`` as ``launch`` does (returncode None after a timeout).
    """
    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None:
        raise RuntimeError(
            "No mpiexec found: install the MPI extra (pip install -e '.[test]') or put your "
            "MPI's mpiexec on PATH."
        )
    if not apps:
        raise ValueError("mpmd_launch needs at least one (nprocs, argv) program")
    cmd = [mpiexec, *launcher_args]
    for i, (nprocs, argv) in enumerate(apps):
        cmd += ([":"] if i else []) + ["-n", str(nprocs), sys.executable, *argv]
    return _run_job(cmd, timeout, extra_env)


def _run_job(cmd, timeout, extra_env):
    """Run the launcher command ``cmd`` with the loopback environment plus ``extra_env``;
    ``(returncode, output)``, returncode None when it was killed (with its whole process
    group) after ``timeout`` seconds."""
    env = dict(os.environ)
    env.update(LOOPBACK_ENV)
    env.update(extra_env or {})
    # Killed ranks of earlier launches (these tests kill many) leave MPICH's shared memory in
    # /dev/shm, named after the job's pid: once pids wrap around, a new job attaches to a dead
    # one's segment and hangs in MPI_Init. The guard clears them for users; plain launches here
    # do it with the same code.
    clear_stale()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
