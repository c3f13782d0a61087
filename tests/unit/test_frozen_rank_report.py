"""The deadline's report names the ranks whose heartbeat went silent: the progress board says
where each rank is, the heartbeat whether its process runs at all (a rank stopped inside a
collective has entered it like the others)."""

import pickle
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from mpidist.comm.board import PULSE_SECONDS, RankProgress
from mpidist.comm.failure_reports import FROZEN_AFTER_SECONDS, missing_ranks_report

SEQ = 7


def topology(size):
    return SimpleNamespace(size=size, hosts=[f"n{r // 2}" for r in range(size)],
                           node_ranks=list(range(size)))


def frozen_named(report):
    return {int(part.split(" ")[0]) for part in report.split("rank ")[1:]
            if "has shown no sign of life" in part.split(";")[0]}


silences = st.one_of(st.just(-1.0), st.floats(0.0, 2.0), st.floats(3.5, 600.0))


@given(st.lists(st.tuples(silences, st.booleans()), min_size=2, max_size=8))
def test_exactly_the_silent_ranks_are_named_frozen(rows):
    known = {rank: RankProgress(SEQ if entered else SEQ - 1, "all_reduce",
                                SEQ - 1, silent, 1000 + rank)
             for rank, (silent, entered) in enumerate(rows)}
    report = missing_ranks_report(known, True, SEQ, "all_reduce", topology(len(rows)))
    silent = {r for r, (s, _) in enumerate(rows) if s > FROZEN_AFTER_SECONDS}
    assert frozen_named(report) == silent, report
    for rank in silent:
        assert f"rank {rank} (pid {1000 + rank} on n{rank // 2}) has shown no sign of life" \
            in report
    late = [r for r, (_, entered) in enumerate(rows) if not entered]
    if late:
        assert report.startswith(f"Ranks that never arrived: [{', '.join(map(str, late))}]")
    elif silent:
        assert report.startswith(f"Every rank entered it, and ranks "
                                 f"[{', '.join(map(str, sorted(silent)))}] stopped responding")
    else:
        assert "a peer stopped responding inside the collective" in report


def test_a_heartbeat_missed_by_a_busy_rank_is_not_frozen():
    """A rank that computes still beats (a thread, every PULSE_SECONDS): the threshold leaves
    room for many late beats before a rank is called frozen."""
    assert FROZEN_AFTER_SECONDS >= 10 * PULSE_SECONDS
    known = {0: RankProgress(SEQ, "all_reduce", SEQ - 1, 0.1, 10),
             1: RankProgress(SEQ, "all_reduce", SEQ - 1, FROZEN_AFTER_SECONDS - 0.5, 11)}
    report = missing_ranks_report(known, True, SEQ, "all_reduce", topology(2))
    assert "no sign of life" not in report


def test_a_row_travels_between_nodes_with_its_heartbeat_and_pid():
    row = RankProgress(3, "barrier", 2, 12.5, 4242)
    assert pickle.loads(pickle.dumps(row)) == row
    assert (row.silent, row.pid) == (12.5, 4242)
