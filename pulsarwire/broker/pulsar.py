"""The broker's Pulsar binary protocol front end: a service holding its settings and
connections, one `BrokerConnection` per client connection, and the links through
which the domain reaches this connection's producers and consumers.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from .. import __version__, codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import BadMetadataError, ChecksumMismatchError, PulsarWireError
from ..messages import ack_set_bits
from .core import DUPLICATE, BrokerCore, highest_sequence
from .topics import EARLIEST, LATEST, LEDGER_ID, ConsumerLink, ProducerLink, Subscription, Topic, start_entry

log = logging.getLogger("pulsarwire.broker")
T = pb.BaseCommand
SERVER_VERSION = f"pulsarwire-broker-{__version__}"
MAX_PROTOCOL_VERSION = 21
_WRITE_HIGH_WATER = 4 * 1024 * 1024
_U64 = 0xFFFFFFFFFFFFFFFF
_I64_MAX = 0x7FFFFFFFFFFFFFFF


def message_id(entry_id: int) -> pb.MessageIdData:
    return pb.MessageIdData(ledgerId=LEDGER_ID, entryId=entry_id & _U64)


def start_position(mid: pb.MessageIdData) -> int:
    """A wire message id as a domain start position: EARLIEST, LATEST or an entry id."""
    if mid.entryId >= 1 << 63 or mid.ledgerId >= 1 << 63:
        return EARLIEST  # earliest is (-1, -1)
    if mid.entryId == _I64_MAX or mid.ledgerId == _I64_MAX:
        return LATEST
    return mid.entryId


class PulsarService:
    """The Pulsar front end's settings and live connections, shared by its listeners."""

    def __init__(self, core: BrokerCore, *, auth_tokens: set[str] | None = None,
                 max_message_size: int = codec.DEFAULT_MAX_MESSAGE_SIZE,
                 keep_alive_interval: float = 30.0) -> None:
        self.core = core
        self.auth_tokens = auth_tokens
        self.max_message_size = max_message_size
        self.keep_alive_interval = keep_alive_interval
        self.connections: set[BrokerConnection] = set()
        self.lookup_url = ""  # what lookups answer: this broker, or a proxy in front of it
        self.service_url_tls = ""

    def protocol(self, tls: bool = False) -> Callable[[], "BrokerConnection"]:
        return lambda: BrokerConnection(self, tls)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class PulsarConsumer(ConsumerLink):
    def __init__(self, conn: "BrokerConnection", consumer_id: int, subscription: Subscription,
                 name: str, priority: int) -> None:
        super().__init__(subscription, name, priority)
        self.conn = conn
        self.consumer_id = consumer_id

    @property
    def writable(self) -> bool:
        return self.conn.writable

    def deliver(self, entry, redelivery_count: int, ack_set) -> None:
        cmd = pb.BaseCommand(type=pb.BaseCommand.MESSAGE)
        m = cmd.message
        m.consumer_id = self.consumer_id
        m.message_id.ledgerId = LEDGER_ID
        m.message_id.entryId = entry.entry_id
        if redelivery_count:
            m.redelivery_count = redelivery_count
        if ack_set:
            m.ack_set.extend(ack_set)
        self.conn.write(codec.encode_payload_frame(cmd, entry.body, entry.checksum))

    def active_changed(self, active: bool) -> None:
        self.conn.command(T.ACTIVE_CONSUMER_CHANGE, "active_consumer_change",
                          pb.CommandActiveConsumerChange(consumer_id=self.consumer_id, is_active=active))

    def reached_end_of_topic(self) -> None:
        self.conn.command(T.REACHED_END_OF_TOPIC, "reachedEndOfTopic",
                          pb.CommandReachedEndOfTopic(consumer_id=self.consumer_id))

    def evict(self) -> None:
        self.conn.evict_consumer(self)


class PulsarProducer(ProducerLink):
    def __init__(self, conn: "BrokerConnection", producer_id: int, topic: Topic, name: str) -> None:
        self.conn = conn
        self.producer_id = producer_id
        self.topic = topic
        self.name = name

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.conn.closed

    def evict(self) -> None:
        self.conn.producers.pop(self.producer_id, None)
        self.conn.command(T.CLOSE_PRODUCER, "close_producer",
                          pb.CommandCloseProducer(producer_id=self.producer_id, request_id=0))


class BrokerConnection(asyncio.Protocol):
    def __init__(self, service: PulsarService, tls: bool = False) -> None:
        self.service = service
        self.core = service.core
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.reader = codec.FrameReader(service.max_message_size + codec.FRAME_PADDING, send_fast_path=True)
        self.connected = False
        self.closed = False
        self.writable = True
        self.producers: dict[int, PulsarProducer] = {}
        self.consumers: dict[int, PulsarConsumer] = {}
        self.last_received = time.monotonic()
        self._keepalive: asyncio.Task | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        self.service.connections.add(self)
        self._keepalive = asyncio.ensure_future(self._keep_alive())

    def data_received(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        try:
            self.reader.feed(data)
            while True:
                try:
                    frame = self.reader.next_frame()
                except (ChecksumMismatchError, BadMetadataError) as exc:
                    command = getattr(exc, "command", None)
                    if command is not None and command.type == T.SEND:
                        self._send_error(command.send.producer_id, command.send.sequence_id,
                                         pb.ChecksumError, str(exc))
                        continue
                    raise
                if frame is None:
                    break
                self._handle(frame)
        except PulsarWireError as exc:
            log.warning("closing connection: %s", exc)
            self.close()
        self.flush()

    def connection_lost(self, exc) -> None:
        self._cleanup()

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for consumer in list(self.consumers.values()):
            consumer.subscription.dispatch()
        self.flush()

    # output

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _WRITE_HIGH_WATER:
            # hand it to the transport now: past its high-water mark it pauses writing, and the
            # subscriptions stop dispatching, so memory stays bounded however many permits a consumer gives
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.closed:
            self.core.commit()  # nothing is acknowledged before it is written
            self.transport.writelines(self._out)
        self._out.clear()
        self._out_bytes = 0

    def command(self, kind: Any, field: str, sub) -> None:
        cmd = T(type=kind)
        getattr(cmd, field).CopyFrom(sub)
        self.write(codec.encode_command(cmd))

    def close(self) -> None:
        if self.transport is not None:
            self.flush()
            self.transport.close()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        self.service.connections.discard(self)
        for producer in self.producers.values():
            if producer.topic.producers.get(producer.name) is producer:
                del producer.topic.producers[producer.name]
        self.producers.clear()
        for consumer in list(self.consumers.values()):
            consumer.subscription.detach(consumer)
        self.consumers.clear()

    async def _keep_alive(self) -> None:
        interval = self.service.keep_alive_interval
        try:
            while not self.closed:
                await asyncio.sleep(interval)
                if time.monotonic() - self.last_received > 2 * interval:
                    log.info("closing a connection silent for %.0fs", 2 * interval)
                    self.close()
                    return
                if self.connected:
                    self.command(T.PING, "ping", pb.CommandPing())
        except asyncio.CancelledError:
            pass

    # dispatch by command type; before CONNECTED only CONNECT is allowed

    def _handle(self, frame) -> None:
        if type(frame) is codec.SendFrame:
            if not self.connected:
                raise PulsarWireError("SEND before CONNECT")
            self.on_send_fast(frame)
            return
        kind = frame.command.type
        if not self.connected and kind != T.CONNECT:
            raise PulsarWireError(f"command {kind} before CONNECT")
        handler = _HANDLERS.get(kind)
        if handler is None:
            log.info("unsupported command %s", kind)
            request_id = _request_id(frame.command)
            if request_id is not None:
                self._error(request_id, pb.NotAllowedError, f"command {kind} is not supported")
            return
        handler(self, frame)

    def _error(self, request_id: int, code: Any, message: str) -> None:
        self.command(T.ERROR, "error", pb.CommandError(request_id=request_id, error=code, message=message))

    def _success(self, request_id: int) -> None:
        self.command(T.SUCCESS, "success", pb.CommandSuccess(request_id=request_id))

    def _send_error(self, producer_id: int, sequence_id: int, code: Any, message: str) -> None:
        self.command(T.SEND_ERROR, "send_error", pb.CommandSendError(
            producer_id=producer_id, sequence_id=sequence_id, error=code, message=message))

    def active_consumer_change(self, consumer_id: int, active: bool) -> None:
        self.command(T.ACTIVE_CONSUMER_CHANGE, "active_consumer_change",
                     pb.CommandActiveConsumerChange(consumer_id=consumer_id, is_active=active))

    # handlers

    def on_connect(self, frame) -> None:
        c = frame.command.connect
        if self.connected:
            raise PulsarWireError("second CONNECT on one connection")
        tokens = self.service.auth_tokens
        if tokens is not None:
            token = c.auth_data.decode("utf-8", "replace") if c.HasField("auth_data") else ""
            if c.auth_method_name != "token" or token not in tokens:
                self._error(0, pb.AuthenticationError, "authentication failed")
                self.flush()
                self.close()
                return
        self.connected = True
        response = pb.CommandConnected(server_version=SERVER_VERSION,
                                       protocol_version=min(c.protocol_version, MAX_PROTOCOL_VERSION),
                                       max_message_size=self.service.max_message_size)
        self.command(T.CONNECTED, "connected", response)

    def on_ping(self, frame) -> None:
        self.command(T.PONG, "pong", pb.CommandPong())

    def on_pong(self, frame) -> None:
        pass

    def on_lookup(self, frame) -> None:
        c = frame.command.lookupTopic
        response = pb.CommandLookupTopicResponse(request_id=c.request_id, authoritative=True,
                                                 response=pb.CommandLookupTopicResponse.Connect,
                                                 brokerServiceUrl=self.service.lookup_url)
        if self.service.service_url_tls:
            response.brokerServiceUrlTls = self.service.service_url_tls
        self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", response)

    def on_partitioned_metadata(self, frame) -> None:
        c = frame.command.partitionMetadata
        self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                     pb.CommandPartitionedTopicMetadataResponse(
                         request_id=c.request_id, partitions=self.core.partitions_of(c.topic),
                         response=pb.CommandPartitionedTopicMetadataResponse.Success))

    def on_producer(self, frame) -> None:
        c = frame.command.producer
        topic = self.core.topic(c.topic)
        if topic is None:
            self._error(c.request_id, pb.TopicNotFound, f"{c.topic} is a partitioned topic; use a partition")
            return
        if topic.terminated:
            self._error(c.request_id, pb.TopicTerminatedError, f"{c.topic} is terminated")
            return
        existing = self.producers.get(c.producer_id)
        if existing is not None and existing.topic is topic:  # a retried create: answer again
            self.command(T.PRODUCER_SUCCESS, "producer_success", pb.CommandProducerSuccess(
                request_id=c.request_id, producer_name=existing.name,
                last_sequence_id=topic.last_sequence.get(existing.name, -1)))
            return
        name = c.producer_name if c.HasField("producer_name") and c.producer_name else \
            self.core.new_producer_name()
        holder = topic.producers.get(name)
        if holder is not None and getattr(holder, "conn", None) is not self and not holder.closed:
            self._error(c.request_id, pb.ProducerBusy, f"producer {name} is already connected to {c.topic}")
            return
        producer = PulsarProducer(self, c.producer_id, topic, name)
        topic.producers[name] = producer
        self.producers[c.producer_id] = producer
        self.command(T.PRODUCER_SUCCESS, "producer_success", pb.CommandProducerSuccess(
            request_id=c.request_id, producer_name=name,
            last_sequence_id=topic.last_sequence.get(name, -1)))

    def on_send(self, frame) -> None:
        """A Send frame decoded in full (the fast path declined it)."""
        s = frame.command.send
        md = frame.metadata
        if md is None:
            self._send_error(s.producer_id, s.sequence_id, pb.UnknownError, "SEND without payload")
            return
        self.store(s.producer_id, s.sequence_id,
                   s.highest_sequence_id if s.HasField("highest_sequence_id") else None, s.num_messages,
                   s.is_chunk, md.chunk_id if md.HasField("chunk_id") else None, md.publish_time,
                   md.deliver_at_time if md.HasField("deliver_at_time") else None,
                   frame.metadata_and_payload, frame.checksum)

    def on_send_fast(self, f) -> None:
        """A plain Send frame read by the codec's fast path."""
        self.store(f.producer_id, f.sequence_id, f.highest_sequence_id, f.num_messages, f.is_chunk, f.chunk_id,
                   f.publish_time, f.deliver_at_time, f.metadata_and_payload, f.checksum)

    def store(self, producer_id, sequence_id, highest_sequence_id, num_messages, is_chunk, chunk_id,
              publish_time, deliver_at_time, body, checksum) -> None:
        """Append one entry (unless it is a duplicate) and answer with its receipt."""
        producer = self.producers.get(producer_id)
        if producer is None:
            self._send_error(producer_id, sequence_id, pb.NotAllowedError, "unknown producer id")
            return
        topic = producer.topic
        if topic.terminated:
            self._send_error(producer_id, sequence_id, pb.TopicTerminatedError, "topic is terminated")
            return
        entry_id = self.core.publish(topic, producer.name, sequence_id, highest_sequence_id,
                                     bool(is_chunk and chunk_id), body, checksum, publish_time,
                                     deliver_at_time, num_messages)
        # a duplicate, already stored, is answered with the (-1, -1) id
        self.write(codec.encode_send_receipt(producer_id, sequence_id,
                                             highest_sequence(sequence_id, highest_sequence_id),
                                             LEDGER_ID if entry_id != DUPLICATE else -1, entry_id))

    def on_close_producer(self, frame) -> None:
        c = frame.command.close_producer
        producer = self.producers.pop(c.producer_id, None)
        if producer is not None and producer.topic.producers.get(producer.name) is producer:
            del producer.topic.producers[producer.name]
        self._success(c.request_id)

    def on_subscribe(self, frame) -> None:
        c = frame.command.subscribe
        topic = self.core.topic(c.topic)
        if topic is None:
            self._error(c.request_id, pb.TopicNotFound, f"{c.topic} is a partitioned topic; use a partition")
            return
        if c.consumer_id in self.consumers:
            self._success(c.request_id)  # a retried subscribe
            return
        subscription = topic.subscription(c.subscription, c.subType, c.durable,
                                          c.initialPosition == pb.CommandSubscribe.Earliest,
                                          start_position(c.start_message_id)
                                          if c.HasField("start_message_id") else None)
        if subscription.consumers and subscription.type != c.subType:
            self._error(c.request_id, pb.ConsumerBusy,
                        f"subscription {c.subscription} is of another type")
            return
        if subscription.type == pb.CommandSubscribe.Exclusive and subscription.consumers:
            self._error(c.request_id, pb.ConsumerBusy, f"exclusive subscription {c.subscription} is in use")
            return
        subscription.type = c.subType
        consumer = PulsarConsumer(self, c.consumer_id, subscription, c.consumer_name or str(c.consumer_id),
                                  c.priority_level)
        self.consumers[c.consumer_id] = consumer
        subscription.add_consumer(consumer)
        self._success(c.request_id)
        subscription.check_end_of_topic()

    def on_flow(self, frame) -> None:
        c = frame.command.flow
        consumer = self.consumers.get(c.consumer_id)
        if consumer is not None:
            consumer.permits += c.messagePermits
            consumer.subscription.dispatch()
            consumer.subscription.check_end_of_topic()

    def on_ack(self, frame) -> None:
        c = frame.command.ack
        consumer = self.consumers.get(c.consumer_id)
        if consumer is not None:
            subscription = consumer.subscription
            cumulative = c.ack_type == pb.CommandAck.Cumulative
            for mid in c.message_id:
                subscription.ack(mid.entryId, ack_set_bits(mid.ack_set) if mid.ack_set else None, cumulative)
            subscription.dispatch()
            subscription.check_end_of_topic()
        if c.HasField("request_id"):
            self.command(T.ACK_RESPONSE, "ackResponse",
                         pb.CommandAckResponse(consumer_id=c.consumer_id, request_id=c.request_id))

    def on_redeliver(self, frame) -> None:
        c = frame.command.redeliverUnacknowledgedMessages
        consumer = self.consumers.get(c.consumer_id)
        if consumer is not None:
            consumer.subscription.redeliver(consumer, [m.entryId for m in c.message_ids] or None)

    def on_seek(self, frame) -> None:
        c = frame.command.seek
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = consumer.subscription
        topic_log = subscription.topic.log
        if c.HasField("message_id"):
            position = start_entry(start_position(c.message_id), topic_log)
        elif c.HasField("message_publish_time"):
            position = topic_log.find_by_publish_time(c.message_publish_time)
        else:
            self._error(c.request_id, pb.UnknownError, "seek needs a message id or a publish time")
            return
        subscription.seek(position)
        self._success(c.request_id)
        # As a real broker does: disconnect the consumers so they re-subscribe at the new position.
        for other in list(subscription.consumers):
            other.evict()

    def on_unsubscribe(self, frame) -> None:
        c = frame.command.unsubscribe
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = consumer.subscription
        if len(subscription.consumers) > 1 and not c.force:
            self._error(c.request_id, pb.UnknownError, "subscription has other consumers")
            return
        for other in list(subscription.consumers):
            if isinstance(other, PulsarConsumer):
                other.conn.consumers.pop(other.consumer_id, None)
        subscription.consumers.clear()
        subscription.topic.drop_subscription(subscription.name)
        self._success(c.request_id)

    def on_close_consumer(self, frame) -> None:
        c = frame.command.close_consumer
        consumer = self.consumers.pop(c.consumer_id, None)
        if consumer is not None:
            consumer.subscription.detach(consumer)
        self._success(c.request_id)

    def evict_consumer(self, consumer: PulsarConsumer) -> None:
        """Close a consumer from the broker's side (CloseConsumer): the client re-subscribes."""
        self.consumers.pop(consumer.consumer_id, None)
        consumer.subscription.detach(consumer)
        self.command(T.CLOSE_CONSUMER, "close_consumer",
                     pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0))

    def on_get_last_message_id(self, frame) -> None:
        c = frame.command.getLastMessageId
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "unknown consumer id")
            return
        subscription = consumer.subscription
        last_entry, batch_index = subscription.topic.last_position()
        last = message_id(last_entry)
        if batch_index >= 0:
            last.batch_index = batch_index
        response = pb.CommandGetLastMessageIdResponse(request_id=c.request_id, last_message_id=last)
        response.consumer_mark_delete_position.CopyFrom(message_id(subscription.cursor.mark_delete))
        self.command(T.GET_LAST_MESSAGE_ID_RESPONSE, "getLastMessageIdResponse", response)

    def on_auth_response(self, frame) -> None:
        pass  # we never challenge; a refreshed token needs no answer


def _request_id(command) -> int | None:
    for field, value in command.ListFields():
        if field.name != "type" and hasattr(value, "request_id"):
            return value.request_id
    return None


_HANDLERS: dict[int, Callable] = {
    T.CONNECT: BrokerConnection.on_connect,
    T.PING: BrokerConnection.on_ping,
    T.PONG: BrokerConnection.on_pong,
    T.LOOKUP: BrokerConnection.on_lookup,
    T.PARTITIONED_METADATA: BrokerConnection.on_partitioned_metadata,
    T.PRODUCER: BrokerConnection.on_producer,
    T.SEND: BrokerConnection.on_send,
    T.CLOSE_PRODUCER: BrokerConnection.on_close_producer,
    T.SUBSCRIBE: BrokerConnection.on_subscribe,
    T.FLOW: BrokerConnection.on_flow,
    T.ACK: BrokerConnection.on_ack,
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: BrokerConnection.on_redeliver,
    T.SEEK: BrokerConnection.on_seek,
    T.UNSUBSCRIBE: BrokerConnection.on_unsubscribe,
    T.CLOSE_CONSUMER: BrokerConnection.on_close_consumer,
    T.GET_LAST_MESSAGE_ID: BrokerConnection.on_get_last_message_id,
    T.AUTH_RESPONSE: BrokerConnection.on_auth_response,
}
