"""asyncio client: connections, lookup, producers, consumers and readers.

Protocol state lives in pulsarwire.session (sans-IO); this module owns the
sockets, timers and user-facing objects. Names follow the official Python
client where it has one (`create_producer`, `subscribe`, `send_async`, ...).
"""
from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import logging
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlparse

from . import codec, compression
from ._proto import PulsarApi_pb2 as pb
from .errors import (
    AuthenticationError, AuthorizationError, ConnectionClosedError, CodecError, NotAllowedError,
    ProducerFencedError, ProducerQueueFullError, PulsarWireError, ServerError, TimeoutError,
    TopicNotFoundError, TopicTerminatedError,
)
from .messages import Message, MessageId, ack_set_bits, ack_set_words, signed64
from .routing import HashingScheme, Router, RoutingMode
from .session import (
    ActiveConsumerChanged, ClientSession, Connected, ConnectionFailed, ConsumerClosedByBroker,
    CorruptMessage, EndOfTopic, MessageArrived, ProducerClosedByBroker, RequestDone, RequestFailed,
    SendFailed, SendReceipt,
)

log = logging.getLogger("pulsarwire")

DEFAULT_PORT = 6650
DEFAULT_TLS_PORT = 6651
# Errors after which retrying the same producer or consumer cannot succeed.
_FATAL = (TopicTerminatedError, ProducerFencedError, NotAllowedError, AuthenticationError,
          AuthorizationError, TopicNotFoundError)


class ConsumerType(enum.IntEnum):
    Exclusive = pb.CommandSubscribe.Exclusive
    Shared = pb.CommandSubscribe.Shared
    Failover = pb.CommandSubscribe.Failover
    KeyShared = pb.CommandSubscribe.Key_Shared


class InitialPosition(enum.IntEnum):
    Latest = pb.CommandSubscribe.Latest
    Earliest = pb.CommandSubscribe.Earliest


class CompressionType(enum.IntEnum):
    NONE = compression.NONE
    LZ4 = compression.LZ4
    ZLIB = compression.ZLIB
    ZSTD = compression.ZSTD
    SNAPPY = compression.SNAPPY


class AuthenticationToken:
    """Token auth; `token` is the token string or a callable returning it (refresh)."""

    method_name = "token"

    def __init__(self, token: str | Callable[[], str]) -> None:
        self._token = token

    def auth_data(self) -> bytes:
        token = self._token() if callable(self._token) else self._token
        return token.encode()


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> "Address":
        parsed = urlparse(url)
        if parsed.scheme not in ("pulsar", "pulsar+ssl"):
            raise ValueError(f"service URL must be pulsar:// or pulsar+ssl://, got {url!r}")
        tls = parsed.scheme == "pulsar+ssl"
        if not parsed.hostname:
            raise ValueError(f"service URL has no host: {url!r}")
        return cls(parsed.hostname, parsed.port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT), tls)

    def url(self) -> str:
        return f"{'pulsar+ssl' if self.tls else 'pulsar'}://{self.host}:{self.port}"


def topic_name(topic: str) -> str:
    """Fully qualify a short topic name: `t` -> `persistent://public/default/t`."""
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    if len(parts) == 3:
        return f"persistent://{topic}"
    raise ValueError(f"invalid topic name {topic!r}")


def partition_name(topic: str, index: int) -> str:
    return f"{topic}-partition-{index}"


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- connection ---------------------------------------------------------------

class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection to a broker, multiplexing producers and consumers."""

    def __init__(self, client: "Client", address: Address) -> None:
        self.client = client
        self.address = address
        auth = client._authentication
        self.session = ClientSession(
            auth_method_name=auth.method_name if auth else None,
            auth_data=auth.auth_data if auth else None,
            max_frame_size=client._max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future = client._loop.create_future()
        self.closed = False
        self.producers: dict[int, _PartitionProducer] = {}
        self.consumers: dict[int, _PartitionConsumer] = {}
        self._requests: dict[int, asyncio.Future] = {}
        self._last_received = time.monotonic()
        self._keepalive: asyncio.Task | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()

    @property
    def max_message_size(self) -> int:
        return self.session.max_message_size

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.session.connect()
        self.flush()
        self._keepalive = asyncio.ensure_future(self._keep_alive())

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        try:
            events = self.session.receive_data(data)
        except PulsarWireError as exc:
            log.warning("closing connection to %s: %s", self.address.url(), exc)
            self.abort(exc)
            return
        for event in events:
            self._dispatch(event)
        self.flush()

    def connection_lost(self, exc) -> None:
        self._closed(exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # operations

    def flush(self) -> None:
        data = self.session.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def write_frame(self, frame: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.session.send_frame(frame)
            self.flush()

    async def drain(self) -> None:
        await self._can_write.wait()

    async def request(self, start: Callable[..., int], *args, **kwargs):
        """Send a request (a session method returning its request id) and await its answer."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.address.url()} is closed")
        rid = start(*args, **kwargs)
        future = self.client._loop.create_future()
        self._requests[rid] = future
        self.flush()
        try:
            return await asyncio.wait_for(future, self.client._operation_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer from {self.address.url()} within "
                               f"{self.client._operation_timeout}s") from None
        finally:
            self._requests.pop(rid, None)

    def abort(self, exc: BaseException | None = None) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._closed(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._closed(None)

    # internals

    def _closed(self, exc) -> None:
        if self.closed:
            return
        self.closed = True
        self.session.connection_lost()
        if self._keepalive is not None:
            self._keepalive.cancel()
        error = ConnectionClosedError(f"connection to {self.address.url()} closed"
                                      + (f": {exc}" if exc else ""))
        if not self.ready.done():
            self.ready.set_exception(error)
        for future in self._requests.values():
            if not future.done():
                future.set_exception(error)
        self._requests.clear()
        self.client._connection_closed(self)
        for producer in list(self.producers.values()):
            producer._connection_lost(self)
        for consumer in list(self.consumers.values()):
            consumer._connection_lost(self)
        self.producers.clear()
        self.consumers.clear()

    async def _keep_alive(self) -> None:
        interval = self.client._keep_alive_interval
        try:
            while not self.closed:
                await asyncio.sleep(interval)
                if time.monotonic() - self._last_received > 2 * interval:
                    log.warning("no data from %s for %.0fs; closing", self.address.url(), 2 * interval)
                    self.abort(TimeoutError("keep-alive timed out"))
                    return
                if self.session.state.value == "connected":
                    self.session.ping()
                    self.flush()
        except asyncio.CancelledError:
            pass

    def _dispatch(self, event) -> None:
        kind = type(event)
        if kind is MessageArrived:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer._on_message(event.command, event.frame)
        elif kind is SendReceipt:
            producer = self.producers.get(event.producer_id)
            if producer is not None:
                producer._on_receipt(event)
        elif kind is RequestDone or kind is RequestFailed:
            future = self._requests.get(event.request_id)
            if future is not None and not future.done():
                if kind is RequestDone:
                    future.set_result(event.response)
                else:
                    future.set_exception(event.error)
        elif kind is Connected:
            if not self.ready.done():
                self.ready.set_result(event)
        elif kind is ConnectionFailed:
            if not self.ready.done():
                self.ready.set_exception(event.error)
            self.close()
        elif kind is SendFailed:
            producer = self.producers.get(event.producer_id)
            if producer is not None:
                producer._on_send_error(event)
        elif kind is CorruptMessage:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer._on_corrupt(event.message_id, event.error)
        elif kind is ProducerClosedByBroker:
            producer = self.producers.pop(event.producer_id, None)
            if producer is not None:
                producer._connection_lost(self)
        elif kind is ConsumerClosedByBroker:
            consumer = self.consumers.pop(event.consumer_id, None)
            if consumer is not None:
                consumer._connection_lost(self)
        elif kind is EndOfTopic:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer._on_end_of_topic()
        elif kind is ActiveConsumerChanged:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer.is_active = event.is_active


# --- client -------------------------------------------------------------------

class Client:
    """Entry point: `async with Client("pulsar://127.0.0.1:6650") as client: ...`."""

    def __init__(self, service_url: str, *, authentication: AuthenticationToken | None = None,
                 operation_timeout_seconds: float = 30, connection_timeout_ms: int = 10_000,
                 keep_alive_interval_seconds: float = 30,
                 tls_trust_certs_file_path: str | None = None,
                 tls_allow_insecure_connection: bool = False, tls_validate_hostname: bool = False,
                 initial_backoff_seconds: float = 0.1, max_backoff_seconds: float = 30,
                 max_frame_size: int = codec.DEFAULT_MAX_FRAME_SIZE) -> None:
        self._service = Address.parse(service_url)
        self._authentication = authentication
        self._operation_timeout = operation_timeout_seconds
        self._connection_timeout = connection_timeout_ms / 1000
        self._keep_alive_interval = keep_alive_interval_seconds
        self._tls_trust = tls_trust_certs_file_path
        self._tls_insecure = tls_allow_insecure_connection
        self._tls_validate_hostname = tls_validate_hostname
        self._initial_backoff = initial_backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._max_frame_size = max_frame_size
        self._loop = asyncio.get_running_loop()
        self._pool: dict[Address, _Connection] = {}
        self._connecting: dict[Address, asyncio.Future] = {}
        self._ids = itertools.count()
        self._handles: set = set()
        self._closed = False

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # connections

    def _ssl_context(self, address: Address) -> ssl.SSLContext | None:
        if not address.tls:
            return None
        context = ssl.create_default_context(cafile=self._tls_trust)
        context.check_hostname = self._tls_validate_hostname and not self._tls_insecure
        if self._tls_insecure:
            context.verify_mode = ssl.CERT_NONE
        return context

    async def _connection(self, address: Address) -> _Connection:
        """A ready connection to `address`, shared by everything that talks to that broker."""
        if self._closed:
            raise ConnectionClosedError("client is closed")
        conn = self._pool.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.ensure_future(self._open(address))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _open(self, address: Address) -> _Connection:
        try:
            _, conn = await asyncio.wait_for(self._loop.create_connection(
                lambda: _Connection(self, address), address.host, address.port,
                ssl=self._ssl_context(address),
                server_hostname=address.host if address.tls else None), self._connection_timeout)
            await asyncio.wait_for(asyncio.shield(conn.ready), self._connection_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"could not connect to {address.url()} within "
                               f"{self._connection_timeout}s") from None
        except OSError as exc:
            raise ConnectionClosedError(f"could not connect to {address.url()}: {exc}") from exc
        self._pool[address] = conn
        return conn

    def _connection_closed(self, conn: _Connection) -> None:
        if self._pool.get(conn.address) is conn:
            del self._pool[conn.address]

    async def _lookup(self, topic: str) -> _Connection:
        """The connection to the broker that owns `topic`, following redirects."""
        conn = await self._connection(self._service)
        authoritative = False
        for _ in range(20):
            response = await conn.request(conn.session.lookup, topic, authoritative)
            url = response.brokerServiceUrlTls if self._service.tls and response.brokerServiceUrlTls \
                else response.brokerServiceUrl
            if response.proxy_through_service_url or not url:
                target = self._service
            else:
                target = Address.parse(url)
            if response.response == pb.CommandLookupTopicResponse.Redirect:
                conn = await self._connection(target)
                authoritative = response.authoritative
                continue
            return await self._connection(target)
        raise ServerError(f"too many lookup redirects for {topic}")

    async def get_topic_partitions(self, topic: str) -> list[str]:
        topic = topic_name(topic)
        conn = await self._connection(self._service)
        response = await conn.request(conn.session.partitioned_metadata, topic)
        if response.partitions > 0:
            return [partition_name(topic, i) for i in range(response.partitions)]
        return [topic]

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self._max_backoff, self._initial_backoff * (2 ** min(attempt, 20))))

    # public API

    async def create_producer(self, topic: str, **options) -> "Producer":
        producer = Producer(self, topic_name(topic), **options)
        await producer._start()
        self._handles.add(producer)
        return producer

    async def subscribe(self, topic: str | list[str], subscription_name: str, **options) -> "Consumer":
        topics = [topic_name(t) for t in ([topic] if isinstance(topic, str) else topic)]
        consumer = Consumer(self, topics, subscription_name, **options)
        await consumer._start()
        self._handles.add(consumer)
        return consumer

    async def create_reader(self, topic: str, start_message_id: MessageId, *,
                            reader_name: str | None = None, receiver_queue_size: int = 1000,
                            subscription_role_prefix: str = "reader",
                            start_message_id_inclusive: bool = False) -> "Reader":
        consumer = Consumer(self, [topic_name(topic)], f"{subscription_role_prefix}-{uuid.uuid4().hex[:10]}",
                            consumer_type=ConsumerType.Exclusive, consumer_name=reader_name,
                            receiver_queue_size=receiver_queue_size, _durable=False,
                            _start_message_id=start_message_id,
                            _start_inclusive=start_message_id_inclusive)
        await consumer._start()
        self._handles.add(consumer)
        return Reader(consumer)

    async def close(self) -> None:
        if self._closed:
            return
        for handle in list(self._handles):
            try:
                await asyncio.wait_for(handle.close(), self._operation_timeout)
            except Exception as exc:  # noqa: BLE001 - closing must go on
                log.debug("error closing %r: %s", handle, exc)
        self._closed = True
        for conn in list(self._pool.values()):
            conn.close()
        self._pool.clear()


# --- reconnection ----------------------------------------------------------------

class _Reconnecting:
    """What producers and consumers share: when their connection goes (or the broker closes
    them), look the topic up again and re-attach, backing off exponentially; give up only on
    errors that retrying cannot fix."""

    client: Client
    topic: str
    conn: _Connection | None
    _closed: bool
    _reconnecting: asyncio.Task | None

    async def _connect(self) -> None:
        raise NotImplementedError

    def _give_up(self, error: BaseException) -> None:
        raise NotImplementedError

    def _connection_lost(self, conn: _Connection) -> None:
        if self.conn is not conn and self.conn is not None:
            return
        self.conn = None
        if self._closed or self._reconnecting is not None:
            return
        self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        attempt = 0
        try:
            while not self._closed:
                await self.client._backoff(attempt)
                attempt += 1
                try:
                    await self._connect()
                    log.info("%s on %s reconnected", type(self).__name__, self.topic)
                    return
                except _FATAL as exc:
                    self._give_up(exc)
                    return
                except (PulsarWireError, OSError) as exc:
                    log.info("%s on %s: reconnect attempt %d failed: %s", type(self).__name__, self.topic,
                             attempt, exc)
        finally:
            self._reconnecting = None


# --- producer -------------------------------------------------------------------

class _OpSend:
    """One Send frame in flight: a single message, a batch, or one chunk."""

    __slots__ = ("sequence_id", "highest_sequence_id", "num_messages", "frame", "futures", "created",
                 "first_chunk")

    def __init__(self, sequence_id, highest_sequence_id, num_messages, frame, futures, first_chunk=None):
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest_sequence_id
        self.num_messages = num_messages
        self.frame = frame
        self.futures = futures  # one per message; empty for all but a message's last chunk
        self.created = time.monotonic()
        self.first_chunk = first_chunk


class _PartitionProducer(_Reconnecting):
    """Producer on one (partition) topic."""

    def __init__(self, parent: "Producer", topic: str, partition: int) -> None:
        self.parent = parent
        self.client = parent.client
        self.topic = topic
        self.partition = partition
        self.producer_id = next(self.client._ids)
        self.producer_name = parent._producer_name
        self.conn: _Connection | None = None
        self.pending: collections.deque[_OpSend] = collections.deque()
        self.last_sequence_id = -1
        self._next_sequence_id: int | None = parent._initial_sequence_id
        self._epoch = 0
        self._batch = codec.BatchBuilder()
        self._batch_futures: list[asyncio.Future] = []
        self._batch_first_sequence = 0
        self._batch_timer: asyncio.TimerHandle | None = None
        self._reconnecting: asyncio.Task | None = None
        self._closed = False
        self._failed: BaseException | None = None
        self._timeout_task: asyncio.Task | None = None
        self._chunk_ids: dict[str, MessageId] = {}

    async def start(self) -> None:
        await self._connect()
        if self.parent._send_timeout:
            self._timeout_task = asyncio.ensure_future(self._check_send_timeouts())

    async def _connect(self) -> None:
        conn = await self.client._lookup(self.topic)
        fields: dict[str, Any] = dict(topic=self.topic, producer_id=self.producer_id, epoch=self._epoch,
                                      producer_access_mode=self.parent._access_mode)
        if self.producer_name:
            fields["producer_name"] = self.producer_name
            fields["user_provided_producer_name"] = self.parent._user_named
        if self.parent._metadata:
            fields["metadata"] = [pb.KeyValue(key=k, value=v) for k, v in self.parent._metadata.items()]
        conn.producers[self.producer_id] = self
        try:
            response = await conn.request(conn.session.create_producer, **fields)
        except BaseException:
            conn.producers.pop(self.producer_id, None)
            raise
        self._epoch += 1
        self.producer_name = response.producer_name
        self.last_sequence_id = max(self.last_sequence_id, response.last_sequence_id)
        if self._next_sequence_id is None:
            self._next_sequence_id = response.last_sequence_id + 1
        self.conn = conn
        for op in self.pending:  # resend in order, same sequence ids: the broker dedups
            conn.write_frame(op.frame)

    def _give_up(self, error: BaseException) -> None:
        self._fail_all(error)

    # sending

    def _take_sequence_id(self, requested: int | None) -> int:
        assert self._next_sequence_id is not None, "sequence ids start once the producer is created"
        if requested is not None:
            self._next_sequence_id = max(self._next_sequence_id, requested + 1)
            return requested
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        return sequence_id

    def send(self, payload: bytes, options: dict, future: asyncio.Future) -> None:
        if self._failed is not None:
            future.set_exception(self._failed)
            return
        parent = self.parent
        sequence_id = self._take_sequence_id(options.get("sequence_id"))
        batchable = parent._batching and options.get("deliver_at") is None and \
            len(payload) < parent._batching_max_bytes
        if batchable:
            if self._batch.num_messages == 0:
                self._batch_first_sequence = sequence_id
            self._batch.add(payload, options.get("properties"), options.get("partition_key"),
                            options.get("event_timestamp") or 0, options.get("ordering_key"),
                            sequence_id)
            self._batch_futures.append(future)
            if self._batch.num_messages >= parent._batching_max_messages or \
                    self._batch.size >= parent._batching_max_bytes:
                self.flush_batch()
            elif self._batch_timer is None:
                self._batch_timer = self.client._loop.call_later(parent._batching_delay, self.flush_batch)
            return
        self.flush_batch()  # keep order: anything batched before goes first
        metadata = self._metadata(sequence_id, options)
        body = compression.compress(parent._compression, payload) if parent._compression else payload
        if parent._compression:
            metadata.compression = parent._compression
            metadata.uncompressed_size = len(payload)
        limit = self.conn.max_message_size if self.conn else codec.DEFAULT_MAX_MESSAGE_SIZE
        if len(body) > limit - 1024:
            if not parent._chunking:
                future.set_exception(PulsarWireError(
                    f"message of {len(body)} bytes is over the broker's {limit}-byte limit; "
                    "enable chunking_enabled to send it"))
                self.parent._release(1)
                return
            self._send_chunks(metadata, body, limit - 1024, future)
            return
        frame = codec.encode_payload_command(self._send_command(sequence_id, sequence_id, 1), metadata, body)
        self._enqueue(_OpSend(sequence_id, sequence_id, 1, frame, [future]))

    def _send_chunks(self, metadata, body, chunk_size, future) -> None:
        sequence_id = metadata.sequence_id
        count = (len(body) + chunk_size - 1) // chunk_size
        metadata.uuid = f"{self.producer_name}-{sequence_id}"
        metadata.num_chunks_from_msg = count
        metadata.total_chunk_msg_size = len(body)
        for chunk_id in range(count):
            metadata.chunk_id = chunk_id
            command = self._send_command(sequence_id, sequence_id, 1)
            command.send.is_chunk = True
            frame = codec.encode_payload_command(command, metadata,
                                                 body[chunk_id * chunk_size:(chunk_id + 1) * chunk_size])
            last = chunk_id == count - 1
            self._enqueue(_OpSend(sequence_id, sequence_id, 1 if last else 0, frame,
                                  [future] if last else [], first_chunk=metadata.uuid))

    def _metadata(self, sequence_id: int, options: dict) -> pb.MessageMetadata:
        md = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=sequence_id,
                                publish_time=_now_ms())
        if options.get("properties"):
            md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in options["properties"].items())
        if options.get("partition_key") is not None:
            md.partition_key = options["partition_key"]
        if options.get("ordering_key") is not None:
            md.ordering_key = options["ordering_key"]
        if options.get("event_timestamp"):
            md.event_time = options["event_timestamp"]
        if options.get("deliver_at") is not None:
            md.deliver_at_time = options["deliver_at"]
        return md

    def _send_command(self, sequence_id: int, highest: int, count: int) -> pb.BaseCommand:
        cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
        cmd.send.producer_id = self.producer_id
        cmd.send.sequence_id = sequence_id
        cmd.send.num_messages = count
        if highest != sequence_id:
            cmd.send.highest_sequence_id = highest
        return cmd

    def flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        count = self._batch.num_messages
        if count == 0:
            return
        raw = self._batch.build()
        futures = self._batch_futures
        self._batch.clear()
        self._batch_futures = []
        first = self._batch_first_sequence
        highest = first + count - 1
        md = pb.MessageMetadata(producer_name=self.producer_name, sequence_id=first,
                                publish_time=_now_ms(), num_messages_in_batch=count)
        if highest != first:
            md.highest_sequence_id = highest
        kind = self.parent._compression
        if kind:
            md.compression = kind
            md.uncompressed_size = len(raw)
            raw = compression.compress(kind, raw)
        frame = codec.encode_payload_command(self._send_command(first, highest, count), md, raw)
        self._enqueue(_OpSend(first, highest, count, frame, futures))

    def _enqueue(self, op: _OpSend) -> None:
        self.pending.append(op)
        if self.conn is not None:
            self.conn.write_frame(op.frame)

    def _on_receipt(self, receipt: SendReceipt) -> None:
        while self.pending:
            op = self.pending[0]
            if receipt.sequence_id < op.sequence_id:
                return  # a duplicate receipt for something already acknowledged
            if receipt.sequence_id > op.sequence_id:
                log.warning("producer %s: receipt for %d while %d is oldest; resending",
                            self.producer_name, receipt.sequence_id, op.sequence_id)
                if self.conn is not None:
                    self.conn.abort(PulsarWireError("out-of-order send receipt"))
                return
            self.pending.popleft()
            if op.num_messages == 0 and op.first_chunk is not None and not op.futures:
                if op.first_chunk not in self._chunk_ids:
                    mid = receipt.message_id
                    self._chunk_ids[op.first_chunk] = MessageId(mid.ledgerId, mid.entryId, self.partition,
                                                                topic=self.topic)
                return  # earlier chunk: wait for the receipt of the last one
            self._chunk_ids.pop(op.first_chunk, None)
            self.last_sequence_id = max(self.last_sequence_id, op.highest_sequence_id)
            mid = receipt.message_id
            batched = len(op.futures) > 1 or op.highest_sequence_id != op.sequence_id
            for index, future in enumerate(op.futures):
                if not future.done():
                    if batched or op.num_messages > 1:
                        future.set_result(MessageId(mid.ledgerId, mid.entryId, self.partition, index,
                                                    len(op.futures), self.topic))
                    else:
                        future.set_result(MessageId(mid.ledgerId, mid.entryId, self.partition,
                                                    topic=self.topic))
            self.parent._release(len(op.futures))
            return

    def _on_send_error(self, event: SendFailed) -> None:
        log.warning("producer %s: send error for %d: %s", self.producer_name, event.sequence_id, event.error)
        if isinstance(event.error, _FATAL):
            self._fail_all(event.error)
        elif self.conn is not None:  # the broker closes; pending messages are resent after reconnect
            self.conn.abort(event.error)

    def _fail_all(self, error: BaseException) -> None:
        self._failed = error
        released = 0
        while self.pending:
            op = self.pending.popleft()
            for future in op.futures:
                if not future.done():
                    future.set_exception(error)
            released += len(op.futures)
        for future in self._batch_futures:
            if not future.done():
                future.set_exception(error)
        released += len(self._batch_futures)
        self._batch_futures = []
        self._batch.clear()
        self.parent._release(released)

    async def _check_send_timeouts(self) -> None:
        timeout = self.parent._send_timeout
        try:
            while not self._closed:
                await asyncio.sleep(min(timeout / 4, 1.0))
                if self.pending and time.monotonic() - self.pending[0].created > timeout:
                    error = TimeoutError(f"send to {self.topic} not acknowledged within {timeout}s")
                    released = 0
                    while self.pending:
                        op = self.pending.popleft()
                        for future in op.futures:
                            if not future.done():
                                future.set_exception(error)
                        released += len(op.futures)
                    self.parent._release(released)
        except asyncio.CancelledError:
            pass

    async def wait_pending(self) -> None:
        futures = [f for op in self.pending for f in op.futures] + list(self._batch_futures)
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)

    async def close(self) -> None:
        self.flush_batch()
        await self.wait_pending()
        self._closed = True
        for task in (self._timeout_task, self._reconnecting):
            if task is not None:
                task.cancel()
        conn = self.conn
        self.conn = None
        if conn is not None and not conn.closed:
            conn.producers.pop(self.producer_id, None)
            try:
                await conn.request(conn.session.close_producer, self.producer_id)
            except PulsarWireError:
                pass
        self._fail_all(ConnectionClosedError("producer closed"))


class Producer:
    """Sends messages to a topic (all partitions of it when partitioned)."""

    def __init__(self, client: Client, topic: str, *, producer_name: str | None = None,
                 initial_sequence_id: int | None = None, send_timeout_millis: int = 30_000,
                 compression_type: int | str = CompressionType.NONE,
                 max_pending_messages: int = 1000, block_if_queue_full: bool = True,
                 batching_enabled: bool = True, batching_max_messages: int = 1000,
                 batching_max_allowed_size_in_bytes: int = 128 * 1024,
                 batching_max_publish_delay_ms: float = 10, chunking_enabled: bool = False,
                 message_routing_mode: RoutingMode = RoutingMode.RoundRobinPartition,
                 hashing_scheme: HashingScheme = HashingScheme.JavaStringHash,
                 properties: dict[str, str] | None = None, access_mode: int = pb.Shared) -> None:
        if chunking_enabled and batching_enabled:
            raise ValueError("chunking cannot be combined with batching")
        self.client = client
        self._topic = topic
        self._producer_name = producer_name
        self._user_named = producer_name is not None
        self._initial_sequence_id = None if initial_sequence_id is None else initial_sequence_id
        self._send_timeout = send_timeout_millis / 1000
        self._compression: Any = compression.compression_type(
            compression_type.name if isinstance(compression_type, enum.Enum) else compression_type)
        self._max_pending = max_pending_messages
        self._block = block_if_queue_full
        self._batching = batching_enabled
        self._batching_max_messages = batching_max_messages
        self._batching_max_bytes = batching_max_allowed_size_in_bytes
        self._batching_delay = batching_max_publish_delay_ms / 1000
        self._chunking = chunking_enabled
        self._metadata = properties or {}
        self._access_mode = access_mode
        self._router = Router(hashing_scheme, message_routing_mode)
        self._partitions: list[_PartitionProducer] = []
        self._in_flight = 0
        self._space = asyncio.Condition()
        self._closed = False

    async def _start(self) -> None:
        topics = await self.client.get_topic_partitions(self._topic)
        partitioned = len(topics) > 1 or topics[0] != self._topic
        self._partitions = [_PartitionProducer(self, t, i if partitioned else -1) for i, t in enumerate(topics)]
        try:
            await asyncio.gather(*(p.start() for p in self._partitions))
        except BaseException:
            for p in self._partitions:
                p._closed = True
                if p._timeout_task:
                    p._timeout_task.cancel()
            raise

    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self._partitions[0].producer_name or ""

    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id for p in self._partitions)

    def _release(self, count: int) -> None:
        if count:
            self._in_flight -= count
            if self._block:
                asyncio.ensure_future(self._notify_space())

    async def _notify_space(self) -> None:
        async with self._space:
            self._space.notify_all()

    async def send_async(self, content: bytes, *, properties: dict[str, str] | None = None,
                         partition_key: str | None = None, ordering_key: bytes | None = None,
                         event_timestamp: int | None = None, sequence_id: int | None = None,
                         deliver_at: int | None = None, deliver_after_ms: int | None = None) -> asyncio.Future:
        """Queue a message; returns a future for its MessageId (waits only for queue space)."""
        if self._closed:
            raise ConnectionClosedError("producer is closed")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        if self._in_flight >= self._max_pending:
            if not self._block:
                raise ProducerQueueFullError(f"{self._max_pending} messages pending")
            async with self._space:
                await self._space.wait_for(lambda: self._in_flight < self._max_pending)
        if deliver_after_ms is not None:
            deliver_at = _now_ms() + deliver_after_ms
        options = {"properties": properties, "partition_key": partition_key, "ordering_key": ordering_key,
                   "event_timestamp": event_timestamp, "sequence_id": sequence_id, "deliver_at": deliver_at}
        partitions = self._partitions
        target = partitions[0] if len(partitions) == 1 else \
            partitions[self._router.partition(partition_key, len(partitions))]
        future = self.client._loop.create_future()
        self._in_flight += 1
        target.send(bytes(content) if not isinstance(content, bytes) else content, options, future)
        conn = target.conn
        if conn is not None and not conn._can_write.is_set():
            await conn.drain()
        return future

    async def send(self, content: bytes, **options) -> MessageId:
        """Send one message and wait for the broker's receipt."""
        future = await self.send_async(content, **options)
        self.flush_batches()
        return await future

    def flush_batches(self) -> None:
        for p in self._partitions:
            p.flush_batch()

    async def flush(self) -> None:
        """Send what is batched and wait until every pending message is acknowledged."""
        self.flush_batches()
        await asyncio.gather(*(p.wait_pending() for p in self._partitions))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(p.close() for p in self._partitions), return_exceptions=True)
        self.client._handles.discard(self)


# --- consumer -------------------------------------------------------------------

class _Entry:
    """Acknowledgement state of one delivered entry (a batch, a message, or a chunked message)."""

    __slots__ = ("owner", "ledger_id", "entry_id", "batch_size", "remaining", "delivered_at",
                 "chunk_entries")

    def __init__(self, owner, ledger_id, entry_id, batch_size, remaining, chunk_entries=None):
        self.owner = owner
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.batch_size = batch_size
        self.remaining = remaining  # bitmask of batch indexes not yet acknowledged
        self.delivered_at = time.monotonic()
        self.chunk_entries = chunk_entries

    def ids(self) -> list[pb.MessageIdData]:
        entries = self.chunk_entries or [(self.ledger_id, self.entry_id)]
        return [pb.MessageIdData(ledgerId=l & 0xFFFFFFFFFFFFFFFF, entryId=e & 0xFFFFFFFFFFFFFFFF)
                for l, e in entries]


class _MessageQueue:
    """The consumer's receiver queue, shared by all of its partitions."""

    def __init__(self) -> None:
        self._items: collections.deque[Message] = collections.deque()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: Message) -> None:
        self._items.append(message)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def pop(self) -> Message | None:
        return self._items.popleft() if self._items else None

    def waiter(self, loop) -> asyncio.Future:
        """A future set when a message arrives; registered now, so no arrival is missed."""
        waiter = loop.create_future()
        self._waiters.append(waiter)
        return waiter

    def remove_from(self, owner) -> int:
        kept = [m for m in self._items if m._ack_unit.owner is not owner]
        removed = len(self._items) - len(kept)
        self._items = collections.deque(kept)
        return removed


class _PartitionConsumer(_Reconnecting):
    """Consumer on one (partition) topic."""

    def __init__(self, parent: "Consumer", topic: str, partition: int) -> None:
        self.parent = parent
        self.client = parent.client
        self.topic = topic
        self.partition = partition
        self.consumer_id = next(self.client._ids)
        self.conn: _Connection | None = None
        self.is_active = True
        self.end_of_topic = False
        self._permits_used = 0
        self._unacked: dict[tuple[int, int], _Entry] = {}
        self._pending_acks: list[pb.MessageIdData] = []
        self._pending_cumulative: pb.MessageIdData | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._nacks: dict[tuple[int, int], float] = {}
        self._nack_timer: asyncio.TimerHandle | None = None
        self._chunks: collections.OrderedDict[str, list] = collections.OrderedDict()
        self._reconnecting: asyncio.Task | None = None
        self._closed = False
        self._last_message: Message | None = None  # the last one handed to the application
        self._start_message_id = parent._start_message_id
        self._start_inclusive = parent._start_inclusive

    async def start(self) -> None:
        await self._connect()

    async def _connect(self) -> None:
        parent = self.parent
        conn = await self.client._lookup(self.topic)
        fields: dict[str, Any] = dict(
            topic=self.topic, subscription=parent._subscription, subType=int(parent._type),
            consumer_id=self.consumer_id, durable=parent._durable,
            initialPosition=int(parent._initial_position), read_compacted=parent._read_compacted)
        if parent._consumer_name:
            fields["consumer_name"] = parent._consumer_name
        if parent._type == ConsumerType.KeyShared:
            fields["keySharedMeta"] = pb.KeySharedMeta(keySharedMode=pb.AUTO_SPLIT)
        if parent._properties:
            fields["metadata"] = [pb.KeyValue(key=k, value=v) for k, v in parent._properties.items()]
        if not parent._durable and self._last_message is not None:
            # resume after what the application already has
            self._start_message_id, self._start_inclusive = self._last_message.message_id(), False
        start = self._start_message_id
        if not parent._durable and start is not None:
            fields["start_message_id"] = pb.MessageIdData(
                ledgerId=start.ledger_id & 0xFFFFFFFFFFFFFFFF, entryId=start.entry_id & 0xFFFFFFFFFFFFFFFF)
        conn.consumers[self.consumer_id] = self
        try:
            await conn.request(conn.session.subscribe, **fields)
        except BaseException:
            conn.consumers.pop(self.consumer_id, None)
            raise
        self.conn = conn
        # A fresh subscription gets a full window; messages still queued locally are dropped
        # (the broker redelivers what was not acknowledged).
        self.parent._queue.remove_from(self)
        self._permits_used = 0
        conn.session.flow(self.consumer_id, parent._receiver_queue_size)
        conn.flush()

    def _give_up(self, error: BaseException) -> None:
        log.warning("consumer on %s cannot reconnect: %s", self.topic, error)
        self.parent._fail(error)

    # incoming

    def _on_message(self, command: pb.CommandMessage, frame) -> None:
        md = frame.metadata
        mid = command.message_id
        ledger, entry = signed64(mid.ledgerId), signed64(mid.entryId)
        if md.HasField("num_chunks_from_msg") and md.num_chunks_from_msg > 1:
            self._on_chunk(command, frame)
            return
        try:
            singles = frame.messages()
        except CodecError as exc:
            self._on_corrupt(mid, exc)
            return
        self._deliver(singles, md, ledger, entry, command, None)

    def _deliver(self, singles, md, ledger, entry, command, chunk_entries) -> None:
        parent = self.parent
        batch_size = singles[0].batch_size if singles else 0
        ack_set = command.ack_set
        skip = 0
        if ack_set:
            bits = ack_set_bits(ack_set)
        else:
            bits = (1 << max(batch_size, 1)) - 1
        unit = _Entry(self, ledger, entry, batch_size, bits, chunk_entries)
        durable = parent._durable
        compacted = parent._read_compacted
        partition, topic, redelivery = self.partition, self.topic, command.redelivery_count
        put = parent._queue.put
        for single in singles:
            index = single.batch_index
            if batch_size and not (bits >> index) & 1:
                skip += 1
                continue
            if (not durable and self._before_start(
                    MessageId(ledger, entry, partition, index, batch_size), batch_size)) or \
                    (compacted and single.compacted_out):
                skip += 1
                unit.remaining &= ~(1 << max(index, 0))
                continue
            put(Message(single, md, ledger, entry, partition, topic, redelivery, unit))
        if unit.remaining:
            self._unacked[(ledger, entry)] = unit
        if skip:
            self._message_consumed(skip)

    def _before_start(self, mid: MessageId, batch_size: int) -> bool:
        """A reader skips what lies before its start position (and the start itself unless inclusive)."""
        start = self._start_message_id
        if self.parent._durable or start is None or start.ledger_id < 0 or start == MessageId.latest:
            return False
        key, start_key = (mid.ledger_id, mid.entry_id), (start.ledger_id, start.entry_id)
        if key != start_key:
            return key < start_key
        if start.batch_index < 0 or batch_size == 0:
            return not self._start_inclusive
        return mid.batch_index < start.batch_index or \
            (mid.batch_index == start.batch_index and not self._start_inclusive)

    def _on_chunk(self, command, frame) -> None:
        md = frame.metadata
        mid = command.message_id
        key = md.uuid
        parts = self._chunks.get(key)
        if md.chunk_id == 0 or parts is None:
            parts = self._chunks[key] = []
        if md.chunk_id != len(parts):
            log.warning("chunk %d of %s out of order; dropping the message", md.chunk_id, key)
            self._chunks.pop(key, None)
            self.ack_ids([mid])
            self._message_consumed(1)
            return
        parts.append((signed64(mid.ledgerId), signed64(mid.entryId), bytes(frame.payload)))
        while len(self._chunks) > self.parent._max_pending_chunked:
            _, dropped = self._chunks.popitem(last=False)
            log.warning("dropping an incomplete chunked message (too many in progress)")
            self.ack_ids([pb.MessageIdData(ledgerId=l, entryId=e) for l, e, _ in dropped])
        if len(parts) < md.num_chunks_from_msg:
            self._message_consumed(1)  # each chunk took a permit; only the last is delivered
            return
        del self._chunks[key]
        whole = b"".join(p for _, _, p in parts)
        md_whole = pb.MessageMetadata()
        md_whole.CopyFrom(md)
        md_whole.ClearField("num_chunks_from_msg")
        try:
            payload = codec.decompress_payload(md_whole, whole)
            singles = codec.split_messages(md_whole, payload)
        except CodecError as exc:
            self._on_corrupt(mid, exc)
            return
        last_ledger, last_entry = parts[-1][0], parts[-1][1]
        self._deliver(singles, md, last_ledger, last_entry, command, [(l, e) for l, e, _ in parts])

    def _on_corrupt(self, message_id: pb.MessageIdData, error: CodecError) -> None:
        log.warning("discarding corrupt message %s:%s on %s: %s", message_id.ledgerId,
                    message_id.entryId, self.topic, error)
        self.parent.corrupt_messages += 1
        if self.conn is not None:
            validation = pb.CommandAck.ChecksumMismatch if "CRC32C" in str(error) else \
                pb.CommandAck.DecompressionError
            self.conn.session.ack(self.consumer_id, [pb.MessageIdData(ledgerId=message_id.ledgerId,
                                                                      entryId=message_id.entryId)],
                                  validation_error=validation)
            self.conn.flush()
        self._message_consumed(1)

    def _on_end_of_topic(self) -> None:
        self.end_of_topic = True
        self.parent._queue.wake_all()

    def _message_consumed(self, count: int) -> None:
        """Return permits: refill the broker's window once half of it is used."""
        self._permits_used += count
        if self._permits_used >= self.parent._refill_at and self.conn is not None:
            self.conn.session.flow(self.consumer_id, self._permits_used)
            self.conn.flush()
            self._permits_used = 0

    # acknowledgement

    def ack(self, message_id: MessageId, cumulative: bool) -> None:
        if cumulative:
            self._ack_cumulative(message_id)
            return
        unit = self._unacked.get((message_id.ledger_id, message_id.entry_id))
        if unit is None:
            self._queue_ack(pb.MessageIdData(ledgerId=message_id.ledger_id & 0xFFFFFFFFFFFFFFFF,
                                             entryId=message_id.entry_id & 0xFFFFFFFFFFFFFFFF))
        else:
            self.ack_in(unit, message_id.batch_index)

    def ack_in(self, unit: _Entry, batch_index: int) -> None:
        """Individual ack of message `batch_index` of a delivered entry (-1: not a batch)."""
        if batch_index >= 0 and unit.batch_size:
            unit.remaining &= ~(1 << batch_index)
            if unit.remaining:
                if self.parent._batch_index_ack:
                    data = pb.MessageIdData(ledgerId=unit.ledger_id, entryId=unit.entry_id)
                    data.ack_set.extend(ack_set_words(unit.remaining, unit.batch_size))
                    self._queue_ack(data)
                return
        else:
            unit.remaining = 0
        key = (unit.ledger_id, unit.entry_id)
        if self._unacked.pop(key, None) is None:
            return  # already acknowledged
        self._nacks.pop(key, None)
        for data in unit.ids():
            self._queue_ack(data)

    def _ack_cumulative(self, message_id: MessageId) -> None:
        key = (message_id.ledger_id, message_id.entry_id)
        unit = self._unacked.get(key)
        data: pb.MessageIdData | None = pb.MessageIdData(ledgerId=message_id.ledger_id & 0xFFFFFFFFFFFFFFFF,
                                                         entryId=message_id.entry_id & 0xFFFFFFFFFFFFFFFF)
        whole_entry = unit is None or not unit.batch_size or message_id.batch_index == unit.batch_size - 1
        if unit is not None and unit.batch_size and not whole_entry:
            unit.remaining &= ~((1 << (message_id.batch_index + 1)) - 1)
            if self.parent._batch_index_ack:
                data.ack_set.extend(ack_set_words(unit.remaining, unit.batch_size))  # type: ignore[union-attr]
            elif message_id.entry_id > 0:
                data.entryId = message_id.entry_id - 1  # type: ignore[union-attr]
            else:
                data = None
        for other in [k for k in self._unacked if k < key or (k == key and whole_entry)]:
            self._unacked.pop(other)
            self._nacks.pop(other, None)
        if data is not None:
            self._pending_cumulative = data
            self._schedule_ack_flush()

    def ack_ids(self, ids: list[pb.MessageIdData]) -> None:
        for data in ids:
            self._queue_ack(data)

    def _queue_ack(self, data: pb.MessageIdData) -> None:
        self._pending_acks.append(data)
        if len(self._pending_acks) >= 1000:
            self.flush_acks()
        else:
            self._schedule_ack_flush()

    def _schedule_ack_flush(self) -> None:
        delay = self.parent._ack_group_time
        if delay <= 0:
            self.flush_acks()
        elif self._ack_timer is None:
            self._ack_timer = self.client._loop.call_later(delay, self.flush_acks)

    def flush_acks(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self.conn is None:
            return  # kept; sent after reconnect or redelivered by the broker
        if self._pending_acks:
            self.conn.session.ack(self.consumer_id, self._pending_acks)
            self._pending_acks = []
        if self._pending_cumulative is not None:
            self.conn.session.ack(self.consumer_id, [self._pending_cumulative], cumulative=True)
            self._pending_cumulative = None
        self.conn.flush()

    def negative_ack(self, message_id: MessageId) -> None:
        key = (message_id.ledger_id, message_id.entry_id)
        self._nacks[key] = time.monotonic() + self.parent._nack_delay
        if self._nack_timer is None:
            self._nack_timer = self.client._loop.call_later(self.parent._nack_delay, self._redeliver_nacked)

    def _redeliver_nacked(self) -> None:
        self._nack_timer = None
        now = time.monotonic()
        due = [k for k, deadline in self._nacks.items() if deadline <= now]
        for key in due:
            del self._nacks[key]
        self._redeliver_keys(due)
        if self._nacks:
            delay = max(0.0, min(self._nacks.values()) - now)
            self._nack_timer = self.client._loop.call_later(delay, self._redeliver_nacked)

    def _redeliver_keys(self, keys) -> None:
        if not keys or self.conn is None:
            return
        ids = []
        for key in keys:
            unit = self._unacked.pop(key, None)
            ids.extend(unit.ids() if unit else [pb.MessageIdData(ledgerId=key[0], entryId=key[1])])
        self.conn.session.redeliver(self.consumer_id, ids)
        self.conn.flush()

    def check_ack_timeout(self, timeout: float) -> None:
        now = time.monotonic()
        expired = [k for k, unit in self._unacked.items() if now - unit.delivered_at > timeout]
        if expired:
            log.info("redelivering %d entries not acknowledged within %.1fs", len(expired), timeout)
            self._redeliver_keys(expired)

    def redeliver_unacknowledged(self) -> None:
        if self.conn is None:
            return
        removed = self.parent._queue.remove_from(self)
        self._unacked.clear()
        self.conn.session.redeliver(self.consumer_id)
        self.conn.flush()
        if removed:
            self._message_consumed(removed)

    async def seek(self, message_id: MessageId | None, timestamp: int | None) -> None:
        conn = self.conn
        if conn is None:
            raise ConnectionClosedError("consumer is not connected")
        data = None if message_id is None else pb.MessageIdData(
            ledgerId=message_id.ledger_id & 0xFFFFFFFFFFFFFFFF, entryId=message_id.entry_id & 0xFFFFFFFFFFFFFFFF)
        await conn.request(conn.session.seek, self.consumer_id, data, timestamp)
        self.parent._queue.remove_from(self)
        self._unacked.clear()
        self._last_message = None
        if not self.parent._durable:
            self._start_message_id, self._start_inclusive = message_id, True

    async def get_last_message_id(self) -> MessageId:
        conn = self.conn
        if conn is None:
            raise ConnectionClosedError("consumer is not connected")
        response = await conn.request(conn.session.get_last_message_id, self.consumer_id)
        return MessageId.from_proto(response.last_message_id, self.topic)

    async def close(self, unsubscribe: bool = False) -> None:
        self.flush_acks()
        self._closed = True
        for timer in (self._ack_timer, self._nack_timer):
            if timer is not None:
                timer.cancel()
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        conn = self.conn
        self.conn = None
        if conn is not None and not conn.closed:
            try:
                if unsubscribe:
                    await conn.request(conn.session.unsubscribe, self.consumer_id)
                else:
                    await conn.request(conn.session.close_consumer, self.consumer_id)
            finally:
                conn.consumers.pop(self.consumer_id, None)


class Consumer:
    """Receives messages from one or more topics (and every partition of each)."""

    def __init__(self, client: Client, topics: list[str], subscription_name: str, *,
                 consumer_type: ConsumerType = ConsumerType.Exclusive,
                 initial_position: InitialPosition = InitialPosition.Latest,
                 receiver_queue_size: int = 1000, consumer_name: str | None = None,
                 unacked_messages_timeout_ms: int | None = None,
                 negative_ack_redelivery_delay_ms: int = 60_000, ack_group_time_ms: int = 100,
                 batch_index_ack_enabled: bool = False, read_compacted: bool = False,
                 properties: dict[str, str] | None = None, max_pending_chunked_message: int = 10,
                 _durable: bool = True, _start_message_id: MessageId | None = None,
                 _start_inclusive: bool = False) -> None:
        if receiver_queue_size < 1:
            raise ValueError("receiver_queue_size must be at least 1")
        self.client = client
        self._topics = topics
        self._subscription = subscription_name
        self._type = ConsumerType(consumer_type)
        self._initial_position = InitialPosition(initial_position)
        self._receiver_queue_size = receiver_queue_size
        self._refill_at = max(1, receiver_queue_size // 2)  # permits go back once half are used
        self._consumer_name = consumer_name
        self._ack_timeout = (unacked_messages_timeout_ms or 0) / 1000
        self._nack_delay = negative_ack_redelivery_delay_ms / 1000
        self._ack_group_time = ack_group_time_ms / 1000
        self._batch_index_ack = batch_index_ack_enabled
        self._read_compacted = read_compacted
        self._properties = properties or {}
        self._max_pending_chunked = max_pending_chunked_message
        self._durable = _durable
        self._start_message_id = _start_message_id
        self._start_inclusive = _start_inclusive
        self._queue = _MessageQueue()
        self._partitions: list[_PartitionConsumer] = []
        self._by_topic: dict[str, _PartitionConsumer] = {}
        self._ack_timeout_task: asyncio.Task | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.corrupt_messages = 0

    async def _start(self) -> None:
        for topic in self._topics:
            names = await self.client.get_topic_partitions(topic)
            partitioned = len(names) > 1 or names[0] != topic
            for index, name in enumerate(names):
                pc = _PartitionConsumer(self, name, index if partitioned else -1)
                self._partitions.append(pc)
                self._by_topic[name] = pc
        try:
            await asyncio.gather(*(p.start() for p in self._partitions))
        except BaseException:
            await asyncio.gather(*(p.close() for p in self._partitions if p.conn), return_exceptions=True)
            raise
        if self._ack_timeout:
            self._ack_timeout_task = asyncio.ensure_future(self._check_ack_timeouts())

    def topic(self) -> str:
        return self._topics[0]

    def subscription_name(self) -> str:
        return self._subscription

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._queue.wake_all()

    def _ended(self) -> bool:
        return bool(self._partitions) and all(p.end_of_topic for p in self._partitions) and not len(self._queue)

    async def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; TimeoutError after timeout_millis, TopicTerminatedError at the end."""
        message = self._queue.pop()
        if message is not None:  # the common case: something is already queued
            unit = message._ack_unit
            unit.owner._last_message = message
            unit.owner._message_consumed(1)
            return message
        loop = self.client._loop
        deadline = None if timeout_millis is None else loop.time() + timeout_millis / 1000
        while True:
            message = self._queue.pop()
            if message is not None:
                unit = message._ack_unit
                unit.owner._last_message = message
                unit.owner._message_consumed(1)
                return message
            if self._error is not None:
                raise self._error
            if self._closed:
                raise ConnectionClosedError("consumer is closed")
            if self._ended():
                raise TopicTerminatedError("reached the end of the topic")
            waiter = self._queue.waiter(loop)
            if deadline is None:
                await waiter
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    waiter.cancel()
                    raise TimeoutError("no message received within the timeout")
                try:
                    await asyncio.wait_for(waiter, remaining)
                except asyncio.TimeoutError:
                    pass

    async def receive_many(self, max_messages: int = 1000, timeout_millis: int | None = None) -> list[Message]:
        """Up to `max_messages` already queued messages, waiting for the first; [] on timeout."""
        try:
            first = await self.receive(timeout_millis)
        except TimeoutError:
            return []
        batch = [first]
        queue = self._queue
        while len(batch) < max_messages:
            message = queue.pop()
            if message is None:
                break
            unit = message._ack_unit
            unit.owner._last_message = message
            unit.owner._message_consumed(1)
            batch.append(message)
        return batch

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except (TopicTerminatedError, ConnectionClosedError):
            raise StopAsyncIteration from None

    def _owner(self, message_id: MessageId) -> _PartitionConsumer:
        if message_id.topic is not None and message_id.topic in self._by_topic:
            return self._by_topic[message_id.topic]
        if message_id.partition >= 0 and len(self._partitions) > message_id.partition:
            return self._partitions[message_id.partition]
        return self._partitions[0]

    @staticmethod
    def _id(message: Message | MessageId) -> MessageId:
        return message.message_id() if isinstance(message, Message) else message

    def acknowledge(self, message: Message | MessageId) -> None:
        if isinstance(message, Message):
            unit = message._ack_unit
            unit.owner.ack_in(unit, message._single.batch_index)
            return
        self._owner(message).ack(message, cumulative=False)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        if self._type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise PulsarWireError("cumulative acknowledgement is not allowed on Shared subscriptions")
        mid = self._id(message)
        self._owner(mid).ack(mid, cumulative=True)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        mid = self._id(message)
        self._owner(mid).negative_ack(mid)

    def redeliver_unacknowledged_messages(self) -> None:
        for p in self._partitions:
            p.redeliver_unacknowledged()

    async def seek(self, target: MessageId | int) -> None:
        """Rewind or skip to a message id, or to a publish time in ms."""
        if isinstance(target, MessageId):
            owners = self._partitions if target in (MessageId.earliest, MessageId.latest) \
                else [self._owner(target)]
            await asyncio.gather(*(p.seek(target, None) for p in owners))
        else:
            await asyncio.gather(*(p.seek(None, int(target)) for p in self._partitions))

    async def get_last_message_id(self) -> MessageId:
        ids = await asyncio.gather(*(p.get_last_message_id() for p in self._partitions))
        return max(ids)

    def is_connected(self) -> bool:
        return all(p.conn is not None for p in self._partitions)

    def flush_acks(self) -> None:
        for p in self._partitions:
            p.flush_acks()

    async def _check_ack_timeouts(self) -> None:
        try:
            while not self._closed:
                await asyncio.sleep(max(0.05, self._ack_timeout / 4))
                for p in self._partitions:
                    p.check_ack_timeout(self._ack_timeout)
        except asyncio.CancelledError:
            pass

    async def unsubscribe(self) -> None:
        await self._shutdown(unsubscribe=True)

    async def close(self) -> None:
        await self._shutdown(unsubscribe=False)

    async def _shutdown(self, unsubscribe: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ack_timeout_task is not None:
            self._ack_timeout_task.cancel()
        results = await asyncio.gather(*(p.close(unsubscribe) for p in self._partitions),
                                       return_exceptions=True)
        self._queue.wake_all()
        self.client._handles.discard(self)
        errors = [r for r in results if isinstance(r, BaseException)]
        if unsubscribe and errors:
            raise errors[0]


class Reader:
    """Reads a topic from a message id on a non-durable subscription."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def topic(self) -> str:
        return self._consumer.topic()

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        return await self._consumer.receive(timeout_millis)

    async def has_message_available(self) -> bool:
        if len(self._consumer._queue):
            return True
        for p in self._consumer._partitions:
            last = await p.get_last_message_id()
            if last.entry_id < 0:
                continue
            seen = p._last_message.message_id() if p._last_message is not None else None
            if seen is None:
                start = p._start_message_id
                if start is None or start == MessageId.earliest:
                    return True
                if start == MessageId.latest:
                    continue
                if (last.ledger_id, last.entry_id) > (start.ledger_id, start.entry_id) or \
                        (self._consumer._start_inclusive and
                         (last.ledger_id, last.entry_id) >= (start.ledger_id, start.entry_id)):
                    return True
                continue
            if (last.ledger_id, last.entry_id) > (seen.ledger_id, seen.entry_id):
                return True
            if (last.ledger_id, last.entry_id) == (seen.ledger_id, seen.entry_id) and seen.batch_size and \
                    seen.batch_index < seen.batch_size - 1:
                return True
        return False

    async def seek(self, target: MessageId | int) -> None:
        await self._consumer.seek(target)

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message in the topic (entry_id -1 when it is empty)."""
        return await self._consumer.get_last_message_id()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        return await self._consumer.__anext__()

    async def close(self) -> None:
        await self._consumer.close()
