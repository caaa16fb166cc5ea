"""Bytes in: however the stream is cut, the session gives the same events and answers; bad bytes
give a typed error (a PulsarWireError), never a crash, and close the session."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulsarwire import codec, errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.session import ClientSession, State

from .wire import T, connected_frame, decode_all, frame, message_frame, normalized, session_in

_BATCH = codec.BatchBuilder()
_BATCH.add(b"first", {"k": "v"}, "key-1")
_BATCH.add(b"second")
_BATCH_METADATA = pb.MessageMetadata(producer_name="p", sequence_id=10, publish_time=5, num_messages_in_batch=2)

# A broker's side of one connection: the handshake, then a little of everything.
FRAMES = [
    connected_frame(max_message_size=8 << 20),
    frame(T.PING),
    frame(T.AUTH_CHALLENGE),
    frame(T.PRODUCER_SUCCESS, request_id=1, producer_name="p-1", last_sequence_id=-1),
    codec.encode_send_receipt(1, 0, 0, 4, 9),
    message_frame(payload=b"one"),
    codec.encode_payload_command(
        pb.BaseCommand(type=T.MESSAGE, message=pb.CommandMessage(
            consumer_id=3, message_id=pb.MessageIdData(ledgerId=1, entryId=3))),
        pb.MessageMetadata(producer_name="p", sequence_id=8, publish_time=2), b"two",
        broker_entry_metadata=pb.BrokerEntryMetadata(broker_timestamp=77, index=5)),
    message_frame(payload=b"three")[:-1] + b"!",  # fails its checksum: rejected alone
    codec.encode_payload_command(
        pb.BaseCommand(type=T.MESSAGE, message=pb.CommandMessage(
            consumer_id=3, message_id=pb.MessageIdData(ledgerId=1, entryId=4))),
        _BATCH_METADATA, _BATCH.build()),
    frame(T.PONG),
    frame(T.LOOKUP_RESPONSE, request_id=2, response=pb.CommandLookupTopicResponse.Connect,
          brokerServiceUrl="pulsar://127.0.0.1:6650"),
    frame(T.PING),
    frame(T.SEND_ERROR, producer_id=1, sequence_id=1, error=pb.PersistenceError, message="disk"),
    frame(T.ACTIVE_CONSUMER_CHANGE, consumer_id=3, is_active=True),
    frame(T.REACHED_END_OF_TOPIC, consumer_id=3),
    frame(T.CLOSE_CONSUMER, consumer_id=3),
]
STREAM = b"".join(FRAMES)
EVENT_KINDS = ["Connected", "RequestDone", "SendReceipt", "MessageArrived", "MessageArrived", "CorruptMessage",
               "MessageArrived", "PongReceived", "RequestDone", "SendFailed", "ActiveConsumerChanged",
               "EndOfTopic", "ConsumerClosedByBroker"]


def _run(chunks) -> tuple[list, list[pb.BaseCommand]]:
    """The events and the answers a connecting session gives for `chunks`."""
    session = ClientSession(auth_method_name="token", auth_data=lambda: b"t0k")
    session.connect()
    session.data_to_send()
    events = []
    for chunk in chunks:
        events += session.receive_data(chunk)
    assert session.state is State.CONNECTED
    return normalized(events), decode_all(session.data_to_send())


WHOLE = _run([STREAM])


def test_the_conversation_gives_its_events_and_answers():
    events, answers = WHOLE
    assert [e[0] for e in events] == EVENT_KINDS
    assert [a.type for a in answers] == [T.PONG, T.AUTH_RESPONSE, T.PONG]
    arrived = [e for e in events if e[0] == "MessageArrived"]
    assert [e[4] for e in arrived[:2]] == [b"one", b"two"]
    assert arrived[1][5] == pb.BrokerEntryMetadata(broker_timestamp=77, index=5)


def test_one_byte_at_a_time():
    assert _run([STREAM[i:i + 1] for i in range(len(STREAM))]) == WHOLE


def test_frame_by_frame():
    assert _run(FRAMES) == WHOLE


def test_frames_split_across_their_boundaries():
    """Each chunk ends in the middle of the next frame."""
    cuts, at = [], 0
    for f in FRAMES:
        cuts.append(at + len(f) // 2)
        at += len(f)
    bounds = [0, *cuts, len(STREAM)]
    assert _run([STREAM[a:b] for a, b in zip(bounds, bounds[1:])]) == WHOLE


def test_empty_chunks_change_nothing():
    assert _run([b"", *FRAMES[:3], b"", *FRAMES[3:], b""]) == WHOLE


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30))
def test_any_cut_of_the_stream(cuts):
    bounds = [0, *sorted(cuts), len(STREAM)]
    assert _run([STREAM[a:b] for a, b in zip(bounds, bounds[1:])]) == WHOLE


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=len(STREAM)))
def test_a_prefix_gives_the_events_of_its_whole_frames(end):
    """A frame is reported once all of it is in, not before (and never a partial one)."""
    session = ClientSession(auth_method_name="token", auth_data=lambda: b"t0k")
    session.connect()
    events = normalized(session.receive_data(STREAM[:end]))
    whole_frames = 0
    at = 0
    for f in FRAMES:
        if at + len(f) > end:
            break
        at += len(f)
        whole_frames += 1
    assert events == WHOLE[0][:len(normalized(_events_of(FRAMES[:whole_frames])))]


def _events_of(frames):
    session = ClientSession(auth_method_name="token", auth_data=lambda: b"t0k")
    session.connect()
    return session.receive_data(b"".join(frames))


def test_a_copied_buffer_is_not_needed():
    """The caller may reuse its receive buffer: events keep their own bytes."""
    buffer = bytearray(message_frame(payload=b"kept"))
    session = session_in(State.CONNECTED)
    (event,) = session.receive_data(buffer)
    buffer[:] = b"\0" * len(buffer)
    assert bytes(event.frame.payload) == b"kept"


# -- malformed input -------------------------------------------------------------------------

def _raw(command_bytes: bytes, tail: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command_bytes) + len(tail), len(command_bytes)) + command_bytes + tail


def _partial(kind: int, field: str) -> bytes:
    """A BaseCommand whose sub-command lacks its required fields."""
    cmd = pb.BaseCommand(type=kind)
    getattr(cmd, field).SetInParent()
    return cmd.SerializePartialToString()


MALFORMED = [
    pytest.param(struct.pack(">I", 0x7FFFFFFF), errors.FrameTooLargeError, id="frame over the limit"),
    pytest.param(struct.pack(">I", 3) + b"abc", errors.TruncatedFrameError, id="frame too small for a command"),
    pytest.param(struct.pack(">II", 8, 100) + b"\0" * 4, errors.TruncatedFrameError, id="command past the frame"),
    pytest.param(_raw(b"\xff\xff\xff"), errors.BadCommandError, id="command does not parse"),
    pytest.param(_raw(b""), errors.BadCommandError, id="empty command: no type"),
    pytest.param(_raw(b"\x08\xe7\x07"), errors.BadCommandError, id="unknown command type"),
    pytest.param(_raw(_partial(T.SUCCESS, "success")), errors.BadCommandError, id="required field missing"),
    pytest.param(_raw(pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()).SerializeToString(), b"\xff" * 6),
                 errors.BadMagicError, id="junk after a simple command"),
]


@pytest.mark.parametrize("state", [State.IDLE, State.CONNECTING, State.CONNECTED])
@pytest.mark.parametrize("data, error", MALFORMED)
def test_malformed_input_is_a_typed_error(state, data, error):
    session = session_in(state)
    with pytest.raises(error):
        session.receive_data(data)
    assert session.state is State.CLOSED
    assert session.receive_data(frame(T.PING)) == [] and session.data_to_send() == b""


def test_a_frame_over_the_sessions_own_limit():
    session = ClientSession(max_frame_size=1024)
    session.connect()
    with pytest.raises(errors.FrameTooLargeError):
        session.receive_data(struct.pack(">I", 2048))


@pytest.mark.parametrize("damage, error", [
    (lambda data: data[:-1] + bytes([data[-1] ^ 1]), errors.ChecksumMismatchError),
    (lambda data: _message_with_metadata(b"\xff\xff\xff"), errors.BadMetadataError),
    (lambda data: _message_with_metadata(pb.MessageMetadata(producer_name="p").SerializePartialToString()),
     errors.BadMetadataError),
], ids=["checksum", "metadata does not parse", "metadata lacks fields"])
def test_a_damaged_message_is_rejected_alone(damage, error):
    session = session_in(State.CONNECTED)
    events = session.receive_data(damage(message_frame()) + message_frame(payload=b"next") + frame(T.PONG))
    assert [type(e).__name__ for e in events] == ["CorruptMessage", "MessageArrived", "PongReceived"]
    assert isinstance(events[0].error, error) and events[0].consumer_id == 3
    assert session.state is State.CONNECTED


def _message_with_metadata(raw_metadata: bytes) -> bytes:
    cmd = pb.BaseCommand(type=T.MESSAGE, message=pb.CommandMessage(
        consumer_id=3, message_id=pb.MessageIdData(ledgerId=1, entryId=2)))
    return codec.encode_payload_frame(cmd, struct.pack(">I", len(raw_metadata)) + raw_metadata + b"x")


def _assert_typed_or_fine(session: ClientSession, data: bytes) -> None:
    """Events or a PulsarWireError; anything else escapes and fails the test."""
    try:
        session.receive_data(data)
    except errors.PulsarWireError:
        assert session.state is State.CLOSED
        assert session.receive_data(STREAM) == []


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([State.IDLE, State.CONNECTING, State.CONNECTED]), st.binary(max_size=200))
def test_random_bytes_never_crash(state, data):
    _assert_typed_or_fine(session_in(state), data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_streams_never_crash(data):
    """The conversation with bytes overwritten, cut out or repeated."""
    stream = bytearray(STREAM)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(stream) - 1))
        how = data.draw(st.sampled_from(["set", "cut", "repeat"]))
        if how == "set":
            stream[at] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del stream[at:at + data.draw(st.integers(1, 16))]
        else:
            stream[at:at] = stream[at:at + data.draw(st.integers(1, 16))]
        if not stream:
            break
    session = ClientSession(auth_method_name="token", auth_data=lambda: b"t0k")
    session.connect()
    _assert_typed_or_fine(session, bytes(stream))
