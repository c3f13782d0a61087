"""Every blocking wait in the library goes through ``mpidist.core.waiting`` (issue 22, item 1).

The scan reads every module of the package (and kernels/) and fails on a call that can block
without a deadline of ours: a thread's, process's or event's ``wait``/``join``, a queue's
``get``, a lock's ``acquire`` without timeout, an MPI blocking call (point-to-point, probe,
barrier, collective, request waits), a subprocess run without timeout, and a ``time.sleep``
inside a loop (a hand-made poll). Such a call belongs in ``mpidist/core/waiting.py``; where
it cannot (a blocking MPI collective bounded by the watchdog, an idle thread's loop for the
process's lifetime), its line says why: ``# wait-ok: <reason>`` (a whole module, only with a
reason that holds for all of it: ``# wait-ok-file: <reason>``).

The scanner itself is tested on snippets, so a rule that stops matching fails here too.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRIMITIVE = ROOT / "mpidist" / "core" / "waiting.py"
WAIT_OK = re.compile(r"#\s*wait-ok:\s*\S")
# A whole module may be exempt only for a reason that holds for all of it (the benchmarks'
# raw MPI baselines are the thing measured).
WAIT_OK_FILE = re.compile(r"^#\s*wait-ok-file:\s*\S", re.MULTILINE)

# MPI's blocking calls (mpi4py's buffer and pickle forms). The buffer forms are capitalized.
MPI_BLOCKING = {
    "Recv", "Send", "Ssend", "Sendrecv", "Probe", "Mprobe", "Barrier", "Wait", "Waitall",
    "Waitany", "Waitsome", "Bcast", "Reduce", "Allreduce", "Allgather", "Allgatherv", "Gather",
    "Gatherv", "Scatter", "Scatterv", "Alltoall", "Alltoallv", "Reduce_scatter", "Scan",
    "Exscan",
}
MPI_PICKLED = {"recv", "send", "ssend", "sendrecv", "probe", "barrier", "bcast", "reduce",
               "allreduce", "allgather", "gather", "scatter", "alltoall"}
COMM_RECEIVER = re.compile(r"comm|COMM_WORLD|world|control", re.IGNORECASE)
QUEUE_RECEIVER = re.compile(r"^q$|_q$|queue|jobs|inbox|mailbox", re.IGNORECASE)
THREAD_RECEIVER = re.compile(r"thread|process|proc|child|dispatcher|coordinator|server|worker",
                             re.IGNORECASE)
SUBPROCESS_BLOCKING = {"run", "call", "check_call", "check_output"}


def _receiver(node: ast.Call) -> str:
    func = node.func
    return ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""


def _has_timeout(node: ast.Call) -> bool:
    return any(k.arg == "timeout" for k in node.keywords)


def _is_blocking(node: ast.Call, in_loop: bool) -> str | None:
    """Why ``node`` can block without our deadline, or None."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return None
    name, receiver = func.attr, _receiver(node)
    if name in ("wait", "wait_for"):
        return f"{receiver}.{name}() waits"
    if name == "join":
        numeric = any(isinstance(a, ast.Constant) and isinstance(a.value, int | float)
                      and not isinstance(a.value, bool) for a in node.args)
        waits = not node.args or numeric or _has_timeout(node) or THREAD_RECEIVER.search(receiver)
        text = isinstance(func.value, ast.Constant) or receiver in ("os.path", "shlex")
        return f"{receiver}.join() waits for a thread or process" if waits and not text else None
    if name == "get" and (QUEUE_RECEIVER.search(receiver) or _has_timeout(node)
                          or any(k.arg == "block" for k in node.keywords)):
        return f"{receiver}.get() waits for an item"
    if name == "acquire" and not node.args and not _has_timeout(node):
        return f"{receiver}.acquire() without timeout"
    if name in MPI_BLOCKING:
        return f"MPI {name} blocks"
    if name in MPI_PICKLED and COMM_RECEIVER.search(receiver) and not _has_timeout(node):
        return f"MPI {name} blocks"
    if receiver == "subprocess" and name in SUBPROCESS_BLOCKING and not _has_timeout(node):
        return f"subprocess.{name} without timeout"
    if name == "communicate" and not _has_timeout(node):
        return "communicate() without timeout"
    if receiver == "time" and name == "sleep" and in_loop:
        return "time.sleep in a loop: a hand-made poll"
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.loops = 0
        self.found: list[tuple[int, str]] = []
        self.exempt = 0

    def _loop(self, node: ast.AST) -> None:
        self.loops += 1
        self.generic_visit(node)
        self.loops -= 1

    visit_While = visit_For = _loop  # noqa: N815 - ast.NodeVisitor's names

    def visit_Call(self, node: ast.Call) -> None:
        why = _is_blocking(node, self.loops > 0)
        if why is not None:
            span = self.lines[node.lineno - 1:(node.end_lineno or node.lineno)]
            if any(WAIT_OK.search(line) for line in span):
                self.exempt += 1
            else:
                self.found.append((node.lineno, why))
        self.generic_visit(node)


def scan(source: str) -> tuple[list[tuple[int, str]], int]:
    """``(unbounded calls as (line, why), number of exempted calls)`` in ``source``."""
    scanner = _Scanner(source.splitlines())
    scanner.visit(ast.parse(source))
    return scanner.found, scanner.exempt


def library_files() -> list[Path]:
    files = sorted((ROOT / "mpidist").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    return [f for f in files if f != PRIMITIVE]


def test_no_blocking_call_bypasses_the_bounded_wait():
    problems, exempt = [], 0
    for path in library_files():
        source = path.read_text()
        if WAIT_OK_FILE.search(source):
            continue
        found, skipped = scan(source)
        exempt += skipped
        lines = source.splitlines()
        problems += [f"{path.relative_to(ROOT)}:{line}: {why}: {lines[line - 1].strip()}"
                     for line, why in found]
    assert not problems, (
        "Blocking calls that bypass mpidist.core.waiting (use wait_until / wait_event / "
        "join_thread / get_item, or say why on the line with `# wait-ok: <reason>`):\n"
        + "\n".join(problems))
    # The exemptions stay few: each is a wait that cannot be polled (see the module docstring).
    assert exempt < 40, f"{exempt} `# wait-ok` exemptions: move waits into mpidist.core.waiting"


def test_the_library_uses_the_primitive():
    users = [p for p in library_files() if "mpidist.core.waiting" in p.read_text()]
    assert len(users) >= 3, users


@pytest.mark.parametrize("snippet", [
    "cond.wait()",
    "cond.wait(0.1)",
    "cond.wait_for(lambda: done)",
    "event.wait()",
    "thread.join()",
    "self._thread.join(timeout)",
    "worker.thread.join(5)",
    "coordinator.join()",
    "jobs.get()",
    "q.get()",
    "self._q.get()",
    "self.queue.get(timeout=1)",
    "lock.acquire()",
    "comm.Recv(buf, 0, 7)",
    "comm.Barrier()",
    "request.Wait()",
    "MPI.Request.Waitall(requests)",
    "self._comm.Allreduce(a, b, op)",
    "control.recv(tag=5)",
    "COMM_WORLD.bcast(obj)",
    "subprocess.run(['ls'])",
    "child.communicate()",
    "while True:\n    time.sleep(0.1)",
    "for _ in range(9):\n    time.sleep(1)",
])
def test_the_scanner_finds_unbounded_waits(snippet):
    found, _ = scan(snippet)
    assert found, snippet


@pytest.mark.parametrize("snippet", [
    "', '.join(parts)",
    "os.path.join(a, b)",
    "sep.join(names)",
    "shlex.join(command)",
    "config.get('x')",
    "x.get()",
    "options.get(name, None)",
    "lock.acquire(timeout=3)",
    "comm.barrier(timeout=5)",
    "subprocess.run(['ls'], timeout=5)",
    "time.sleep(1)",
    "comm.Iallreduce(a, b, op)",
    "cond.wait()  # wait-ok: the reason",
])
def test_the_scanner_accepts_bounded_or_non_blocking_calls(snippet):
    found, _ = scan(snippet)
    assert not found, (snippet, found)
