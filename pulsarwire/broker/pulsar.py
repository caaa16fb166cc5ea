"""The broker's Pulsar binary protocol front end: a service holding its settings and
connections, one `BrokerConnection` per client connection, and the links through
which the domain reaches this connection's producers and consumers.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import hmac
import logging
import re
import struct
import select
import time
from typing import Any, Callable

from crc32c import crc32c

from .. import __version__, codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import BadMetadataError, ChecksumMismatchError, FrameTooLargeError, PulsarWireError
from ..messages import ack_set_bits
from ..schema import schema_definitions_match
from .core import DUPLICATE, BrokerCore, InvalidTopicName, close_transport, highest_sequence
from .storage import StorageError
from .topics import (
    EARLIEST, LATEST, SHARED, ConsumerLink, MalformedBatchError, ProducerBusyError, ProducerFencedError,
    ProducerLink, Subscription, Topic, start_entry,
)

log = logging.getLogger("pulsarwire.broker")
_NO_ENTRY = (1 << 64) - 1  # entry id -1 as the wire's uint64 carries it
T = pb.BaseCommand
SERVER_VERSION = f"pulsarwire-broker-{__version__}"
MAX_PROTOCOL_VERSION = 21
# Limits on what one client can make the broker hold (Broker options and CLI flags of the same names).
DEFAULT_MAX_CONNECTIONS = 1000
MAX_SEND_RUN = 256  # Send frames stored together: their receipts may pass the output budget by this many
DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # unsent output per connection before it is paused
DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # seconds from accept to an accepted CONNECT
DEFAULT_MAX_FRAME_BEFORE_CONNECT = 64 * 1024
DEFAULT_FRAME_TIMEOUT = 30.0  # seconds one frame may take to arrive in full
DEFAULT_MAX_INPUT_BYTES = 256 * 1024 * 1024  # unfinished frames held, all connections together
_U64 = 0xFFFFFFFFFFFFFFFF
_I64_MAX = 0x7FFFFFFFFFFFFFFF


def message_id(topic: Topic, entry_id: int) -> pb.MessageIdData:
    return pb.MessageIdData(ledgerId=topic.ledger_of(entry_id), entryId=entry_id & _U64)


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
                 auth_basic: dict[str, str] | None = None, auth_tls: bool = False,
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
        self.auth_basic = auth_basic  # username -> password
        self.auth_tls = auth_tls  # accept a client certificate the TLS listener verified
        self.max_message_size = max_message_size
        self.keep_alive_interval = keep_alive_interval
        self.connections: set[BrokerConnection] = set()
        self.lookup_url = ""  # what lookups answer: this broker, or a proxy in front of it
        self.service_url_tls = ""

    @property
    def auth_enabled(self) -> bool:
        return self.auth_tokens is not None or self.auth_basic is not None or self.auth_tls

    def authenticate(self, method: str, data: bytes, peer_certificate: dict | None) -> str | None:
        """The role a CONNECT proves, or None. Methods: token, basic (`user:password`), tls."""
        if method == "token" and self.auth_tokens is not None:
            # compare with every token, so the time taken does not tell which one nearly matched
            matched = [hmac.compare_digest(data, token) for token in self.auth_tokens]
            return "token" if data and any(matched) else None
        if method == "basic" and self.auth_basic is not None:
            user, sep, password = data.decode("utf-8", "replace").partition(":")
            expected = self.auth_basic.get(user)
            if sep and expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
                return user
            return None
        if method == "tls" and self.auth_tls and peer_certificate:
            subject = dict(pair for rdn in peer_certificate.get("subject", ()) for pair in rdn)
            return subject.get("commonName", "tls")
        return None

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
        self.topic = subscription.topic

    @property
    def writable(self) -> bool:
        return self.conn.writable

    def deliver(self, entry, redelivery_count: int, ack_set) -> None:
        cmd = pb.BaseCommand(type=pb.BaseCommand.MESSAGE)
        m = cmd.message
        m.consumer_id = self.consumer_id
        topic = self.topic
        entry_id = entry.entry_id
        m.message_id.ledgerId = topic.ledger_id if entry_id >= topic.ledger_start else topic.ledger_of(entry_id)
        m.message_id.entryId = entry_id
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
        self.epoch: int | None = None  # the topic epoch an exclusive producer holds the topic at
        self.schema_version: bytes | None = None  # of the schema it declared, if any

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.conn.closed

    def evict(self) -> None:
        self.conn.producers.pop(self.producer_id, None)
        self.conn.waiting_producers.pop(self.producer_id, None)
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
        self.waiting_producers: dict[int, PulsarProducer] = {}  # WaitForExclusive, not yet granted
        self.consumers: dict[int, PulsarConsumer] = {}
        self.last_received = time.monotonic()
        self.accepted_at = self.last_received
        self._partial_since: float | None = None  # when the unfinished frame in the reader began
        self._keepalive: asyncio.Task | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._transport_bytes = 0  # the transport's buffer at the last flush: it only drains until the next
        self._flush_scheduled = False
        # receipts in _out wait on their group commit: (index in _out, batch, producer, sequence id)
        self._sends: list[tuple] = []
        self._batches: list = []  # the distinct commit batches those receipts belong to
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
        """Handle the complete frames the reader holds, stopping while output is over budget.
        Plain Send frames read one after another are stored together (the hot path), before
        anything read after them is handled."""
        completed = False
        send_frame = codec.SendFrame
        sends: list = []
        try:
            while self.writable and not self.closed:
                try:
                    frame = self.reader.next_frame()
                except (ChecksumMismatchError, BadMetadataError) as exc:
                    self._store_sends(sends)
                    command = getattr(exc, "command", None)
                    if command is not None and command.type == T.SEND:
                        self._send_error(command.send.producer_id, command.send.sequence_id,
                                         pb.ChecksumError, str(exc))
                        continue
                    raise
                if frame is None:
                    break
                completed = True
                if type(frame) is send_frame and self.connected and not self.refused:
                    sends.append(frame)  # a plain Send frame read by the codec's fast path
                    if len(sends) >= MAX_SEND_RUN:
                        self._store_sends(sends)
                    continue
                self._store_sends(sends)
                if type(frame) is send_frame:
                    if not self.connected:
                        raise PulsarWireError("SEND before CONNECT")
                    self._send_error(frame.producer_id, frame.sequence_id, pb.AuthenticationError, self.refused)
                else:
                    self._handle(frame)
            self._store_sends(sends)
        except PulsarWireError as exc:
            self._store_sends(sends)
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
        self._queued(len(data))

    def _queued(self, size: int) -> None:
        """`size` bytes were put in self._out: pause past the output budget, schedule a flush."""
        self._out_bytes += size
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
            if self._sends and any(batch.error is not None for batch in self._batches):
                self._fail_uncommitted_sends()
            self.transport.writelines(self._out)
            self._out_bytes = 0
            self._transport_bytes = output = self.transport.get_write_buffer_size()
            if output > self.service.counters["peak_connection_output_bytes"]:
                self.service.counters["peak_connection_output_bytes"] = output
        self._out.clear()
        self._sends.clear()
        self._batches.clear()
        self._out_bytes = 0
        if not self.writable and not self.closed and not self._transport_paused:
            # the transport holds at most the budget and will send no resume_writing: resume
            # (scheduled, as flush runs inside _process)
            asyncio.get_running_loop().call_soon(self._resume_unless_transport_paused)

    def _fail_uncommitted_sends(self) -> None:
        """The file system refused a group commit: each of its sends is answered SendError
        in place of its receipt (the log and the dedup state were rolled back)."""
        for index, batch, producer_id, sequence_id in self._sends:
            if batch.error is not None:
                cmd = T(type=T.SEND_ERROR)
                cmd.send_error.CopyFrom(pb.CommandSendError(
                    producer_id=producer_id, sequence_id=sequence_id, error=pb.PersistenceError,
                    message=f"not stored: {batch.error}"))
                self._out[index] = codec.encode_command(cmd)

    def command(self, kind: Any, field: str, sub) -> None:
        cmd = T(type=kind)
        getattr(cmd, field).CopyFrom(sub)
        self.write(codec.encode_command(cmd))

    def close(self, abort: bool = False) -> None:
        """Close after sending what is queued; `abort` drops it. A peer that does not read what is
        left within CLOSE_GRACE is aborted, so its unsent output is freed."""
        close_transport(self.transport, abort, self.flush)
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
        for producer in list(self.producers.values()) + list(self.waiting_producers.values()):
            producer.topic.remove_producer(producer)
        self.producers.clear()
        self.waiting_producers.clear()
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
        try:
            handler(self, frame)
        except StorageError as exc:
            # the file system refused (no descriptors left, disk full): an error reply, and the
            # connection stays up for the client to retry
            log.error("command %s failed: %s", kind, exc)
            request_id = _request_id(frame.command)
            if request_id is not None:
                self._error(request_id, pb.PersistenceError, str(exc))

    def _error(self, request_id: int, code: Any, message: str) -> None:
        self.command(T.ERROR, "error", pb.CommandError(request_id=request_id, error=code, message=message))

    def _request_topic(self, request_id: int, name: str):
        """The topic a producer or subscribe request names, or None after answering its error."""
        try:
            topic = self.core.topic(name)
        except InvalidTopicName as exc:
            self._error(request_id, pb.InvalidTopicName, str(exc))
            return None
        if topic is None:
            self._error(request_id, pb.TopicNotFound, f"{name} is a partitioned topic; use a partition")
        return topic

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
        if self.service.auth_enabled:
            peer = self.transport.get_extra_info("peercert") if self.tls and self.transport else None
            offered = c.auth_data if c.HasField("auth_data") else b""
            if self.service.authenticate(c.auth_method_name, offered, peer) is None:
                # The official (C++) client treats any answer to CONNECT but CONNECTED as a broken
                # connection and retries until its operation timeout. So the handshake completes,
                # and every request on this connection is refused with AuthenticationError, which
                # clients raise at once; the handshake timeout closes the connection.
                log.warning("authentication failed (method %r)", c.auth_method_name)
                self.refused = "authentication failed: " + (
                    "no credentials offered" if not offered and c.auth_method_name != "tls"
                    else "the credentials are not accepted")
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
        topic = self._request_topic(c.request_id, c.topic)
        if topic is None:
            return
        if topic.terminated:
            self._error(c.request_id, pb.TopicTerminatedError, f"{c.topic} is terminated")
            return
        existing = self.producers.get(c.producer_id)
        if existing is not None and existing.topic is topic:  # a retried create: answer again
            self._producer_success(c.request_id, existing, existing.epoch)
            return
        waiting = self.waiting_producers.get(c.producer_id)
        if waiting is not None and waiting.topic is topic:
            self._producer_success(c.request_id, waiting, None)
            return
        accepted, schema_version = self._attach_schema(c.request_id, topic,
                                                       c.schema if c.HasField("schema") else None)
        if not accepted:
            return
        name = c.producer_name if c.HasField("producer_name") and c.producer_name else \
            self.core.new_producer_name(topic)
        holder = topic.producers.get(name)
        if holder is not None and getattr(holder, "conn", None) is not self and not holder.closed:
            self._error(c.request_id, pb.ProducerBusy, f"producer {name} is already connected to {c.topic}")
            return
        if c.HasField("initial_subscription_name") and c.initial_subscription_name:
            topic.subscription(c.initial_subscription_name, pb.CommandSubscribe.Shared, True, True, None)
        producer = PulsarProducer(self, c.producer_id, topic, name)
        producer.schema_version = schema_version
        request_id = c.request_id

        def granted(epoch: int) -> None:  # a WaitForExclusive producer got the topic
            if self.waiting_producers.pop(producer.producer_id, None) is producer and not self.closed:
                self.producers[producer.producer_id] = producer
                producer.epoch = epoch
                self._producer_success(request_id, producer, epoch)
                self.flush()

        def refused(error: Exception) -> None:
            if self.waiting_producers.pop(producer.producer_id, None) is producer and not self.closed:
                code = pb.ProducerFenced if isinstance(error, ProducerFencedError) else pb.PersistenceError
                self._error(request_id, code, str(error))
                self.flush()

        try:
            epoch = topic.add_producer(producer, c.producer_access_mode,
                                       c.topic_epoch if c.HasField("topic_epoch") else None, granted, refused)
        except ProducerBusyError as exc:
            self._error(c.request_id, pb.ProducerBusy, str(exc))
            return
        except ProducerFencedError as exc:
            self._error(c.request_id, pb.ProducerFenced, str(exc))
            return
        if epoch is None:
            self.waiting_producers[c.producer_id] = producer
        else:
            producer.epoch = epoch if c.producer_access_mode != SHARED else None
            self.producers[c.producer_id] = producer
        self._producer_success(c.request_id, producer, producer.epoch)

    def _producer_success(self, request_id: int, producer: PulsarProducer, epoch: int | None) -> None:
        """Answer a create; a waiting producer (not ready yet) is answered again once it is granted."""
        response = pb.CommandProducerSuccess(
            request_id=request_id, producer_name=producer.name,
            last_sequence_id=producer.topic.last_sequence.get(producer.name, -1))
        if producer.producer_id in self.waiting_producers:
            response.producer_ready = False
        elif epoch is not None:
            response.topic_epoch = epoch
        if producer.schema_version is not None:
            response.schema_version = producer.schema_version
        self.command(T.PRODUCER_SUCCESS, "producer_success", response)

    def on_send(self, frame) -> None:
        """A Send frame decoded in full (the fast path declined it)."""
        s = frame.command.send
        md = frame.metadata
        if md is None:
            self._send_error(s.producer_id, s.sequence_id, pb.UnknownError, "SEND without payload")
            return
        self.store(s.producer_id, s.sequence_id,
                   s.highest_sequence_id if s.HasField("highest_sequence_id") else None,
                   md.num_messages_in_batch if md.HasField("num_messages_in_batch") else None,
                   s.is_chunk, md.chunk_id if md.HasField("chunk_id") else None, md.publish_time,
                   md.deliver_at_time if md.HasField("deliver_at_time") else None,
                   frame.metadata_and_payload, frame.checksum, md.compression)

    def _store_sends(self, frames: list) -> None:
        """Store plain Send frames (codec.SendFrame) in order, each run of one producer's frames
        with one call to its topic, and queue their receipts; `frames` is emptied."""
        try:
            self._store_runs(frames)
        finally:
            frames.clear()

    def _store_runs(self, frames: list) -> None:
        start, end = 0, len(frames)
        while start < end:
            frame = frames[start]
            producer_id = frame.producer_id
            producer = self.producers.get(producer_id)
            if producer is None or producer.topic.terminated or producer.topic.fenced:
                self._store_frame(frame)
                start += 1
                continue
            topic = producer.topic
            run_end = start + 1
            while run_end < end and frames[run_end].producer_id == producer_id:
                run_end += 1
            ids = topic.append_sends(frames, start, run_end, producer.name)
            if not ids:  # the first needs the general path
                self._store_frame(frame)
                start += 1
                continue
            batch = topic.log.batch
            if not self._batches or self._batches[-1] is not batch:
                self._batches.append(batch)
            if not self.closed:
                self._queued(codec.queue_send_receipts(self._out, self._sends, batch, producer_id, frames, start, ids,
                                                       topic.ledger_id, DUPLICATE))
            start += len(ids)

    def _store_frame(self, frame) -> None:
        self.store(frame.producer_id, frame.sequence_id, frame.highest_sequence_id, frame.num_messages_in_batch,
                   frame.is_chunk, frame.chunk_id, frame.publish_time, frame.deliver_at_time,
                   frame.metadata_and_payload, frame.checksum, frame.compression)

    def store(self, producer_id, sequence_id, highest_sequence_id, batch_count, is_chunk, chunk_id,
              publish_time, deliver_at_time, body, checksum, compression: int | None = None) -> None:
        """Append one entry (unless it is a duplicate) and answer with its receipt. `batch_count` is
        the metadata's num_messages_in_batch (None: not a batch); CommandSend's num_messages is not
        trusted."""
        producer = self.producers.get(producer_id)
        if producer is None:
            self._send_error(producer_id, sequence_id, pb.NotAllowedError, "unknown producer id")
            return
        topic = producer.topic
        if topic.terminated:
            self._send_error(producer_id, sequence_id, pb.TopicTerminatedError, "topic is terminated")
            return
        if topic.fenced and topic.refuses(producer, sequence_id):
            self._send_error(producer_id, sequence_id, pb.PersistenceError,
                             "an earlier send of this producer was not stored: resend it first")
            return
        try:
            entry_id = self.core.publish(topic, producer.name, sequence_id, highest_sequence_id,
                                         bool(is_chunk and chunk_id), body, checksum, publish_time,
                                         deliver_at_time, batch_count, compression)
        except StorageError as exc:
            topic.fence(producer)
            self._send_error(producer_id, sequence_id, pb.PersistenceError, f"not stored: {exc}")
            return
        except MalformedBatchError as exc:
            # ChecksumError: the official client fails that one message and keeps its connection
            self._send_error(producer_id, sequence_id, pb.ChecksumError, f"not stored: {exc}")
            return
        # the receipt stands only if its group commit succeeds (see flush); a duplicate, judged
        # against pending sends too, waits on the same batch and is answered with the (-1, -1) id
        batch = topic.log.batch
        if not self._batches or self._batches[-1] is not batch:
            self._batches.append(batch)
        self._sends.append((len(self._out), batch, producer_id, sequence_id))
        self.write(codec.encode_send_receipt(producer_id, sequence_id,
                                             highest_sequence(sequence_id, highest_sequence_id),
                                             topic.ledger_id if entry_id != DUPLICATE else -1, entry_id))

    def on_close_producer(self, frame) -> None:
        c = frame.command.close_producer
        producer = self.producers.pop(c.producer_id, None) or self.waiting_producers.pop(c.producer_id, None)
        if producer is not None:
            producer.topic.remove_producer(producer)
        self._success(c.request_id)

    def on_subscribe(self, frame) -> None:
        c = frame.command.subscribe
        topic = self._request_topic(c.request_id, c.topic)
        if topic is None:
            return
        if c.consumer_id in self.consumers:
            self._answer_subscribe(c.request_id, self.consumers[c.consumer_id])  # a retried subscribe
            return
        if not self._attach_schema(c.request_id, topic, c.schema if c.HasField("schema") else None)[0]:
            return
        subscription = topic.subscription(c.subscription, c.subType, c.durable,
                                          c.initialPosition == pb.CommandSubscribe.Earliest,
                                          start_position(c.start_message_id)
                                          if c.HasField("start_message_id") else None, wait=False)
        if subscription.consumers and subscription.type != c.subType:
            self._error(c.request_id, pb.ConsumerBusy,
                        f"subscription {c.subscription} is of another type")
            return
        if subscription.type == pb.CommandSubscribe.Exclusive and subscription.consumers:
            self._error(c.request_id, pb.ConsumerBusy, f"exclusive subscription {c.subscription} is in use")
            return
        sticky = False
        if c.subType == pb.CommandSubscribe.Key_Shared:
            meta = c.keySharedMeta
            sticky = c.HasField("keySharedMeta") and meta.keySharedMode == pb.STICKY
            ranges = [(r.start, r.end) for r in meta.hashRanges] if sticky else []
            refusal = subscription.key_shared_refusal(sticky, ranges)
            if refusal is not None:
                self._error(c.request_id, pb.ConsumerAssignError, refusal)
                return
        subscription.type = c.subType
        consumer = PulsarConsumer(self, c.consumer_id, subscription, c.consumer_name or str(c.consumer_id),
                                  c.priority_level)
        if sticky:
            consumer.hash_ranges = ranges
        self.consumers[c.consumer_id] = consumer
        subscription.add_consumer(consumer, sticky)
        self._answer_subscribe(c.request_id, consumer)

    def _answer_subscribe(self, request_id: int, consumer: PulsarConsumer) -> None:
        """Success once the subscription is on disk; the metadata writer stores a new one while
        the event loop goes on. Not stored: an error, and the consumer is gone again."""
        subscription = consumer.subscription
        stored = subscription.topic.stored(subscription)
        if stored is None:
            self._success(request_id)
            subscription.check_end_of_topic()
            return

        def answer(done: asyncio.Future) -> None:
            if self.closed or self.consumers.get(consumer.consumer_id) is not consumer:
                return
            error = None if done.cancelled() else done.exception()
            if error is None:
                self._answer_subscribe(request_id, consumer)
            else:
                self.consumers.pop(consumer.consumer_id, None)
                subscription.detach(consumer)
                self._error(request_id, pb.PersistenceError, f"the subscription is not stored: {error}")
            self.flush()
        asyncio.wrap_future(stored).add_done_callback(answer)

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
                if cumulative and mid.entryId == _NO_ENTRY:
                    continue  # "before the first entry" (a reader after a seek): nothing to move
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
        # As Pulsar does: close the consumers first, then answer, so that a client re-subscribes
        # from the seek position (the official client takes it as its start while the seek is
        # pending); a reader's non-durable subscription is kept meanwhile (topics.py).
        for other in list(subscription.consumers):
            other.evict()
        self._success(c.request_id)

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
        last = message_id(subscription.topic, last_entry)
        if batch_index >= 0:
            last.batch_index = batch_index
        response = pb.CommandGetLastMessageIdResponse(request_id=c.request_id, last_message_id=last)
        response.consumer_mark_delete_position.CopyFrom(message_id(subscription.topic, subscription.cursor.mark_delete))
        self.command(T.GET_LAST_MESSAGE_ID_RESPONSE, "getLastMessageIdResponse", response)

    def on_get_topics_of_namespace(self, frame) -> None:
        c = frame.command.getTopicsOfNamespace
        if not _NAMESPACE.fullmatch(c.namespace):
            self._error(c.request_id, pb.InvalidTopicName, f"invalid namespace {c.namespace!r}")
            return
        modes = pb.CommandGetTopicsOfNamespace
        topics = self.core.topics_of_namespace(c.namespace, persistent=c.mode != modes.NON_PERSISTENT,
                                               non_persistent=c.mode != modes.PERSISTENT)
        response = pb.CommandGetTopicsOfNamespaceResponse(request_id=c.request_id)
        if c.HasField("topics_pattern") and c.topics_pattern:
            matched = _filter_topics(topics, c.topics_pattern)
            if matched is not None:
                topics, response.filtered = matched, True
        response.topics_hash = topics_hash(topics)
        if c.HasField("topics_hash") and c.topics_hash == response.topics_hash:
            response.changed = False  # the client's list is current: no need to send it again
        else:
            response.topics.extend(topics)
        self.command(T.GET_TOPICS_OF_NAMESPACE_RESPONSE, "getTopicsOfNamespaceResponse", response)

    # schemas: one per topic; a producer or consumer may declare it, or the same one, or none

    def _attach_schema(self, request_id: int, topic: Topic, schema: pb.Schema | None) -> tuple[bool, bytes | None]:
        """(accepted, the schema version of a declared schema, registering the first one); not
        accepted after answering IncompatibleSchema; no version when none is declared."""
        if schema is None:
            return True, None
        if topic.schemas:
            version = len(topic.schemas) - 1
            if not schema_definitions_match(_schema_proto(topic.schemas[version]), schema):
                self._error(request_id, pb.IncompatibleSchema,
                            f"a {pb.Schema.Type.Name(schema.type)} schema is incompatible with the "
                            f"{pb.Schema.Type.Name(topic.schemas[version]['type'])} schema of {topic.name}")
                return False, None
        else:
            version = topic.register_schema({
                "type": schema.type, "name": schema.name, "data": base64.b64encode(schema.schema_data).decode(),
                "properties": {p.key: p.value for p in schema.properties}})
        return True, version.to_bytes(8, "big")

    def on_get_schema(self, frame) -> None:
        c = frame.command.getSchema
        name = c.topic
        partitions = self.core.partitioned_count(name)
        if partitions:
            name = f"{name}-partition-0"  # every partition carries the same schema
        topic = self.core.topic(name) if self.core.non_partitioned_exists(name) else None
        response = pb.CommandGetSchemaResponse(request_id=c.request_id)
        versions = topic.schemas if topic is not None else []
        version = int.from_bytes(c.schema_version, "big") if c.HasField("schema_version") and c.schema_version \
            else len(versions) - 1
        if not 0 <= version < len(versions):
            response.error_code = pb.TopicNotFound
            response.error_message = f"no schema for {c.topic}"
        else:
            response.schema.CopyFrom(_schema_proto(versions[version]))
            response.schema_version = version.to_bytes(8, "big")
        self.command(T.GET_SCHEMA_RESPONSE, "getSchemaResponse", response)

    def on_auth_response(self, frame) -> None:
        pass  # we never challenge; a refreshed token needs no answer


_CLOSED_READER = codec.FrameReader(8)  # what a closed connection holds instead of its buffers


_NAMESPACE = re.compile(r"[^/\s]+/[^/\s]+")
MAX_TOPICS_PATTERN = 256  # longer patterns are left to the client to apply, as Pulsar does
MAX_PATTERN_REPEATS = 2  # Python's re cannot be timed out: only patterns that cannot backtrack badly


def _cheap_to_match(regex: str) -> bool:
    """Whether matching `regex` costs at most about (name length)^2 steps: no backreference, no
    repeated group, at most MAX_PATTERN_REPEATS repetitions. Others are left to the client, so a
    client's pattern can never stall the broker."""
    repeats, i, previous = 0, 0, ""
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            if regex[i + 1:i + 2].isdigit():
                return False
            i, previous = i + 2, "atom"
            continue
        if char == "[":  # a character class is one atom: skip to its closing bracket
            i += 2 if regex[i + 1:i + 2] == "^" else 1
            i += 1 if regex[i:i + 1] == "]" else 0
            while i < len(regex) and regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
            i, previous = i + 1, "atom"
            continue
        if char in "*+?{" and previous != "(":
            if previous == ")":
                return False
            repeats += 1
            if char == "{":
                i = regex.find("}", i)
                if i < 0:
                    return False
        previous = char if char in "()" else "atom"
        i += 1
    return repeats <= MAX_PATTERN_REPEATS


def _without_scheme(name: str) -> str:
    return name.split("://", 1)[1] if "://" in name else name


def _filter_topics(topics: list[str], pattern: str) -> list[str] | None:
    """The topics whose name (scheme aside) matches `pattern` in full, or None when the broker
    leaves filtering to the client (a pattern too long or too costly, or one Python cannot compile)."""
    if len(pattern) > MAX_TOPICS_PATTERN or not _cheap_to_match(_without_scheme(pattern)):
        return None
    try:
        regex = re.compile(_without_scheme(pattern))
    except re.error as exc:
        log.info("topics pattern %r left to the client: %s", pattern, exc)
        return None
    return [t for t in topics if regex.fullmatch(_without_scheme(t))]


def topics_hash(topics: list[str]) -> str:
    """A digest of a topic list, which a client sends back to learn whether it changed."""
    return struct.pack("<I", crc32c(",".join(sorted(topics)).encode())).hex()


def _schema_proto(record: dict) -> pb.Schema:
    return pb.Schema(type=record["type"], name=record["name"], schema_data=base64.b64decode(record["data"]),
                     properties=[pb.KeyValue(key=k, value=v) for k, v in sorted(record["properties"].items())])


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
    T.GET_TOPICS_OF_NAMESPACE: BrokerConnection.on_get_topics_of_namespace,
    T.GET_SCHEMA: BrokerConnection.on_get_schema,
}
