"""How a parameter-server rank polls (issue 24, PS speed): a few plain polls after each message
before it yields the core, and a receive that finds its message within them builds no bounded
wait; one that does not still goes through ``wait_until`` with its deadline."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpidist.errors import DeadlineExceededError
from mpidist.ps import transport as transport_module
from mpidist.ps.transport import QUICK_POLLS, Backoff, Transport


@given(quick=st.integers(0, 40), calls=st.integers(0, 80), again=st.integers(0, 80))
def test_backoff_yields_only_after_its_quick_polls_each_time_it_is_reset(quick, calls, again):
    yields = []
    backoff = Backoff(spin_seconds=60.0, quick_polls=quick)  # spinning for the whole test
    original = transport_module.os.sched_yield
    transport_module.os.sched_yield = lambda: yields.append(1)
    try:
        for _ in range(calls):
            backoff.pause()
        assert len(yields) == max(0, calls - quick)
        backoff.reset()
        yields.clear()
        for _ in range(again):
            backoff.pause()
        assert len(yields) == max(0, again - quick)
    finally:
        transport_module.os.sched_yield = original


class _Late(Transport):
    """A transport whose message arrives at the ``arrives_at``-th poll (never: None)."""

    rank, size = 0, 2

    def __init__(self, arrives_at: int | None) -> None:
        self.arrives_at = arrives_at
        self.polls = 0

    def try_recv(self, channel, source=-1, tag=-1):
        self.polls += 1
        if self.arrives_at is not None and self.polls >= self.arrives_at:
            return (1, 7, b"reply")
        return None


@pytest.mark.parametrize("arrives_at", [1, QUICK_POLLS // 2, QUICK_POLLS])
def test_a_message_within_the_quick_polls_builds_no_bounded_wait(monkeypatch, arrives_at):
    def no_wait(*args, **kwargs):
        raise AssertionError("wait_until was built for a message already there")

    monkeypatch.setattr(transport_module, "wait_until", no_wait)
    late = _Late(arrives_at)
    assert late.recv(0, 1, 7, "the reply", "rank 1", 5.0) == (1, 7, b"reply")
    assert late.polls == arrives_at


@pytest.mark.parametrize("arrives_at", [QUICK_POLLS + 1, QUICK_POLLS + 50])
def test_a_later_message_is_still_received_through_the_bounded_wait(arrives_at):
    late = _Late(arrives_at)
    assert late.recv(0, 1, 7, "the reply", "rank 1", 5.0) == (1, 7, b"reply")
    assert late.polls == arrives_at


def test_a_message_that_never_comes_is_still_a_deadline_naming_the_wait():
    with pytest.raises(DeadlineExceededError, match="the reply to a read.*rank 1.*MY_SETTING"):
        _Late(None).recv(0, 1, 7, "the reply to a read", "rank 1", 0.05, "MY_SETTING")
