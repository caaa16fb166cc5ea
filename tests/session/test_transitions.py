"""The session's transition table, tested from the table itself.

Every (state, command) entry of `_TRANSITIONS` has expected outcomes here, keyed the
same way: the events, the commands the session answers with, and the state after.
Every pair that is not in the table must raise ProtocolError and close the session.
A new table entry without cases here fails `test_every_transition_has_cases`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire import codec, errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.session import (ActiveConsumerChanged, ClientSession, Connected, ConnectionFailed,
                                ConsumerClosedByBroker, CorruptMessage, EndOfTopic,
                                PongReceived, ProducerClosedByBroker, RequestDone, RequestFailed,
                                SendFailed, SendReceipt, State, _TRANSITIONS)

from .wire import (ALL_TYPES, SUB_FIELD, T, command, connected_frame, decode_all, decode_one, frame,
                   message_frame, normalized, session_in)

MSG_ID = pb.MessageIdData(ledgerId=4, entryId=9)
AUTH = {"auth_method_name": "token", "auth_data": lambda: b"t0k"}


@dataclass
class Case:
    """One frame fed to a session in the table's state, and what must follow."""
    name: str
    data: bytes
    events: list[Any]
    state: State | None = None  # None: the state is unchanged
    sends: list[int] = field(default_factory=list)  # command types answered, in order
    check: Callable[[ClientSession, list[pb.BaseCommand]], None] | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _sub(kind: int, **fields):
    """The sub-command a frame of `kind` carries, as the session will hand it on."""
    return getattr(command(kind, **fields), SUB_FIELD[kind])


def _auth_answer(session, sent):
    (answer,) = sent
    assert answer.authResponse.response.auth_method_name == "token"
    assert answer.authResponse.response.auth_data == b"t0k"
    assert answer.authResponse.protocol_version == 21


def _auth_answer_without_auth(session, sent):
    (answer,) = sent
    assert answer.authResponse.response.auth_method_name == "none"
    assert answer.authResponse.response.auth_data == b""


def _raised_frame_limit(session, sent):
    assert session.max_message_size == 16 << 20
    assert session.server_version == "broker-2" and session.protocol_version == 19
    # a frame as big as the broker's limit is now allowed (only its header is fed)
    assert session.receive_data(((16 << 20) + 8).to_bytes(4, "big")) == []


def _default_limits(session, sent):
    assert session.max_message_size == codec.DEFAULT_MAX_MESSAGE_SIZE
    with pytest.raises(errors.FrameTooLargeError):
        session.receive_data(((16 << 20) + 8).to_bytes(4, "big"))


def _lookup(kind_response, **fields):
    return _sub(T.LOOKUP_RESPONSE, response=kind_response, **fields)


LOOKUP = pb.CommandLookupTopicResponse
META = pb.CommandPartitionedTopicMetadataResponse
RECEIPT = pb.CommandSendReceipt

_C, _D = State.CONNECTING, State.CONNECTED

EXPECTED: dict[tuple[State, int], list[Case]] = {
    (_C, T.CONNECTED): [
        Case("plain", connected_frame(), [Connected("broker-1", 21, codec.DEFAULT_MAX_MESSAGE_SIZE)], _D,
             check=_default_limits),
        Case("max_message_size", connected_frame("broker-2", 19, 16 << 20), [Connected("broker-2", 19, 16 << 20)],
             _D, check=_raised_frame_limit),
        Case("zero max_message_size keeps the default", connected_frame(max_message_size=0),
             [Connected("broker-1", 21, codec.DEFAULT_MAX_MESSAGE_SIZE)], _D),
    ],
    (_C, T.ERROR): [
        Case("auth refused", frame(T.ERROR, error=pb.AuthenticationError, message="bad token"),
             [ConnectionFailed(errors.AuthenticationError("bad token", code=pb.AuthenticationError))],
             State.CLOSED),
        Case("unknown code", frame(T.ERROR, error=pb.ServiceNotReady, message="later"),
             [ConnectionFailed(errors.ServiceNotReadyError("later", code=pb.ServiceNotReady))], State.CLOSED),
    ],
    (_C, T.AUTH_CHALLENGE): [
        Case("answers with auth data", frame(T.AUTH_CHALLENGE), [], sends=[T.AUTH_RESPONSE],
             check=_auth_answer, options=AUTH),
        Case("no auth configured", frame(T.AUTH_CHALLENGE), [], sends=[T.AUTH_RESPONSE],
             check=_auth_answer_without_auth),
    ],
    (_C, T.PING): [Case("pong", frame(T.PING), [], sends=[T.PONG])],
    (_D, T.AUTH_CHALLENGE): [
        Case("refresh", frame(T.AUTH_CHALLENGE), [], sends=[T.AUTH_RESPONSE], check=_auth_answer, options=AUTH),
    ],
    (_D, T.PING): [Case("pong", frame(T.PING), [], sends=[T.PONG])],
    (_D, T.PONG): [Case("pong received", frame(T.PONG), [PongReceived()])],
    (_D, T.SUCCESS): [Case("done", frame(T.SUCCESS, request_id=5), [RequestDone(5, _sub(T.SUCCESS, request_id=5))])],
    (_D, T.ERROR): [
        Case("typed", frame(T.ERROR, request_id=6, error=pb.TopicNotFound, message="gone"),
             [RequestFailed(6, errors.TopicNotFoundError("gone", code=pb.TopicNotFound))]),
        Case("producer fenced", frame(T.ERROR, request_id=7, error=pb.ProducerFenced, message="f"),
             [RequestFailed(7, errors.ProducerFencedError("f", code=pb.ProducerFenced))]),
    ],
    (_D, T.PRODUCER_SUCCESS): [
        Case("ready", frame(T.PRODUCER_SUCCESS, request_id=8, producer_name="p-1"),
             [RequestDone(8, _sub(T.PRODUCER_SUCCESS, request_id=8, producer_name="p-1"))]),
        Case("explicitly ready", frame(T.PRODUCER_SUCCESS, request_id=8, producer_name="p", producer_ready=True),
             [RequestDone(8, _sub(T.PRODUCER_SUCCESS, request_id=8, producer_name="p", producer_ready=True))]),
        Case("waiting for exclusive access",
             frame(T.PRODUCER_SUCCESS, request_id=8, producer_name="p", producer_ready=False), []),
    ],
    (_D, T.LOOKUP_RESPONSE): [
        Case("connect", frame(T.LOOKUP_RESPONSE, request_id=9, response=LOOKUP.Connect, brokerServiceUrl="pulsar://b:1"),
             [RequestDone(9, _lookup(LOOKUP.Connect, request_id=9, brokerServiceUrl="pulsar://b:1"))]),
        Case("redirect", frame(T.LOOKUP_RESPONSE, request_id=9, response=LOOKUP.Redirect, authoritative=True),
             [RequestDone(9, _lookup(LOOKUP.Redirect, request_id=9, authoritative=True))]),
        Case("failed", frame(T.LOOKUP_RESPONSE, request_id=9, response=LOOKUP.Failed, error=pb.TopicNotFound,
                             message="no such topic"),
             [RequestFailed(9, errors.TopicNotFoundError("no such topic", code=pb.TopicNotFound))]),
        Case("failed without text", frame(T.LOOKUP_RESPONSE, request_id=9, response=LOOKUP.Failed),
             [RequestFailed(9, errors.UnknownServerError("lookup failed", code=0))]),
        Case("error without Failed", frame(T.LOOKUP_RESPONSE, request_id=9, error=pb.ServiceNotReady),
             [RequestFailed(9, errors.ServiceNotReadyError("lookup failed", code=pb.ServiceNotReady))]),
    ],
    (_D, T.PARTITIONED_METADATA_RESPONSE): [
        Case("partitions", frame(T.PARTITIONED_METADATA_RESPONSE, request_id=10, partitions=4),
             [RequestDone(10, _sub(T.PARTITIONED_METADATA_RESPONSE, request_id=10, partitions=4))]),
        Case("failed", frame(T.PARTITIONED_METADATA_RESPONSE, request_id=10, response=META.Failed,
                             error=pb.AuthorizationError, message="no"),
             [RequestFailed(10, errors.AuthorizationError("no", code=pb.AuthorizationError))]),
        Case("error without Failed", frame(T.PARTITIONED_METADATA_RESPONSE, request_id=10, error=pb.MetadataError),
             [RequestFailed(10, errors.MetadataError("metadata failed", code=pb.MetadataError))]),
    ],
    (_D, T.GET_LAST_MESSAGE_ID_RESPONSE): [
        Case("id", frame(T.GET_LAST_MESSAGE_ID_RESPONSE, request_id=11, last_message_id=MSG_ID),
             [RequestDone(11, _sub(T.GET_LAST_MESSAGE_ID_RESPONSE, request_id=11, last_message_id=MSG_ID))]),
    ],
    (_D, T.ACK_RESPONSE): [
        Case("without request id: nothing to answer", frame(T.ACK_RESPONSE, consumer_id=3), []),
        Case("done", frame(T.ACK_RESPONSE, consumer_id=3, request_id=12),
             [RequestDone(12, _sub(T.ACK_RESPONSE, consumer_id=3, request_id=12))]),
        Case("failed", frame(T.ACK_RESPONSE, consumer_id=3, request_id=12, error=pb.TransactionConflict,
                             message="conflict"),
             [RequestFailed(12, errors.TransactionConflictError("conflict", code=pb.TransactionConflict))]),
    ],
    (_D, T.GET_TOPICS_OF_NAMESPACE_RESPONSE): [
        Case("topics", frame(T.GET_TOPICS_OF_NAMESPACE_RESPONSE, request_id=13, topics=["a", "b"]),
             [RequestDone(13, _sub(T.GET_TOPICS_OF_NAMESPACE_RESPONSE, request_id=13, topics=["a", "b"]))]),
    ],
    (_D, T.GET_SCHEMA_RESPONSE): [
        Case("schema", frame(T.GET_SCHEMA_RESPONSE, request_id=14, schema_version=b"\x01"),
             [RequestDone(14, _sub(T.GET_SCHEMA_RESPONSE, request_id=14, schema_version=b"\x01"))]),
        Case("failed", frame(T.GET_SCHEMA_RESPONSE, request_id=14, error_code=pb.TopicNotFound, error_message="none"),
             [RequestFailed(14, errors.TopicNotFoundError("none", code=pb.TopicNotFound))]),
    ],
    (_D, T.SEND_RECEIPT): [
        Case("the broker's encoder", codec.encode_send_receipt(2, 30, 34, 4, 9),
             [SendReceipt(2, 30, 34, 4, 9)]),
        Case("no highest sequence id", frame(T.SEND_RECEIPT, producer_id=2, sequence_id=30, message_id=MSG_ID),
             [SendReceipt(2, 30, 30, 4, 9)]),
        Case("a message id with more than ledger and entry (read through protobuf)",
             frame(T.SEND_RECEIPT, producer_id=2, sequence_id=30,
                   message_id=pb.MessageIdData(ledgerId=4, entryId=9, partition=1, batch_index=3)),
             [SendReceipt(2, 30, 30, 4, 9)]),
        Case("a duplicate's id", frame(T.SEND_RECEIPT, producer_id=2, sequence_id=30, highest_sequence_id=31,
                                       message_id=pb.MessageIdData(ledgerId=2**64 - 1, entryId=2**64 - 1)),
             [SendReceipt(2, 30, 31, -1, -1)]),
    ],
    (_D, T.SEND_ERROR): [
        Case("typed", frame(T.SEND_ERROR, producer_id=2, sequence_id=31, error=pb.ChecksumError, message="crc"),
             [SendFailed(2, 31, errors.ChecksumServerError("crc", code=pb.ChecksumError))]),
    ],
    (_D, T.MESSAGE): [
        Case("arrives", message_frame(), ["MessageArrived"]),
        Case("without payload", frame(T.MESSAGE, consumer_id=3, message_id=MSG_ID),
             [CorruptMessage(3, MSG_ID, errors.CodecError("x"))]),
        Case("bad checksum", message_frame()[:-1] + b"?", [CorruptMessage(3, pb.MessageIdData(ledgerId=1, entryId=2),
                                                                          errors.ChecksumMismatchError(0, 1))]),
    ],
    (_D, T.CLOSE_PRODUCER): [
        Case("closed", frame(T.CLOSE_PRODUCER, producer_id=2), [ProducerClosedByBroker(2)]),
    ],
    (_D, T.CLOSE_CONSUMER): [
        Case("closed", frame(T.CLOSE_CONSUMER, consumer_id=3), [ConsumerClosedByBroker(3)]),
    ],
    (_D, T.REACHED_END_OF_TOPIC): [
        Case("end", frame(T.REACHED_END_OF_TOPIC, consumer_id=3), [EndOfTopic(3)]),
    ],
    (_D, T.ACTIVE_CONSUMER_CHANGE): [
        Case("active", frame(T.ACTIVE_CONSUMER_CHANGE, consumer_id=3, is_active=True), [ActiveConsumerChanged(3, True)]),
        Case("inactive", frame(T.ACTIVE_CONSUMER_CHANGE, consumer_id=3, is_active=False),
             [ActiveConsumerChanged(3, False)]),
    ],
    (_D, T.TOPIC_MIGRATED): [Case("ignored", frame(T.TOPIC_MIGRATED), [])],
}


def _key_id(key) -> str:
    state, kind = key
    return f"{state.value}-{T.Type.Name(kind)}"


def test_every_transition_has_cases():
    """The table and this file cannot drift apart."""
    missing = sorted(map(_key_id, set(_TRANSITIONS) - set(EXPECTED)))
    stale = sorted(map(_key_id, set(EXPECTED) - set(_TRANSITIONS)))
    assert not missing, f"table entries without expected outcomes: {missing}"
    assert not stale, f"expected outcomes for pairs the table lacks: {stale}"
    assert all(EXPECTED.values())


CASES = [pytest.param(key, case, id=f"{_key_id(key)}-{case.name}")
         for key, cases in EXPECTED.items() for case in cases]


def _expected_events(case: Case) -> list:
    if case.events == ["MessageArrived"]:  # the frame itself is the payload view: compare by content
        reader = codec.FrameReader()
        reader.feed(case.data)
        f = reader.next_frame()
        return [("MessageArrived", f.command.message.consumer_id, f.command.message, f.metadata,
                 bytes(f.payload), f.broker_entry_metadata)]
    return normalized(case.events)  # a CorruptMessage's error compares by class alone


@pytest.mark.parametrize("key, case", CASES)
def test_transition(key, case):
    state, kind = key
    assert decode_kind(case.data) == kind, "the case's frame is not of its key's command type"
    session = session_in(state, **case.options)
    events = session.receive_data(case.data)
    assert normalized(events) == _expected_events(case)
    assert session.state is (case.state or state)
    sent = decode_all(session.data_to_send())
    assert [c.type for c in sent] == case.sends
    if case.check is not None:
        case.check(session, sent)


def decode_kind(data: bytes) -> int:
    """The command type of a frame, read without its payload checks."""
    size = int.from_bytes(data[4:8], "big")
    return pb.BaseCommand.FromString(data[8:8 + size]).type


# -- pairs the table does not hold ---------------------------------------------------------

REFUSED = [pytest.param(state, kind, id=f"{state.value}-{T.Type.Name(kind)}")
           for state in (State.IDLE, State.CONNECTING, State.CONNECTED)
           for kind in ALL_TYPES if (state, kind) not in _TRANSITIONS]


@pytest.mark.parametrize("state, kind", REFUSED)
def test_command_outside_the_table_is_a_protocol_error(state, kind):
    session = session_in(state)
    with pytest.raises(errors.ProtocolError, match=f"{T.Type.Name(kind)} is not allowed while {state.value}"):
        session.receive_data(frame(kind))
    assert session.state is State.CLOSED
    assert session.data_to_send() == b""
    assert session.receive_data(frame(T.PING)) == []  # a closed session reads nothing more


@pytest.mark.parametrize("state", [State.IDLE, State.CONNECTING])
@pytest.mark.parametrize("corrupt", [False, True], ids=["whole", "bad-checksum"])
def test_a_message_before_connected_is_a_protocol_error(state, corrupt):
    """A Message frame with payload is refused before Connected, even one failing its checks."""
    data = message_frame()
    if corrupt:
        data = data[:-1] + b"?"
    session = session_in(state)
    with pytest.raises(errors.ProtocolError, match="MESSAGE is not allowed"):
        session.receive_data(data)
    assert session.state is State.CLOSED


def test_refused_pairs_and_table_cover_every_state_and_command():
    covered = set(_TRANSITIONS) | {(p.values[0], p.values[1]) for p in REFUSED}
    assert covered == {(s, k) for s in (State.IDLE, State.CONNECTING, State.CONNECTED) for k in ALL_TYPES}
    assert not any(state is State.CLOSED for state, _ in _TRANSITIONS)  # closed reads nothing


@pytest.mark.parametrize("kind", ALL_TYPES, ids=T.Type.Name)
def test_a_closed_session_ignores_every_command(kind):
    session = session_in(State.CLOSED)
    assert session.receive_data(frame(kind)) == []
    assert session.state is State.CLOSED
    assert session.data_to_send() == b""


def test_the_session_always_starts_idle_and_connects_once():
    session = ClientSession()
    assert session.state is State.IDLE
    session.connect()
    assert session.state is State.CONNECTING
    with pytest.raises(errors.ProtocolError):
        session.connect()
    assert decode_one(session.data_to_send()).type == T.CONNECT
    session.receive_data(connected_frame())
    with pytest.raises(errors.ProtocolError):
        session.connect()
    session.connection_lost()
    assert session.state is State.CLOSED
    with pytest.raises(errors.ProtocolError):
        session.connect()


def test_connection_failed_ends_the_stream_in_one_chunk_as_in_many():
    """Frames after a connect error in the same chunk are not read (the session is closed)."""
    error = frame(T.ERROR, error=pb.AuthenticationError, message="no")
    for chunks in ([error + frame(T.PING)], [error, frame(T.PING)]):
        session = session_in(State.CONNECTING)
        events = [e for chunk in chunks for e in session.receive_data(chunk)]
        assert [type(e) for e in events] == [ConnectionFailed]
        assert session.state is State.CLOSED and session.data_to_send() == b""



# -- walks through the table -----------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_walk_through_the_table_follows_it(data):
    """Random frames, each checked against the table's cases: the session's state after every
    step is the one its case names, and a pair outside the table ends the walk closed."""
    session = ClientSession(**AUTH)
    state = State.IDLE
    if data.draw(st.booleans()):
        session.connect()
        state = State.CONNECTING
    session.data_to_send()
    for _ in range(data.draw(st.integers(1, 12))):
        kind = data.draw(st.sampled_from(ALL_TYPES))
        # the cases for this session's options, whose checks only read what was sent
        cases = [c for c in EXPECTED.get((state, kind), []) if c.options == AUTH or c.check is None]
        if (state, kind) in _TRANSITIONS and not cases:
            continue
        if not cases:
            with pytest.raises(errors.ProtocolError):
                session.receive_data(frame(kind))
            assert session.state is State.CLOSED
            return
        case = data.draw(st.sampled_from(cases))
        assert normalized(session.receive_data(case.data)) == _expected_events(case)
        sent = decode_all(session.data_to_send())
        assert [c.type for c in sent] == case.sends
        if case.check is not None:
            case.check(session, sent)
        state = case.state or state
        assert session.state is state
        if state is State.CLOSED:
            assert session.receive_data(frame(T.PING)) == []
            return
