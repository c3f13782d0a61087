"""Checkpoint calls made on some ranks only (``if rank == 0: checkpoint.save(path)``) under
MultiWorkerMirroredStrategy: every rank gets the collective-mismatch error naming the
checkpoint call, nothing is written, no rank hangs, and saving on every rank then works.

Each test launches tests/failure_programs/checkpoint_on_chief_only.py under ``mpiexec -n N``
(N in 2 and 4) with a hard timeout.
"""

import re
import time
from pathlib import Path

import pytest
from mpi_launch import launch

PROGRAM = Path(__file__).parent / "failure_programs" / "checkpoint_on_chief_only.py"
LAUNCH_TIMEOUT = 60  # a launch still running after this is a hang
QUICK = 30


@pytest.mark.parametrize("what,call,prefix", [("save", "Checkpoint.save", "ck"),
                                              ("manager", "CheckpointManager.save", "ckpt")])
@pytest.mark.parametrize("nprocs", [2, 4])
def test_save_on_the_chief_only_names_the_call_on_every_rank(tmp_path, nprocs, what, call,
                                                             prefix):
    start = time.monotonic()
    code, out = launch(nprocs, [str(PROGRAM), str(tmp_path), what], LAUNCH_TIMEOUT)
    elapsed = time.monotonic() - start
    assert code is not None, f"hung: still running after {LAUNCH_TIMEOUT} s:\n{out}"
    assert code == 0, f"the ranks caught the error and carried on, yet exited {code}:\n{out}"
    assert elapsed < QUICK, f"took {elapsed:.1f} s:\n{out}"
    assert "must not happen" not in out, out
    others = ", ".join(str(r) for r in range(1, nprocs))
    pattern = (r"Ranks issued different collectives \(seen on rank (\d+)\): ranks \[0\] are at "
               rf"collective #\d+ barrier\(\) in {re.escape(call)}; ranks \[{others}\] are at "
               r"collective #\d+ all_reduce\(op=sum, dtype=float64, shape=\[3\]\) in "
               r"Strategy\.reduce")
    caught = re.findall(r"caught on rank (\d+): InvalidArgumentError: ([^\n]*)", out)
    assert sorted(int(r) for r, _ in caught) == list(range(nprocs)), out
    for rank, line in caught:
        match = re.match(pattern, line)
        assert match, f"unexpected message on rank {rank} (pattern {pattern!r}):\n{line}"
        assert match.group(1) == rank, line
        assert f"{call} and Strategy.reduce are collective calls" in line, line
    for rank in range(nprocs):
        # Nothing was written and the counter was not advanced ...
        assert f"rank {rank}: files after the error: [], save_counter 0" in out, out
        # ... and the job goes on: saving on every rank writes the first checkpoint.
        assert f"rank {rank}: saved on every rank: {prefix}-1, files ['checkpoint', " \
            f"'{prefix}-1']" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", f"{prefix}-1"]
