"""The typed parameter-server protocol (issue 24, item 4): every message a frozen dataclass that
round-trips through its one encoder; Tag, Outcome and Status IntEnums defined once in wire.py;
a ps failure recognised by its type (PSUnavailableError, carrying the ps rank), never by the
text of a message; serving below the strategy; the fault-injection seam unset by default."""

import dataclasses
import enum
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpidist
from mpidist.errors import UnavailableError
from mpidist.experimental.coordinator import PSUnavailableError
from mpidist.ps import messages, wire
from mpidist.ps.failures import PSUnavailableError as FailuresPSUnavailableError
from mpidist.ps.faults import Fault, Faults
from mpidist.ps.serialization import dumps_error, dumps_payload, loads_error, pack_frames
from mpidist.ps.serving import run_task
from mpidist.ps.worker import ResourceRef

from ps_cluster import ps_job, ps_settings

ints = st.integers(min_value=0, max_value=2**62)


# -- enums ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [wire.Tag, wire.Outcome, wire.Status, wire.Op])
def test_wire_enums_are_int_enums_with_distinct_values(kind):
    assert issubclass(kind, enum.IntEnum)
    assert len({int(member) for member in kind}) == len(kind)


def test_each_control_message_has_its_own_tag_and_every_tag_a_message():
    kinds = [messages.Work, messages.Result, messages.Hello, messages.Heartbeat,
             messages.Shutdown, messages.Bye]
    assert sorted(k.TAG for k in kinds) == sorted(wire.Tag)


# -- control messages ------------------------------------------------------------------------------
arrays = st.builds(lambda n, seed: np.random.default_rng(seed).normal(size=n),
                   st.integers(0, 3000), st.integers(0, 2**32 - 1))
works = st.builds(messages.Work, ints, ints, ints, st.none() | st.binary(max_size=64),
                  st.tuples(arrays, st.integers(), st.builds(ResourceRef, ints)),
                  st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                  max_size=3),
                  ints, st.booleans())
controls = st.one_of(
    works,
    st.builds(messages.Result, ints, ints, st.sampled_from(wire.Outcome), st.binary(max_size=300)),
    st.builds(messages.Hello, ints, ints),
    st.builds(messages.Heartbeat),
    st.builds(messages.Shutdown, st.booleans()),
    st.builds(messages.Bye, ints),
)


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b) and a.dtype == b.dtype
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, memoryview) or isinstance(b, memoryview):
        return bytes(a) == bytes(b)
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None)
@given(controls)
def test_control_messages_round_trip_through_their_one_encoder(message):
    buffer = bytearray(messages.encode(message))   # what the transport delivers
    back = messages.decode(message.TAG, buffer)
    assert type(back) is type(message)
    for field in dataclasses.fields(message):
        assert _same(getattr(message, field.name), getattr(back, field.name)), field.name


@pytest.mark.parametrize("message", [messages.Hello(1, 0), messages.Shutdown(), messages.Bye(2),
                                     messages.Heartbeat(), messages.Result(1, 0, wire.Outcome.OK, b"")])
def test_messages_are_frozen(message):
    for field in dataclasses.fields(message):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, field.name, 0)
    # No new attribute either (slots; Python 3.11's frozen+slots says so with a TypeError).
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        message.anything = 0


def test_decode_refuses_an_unknown_tag_and_encode_a_foreign_object():
    with pytest.raises(ValueError, match="tag 99 is not a control-channel tag"):
        messages.decode(99, b"")
    with pytest.raises(TypeError, match="is not a control message"):
        messages.encode((1, 0, 7))  # the positional tuples of old
    with pytest.raises(TypeError, match="a WORK message holds tuple, not a Work"):
        messages.decode(wire.Tag.WORK, bytearray(pack_frames(dumps_payload((1, 0, 7)))))


# -- requests and replies ----------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(op=st.sampled_from(wire.Op), var_id=ints, reply_tag=ints,
       params=st.lists(st.floats(allow_nan=False), max_size=4).map(tuple),
       ids=st.none() | st.lists(st.integers(-2**63, 2**63 - 1), max_size=6),
       data=st.none() | st.integers(0, 3 * wire.INLINE_BYTES).map(lambda n: bytes(range(256)) * (n // 256)),
       extra=st.integers(-2**63, 2**63 - 1))
def test_requests_round_trip(op, var_id, reply_tag, params, ids, data, extra):
    first, second = wire.encode_request(op, var_id, reply_tag, params, ids, data, extra)
    request = wire.decode_request(bytearray(first))
    assert (request.op, request.var_id, request.reply_tag, request.extra) == \
        (op, var_id, reply_tag, extra)
    assert tuple(request.params) == params
    assert list(request.ids) == (ids or [])
    nbytes = len(data) if data is not None else 0
    assert request.nbytes == nbytes
    sent = request.data if request.data is not None else second
    assert (second is None) == (nbytes <= wire.INLINE_BYTES)
    assert bytes(sent if sent is not None else b"") == (data or b"")
    with pytest.raises(AttributeError):  # slotted: no field that the wire does not carry
        request.extra_field = 1


@settings(max_examples=60, deadline=None)
@given(status=st.sampled_from(wire.Status),
       data=st.none() | st.integers(0, 3 * wire.INLINE_BYTES).map(lambda n: b"\x07" * n))
def test_replies_round_trip(status, data):
    first, second = wire.encode_reply(status, data)
    reply = wire.decode_reply(bytearray(first))
    assert reply.status is status
    assert reply.nbytes == len(data or b"")
    got = reply.data if reply.data is not None else second
    assert bytes(got if got is not None else b"") == (data or b"")


# -- typed failures ------------------------------------------------------------------------------------
def test_ps_unavailable_error_is_one_class_with_its_public_name():
    assert PSUnavailableError is FailuresPSUnavailableError
    assert issubclass(PSUnavailableError, UnavailableError)
    assert f"{PSUnavailableError.__module__}.{PSUnavailableError.__qualname__}" == \
        "mpidist.ps.coordinator.PSUnavailableError"   # as tracebacks print it


def test_ps_unavailable_error_travels_with_its_rank_task_and_message():
    error = PSUnavailableError("parameter server /job:ps/replica:0/task:1 (rank 2) is gone",
                               ps_rank=2, task="/job:ps/replica:0/task:1")
    error.add_note("a note")
    back = loads_error(dumps_error(error, "/job:worker/replica:0/task:0 (rank 3)"))
    assert type(back) is PSUnavailableError
    assert (back.ps_rank, back.task, str(back)) == (2, "/job:ps/replica:0/task:1", str(error))
    assert back.__notes__[0] == "a note" and "Traceback on /job:worker" in back.__notes__[-1]
    plain = pickle.loads(pickle.dumps(PSUnavailableError("m")))
    assert (plain.ps_rank, plain.task, str(plain)) == (None, None, "m")


@mpidist.function
def _raise(kind, message):
    if kind == "typed":
        raise PSUnavailableError(message, ps_rank=1, task="/job:ps/replica:0/task:0")
    raise UnavailableError(message)


def test_the_coordinator_knows_a_ps_failure_by_its_type_not_its_text():
    """A plain UnavailableError whose text names a parameter server is an ordinary closure
    error (raised once, then scheduling works); a PSUnavailableError with any text is fatal
    and the job has lost its rank."""
    with ps_job(num_ps=1, num_workers=1) as (_, coordinator):
        lookalike = "parameter server /job:ps/replica:0/task:0 (rank 1) did not answer within 1 s"
        coordinator.schedule(_raise, args=("plain", lookalike))
        with pytest.raises(UnavailableError) as info:
            coordinator.join()
        assert not isinstance(info.value, PSUnavailableError)
        assert coordinator.lost == {} and coordinator.fatal is None
        coordinator.join()  # raised once: cleared
        coordinator.schedule(_raise, args=("typed", "no ps named here"))
        with pytest.raises(PSUnavailableError) as fatal:
            coordinator.join()
        assert (str(fatal.value), fatal.value.ps_rank) == ("no ps named here", 1)
        assert coordinator.lost == {1: "a parameter server that did not answer"}
        with pytest.raises(PSUnavailableError):
            coordinator.done()    # fatal: every later call


# -- serving and the fault seam --------------------------------------------------------------------------
def test_run_task_serves_ps_and_workers_only():
    with ps_job(num_ps=1, num_workers=1) as (strategy, _):
        runtime = strategy.extended.runtime
        with pytest.raises(ValueError, match=r"is the chief: it coordinates, it does not serve"):
            run_task(runtime, strategy)


def test_the_fault_seam_is_unset_without_faults(monkeypatch):
    ps_settings(monkeypatch, MPIDIST_PS_FAULTS="")
    with ps_job(num_ps=1, num_workers=1) as (strategy, _):
        assert strategy.extended.runtime.faults is None
    assert Faults.none().or_none() is None
    seam = Faults((Fault("closure", 2, "preempt"),))
    assert seam.or_none() is seam
