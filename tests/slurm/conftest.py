"""A real single-node Slurm on localhost for the tests in this folder.

The session fixture ``slurm`` installs Slurm with apt when it is missing (Debian's
``slurmd slurmctld slurm-client munge``), starts a cluster with ``slurm/local-cluster.sh``
in a temporary directory, yields a :class:`LocalSlurm` to submit jobs with, and stops exactly
the daemons it started. The tests skip, saying why, only where Slurm cannot be had: not root,
no apt-get, or the installation failed. A cluster that does not start is a failure.

Every client call has a timeout; jobs are polled with ``scontrol show job`` against a deadline
and cancelled when it passes, so nothing here can hang.
"""

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = ROOT / "slurm"
LOCAL_CLUSTER = SLURM_DIR / "local-cluster.sh"
PROGRAMS = Path(__file__).parent / "programs"
sys.path.insert(0, str(ROOT / "tests"))

from mpi_launch import LOOPBACK_ENV, launch  # noqa: E402

PACKAGES = ["slurmd", "slurmctld", "slurm-client", "munge"]
COMMANDS = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel",
            "sinfo"]
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
PORTS = (16817, 16818)
FAKE_GPUS = 4
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
# Inherited from a job this test session might itself run in: they would confuse the clients.
INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "OMPI_",
                      "HYDRA_", "MPIEXEC_")


def _missing_commands():
    return [c for c in COMMANDS if shutil.which(c, path=SEARCH_PATH) is None]


def _tail(text, lines=25):
    return "\n".join(text.strip().splitlines()[-lines:])


def install_slurm():
    """None when Slurm's commands are there (installing them if needed), else why not."""
    if not _missing_commands():
        return None
    if os.geteuid() != 0:
        return f"Slurm is not installed ({', '.join(_missing_commands())} missing) and this " \
               "is not root, so apt-get cannot install it"
    apt = shutil.which("apt-get", path=SEARCH_PATH)
    if apt is None:
        return "Slurm is not installed and there is no apt-get to install it with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", *PACKAGES]
    output = ""
    for attempt in range(2):
        if attempt:  # a stale package index is the usual reason
            subprocess.run([apt, "update"], env=env, capture_output=True, timeout=600)
        try:
            proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return "apt-get install of Slurm took more than 900 s"
        output = proc.stdout + proc.stderr
        if proc.returncode == 0 and not _missing_commands():
            return None
    return f"`{' '.join(install[1:])}` failed:\n{_tail(output)}"


def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_ports():
    """16817/16818 unless taken (another test cluster running beside this one)."""
    if all(_port_free(p) for p in PORTS):
        return PORTS
    ports = []
    while len(ports) < 2:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    return tuple(ports)


def can_make_devices(directory):
    """Whether character devices can be made here (the fake GPUs need them)."""
    probe = Path(directory) / "mknod-probe"
    try:
        os.mknod(probe, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        return False
    probe.unlink()
    return True


def clean_environ():
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), SEARCH_PATH])
    return env


class JobTimeout(AssertionError):
    pass


class LocalSlurm:
    """The running test cluster and the client calls the tests make."""

    def __init__(self, directory, env, gpus):
        self.directory = Path(directory)
        self.conf = self.directory / "slurm.conf"
        self.gpus = gpus
        self.env = {**env, "SLURM_CONF": str(self.conf)}
        # What every job gets: this interpreter, loopback-only MPI traffic.
        self.job_env = {**self.env, **LOOPBACK_ENV, "PYTHON": sys.executable}

    # -- client commands ----------------------------------------------------------------------
    def command(self, args, timeout=60, env=None, check=True):
        proc = subprocess.run(args, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n"
                                 f"{proc.stdout}{proc.stderr}")
        return proc

    def job(self, jobid):
        """``scontrol show job -o`` as a dict (JobState, Restarts, ExitCode, ...)."""
        out = self.command(["scontrol", "show", "job", "-o", str(jobid)]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def sbatch(self, script, args=(), options=(), workdir=None, env=None):
        """Submit ``script`` (from workdir, with logs/ made there); returns the job id."""
        workdir = Path(workdir)
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        cmd = ["sbatch", "--parsable", f"--chdir={workdir}", *options, str(script),
               *map(str, args)]
        proc = subprocess.run(cmd, env={**self.job_env, **(env or {})}, cwd=workdir,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"sbatch failed: {proc.stdout}{proc.stderr}"
        return int(proc.stdout.strip().split(";")[0])

    def wait(self, jobid, timeout, done=None, logs=None):
        """Poll until ``done(info)`` (default: a terminal state); on timeout cancel the job and
        fail with its state and logs."""
        done = done or (lambda info: info.get("JobState") in TERMINAL_STATES)
        deadline = time.monotonic() + timeout
        info = {}
        while time.monotonic() < deadline:
            info = self.job(jobid)
            if done(info):
                return info
            time.sleep(0.25)
        self.command(["scancel", str(jobid)], check=False)
        text = "\n".join(f"--- {p}\n{p.read_text(errors='replace')}" for p in logs or ()
                         if p.exists())
        raise JobTimeout(f"job {jobid} not done after {timeout} s (state {info.get('JobState')},"
                         f" reason {info.get('Reason')}); cancelled.\n{text}")

    def srun(self, args, timeout=90, env=None):
        """Run ``srun ARGS`` (its own allocation); returns (exit code, stdout+stderr). A step
        still running after ``timeout`` is killed and its job cancelled."""
        name = f"mpidist-test-{uuid.uuid4().hex[:8]}"
        proc = subprocess.Popen(["srun", f"--job-name={name}", *map(str, args)],
                                env={**self.job_env, **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.command(["scancel", f"--name={name}"], check=False)
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            raise JobTimeout(f"srun {' '.join(map(str, args))} still running after {timeout} s; "
                             f"cancelled. Output so far:\n{out}") from None
        return proc.returncode, out


def _daemon_pids(directory):
    files = [directory / "munge" / "munged.pid", directory / "slurmctld.pid",
             directory / "slurmd.pid"]
    return {f.name: int(f.read_text().strip()) for f in files if f.exists()}


def _alive(pid):
    try:
        return Path(f"/proc/{pid}").exists() and \
            "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = install_slurm()
    if reason is not None:
        pytest.skip(f"no Slurm: {reason}")
    directory = tmp_path_factory.mktemp("slurm")
    gpus = FAKE_GPUS if can_make_devices(directory) else 0
    ctld_port, d_port = choose_ports()
    env = clean_environ()
    start_env = {**env, "LOCAL_SLURM_GPUS": str(gpus), "LOCAL_SLURM_CTLD_PORT": str(ctld_port),
                 "LOCAL_SLURM_D_PORT": str(d_port)}
    proc = subprocess.run(["bash", str(LOCAL_CLUSTER), "start", str(directory)], env=start_env,
                          capture_output=True, text=True, timeout=180)
    pids = _daemon_pids(directory)
    if proc.returncode != 0:
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop", str(directory)], env=env,
                       capture_output=True, timeout=180)
        pytest.fail(f"slurm/local-cluster.sh start failed ({proc.returncode}):\n"
                    f"{proc.stdout}{proc.stderr}", pytrace=False)
    try:
        yield LocalSlurm(directory, env, gpus)
    finally:
        stop = subprocess.run(["bash", str(LOCAL_CLUSTER), "stop", str(directory)], env=env,
                              capture_output=True, text=True, timeout=180)
        left = {name: pid for name, pid in pids.items() if _alive(pid)}
        assert stop.returncode == 0 and not left, \
            f"stopping the test cluster failed (still running: {left}):\n{stop.stdout}{stop.stderr}"


SHM = Path("/dev/shm")


def _mapped_mpich_segments():
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            names.update(re.findall(r"/dev/shm/(mpich_\S+)", maps.read_text()))
        except OSError:
            pass
    return names


@pytest.fixture(autouse=True)
def remove_leaked_mpich_segments():
    """Ranks ended by MPI_Abort (the launch-check test) leave MPICH's /dev/shm/mpich_* files
    behind; remove those that appeared during the test and that no live process maps."""
    before = set(SHM.glob("mpich_*")) if SHM.is_dir() else set()
    yield
    leaked = (set(SHM.glob("mpich_*")) - before) if SHM.is_dir() else set()
    deadline = time.monotonic() + 3
    while leaked:
        in_use = _mapped_mpich_segments()
        for path in [p for p in leaked if p.name not in in_use]:
            path.unlink(missing_ok=True)
            leaked.discard(path)
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)


@pytest.fixture(scope="session")
def mpiexec_reference():
    """examples/digits_mlp.py on 2 ranks under the mpich wheel's mpiexec: the model every
    Slurm run of the same training (slurm/train.py included) must end with, bit for bit."""
    from jobs import json_lines

    digits = ROOT / "examples" / "digits_mlp.py"
    args = ["--strategy", "multi-worker", "--replicas", "1", "--loop", "fit", "--json"]
    code, out = launch(2, [str(digits), *args], 180)
    assert code == 0, f"mpiexec run failed (None = hang):\n{out}"
    lines = json_lines(out)
    assert len(lines) == 1, out
    assert lines[0]["replicas"] == 2 and lines[0]["accuracy"] > 0.95
    return lines[0]
