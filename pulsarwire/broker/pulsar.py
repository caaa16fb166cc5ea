"""The broker's Pulsar binary protocol front end: a service holding its settings and
connections, one `BrokerConnection` per client connection, and the links through
which the domain reaches this connection's producers and consumers.
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import select
import time
from typing import Any, Callable

from .. import __version__, codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import BadMetadataError, ChecksumMismatchError, FrameTooLargeError, PulsarWireError
from ..messages import ack_set_bits
from .core import DUPLICATE, BrokerCore, InvalidTopicName, highest_sequence
from .topics import EARLIEST, LATEST, LEDGER_ID, ConsumerLink, ProducerLink, Subscription, Topic, start_entry

log = logging.getLogger("pulsarwire.broker")
T = pb.BaseCommand
SERVER_VERSION = f"pulsarwire-broker-{__version__}"
MAX_PROTOCOL_VERSION = 21
# Limits on what one client can make the broker hold (Broker options and CLI flags of the same names).
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # unsent output per connection before it is paused
DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # seconds from accept to an accepted CONNECT
DEFAULT_MAX_FRAME_BEFORE_CONNECT = 64 * 1024
DEFAULT_FRAME_TIMEOUT = 30.0  # seconds one frame may take to arrive in full
DEFAULT_MAX_INPUT_BYTES = 256 * 1024 * 1024  # unfinished frames held, all connections together
CLOSE_GRACE = 5.0  # seconds a closing connection may take to send its last bytes before it is aborted
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
                 keep_alive_interval: float = 30.0, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                 max_frame_before_connect: int = DEFAULT_MAX_FRAME_BEFORE_CONNECT,
                 frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
                 max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> None:
        if max_input_bytes < max_message_size + codec.FRAME_PADDING:
            raise ValueError("max_input_bytes must hold at least one frame of the max message size")
        for name, value in (("max_connections", max_connections), ("max_output_bytes", max_output_bytes),
                            ("handshake_timeout", handshake_timeout), ("frame_timeout", frame_timeout)):
            if value <= 0:
                raise ValueError(f"{name} must be positive")
        if max_frame_before_connect < 64:
            raise ValueError("max_frame_before_connect must be at least 64 bytes (a CONNECT must fit)")
        self.core = core
        self.max_connections = max_connections
        self.max_output_bytes = max_output_bytes
        self.handshake_timeout = handshake_timeout
        self.max_frame_before_connect = max_frame_before_connect
        self.frame_timeout = frame_timeout
        self.max_input_bytes = max_input_bytes
        self.input_bytes = 0  # bytes of unfinished frames held by every connection
        self._input_paused: set[BrokerConnection] = set()
        # what hostile or slow clients cost: refused/closed connections, pauses, peak output held
        self.counters: collections.Counter[str] = collections.Counter()
        self._sweeper: asyncio.Task | None = None
        if auth_tokens is not None and (not auth_tokens or any(not token for token in auth_tokens)):
            raise ValueError("auth tokens must be non-empty strings (an empty one would admit a CONNECT without a token)")
        self.auth_tokens = None if auth_tokens is None else [t.encode() for t in auth_tokens]
        self.max_message_size = max_message_size
        self.keep_alive_interval = keep_alive_interval
        self.connections: set[BrokerConnection] = set()
        self.lookup_url = ""  # what lookups answer: this broker, or a proxy in front of it
        self.service_url_tls = ""

    def protocol(self, tls: bool = False) -> Callable[[], "BrokerConnection"]:
        return lambda: BrokerConnection(self, tls)

    def close_all(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.connections):
            conn.close()

    def stats(self) -> dict[str, int]:
        """The counters, plus what live connections hold now: unsent output and unfinished input."""
        live = list(self.connections)
        return dict(self.counters, connections=len(live),
                    output_bytes=sum(c.output_bytes for c in live),
                    input_bytes=self.input_bytes,
                    paused_connections=sum(1 for c in live if not c.writable))

    def release_input(self) -> None:
        """Let connections paused for the input budget read again once half of it is free."""
        if self._input_paused and self.input_bytes <= self.max_input_bytes // 2:
            paused, self._input_paused = self._input_paused, set()
            for conn in paused:
                conn.set_input_paused(False)

    def watch(self) -> None:
        """Start the sweep that closes connections past their handshake or frame deadline."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        step = max(0.05, min(1.0, self.handshake_timeout / 4, self.frame_timeout / 4))
        try:
            while True:
                await asyncio.sleep(step)
                now = time.monotonic()
                for conn in list(self.connections):
                    conn.check_deadlines(now)
                self.release_input()
        except asyncio.CancelledError:
            pass


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
        self.refused = ""  # why authentication failed: every request is answered with that error
        self.closed = False
        # False while unsent output is over the budget: no dispatch to it, no reading from it
        self.writable = True
        self.producers: dict[int, PulsarProducer] = {}
        self.consumers: dict[int, PulsarConsumer] = {}
        self.last_received = time.monotonic()
        self.accepted_at = self.last_received
        self._partial_since: float | None = None  # when the unfinished frame in the reader began
        self._keepalive: asyncio.Task | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._transport_bytes = 0  # the transport's buffer at the last flush: it only drains until the next
        self._flush_scheduled = False
        self._transport_paused = False  # between the transport's pause_writing and resume_writing
        self._input_paused = False  # while unfinished frames of all connections are over their budget
        self._input_held = 0  # this connection's share of service.input_bytes
        self._reading = True

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        service = self.service
        budget = service.max_output_bytes
        transport.set_write_buffer_limits(high=budget, low=budget // 2)
        if len(service.connections) >= service.max_connections:
            service.counters["refused_connections"] += 1
            log.warning("refusing a connection: at the limit of %d connections", service.max_connections)
            self._error(_U64, pb.ServiceNotReady,
                        f"too many connections: this broker serves at most {service.max_connections}")
            self.close()
            return
        self.reader.max_frame_size = service.max_frame_before_connect
        service.connections.add(self)
        service.watch()
        self._keepalive = asyncio.ensure_future(self._keep_alive())

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        now = self.last_received = time.monotonic()
        try:
            self.reader.feed(data)
        except PulsarWireError as exc:
            log.warning("closing connection: %s", exc)
            self.close()
            return
        if self._partial_since is None:
            self._partial_since = now
        self._process()

    def _process(self) -> None:
        """Handle the complete frames the reader holds, stopping while output is over budget."""
        completed = False
        try:
            while self.writable and not self.closed:
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
                completed = True
                self._handle(frame)
        except PulsarWireError as exc:
            if isinstance(exc, FrameTooLargeError) and not self.connected:
                self.service.counters["oversized_frames_before_connect"] += 1
            log.warning("closing connection: %s", exc)
            self.close()
        if not self.reader.buffered:
            self._partial_since = None
        elif completed:  # the unfinished frame began after the last complete one
            self._partial_since = time.monotonic()
        if not self.closed:
            self._account_input()
        self.flush()

    def _peer_closed(self) -> bool:
        """Whether the peer has shut down its side: asyncio cannot see that while reading is paused."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not hasattr(select, "POLLRDHUP"):
            return False  # the frame timeout still bounds what it holds
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                   for _, events in poller.poll(0))

    def check_deadlines(self, now: float) -> None:
        """Close a connection that has not completed its handshake, or whose frame is too slow;
        and one paused for reading whose peer has gone, so what it holds is freed at once."""
        service = self.service
        if not self._reading and self._peer_closed():
            self.close(abort=True)
        elif (not self.connected or self.refused) and now - self.accepted_at > service.handshake_timeout:
            service.counters["handshake_timeouts"] += 1
            log.warning("closing a connection %s after %.0fs", "refused authentication" if self.refused
                        else "that did not CONNECT", service.handshake_timeout)
            self.close(abort=True)
        elif self.writable and self._partial_since is not None and self.reader.buffered and \
                now - self._partial_since > service.frame_timeout:
            service.counters["frame_timeouts"] += 1
            log.warning("closing a connection whose frame took over %.0fs (%d bytes arrived)",
                        service.frame_timeout, self.reader.buffered)
            self.close(abort=True)

    def connection_lost(self, exc) -> None:
        self._cleanup()

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._resume()

    def _resume_unless_transport_paused(self) -> None:
        if not self._transport_paused:
            self._resume()

    def _set_reading(self) -> None:
        """Read while output is under its budget and the broker-wide input budget allows."""
        reading = self.writable and not self._input_paused
        if reading != self._reading and self.transport is not None and not self.closed:
            self._reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def set_input_paused(self, paused: bool) -> None:
        self._input_paused = paused
        if not paused and self._partial_since is not None:
            self._partial_since = time.monotonic()  # it was waiting for us, not the client for it
        self._set_reading()

    def _account_input(self) -> None:
        """Count this connection's unfinished frame in the broker-wide input budget; pause its reading
        while the budget is spent (complete small frames never hold input, so they still pass)."""
        service = self.service
        held = self.reader.buffered
        service.input_bytes += held - self._input_held
        freed = held < self._input_held
        self._input_held = held
        if held and not self._input_paused and service.input_bytes > service.max_input_bytes:
            service.counters["input_pauses"] += 1
            service._input_paused.add(self)
            self.set_input_paused(True)
        elif freed:
            service.release_input()

    def _pause(self) -> None:
        if self.writable:
            self.writable = False
            self.service.counters["output_pauses"] += 1
            self._set_reading()

    def _resume(self) -> None:
        if self.writable or self.closed:
            return
        self.writable = True
        self._set_reading()
        if self._partial_since is not None:
            self._partial_since = time.monotonic()  # the client may have been stalled by us
        for consumer in list(self.consumers.values()):
            consumer.subscription.dispatch()
        self._process()  # frames read before the pause

    # output

    @property
    def output_bytes(self) -> int:
        """Output queued and not yet taken by the socket."""
        transport = self.transport
        buffered = transport.get_write_buffer_size() if transport is not None and not self.closed else 0
        return self._out_bytes + buffered

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        if self.writable and self._out_bytes + self._transport_bytes > self.service.max_output_bytes:
            self._transport_bytes = self.transport.get_write_buffer_size() if self.transport is not None else 0
            if self._out_bytes + self._transport_bytes > self.service.max_output_bytes:
                self._pause()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.closed:
            self.core.commit()  # nothing is acknowledged before it is written
            self.transport.writelines(self._out)
            self._out_bytes = 0
            self._transport_bytes = output = self.transport.get_write_buffer_size()
            if output > self.service.counters["peak_connection_output_bytes"]:
                self.service.counters["peak_connection_output_bytes"] = output
        self._out.clear()
        self._out_bytes = 0
        if not self.writable and not self.closed and not self._transport_paused:
            # the transport holds at most the budget and will send no resume_writing: resume
            # (scheduled, as flush runs inside _process)
            asyncio.get_running_loop().call_soon(self._resume_unless_transport_paused)

    def command(self, kind: Any, field: str, sub) -> None:
        cmd = T(type=kind)
        getattr(cmd, field).CopyFrom(sub)
        self.write(codec.encode_command(cmd))

    def close(self, abort: bool = False) -> None:
        """Close after sending what is queued; `abort` drops it. A peer that does not read what is
        left within CLOSE_GRACE is aborted, so its unsent output is freed."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if abort:
                transport.abort()
            else:
                self.flush()
                transport.close()
                if transport.get_write_buffer_size():
                    asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)
        self._cleanup()

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.writable = False
        # hand back what this connection held: unread input, unsent output
        self.reader = _CLOSED_READER
        self.service.input_bytes -= self._input_held
        self._input_held = 0
        self.service._input_paused.discard(self)
        self.service.release_input()
        self._out.clear()
        self._out_bytes = 0
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
            if self.refused:
                self._send_error(frame.producer_id, frame.sequence_id, pb.AuthenticationError, self.refused)
                return
            self.on_send_fast(frame)
            return
        kind = frame.command.type
        if not self.connected and kind != T.CONNECT:
            raise PulsarWireError(f"command {kind} before CONNECT")
        if self.refused and kind not in (T.PING, T.PONG):
            self._refuse(frame.command)
            return
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
            offered = c.auth_data if c.HasField("auth_data") else b""
            # compare with every token, so the time taken does not tell which one nearly matched
            matched = [hmac.compare_digest(offered, token) for token in tokens]
            if c.auth_method_name != "token" or not offered or not any(matched):
                # The official (C++) client treats any answer to CONNECT but CONNECTED as a broken
                # connection and retries until its operation timeout. So the handshake completes,
                # and every request on this connection is refused with AuthenticationError, which
                # clients raise at once; the handshake timeout closes the connection.
                log.warning("authentication failed (method %r)", c.auth_method_name)
                self.refused = "authentication failed: " + (
                    "no token offered" if not offered else "the token is not accepted")
        self.connected = True
        if not self.refused:  # an unauthenticated connection keeps the small frame limit
            self.reader.max_frame_size = self.service.max_message_size + codec.FRAME_PADDING
        response = pb.CommandConnected(server_version=SERVER_VERSION,
                                       protocol_version=min(c.protocol_version, MAX_PROTOCOL_VERSION),
                                       max_message_size=self.service.max_message_size)
        self.command(T.CONNECTED, "connected", response)

    def _refuse(self, command) -> None:
        """Answer one request on an unauthenticated connection with AuthenticationError."""
        kind = command.type
        if kind == T.LOOKUP:
            self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", pb.CommandLookupTopicResponse(
                request_id=command.lookupTopic.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=pb.AuthenticationError, message=self.refused))
        elif kind == T.PARTITIONED_METADATA:
            self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                         pb.CommandPartitionedTopicMetadataResponse(
                             request_id=command.partitionMetadata.request_id,
                             response=pb.CommandPartitionedTopicMetadataResponse.Failed,
                             error=pb.AuthenticationError, message=self.refused))
        elif kind == T.SEND:
            self._send_error(command.send.producer_id, command.send.sequence_id, pb.AuthenticationError,
                             self.refused)
        else:
            request_id = _request_id(command)
            if request_id is not None:
                self._error(request_id, pb.AuthenticationError, self.refused)

    def on_ping(self, frame) -> None:
        self.command(T.PONG, "pong", pb.CommandPong())

    def on_pong(self, frame) -> None:
        pass

    def on_lookup(self, frame) -> None:
        c = frame.command.lookupTopic
        try:
            self.core.check_topic_name(c.topic)
        except InvalidTopicName as exc:
            self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", pb.CommandLookupTopicResponse(
                request_id=c.request_id, response=pb.CommandLookupTopicResponse.Failed,
                error=pb.InvalidTopicName, message=str(exc)))
            return
        response = pb.CommandLookupTopicResponse(request_id=c.request_id, authoritative=True,
                                                 response=pb.CommandLookupTopicResponse.Connect,
                                                 brokerServiceUrl=self.service.lookup_url)
        if self.service.service_url_tls:
            response.brokerServiceUrlTls = self.service.service_url_tls
        self.command(T.LOOKUP_RESPONSE, "lookupTopicResponse", response)

    def on_partitioned_metadata(self, frame) -> None:
        c = frame.command.partitionMetadata
        try:
            partitions = self.core.partitions_of(c.topic)
        except InvalidTopicName as exc:
            self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                         pb.CommandPartitionedTopicMetadataResponse(
                             request_id=c.request_id, response=pb.CommandPartitionedTopicMetadataResponse.Failed,
                             error=pb.InvalidTopicName, message=str(exc)))
            return
        self.command(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                     pb.CommandPartitionedTopicMetadataResponse(
                         request_id=c.request_id, partitions=partitions,
                         response=pb.CommandPartitionedTopicMetadataResponse.Success))

    def on_producer(self, frame) -> None:
        c = frame.command.producer
        try:
            topic = self.core.topic(c.topic)
        except InvalidTopicName as exc:
            self._error(c.request_id, pb.InvalidTopicName, str(exc))
            return
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
            self.core.new_producer_name(topic)
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
                   frame.metadata_and_payload, frame.checksum,
                   (md.num_messages_in_batch if md.HasField("num_messages_in_batch") else None, md.compression))

    def on_send_fast(self, f) -> None:
        """A plain Send frame read by the codec's fast path."""
        self.store(f.producer_id, f.sequence_id, f.highest_sequence_id, f.num_messages, f.is_chunk, f.chunk_id,
                   f.publish_time, f.deliver_at_time, f.metadata_and_payload, f.checksum,
                   (f.num_messages_in_batch, f.compression))

    def store(self, producer_id, sequence_id, highest_sequence_id, num_messages, is_chunk, chunk_id,
              publish_time, deliver_at_time, body, checksum, batch=None) -> None:
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
                                     deliver_at_time, num_messages, batch)
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
        try:
            topic = self.core.topic(c.topic)
        except InvalidTopicName as exc:
            self._error(c.request_id, pb.InvalidTopicName, str(exc))
            return
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
        refused = []
        if consumer is not None:
            subscription = consumer.subscription
            cumulative = c.ack_type == pb.CommandAck.Cumulative
            for mid in c.message_id:
                if not subscription.ack(mid.entryId, ack_set_bits(mid.ack_set) if mid.ack_set else None,
                                        cumulative):
                    refused.append(mid.entryId)
            subscription.dispatch()
            subscription.check_end_of_topic()
            if refused:
                log.warning("refused acks of entries %s on %s: the topic ends before entry %d",
                            refused[:5], subscription.topic.name, subscription.topic.log.next_entry_id)
        if c.HasField("request_id"):
            response = pb.CommandAckResponse(consumer_id=c.consumer_id, request_id=c.request_id)
            if refused:
                response.error = pb.NotAllowedError
                response.message = f"no entry {refused[0]} on this topic: acknowledgement refused"
            self.command(T.ACK_RESPONSE, "ackResponse", response)

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


_CLOSED_READER = codec.FrameReader(8)  # what a closed connection holds instead of its buffers


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
