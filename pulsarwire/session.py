"""Sans-IO client session for one broker connection: bytes in, events out.

The session owns the handshake, request-id correlation, keep-alive replies,
auth challenges and the command state table. It never touches a socket or a
clock: the caller feeds `receive_data()`, acts on the returned events, and
writes out what `data_to_send()` returns.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, cast

from . import codec
from ._version import __version__
from ._proto import PulsarApi_pb2 as pb
from .errors import CodecError, ProtocolError, ServerError, server_error
from .messages import signed64

_ReceiptFrame = codec.ReceiptFrame

T = pb.BaseCommand
PROTOCOL_VERSION = 21
CLIENT_VERSION = f"pulsarwire-{__version__}"


class State(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


# --- events -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Event:
    pass


@dataclass(frozen=True, slots=True)
class Connected(Event):
    server_version: str
    protocol_version: int
    max_message_size: int


@dataclass(frozen=True, slots=True)
class ConnectionFailed(Event):
    error: ServerError


@dataclass(frozen=True, slots=True)
class RequestDone(Event):
    request_id: int
    response: Any  # the sub-command: CommandSuccess, CommandProducerSuccess, ...


@dataclass(frozen=True, slots=True)
class RequestFailed(Event):
    request_id: int
    error: ServerError


@dataclass(frozen=True, slots=True)
class SendReceipt(Event):
    producer_id: int
    sequence_id: int
    highest_sequence_id: int  # sequence_id's when the broker left it out
    ledger_id: int  # of the message id; -1 and -1 for a duplicate the broker dropped
    entry_id: int


@dataclass(frozen=True, slots=True)
class SendFailed(Event):
    producer_id: int
    sequence_id: int
    error: ServerError


@dataclass(frozen=True, slots=True)
class MessageArrived(Event):
    consumer_id: int
    command: pb.CommandMessage
    frame: codec.Frame  # metadata, payload


@dataclass(frozen=True, slots=True)
class CorruptMessage(Event):
    """A Message frame that failed its checksum or metadata checks."""
    consumer_id: int
    message_id: pb.MessageIdData
    error: CodecError


@dataclass(frozen=True, slots=True)
class ProducerClosedByBroker(Event):
    producer_id: int


@dataclass(frozen=True, slots=True)
class ConsumerClosedByBroker(Event):
    consumer_id: int


@dataclass(frozen=True, slots=True)
class EndOfTopic(Event):
    consumer_id: int


@dataclass(frozen=True, slots=True)
class ActiveConsumerChanged(Event):
    consumer_id: int
    is_active: bool


@dataclass(frozen=True, slots=True)
class PongReceived(Event):
    pass


# --- the session ------------------------------------------------------------

class ClientSession:
    """One client-side connection's protocol state."""

    def __init__(self, *, auth_method_name: str | None = None,
                 auth_data: Callable[[], bytes] | None = None,
                 client_version: str = CLIENT_VERSION, protocol_version: int = PROTOCOL_VERSION,
                 max_frame_size: int = codec.DEFAULT_MAX_FRAME_SIZE,
                 proxy_to_broker_url: str | None = None) -> None:
        self.state = State.IDLE
        self.max_message_size = codec.DEFAULT_MAX_MESSAGE_SIZE
        self.server_version = ""
        self.protocol_version = 0
        self._auth_method_name = auth_method_name
        self._auth_data = auth_data
        self._client_version = client_version
        self._advertised_version = protocol_version
        self._proxy_to_broker_url = proxy_to_broker_url
        self._reader = codec.FrameReader(max_frame_size, receipt_fast_path=True)
        self._out: list[bytes] = []
        self._next_request_id = 0

    # -- I/O boundary --

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed received bytes; return the events they complete.

        Raises CodecError for a stream that cannot continue (size or command
        errors) and ProtocolError for a command not allowed in this state.
        """
        if self.state is State.CLOSED:
            return []
        self._reader.feed(data)
        events: list[Event] = []
        while True:
            try:
                # this reader has no send_fast_path, so its frames are Frame or ReceiptFrame, never SendFrame
                frame: codec.Frame | codec.ReceiptFrame | None = self._reader.next_frame()  # type: ignore[assignment]
            except CodecError as exc:
                command = exc.command
                if command is not None and command.type == T.MESSAGE:
                    if (self.state, T.MESSAGE) not in _TRANSITIONS:
                        self._refuse(T.MESSAGE)  # no Message is allowed here, sound or not
                    # The stream is still in sync: reject just this message.
                    events.append(CorruptMessage(command.message.consumer_id,
                                                 command.message.message_id, exc))
                    continue
                self.state = State.CLOSED
                raise
            if frame is None:
                return events
            handler = _TRANSITIONS.get((self.state, frame.type))
            if handler is None:
                self._refuse(frame.type)
            handler(self, frame, events)  # type: ignore[arg-type]  # a ReceiptFrame goes to _on_send_receipt only
            if self.state is State.CLOSED:  # a connect error: what follows it is not read
                return events

    def _refuse(self, kind: int) -> NoReturn:
        name = T.Type.Name(kind) if kind in T.Type.values() else str(kind)
        state, self.state = self.state, State.CLOSED
        raise ProtocolError(f"{name} is not allowed while {state.value}")

    def connection_lost(self) -> None:
        self.state = State.CLOSED

    # -- outgoing commands --

    def connect(self) -> None:
        if self.state is not State.IDLE:
            raise ProtocolError(f"connect() while {self.state.value}")
        cmd = pb.CommandConnect(client_version=self._client_version,
                                protocol_version=self._advertised_version)
        cmd.feature_flags.supports_auth_refresh = True
        cmd.feature_flags.supports_broker_entry_metadata = True
        if self._auth_method_name:
            cmd.auth_method_name = self._auth_method_name
            cmd.auth_data = self._auth_data() if self._auth_data else b""
        if self._proxy_to_broker_url:
            cmd.proxy_to_broker_url = self._proxy_to_broker_url
        self._emit(T.CONNECT, "connect", cmd)
        self.state = State.CONNECTING

    def new_request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def lookup(self, topic: str, authoritative: bool = False, listener_name: str | None = None) -> int:
        rid = self.new_request_id()
        command = pb.CommandLookupTopic(topic=topic, request_id=rid, authoritative=authoritative)
        if listener_name:
            command.advertised_listener_name = listener_name
        self._command(T.LOOKUP, "lookupTopic", command)
        return rid

    def partitioned_metadata(self, topic: str) -> int:
        rid = self.new_request_id()
        self._command(T.PARTITIONED_METADATA, "partitionMetadata",
                      pb.CommandPartitionedTopicMetadata(topic=topic, request_id=rid))
        return rid

    def create_producer(self, **fields: Any) -> int:
        rid = self.new_request_id()
        self._command(T.PRODUCER, "producer", pb.CommandProducer(request_id=rid, **fields))
        return rid

    def subscribe(self, **fields: Any) -> int:
        rid = self.new_request_id()
        self._command(T.SUBSCRIBE, "subscribe", pb.CommandSubscribe(request_id=rid, **fields))
        return rid

    def flow(self, consumer_id: int, permits: int) -> None:
        self._command(T.FLOW, "flow", pb.CommandFlow(consumer_id=consumer_id, messagePermits=permits))

    def send_frame(self, frame: bytes) -> None:
        """Queue an already encoded Send frame (producers build and keep their own)."""
        self._require_connected()
        self._out.append(frame)

    def ack(self, consumer_id: int, message_ids: list[pb.MessageIdData], cumulative: bool = False,
            validation_error: Any = None) -> None:
        cmd = pb.CommandAck(consumer_id=consumer_id,
                            ack_type=pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual,
                            message_id=message_ids)
        if validation_error is not None:
            cmd.validation_error = validation_error
        self._command(T.ACK, "ack", cmd)

    def redeliver(self, consumer_id: int, message_ids: list[pb.MessageIdData] | None = None) -> None:
        self._command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES, "redeliverUnacknowledgedMessages",
                      pb.CommandRedeliverUnacknowledgedMessages(consumer_id=consumer_id,
                                                                message_ids=message_ids or []))

    def seek(self, consumer_id: int, message_id: pb.MessageIdData | None = None,
             publish_time: int | None = None) -> int:
        rid = self.new_request_id()
        cmd = pb.CommandSeek(consumer_id=consumer_id, request_id=rid)
        if message_id is not None:
            cmd.message_id.CopyFrom(message_id)
        if publish_time is not None:
            cmd.message_publish_time = publish_time
        self._command(T.SEEK, "seek", cmd)
        return rid

    def unsubscribe(self, consumer_id: int) -> int:
        rid = self.new_request_id()
        self._command(T.UNSUBSCRIBE, "unsubscribe", pb.CommandUnsubscribe(consumer_id=consumer_id, request_id=rid))
        return rid

    def close_producer(self, producer_id: int) -> int:
        rid = self.new_request_id()
        self._command(T.CLOSE_PRODUCER, "close_producer",
                      pb.CommandCloseProducer(producer_id=producer_id, request_id=rid))
        return rid

    def close_consumer(self, consumer_id: int) -> int:
        rid = self.new_request_id()
        self._command(T.CLOSE_CONSUMER, "close_consumer",
                      pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=rid))
        return rid

    def get_last_message_id(self, consumer_id: int) -> int:
        rid = self.new_request_id()
        self._command(T.GET_LAST_MESSAGE_ID, "getLastMessageId",
                      pb.CommandGetLastMessageId(consumer_id=consumer_id, request_id=rid))
        return rid

    def get_topics_of_namespace(self, namespace: str, mode: int = pb.CommandGetTopicsOfNamespace.PERSISTENT,
                                topics_pattern: str | None = None, topics_hash: str | None = None) -> int:
        rid = self.new_request_id()
        cmd = pb.CommandGetTopicsOfNamespace(request_id=rid, namespace=namespace, mode=cast(Any, mode))
        if topics_pattern is not None:
            cmd.topics_pattern = topics_pattern
        if topics_hash is not None:
            cmd.topics_hash = topics_hash
        self._command(T.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace", cmd)
        return rid

    def get_schema(self, topic: str, schema_version: bytes | None = None) -> int:
        rid = self.new_request_id()
        cmd = pb.CommandGetSchema(request_id=rid, topic=topic)
        if schema_version is not None:
            cmd.schema_version = schema_version
        self._command(T.GET_SCHEMA, "getSchema", cmd)
        return rid

    def ping(self) -> None:
        self._command(T.PING, "ping", pb.CommandPing())

    # -- internals --

    def _require_connected(self) -> None:
        if self.state is not State.CONNECTED:
            raise ProtocolError(f"cannot send commands while {self.state.value}")

    def _command(self, kind: Any, field: str, sub: Any) -> None:
        self._require_connected()
        self._emit(kind, field, sub)

    def _emit(self, kind: Any, field: str, sub: Any) -> None:
        cmd = T(type=kind)
        getattr(cmd, field).CopyFrom(sub)
        self._out.append(codec.encode_command(cmd))

    # handlers: (self, frame, events)

    def _on_connected(self, frame: codec.Frame, events: list[Event]) -> None:
        c = frame.command.connected
        self.state = State.CONNECTED
        self.server_version = c.server_version
        self.protocol_version = c.protocol_version
        if c.HasField("max_message_size") and c.max_message_size > 0:
            self.max_message_size = c.max_message_size
            self._reader.max_frame_size = max(self._reader.max_frame_size,
                                              c.max_message_size + codec.FRAME_PADDING)
        events.append(Connected(c.server_version, c.protocol_version, self.max_message_size))

    def _on_connect_error(self, frame: codec.Frame, events: list[Event]) -> None:
        e = frame.command.error
        self.state = State.CLOSED
        events.append(ConnectionFailed(server_error(e.error, e.message)))

    def _on_auth_challenge(self, frame: codec.Frame, events: list[Event]) -> None:
        response = pb.CommandAuthResponse(client_version=self._client_version,
                                          protocol_version=self._advertised_version)
        response.response.auth_method_name = self._auth_method_name or "none"
        response.response.auth_data = self._auth_data() if self._auth_data else b""
        self._emit(T.AUTH_RESPONSE, "authResponse", response)

    def _on_ping(self, frame: codec.Frame, events: list[Event]) -> None:
        self._emit(T.PONG, "pong", pb.CommandPong())

    def _on_pong(self, frame: codec.Frame, events: list[Event]) -> None:
        events.append(PongReceived())

    def _on_success(self, frame: codec.Frame, events: list[Event]) -> None:
        events.append(RequestDone(frame.command.success.request_id, frame.command.success))

    def _on_error(self, frame: codec.Frame, events: list[Event]) -> None:
        e = frame.command.error
        events.append(RequestFailed(e.request_id, server_error(e.error, e.message)))

    def _on_producer_success(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.producer_success
        if r.HasField("producer_ready") and not r.producer_ready:
            return  # waiting for exclusive access; the real answer follows
        events.append(RequestDone(r.request_id, r))

    def _on_lookup_response(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.lookupTopicResponse
        if r.response == pb.CommandLookupTopicResponse.Failed or r.HasField("error"):
            events.append(RequestFailed(r.request_id, server_error(r.error, r.message or "lookup failed")))
        else:
            events.append(RequestDone(r.request_id, r))

    def _on_partitioned_metadata_response(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.partitionMetadataResponse
        if r.response == pb.CommandPartitionedTopicMetadataResponse.Failed or r.HasField("error"):
            events.append(RequestFailed(r.request_id, server_error(r.error, r.message or "metadata failed")))
        else:
            events.append(RequestDone(r.request_id, r))

    def _on_last_message_id(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.getLastMessageIdResponse
        events.append(RequestDone(r.request_id, r))

    def _on_topics_of_namespace(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.getTopicsOfNamespaceResponse
        events.append(RequestDone(r.request_id, r))

    def _on_ack_response(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.ackResponse
        if not r.HasField("request_id"):
            return
        if r.HasField("error"):
            events.append(RequestFailed(r.request_id, server_error(r.error, r.message)))
        else:
            events.append(RequestDone(r.request_id, r))

    def _on_get_schema_response(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.getSchemaResponse
        if r.HasField("error_code"):
            events.append(RequestFailed(r.request_id, server_error(r.error_code, r.error_message)))
        else:
            events.append(RequestDone(r.request_id, r))

    def _on_send_receipt(self, frame: codec.Frame | codec.ReceiptFrame, events: list[Event]) -> None:
        if type(frame) is _ReceiptFrame:  # the common receipt, read without protobuf (FrameReader)
            events.append(SendReceipt(frame.producer_id, frame.sequence_id, frame.highest_sequence_id,
                                      frame.ledger_id, frame.entry_id))
            return
        r = frame.command.send_receipt  # type: ignore[union-attr]
        events.append(SendReceipt(r.producer_id, r.sequence_id,
                                  r.highest_sequence_id if r.HasField("highest_sequence_id") else r.sequence_id,
                                  signed64(r.message_id.ledgerId), signed64(r.message_id.entryId)))

    def _on_send_error(self, frame: codec.Frame, events: list[Event]) -> None:
        r = frame.command.send_error
        events.append(SendFailed(r.producer_id, r.sequence_id, server_error(r.error, r.message)))

    def _on_message(self, frame: codec.Frame, events: list[Event]) -> None:
        m = frame.command.message
        if frame.metadata is None:
            events.append(CorruptMessage(m.consumer_id, m.message_id,
                                         CodecError("Message frame without metadata or payload")))
            return
        events.append(MessageArrived(m.consumer_id, m, frame))

    def _on_close_producer(self, frame: codec.Frame, events: list[Event]) -> None:
        events.append(ProducerClosedByBroker(frame.command.close_producer.producer_id))

    def _on_close_consumer(self, frame: codec.Frame, events: list[Event]) -> None:
        events.append(ConsumerClosedByBroker(frame.command.close_consumer.consumer_id))

    def _on_end_of_topic(self, frame: codec.Frame, events: list[Event]) -> None:
        events.append(EndOfTopic(frame.command.reachedEndOfTopic.consumer_id))

    def _on_active_consumer_change(self, frame: codec.Frame, events: list[Event]) -> None:
        c = frame.command.active_consumer_change
        events.append(ActiveConsumerChanged(c.consumer_id, c.is_active))

    def _on_ignored(self, frame: codec.Frame, events: list[Event]) -> None:
        pass


_S = State
_TRANSITIONS: dict[tuple[State, int], Callable[[ClientSession, codec.Frame, list[Event]], None]] = {
    (_S.CONNECTING, T.CONNECTED): ClientSession._on_connected,
    (_S.CONNECTING, T.ERROR): ClientSession._on_connect_error,
    (_S.CONNECTING, T.AUTH_CHALLENGE): ClientSession._on_auth_challenge,
    (_S.CONNECTING, T.PING): ClientSession._on_ping,
    (_S.CONNECTED, T.AUTH_CHALLENGE): ClientSession._on_auth_challenge,
    (_S.CONNECTED, T.PING): ClientSession._on_ping,
    (_S.CONNECTED, T.PONG): ClientSession._on_pong,
    (_S.CONNECTED, T.SUCCESS): ClientSession._on_success,
    (_S.CONNECTED, T.ERROR): ClientSession._on_error,
    (_S.CONNECTED, T.PRODUCER_SUCCESS): ClientSession._on_producer_success,
    (_S.CONNECTED, T.LOOKUP_RESPONSE): ClientSession._on_lookup_response,
    (_S.CONNECTED, T.PARTITIONED_METADATA_RESPONSE): ClientSession._on_partitioned_metadata_response,
    (_S.CONNECTED, T.GET_LAST_MESSAGE_ID_RESPONSE): ClientSession._on_last_message_id,
    (_S.CONNECTED, T.ACK_RESPONSE): ClientSession._on_ack_response,
    (_S.CONNECTED, T.GET_TOPICS_OF_NAMESPACE_RESPONSE): ClientSession._on_topics_of_namespace,
    (_S.CONNECTED, T.GET_SCHEMA_RESPONSE): ClientSession._on_get_schema_response,
    (_S.CONNECTED, T.SEND_RECEIPT): ClientSession._on_send_receipt,
    (_S.CONNECTED, T.SEND_ERROR): ClientSession._on_send_error,
    (_S.CONNECTED, T.MESSAGE): ClientSession._on_message,
    (_S.CONNECTED, T.CLOSE_PRODUCER): ClientSession._on_close_producer,
    (_S.CONNECTED, T.CLOSE_CONSUMER): ClientSession._on_close_consumer,
    (_S.CONNECTED, T.REACHED_END_OF_TOPIC): ClientSession._on_end_of_topic,
    (_S.CONNECTED, T.ACTIVE_CONSUMER_CHANGE): ClientSession._on_active_consumer_change,
    (_S.CONNECTED, T.TOPIC_MIGRATED): ClientSession._on_ignored,
}
