"""Bytes out: what the session queues for each call, decoded by the codec; request ids; keep-alive;
no command leaves before the handshake is done."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire import codec, errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.session import CLIENT_VERSION, PROTOCOL_VERSION, ClientSession, PongReceived, State

from .wire import T, connected_frame, decode_all, decode_one, frame, session_in

ID_A = pb.MessageIdData(ledgerId=4, entryId=9)
ID_B = pb.MessageIdData(ledgerId=4, entryId=10, batch_index=1)
TOPIC = "persistent://public/default/t"


# -- connect -----------------------------------------------------------------------------------

def test_connect_announces_the_client():
    session = ClientSession()
    session.connect()
    sent = decode_one(session.data_to_send())
    assert sent.type == T.CONNECT
    c = sent.connect
    assert c.client_version == CLIENT_VERSION and c.protocol_version == PROTOCOL_VERSION
    assert c.feature_flags.supports_auth_refresh and c.feature_flags.supports_broker_entry_metadata
    assert not c.HasField("auth_method_name") and not c.HasField("proxy_to_broker_url")
    assert session.data_to_send() == b""  # drained


def test_connect_with_auth_proxy_and_versions():
    calls = []
    session = ClientSession(auth_method_name="token", auth_data=lambda: calls.append(1) or b"t0k",
                            client_version="custom-1", protocol_version=15, proxy_to_broker_url="pulsar://b:6650")
    session.connect()
    c = decode_one(session.data_to_send()).connect
    assert (c.auth_method_name, c.auth_data, c.client_version, c.protocol_version, c.proxy_to_broker_url) == (
        "token", b"t0k", "custom-1", 15, "pulsar://b:6650")
    # the auth data is asked for again on each challenge (a token may have been refreshed)
    session.receive_data(frame(T.AUTH_CHALLENGE))
    assert decode_one(session.data_to_send()).authResponse.protocol_version == 15
    assert len(calls) == 2


def test_auth_method_without_data_sends_empty_data():
    session = ClientSession(auth_method_name="none")
    session.connect()
    c = decode_one(session.data_to_send()).connect
    assert c.auth_method_name == "none" and c.auth_data == b""


# -- requests ----------------------------------------------------------------------------------

# (call, command type, sub-command field, expected fields besides request_id)
REQUESTS = [
    (lambda s: s.lookup(TOPIC), T.LOOKUP, "lookupTopic", {"topic": TOPIC, "authoritative": False}),
    (lambda s: s.lookup(TOPIC, True, "internal"), T.LOOKUP, "lookupTopic",
     {"topic": TOPIC, "authoritative": True, "advertised_listener_name": "internal"}),
    (lambda s: s.partitioned_metadata(TOPIC), T.PARTITIONED_METADATA, "partitionMetadata", {"topic": TOPIC}),
    (lambda s: s.create_producer(topic=TOPIC, producer_id=1, producer_name="p"), T.PRODUCER, "producer",
     {"topic": TOPIC, "producer_id": 1, "producer_name": "p"}),
    (lambda s: s.subscribe(topic=TOPIC, subscription="sub", subType=pb.CommandSubscribe.Shared, consumer_id=3),
     T.SUBSCRIBE, "subscribe", {"topic": TOPIC, "subscription": "sub", "subType": pb.CommandSubscribe.Shared,
                                "consumer_id": 3}),
    (lambda s: s.seek(3, message_id=ID_A), T.SEEK, "seek", {"consumer_id": 3, "message_id": ID_A}),
    (lambda s: s.seek(3, publish_time=1234), T.SEEK, "seek", {"consumer_id": 3, "message_publish_time": 1234}),
    (lambda s: s.unsubscribe(3), T.UNSUBSCRIBE, "unsubscribe", {"consumer_id": 3}),
    (lambda s: s.close_producer(1), T.CLOSE_PRODUCER, "close_producer", {"producer_id": 1}),
    (lambda s: s.close_consumer(3), T.CLOSE_CONSUMER, "close_consumer", {"consumer_id": 3}),
    (lambda s: s.get_last_message_id(3), T.GET_LAST_MESSAGE_ID, "getLastMessageId", {"consumer_id": 3}),
    (lambda s: s.get_topics_of_namespace("public/default"), T.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace",
     {"namespace": "public/default", "mode": pb.CommandGetTopicsOfNamespace.PERSISTENT}),
    (lambda s: s.get_topics_of_namespace("public/default", pb.CommandGetTopicsOfNamespace.ALL, "t-.*", "h1"),
     T.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace",
     {"namespace": "public/default", "mode": pb.CommandGetTopicsOfNamespace.ALL, "topics_pattern": "t-.*",
      "topics_hash": "h1"}),
    (lambda s: s.get_schema(TOPIC), T.GET_SCHEMA, "getSchema", {"topic": TOPIC}),
    (lambda s: s.get_schema(TOPIC, b"\x02"), T.GET_SCHEMA, "getSchema", {"topic": TOPIC, "schema_version": b"\x02"}),
]
REQUEST_IDS = [f"{T.Type.Name(kind)}-{i}" for i, (_, kind, _, _) in enumerate(REQUESTS)]


@pytest.mark.parametrize("call, kind, field, fields", REQUESTS, ids=REQUEST_IDS)
def test_a_request_is_one_command_with_a_new_request_id(call, kind, field, fields):
    session = session_in(State.CONNECTED)
    rid = call(session)
    sent = decode_one(session.data_to_send())
    assert sent.type == kind
    sub = getattr(sent, field)
    assert sub.request_id == rid
    for name, value in fields.items():
        assert getattr(sub, name) == value, name
    if field == "seek":  # one of message id and publish time, never both
        assert sub.HasField("message_id") != sub.HasField("message_publish_time")


def test_request_ids_count_up_from_one_across_all_requests():
    session = session_in(State.CONNECTED)
    ids = [call(session) for call, *_ in REQUESTS]
    assert ids == list(range(1, len(REQUESTS) + 1))
    sent = decode_all(session.data_to_send())  # queued in call order, in one write
    assert [c.type for c in sent] == [kind for _, kind, _, _ in REQUESTS]
    assert session.new_request_id() == len(REQUESTS) + 1


# -- consumer and producer traffic (no request id) ---------------------------------------------

def test_flow():
    session = session_in(State.CONNECTED)
    session.flow(3, 1000)
    f = decode_one(session.data_to_send()).flow
    assert (f.consumer_id, f.messagePermits) == (3, 1000)


@pytest.mark.parametrize("cumulative", [False, True])
def test_ack(cumulative):
    session = session_in(State.CONNECTED)
    session.ack(3, [ID_A, ID_B] if not cumulative else [ID_B], cumulative=cumulative)
    a = decode_one(session.data_to_send()).ack
    assert a.consumer_id == 3
    assert a.ack_type == (pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual)
    assert list(a.message_id) == ([ID_B] if cumulative else [ID_A, ID_B])
    assert not a.HasField("validation_error")


def test_ack_with_validation_error():
    session = session_in(State.CONNECTED)
    session.ack(3, [ID_A], validation_error=pb.CommandAck.ChecksumMismatch)
    assert decode_one(session.data_to_send()).ack.validation_error == pb.CommandAck.ChecksumMismatch


@pytest.mark.parametrize("ids", [None, [ID_A, ID_B]], ids=["all", "some"])
def test_redeliver(ids):
    session = session_in(State.CONNECTED)
    session.redeliver(3, ids)
    r = decode_one(session.data_to_send()).redeliverUnacknowledgedMessages
    assert r.consumer_id == 3 and list(r.message_ids) == (ids or [])


def test_send_frame_goes_out_as_built():
    send = codec.encode_payload_command(
        pb.BaseCommand(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=0)),
        pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"body")
    session = session_in(State.CONNECTED)
    session.send_frame(send)
    session.send_frame(send)
    assert session.data_to_send() == send + send
    reader = codec.FrameReader()
    reader.feed(send)
    assert bytes(reader.next_frame().payload) == b"body"


# -- keep-alive --------------------------------------------------------------------------------

@pytest.mark.parametrize("state", [State.CONNECTING, State.CONNECTED])
def test_every_ping_is_answered_in_order(state):
    session = session_in(state)
    assert session.receive_data(frame(T.PING) * 3) == []
    assert [c.type for c in decode_all(session.data_to_send())] == [T.PONG] * 3


def test_ping_and_its_pong():
    session = session_in(State.CONNECTED)
    session.ping()
    assert decode_one(session.data_to_send()).type == T.PING
    assert session.receive_data(frame(T.PONG)) == [PongReceived()]
    assert session.data_to_send() == b""  # a pong is not answered


def test_a_pong_while_connecting_is_refused():
    """The client pings only once connected, so a pong before that is not an answer to anything."""
    session = session_in(State.CONNECTING)
    with pytest.raises(errors.ProtocolError):
        session.receive_data(frame(T.PONG))


def test_pongs_and_commands_share_one_queue_in_order():
    session = session_in(State.CONNECTED)
    session.flow(3, 10)
    session.receive_data(frame(T.PING))
    session.ack(3, [ID_A])
    assert [c.type for c in decode_all(session.data_to_send())] == [T.FLOW, T.PONG, T.ACK]


# -- nothing before the handshake, nothing after close ----------------------------------------

OUTGOING = [
    *(call for call, *_ in REQUESTS),
    lambda s: s.flow(3, 1),
    lambda s: s.ack(3, [ID_A]),
    lambda s: s.redeliver(3),
    lambda s: s.send_frame(b"\0" * 8),
    lambda s: s.ping(),
]


@pytest.mark.parametrize("state", [State.IDLE, State.CONNECTING, State.CLOSED])
@pytest.mark.parametrize("index", range(len(OUTGOING)))
def test_no_command_leaves_outside_connected(state, index):
    session = session_in(state)
    with pytest.raises(errors.ProtocolError, match=f"while {state.value}"):
        OUTGOING[index](session)
    assert session.data_to_send() == b""
    assert session.state is state  # refusing a call does not end the session


def test_bytes_queued_before_a_close_still_drain():
    """connection_lost() changes the state; what was queued is the caller's to drop or flush."""
    session = session_in(State.CONNECTED)
    session.flow(3, 5)
    session.connection_lost()
    assert decode_one(session.data_to_send()).type == T.FLOW
    assert session.state is State.CLOSED


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(range(len(OUTGOING) - 2)), max_size=25))  # all but the raw send and ping
def test_any_sequence_of_calls_is_a_valid_stream(calls):
    """What the session queues always decodes as whole, well-formed frames, one per call."""
    session = ClientSession()
    session.connect()
    session.receive_data(connected_frame())
    for index in calls:
        OUTGOING[index](session)
    sent = decode_all(session.data_to_send())
    assert [c.type for c in sent] == [T.CONNECT] + [_kind_of(index) for index in calls]


def _kind_of(index: int) -> int:
    if index < len(REQUESTS):
        return REQUESTS[index][1]
    return [T.FLOW, T.ACK, T.REDELIVER_UNACKNOWLEDGED_MESSAGES][index - len(REQUESTS)]
