"""mpidist.core.waiting: every wait ends, by its condition or by its deadline with a report."""

import logging
import queue
import threading
import time

import pytest

from mpidist import config as config_module
from mpidist.config import Config
from mpidist.core import waiting
from mpidist.errors import DeadlineExceededError


@pytest.fixture
def settings(monkeypatch):
    """Replace the process-wide Config for one test: ``settings(wait_timeout=0.2, ...)``."""

    def use(**fields):
        monkeypatch.setattr(config_module, "_config", Config(**fields))

    return use


def test_returns_at_once_when_ready():
    assert waiting.wait_until(lambda: True, "nothing", "nobody", timeout=0.01) is True


def test_ends_when_the_condition_turns_true():
    start = time.monotonic()
    end = start + 0.1
    assert waiting.wait_until(lambda: time.monotonic() >= end, "a clock", "time", timeout=5)
    assert time.monotonic() - start < 2


def test_deadline_raises_a_report_naming_what_whom_since_and_the_setting(settings):
    settings(wait_timeout=0.2)
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError) as info:
        waiting.wait_until(lambda: False, "the reply to a read of 'w'", "parameter server 1")
    waited = time.monotonic() - start
    assert 0.2 <= waited < 2
    message = str(info.value)
    for part in ("the reply to a read of 'w'", "parameter server 1", "since ",
                 "MPIDIST_WAIT_TIMEOUT", "0.2 s"):
        assert part in message, (part, message)


@pytest.mark.parametrize("kind", [waiting.WaitKind.LOCAL, waiting.WaitKind.COLLECTIVE,
                                  waiting.WaitKind.CONSTRUCTION])
def test_each_kind_takes_its_own_setting(settings, kind):
    settings(**{kind[0]: 0.05})
    with pytest.raises(DeadlineExceededError, match=kind[1]):
        waiting.wait_until(lambda: False, "x", "y", kind=kind)


def test_an_explicit_timeout_wins_and_is_named():
    with pytest.raises(DeadlineExceededError, match="the timeout argument"):
        waiting.wait_until(lambda: False, "x", "y", timeout=0.05)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_deadline_is_finite_and_positive(bad):
    with pytest.raises(ValueError, match="finite positive number of seconds"):
        waiting.wait_until(lambda: False, "x", "y", timeout=bad)


def test_progress_restarts_the_deadline():
    counter = [0]
    start = time.monotonic()

    def ready():
        counter[0] += 1  # keeps moving for 0.5 s, longer than the 0.2 s deadline
        return time.monotonic() - start > 0.5

    assert waiting.wait_until(ready, "work", "a worker", timeout=0.2, progress=lambda: counter[0])


def test_no_progress_ends_the_wait():
    with pytest.raises(DeadlineExceededError):
        waiting.wait_until(lambda: False, "work", "a worker", timeout=0.1, progress=lambda: 7)


def test_on_expiry_may_end_a_grace_period_quietly():
    seen = []
    assert waiting.wait_until(lambda: False, "x", "y", timeout=0.05,
                              on_expiry=lambda wait, now: seen.append(wait.timeout)) is False
    assert seen == [0.05]


def test_a_stalled_wait_is_logged_once_before_its_deadline(settings, caplog):
    settings(wait_timeout=0.4, stall_warning_seconds=0.1)
    with caplog.at_level(logging.WARNING, logger="mpidist"):
        with pytest.raises(DeadlineExceededError):
            waiting.wait_until(lambda: False, "a stuck thing", "someone")
    stalls = [r for r in caplog.records if "still waiting" in r.getMessage()]
    assert len(stalls) == 1 and "a stuck thing" in stalls[0].getMessage()


def test_condition_pause_wakes_on_notify():
    cond = threading.Condition()
    flag = []

    def later():
        time.sleep(0.05)
        with cond:
            flag.append(1)
            cond.notify_all()

    threading.Thread(target=later).start()
    with cond:
        assert waiting.wait_until(lambda: bool(flag), "flag", "a thread", timeout=5,
                                  pause=cond.wait, poll=10)


def test_event_thread_and_queue_helpers():
    event = threading.Event()
    threading.Timer(0.05, event.set).start()
    waiting.wait_event(event, "event", "a timer", timeout=5)
    thread = threading.Thread(target=time.sleep, args=(0.05,), name="sleeper")
    thread.start()
    waiting.join_thread(thread, timeout=5)
    assert not thread.is_alive()
    items = queue.SimpleQueue()
    threading.Timer(0.05, items.put, args=("x",)).start()
    assert waiting.get_item(items, "an item", "a timer", timeout=5) == "x"


def test_helpers_are_bounded_too():
    with pytest.raises(DeadlineExceededError, match="thread 'stuck'"):
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait, name="stuck", daemon=True)
        thread.start()
        try:
            waiting.join_thread(thread, timeout=0.05)
        finally:
            stop.set()
    with pytest.raises(DeadlineExceededError):
        waiting.get_item(queue.Queue(), "an item", "nobody", timeout=0.05)
    with pytest.raises(DeadlineExceededError):
        waiting.wait_event(threading.Event(), "an event", "nobody", timeout=0.05)


@pytest.mark.parametrize("variable", ["MPIDIST_COLLECTIVE_TIMEOUT", "MPIDIST_WAIT_TIMEOUT",
                                      "MPIDIST_CONSTRUCTION_TIMEOUT", "MPIDIST_PS_TIMEOUT",
                                      "MPIDIST_PS_CONNECT_TIMEOUT"])
@pytest.mark.parametrize("raw", ["off", "never", "inf", "0", "-3", "soon"])
def test_a_deadline_cannot_be_turned_off_from_the_environment(monkeypatch, variable, raw):
    monkeypatch.setenv(variable, raw)
    with pytest.warns(RuntimeWarning, match="finite positive number of seconds"):
        config = Config.from_env()
    field = {"MPIDIST_COLLECTIVE_TIMEOUT": "collective_timeout",
             "MPIDIST_WAIT_TIMEOUT": "wait_timeout",
             "MPIDIST_CONSTRUCTION_TIMEOUT": "construction_timeout",
             "MPIDIST_PS_TIMEOUT": "ps_timeout",
             "MPIDIST_PS_CONNECT_TIMEOUT": "ps_connect_timeout"}[variable]
    value = getattr(config, field)
    assert value == getattr(Config(), field) and 0 < value < float("inf")


def test_a_deadline_can_be_raised_from_the_environment(monkeypatch):
    monkeypatch.setenv("MPIDIST_COLLECTIVE_TIMEOUT", "7200")
    assert Config.from_env().collective_timeout == 7200.0
