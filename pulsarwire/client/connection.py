"""One connection to a broker: the transport, keep-alive and the dispatch of the
sans-IO session's events to the producers and consumers multiplexed on it; and the
pool that shares connections per broker and looks topics up (following redirects).

The contracts with the modules above: what the connection calls on a consumer or a producer
(`ConsumerHandler`, `ProducerHandler`), and what they and the connection need from their client
(`ClientContext`), so that nothing here knows the classes that implement them."""
from __future__ import annotations

import asyncio
import collections
import logging
import itertools
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Protocol, cast

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import (
    AlreadyClosedError, ConnectError, ConnectionClosedError, ConnectTimeoutError, PulsarWireError, ServerError,
    ServiceNotReadyError, TimeoutError, UnknownServerError, UnsupportedByBrokerError,
)
from ..errors import CodecError
from ..messages import MessageId, entry_id_data
from ..reads import adapt_reads, keep_read_memory, tune_reads
from ..session import (
    ActiveConsumerChanged, ClientSession, Connected, ConnectionFailed, ConsumerClosedByBroker,
    CorruptMessage, EndOfTopic, MessageArrived, ProducerClosedByBroker, RequestDone, RequestFailed,
    SendFailed, SendReceipt,
)
from .http_lookup import HttpLookup
from .options import Address, Backoff, ConsumerType, InitialPosition, KeySharedPolicy, partition_name

log = logging.getLogger("pulsarwire")


# Requests that some brokers leave unanswered (pulsar-lite logs "Unsupported command type" and
# says nothing), by the server_version their CONNECTED gives: asked, they would wait out the
# operation timeout for an answer that cannot come.
_PULSAR_LITE = "Pulsar-Lite"
_UNANSWERED = {_PULSAR_LITE: frozenset({"GetSchema", "GetTopicsOfNamespace"})}
# pulsar-lite answers GetLastMessageId on an empty topic with this error, where Pulsar answers an
# id whose entry id is -1
_LITE_EMPTY_TOPIC = "Topic has no messages"


def broker_leaves_unanswered(conn: "Connection", request: str) -> bool:
    """Whether `conn`'s broker is known to leave `request` (a command's name) unanswered."""
    version = conn.session.server_version
    return any(version.startswith(prefix) and request in requests for prefix, requests in _UNANSWERED.items())


class ConsumerHandler(Protocol):
    """What a connection calls on a consumer subscribed through it (a partition consumer, an
    entry reader), from its event dispatch."""

    consumer_id: int
    is_active: bool  # set as the broker names the active consumer of a Failover subscription

    def on_message(self, command: pb.CommandMessage, frame: codec.Frame) -> None: ...

    def on_corrupt(self, message_id: pb.MessageIdData, error: CodecError) -> None: ...

    def on_end_of_topic(self) -> None: ...

    def connection_lost(self, conn: Connection) -> None:
        """`conn` closed, or the broker closed this consumer on it."""


class ProducerHandler(Protocol):
    """What a connection calls on a producer attached through it."""

    conn: Connection | None

    def on_receipt(self, receipt: SendReceipt) -> None: ...

    def on_send_error(self, event: SendFailed) -> None: ...

    def write_pending(self) -> None:
        """The connection's budget for unanswered Send bytes has room again."""

    def connection_lost(self, conn: Connection) -> None:
        """`conn` closed, or the broker closed this producer on it."""


@dataclass(slots=True, eq=False)
class ClientContext:
    """What connections, producers and consumers need from their client: its loop, timeouts,
    retry backoff, credentials, ids, connection pool and open handles (read here, not from the
    client's private attributes)."""

    loop: asyncio.AbstractEventLoop
    operation_timeout: float
    connection_timeout: float
    keep_alive_interval: float
    backoff: Backoff
    max_frame_size: int
    authentication: Any
    tls_certificate: tuple[str, str] | None  # shown in TLS handshakes whatever the authentication
    listener_name: str | None  # the broker's advertised listener lookups answer for (None: default)
    create_producer: Callable[..., Awaitable[Any]]  # the client's, for dead and retry letters
    ids: Iterator[int] = field(default_factory=itertools.count)  # producer and consumer ids
    handles: set[Any] = field(default_factory=set)  # open producers, consumers, readers: closed with the client
    closed: bool = False
    pool: ConnectionPool = field(init=False)  # set by the client once the pool exists


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection to a broker, multiplexing producers and consumers."""

    # Bytes of Send frames on the wire without a receipt, at most, over all of the connection's
    # producers (each may always have one frame out, however large); the rest wait in their
    # producers' pending queues. FLOW, ACK, PING and lookup frames then queue behind this much
    # data at most, not behind every message max_pending_messages lets producers hold (with one
    # client producing and consuming, the consumer's permits waited behind megabytes).
    WIRE_BUDGET = 512 * 1024

    def __init__(self, context: ClientContext, address: Address) -> None:
        self.context = context
        self.address = address
        auth = context.authentication
        self.session = ClientSession(
            auth_method_name=auth.method_name if auth else None,
            auth_data=auth.auth_data if auth else None,
            max_frame_size=context.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self._adapt_reads = False  # set once connected: reads grow for bulk flows (reads.adapt_reads)
        self.ready: asyncio.Future[Connected] = context.loop.create_future()
        self.closed = False
        self.producers: dict[int, ProducerHandler] = {}
        self.consumers: dict[int, ConsumerHandler] = {}
        self._requests: dict[int, asyncio.Future[Any]] = {}
        self._last_received = time.monotonic()
        self._keepalive: asyncio.Task[None] | None = None
        self.can_write = asyncio.Event()  # clear while the transport's buffer is full
        self.can_write.set()
        self.wire_bytes = 0  # Send bytes written and not yet answered
        self._flush_soon = False  # a flush is scheduled for frames queued by write_frame
        self._waiting_for_wire: collections.deque[ProducerHandler] = collections.deque()

    @property
    def max_message_size(self) -> int:
        return self.session.max_message_size

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport: write() and abort()
        self._adapt_reads = tune_reads(transport)
        keep_read_memory()
        self.session.connect()
        self.flush()
        self._keepalive = asyncio.ensure_future(self._keep_alive())

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        if self._adapt_reads:
            adapt_reads(self.transport, len(data))
        try:
            events = self.session.receive_data(data)
        except PulsarWireError as exc:
            log.warning("closing connection to %s: %s", self.address.url(), exc)
            self.abort(exc)
            return
        # in order: settling a read's receipts after its messages was measured worse (the woken
        # receiving thread waits for the GIL meanwhile; docs/benchmarks.md)
        for event in events:
            self._dispatch(event)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(exc)

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    # operations

    def flush(self) -> None:
        data = self.session.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def write_frame(self, frame: bytes) -> None:
        """Queue a frame; it goes out with whatever else is written in this turn of the loop (one
        write for a run of Send frames instead of a system call each)."""
        if not self.closed and self.transport is not None:
            self.session.send_frame(frame)
            if not self._flush_soon:
                self._flush_soon = True
                self.context.loop.call_soon(self._flush_queued)

    def _flush_queued(self) -> None:
        self._flush_soon = False
        self.flush()
    # left behind, a no-op, when flush_now() wrote first: no reason to wake a loop (LoopThread.give_back)
    _flush_queued.wakes_nothing = True  # type: ignore[attr-defined]

    def flush_now(self) -> None:
        """Write what write_frame queued without waiting for the loop's next turn."""
        if self._flush_soon:
            self.flush()  # the scheduled flush finds nothing left

    def wait_for_wire(self, producer: ProducerHandler) -> None:
        """`producer` has frames to write once the budget has room."""
        if producer not in self._waiting_for_wire:
            self._waiting_for_wire.append(producer)

    def wire_released(self, size: int) -> None:
        """`size` bytes of Send frames were answered (or given up): waiting producers go on, in turn."""
        self.wire_bytes -= size
        waiting = self._waiting_for_wire
        while waiting and self.wire_bytes < self.WIRE_BUDGET and not self.closed:
            producer = waiting.popleft()
            if producer.conn is self:
                producer.write_pending()

    async def drain(self) -> None:
        await self.can_write.wait()

    async def subscribe(self, consumer: ConsumerHandler, topic: str, subscription: str, sub_type: ConsumerType, *,
                        durable: bool = True, initial_position: InitialPosition = InitialPosition.Latest,
                        start: tuple[int, int] | None = None, read_compacted: bool = False,
                        consumer_name: str | None = None, key_shared: KeySharedPolicy | None = None,
                        properties: dict[str, str] | None = None, replicate_state: bool = False,
                        schema: pb.Schema | None = None) -> None:
        """Subscribe `consumer` (the one place a Subscribe command's fields are built): it gets its
        events from the moment the request goes out, and none if the broker refuses. A
        non-durable subscription starts at `start`."""
        consumer_id = consumer.consumer_id
        fields: dict[str, Any] = dict(
            topic=topic, subscription=subscription, subType=int(sub_type), consumer_id=consumer_id,
            durable=durable, initialPosition=int(initial_position), read_compacted=read_compacted)
        if consumer_name:
            fields["consumer_name"] = consumer_name
        if key_shared is not None:
            fields["keySharedMeta"] = key_shared.to_proto()
        if properties:
            fields["metadata"] = [pb.KeyValue(key=k, value=v) for k, v in properties.items()]
        if replicate_state:
            fields["replicate_subscription_state"] = True
        if schema is not None:
            fields["schema"] = schema
        if not durable and start is not None:
            fields["start_message_id"] = entry_id_data(*start)  # (ledger, entry)
        self.consumers[consumer_id] = consumer
        try:
            await self.request(self.session.subscribe, **fields)
        except BaseException:
            self.consumers.pop(consumer_id, None)
            raise

    async def last_message_id(self, consumer_id: int, topic: str) -> MessageId:
        """The id of the last message of the topic that consumer `consumer_id` reads (entry id -1:
        the topic is empty)."""
        try:
            response = await self.request(self.session.get_last_message_id, consumer_id)
        except UnknownServerError as exc:
            if str(exc) == _LITE_EMPTY_TOPIC and self.session.server_version.startswith(_PULSAR_LITE):
                return MessageId(-1, -1, topic=topic)  # pulsar-lite's way to say what Pulsar says so
            raise
        return MessageId.from_proto(response.last_message_id, topic)

    async def request(self, start: Callable[..., int], *args: Any, _wait: bool = False, **kwargs: Any) -> Any:
        """Send a request (a session method returning its request id) and await its answer
        (within the operation timeout, or as long as the connection lives with `_wait`)."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.address.url()} is closed")
        rid = start(*args, **kwargs)
        future = self.context.loop.create_future()
        self._requests[rid] = future
        self.flush()
        try:
            return await asyncio.wait_for(future, None if _wait else self.context.operation_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer from {self.address.url()} within "
                               f"{self.context.operation_timeout}s") from None
        finally:
            self._requests.pop(rid, None)

    def abort(self, exc: BaseException | None = None) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._closed(exc)

    def close(self) -> None:
        self.flush()  # frames queued in this turn of the loop go before the close
        if self.transport is not None:
            self.transport.close()
        self._closed(None)

    # internals

    def _closed(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.can_write.set()  # a sender waiting in drain() for room must not wait on a dead connection
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
        self.context.pool.discard(self)
        for producer in list(self.producers.values()):
            producer.connection_lost(self)
        for consumer in list(self.consumers.values()):
            consumer.connection_lost(self)
        self.producers.clear()
        self.consumers.clear()

    async def _keep_alive(self) -> None:
        interval = self.context.keep_alive_interval
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

    def _dispatch(self, event: Any) -> None:  # a session Event, told apart by `type(event) is`
        kind = type(event)
        if kind is MessageArrived:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer.on_message(event.command, event.frame)
        elif kind is SendReceipt:
            producer = self.producers.get(event.producer_id)
            if producer is not None:
                producer.on_receipt(event)
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
                producer.on_send_error(event)
        elif kind is CorruptMessage:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer.on_corrupt(event.message_id, event.error)
        elif kind is ProducerClosedByBroker:
            producer = self.producers.pop(event.producer_id, None)
            if producer is not None:
                producer.connection_lost(self)
        elif kind is ConsumerClosedByBroker:
            consumer = self.consumers.pop(event.consumer_id, None)
            if consumer is not None:
                consumer.connection_lost(self)
        elif kind is EndOfTopic:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer.on_end_of_topic()
        elif kind is ActiveConsumerChanged:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer.is_active = event.is_active


class _BadClientCertificate(OSError):
    """The client's own certificate or key cannot be loaded (a ConnectError's cause)."""


class ConnectionPool:
    """One ready connection per broker address, shared by everything that talks to that
    broker; lookups and partitioned-topic metadata go through it."""

    def __init__(self, context: ClientContext, service: Address, *,
                 tls_trust_certs_file_path: str | None, tls_allow_insecure_connection: bool,
                 tls_validate_hostname: bool, other_service_hosts: "list[Address] | None" = None) -> None:
        self._context = context
        self._service = service  # the service host in use; lookups and metadata go there
        self._service_hosts = [service, *(other_service_hosts or [])]
        self._connection_timeout = context.connection_timeout
        self._tls_trust = tls_trust_certs_file_path
        self._tls_insecure = tls_allow_insecure_connection
        self._tls_validate_hostname = tls_validate_hostname
        self._connections: dict[Address, Connection] = {}
        self._connecting: dict[Address, asyncio.Future[Connection]] = {}
        self._http: HttpLookup | None = None  # an http(s):// service URL: lookups over HTTP
        self._http_broker: Address | None = None  # the binary address that HTTP lookup named
        if service.http:
            self._http = HttpLookup(service.url(), context.authentication, context.operation_timeout,
                                    self._ssl_context(service))

    def __len__(self) -> int:
        return len(self._connections)

    @property
    def service(self) -> Address:
        return self._service

    def _ssl_context(self, address: Address) -> ssl.SSLContext | None:
        if not address.tls:
            return None
        context = ssl.create_default_context(cafile=self._tls_trust)
        context.check_hostname = self._tls_validate_hostname and not self._tls_insecure
        if self._tls_insecure:
            context.verify_mode = ssl.CERT_NONE
        # AuthenticationTLS: the client certificate is the credential; else the client's own
        # (tls_certificate_file_path, with another authentication or none)
        certificate = getattr(self._context.authentication, "tls_certificate", None) or \
            self._context.tls_certificate
        if certificate is not None:
            try:
                context.load_cert_chain(*certificate)
            except (OSError, ValueError) as exc:  # ssl.SSLError included
                raise _BadClientCertificate(f"the client certificate {certificate[0]} or its key "
                                            f"{certificate[1]} cannot be loaded: {exc}") from exc
        return context

    async def connection(self, address: Address) -> Connection:
        """A ready connection to `address`: the pooled one, or a new one (opened once even
        when several callers ask at the same time)."""
        if self._context.closed:
            raise AlreadyClosedError("client is closed")
        if address.http:  # the service URL is an admin URL: the broker it names speaks the protocol
            address = await self._binary_service()
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.ensure_future(self._open(address))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _open(self, address: Address) -> Connection:
        """Connect, retrying refused or unanswered attempts with backoff until the client's
        operation timeout (as the official client does), then ConnectTimeoutError."""
        context = self._context
        loop = context.loop
        deadline = loop.time() + context.operation_timeout
        attempt = hosts_tried = 0
        while True:
            remaining = deadline - loop.time()
            try:
                conn = await self._open_once(address, max(0.001, min(self._connection_timeout, remaining)))
            except ConnectError as exc:
                if isinstance(exc.__cause__, (ssl.SSLCertVerificationError, _BadClientCertificate)):
                    raise  # an untrusted certificate, or an unreadable own one, does not get better with retries
                if address == self._service and len(self._service_hosts) > 1:
                    # a service URL listing several hosts: the next one is tried (and kept)
                    hosts = self._service_hosts
                    address = self._service = hosts[(hosts.index(address) + 1) % len(hosts)]
                    hosts_tried += 1
                    if hosts_tried % len(hosts):
                        continue  # the back-off comes once every host was tried
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ConnectTimeoutError(f"could not connect to {address.url()} within "
                                              f"{context.operation_timeout}s: {exc}") from exc
                log.info("connecting to %s failed (%s); retrying", address.url(), exc)
                await asyncio.sleep(min(context.backoff.delay(attempt), remaining))
                attempt += 1
                if context.closed:
                    raise AlreadyClosedError("client is closed") from exc
                continue
            self._connections[address] = conn
            return conn

    async def _open_once(self, address: Address, timeout: float) -> Connection:
        loop = self._context.loop
        prepare = getattr(self._context.authentication, "prepare", None)
        try:
            if prepare is not None:  # e.g. OAuth2 fetches or refreshes its token first
                await asyncio.wait_for(prepare(), self._connection_timeout)
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: Connection(self._context, address), address.host, address.port,
                ssl=self._ssl_context(address),
                server_hostname=address.host if address.tls else None), timeout)
        except asyncio.TimeoutError:
            raise ConnectError(f"no connection to {address.url()} within {timeout:.3g}s") from None
        except OSError as exc:
            raise ConnectError(f"could not connect to {address.url()}: {exc}") from exc
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), timeout)
        except asyncio.TimeoutError:
            conn.abort()
            conn.ready.exception()  # retrieved: the error raised here replaces it
            raise ConnectError(f"no handshake answer from {address.url()} within {timeout:.3g}s") from None
        except ConnectionClosedError as exc:  # closed during the handshake: worth another try
            raise ConnectError(f"connection to {address.url()} closed during the handshake: {exc}") from exc
        return conn

    def discard(self, conn: Connection) -> None:
        if self._connections.get(conn.address) is conn:
            del self._connections[conn.address]

    async def _binary_service(self) -> Address:
        """The binary-protocol address behind an http(s):// service URL (asked once)."""
        if self._http_broker is None:
            assert self._http is not None
            url = await self._http.broker_url("persistent://public/default/__lookup", self._service.tls)
            self._http_broker = Address.parse(url)
        return self._http_broker

    async def lookup(self, topic: str) -> Connection:
        """The connection to the broker that owns `topic`, following redirects. A lookup the
        broker answers ServiceNotReady (no such advertised listener, a topic being moved) is
        retried with backoff until the operation timeout, then TimeoutError, as the official
        client does."""
        if self._http is not None:
            return await self.connection(Address.parse(await self._http.broker_url(topic, self._service.tls)))
        context = self._context
        deadline = context.loop.time() + context.operation_timeout
        attempt = 0
        while True:
            try:
                return await self._lookup_once(topic)
            except ServiceNotReadyError as exc:
                remaining = deadline - context.loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"lookup of {topic} not served within {context.operation_timeout}s: "
                                       f"{exc}") from exc
                log.info("lookup of %s refused (%s); retrying", topic, exc)
                await asyncio.sleep(min(context.backoff.delay(attempt), remaining))
                attempt += 1
                if context.closed:
                    raise AlreadyClosedError("client is closed") from exc

    async def _lookup_once(self, topic: str) -> Connection:
        conn = await self.connection(self._service)
        authoritative = False
        for _ in range(20):
            response = await conn.request(conn.session.lookup, topic, authoritative, self._context.listener_name)
            url = response.brokerServiceUrlTls if self._service.tls and response.brokerServiceUrlTls \
                else response.brokerServiceUrl
            if response.proxy_through_service_url or not url:
                target = self._service
            else:
                target = Address.parse(url)
            if response.response == pb.CommandLookupTopicResponse.Redirect:
                conn = await self.connection(target)
                authoritative = response.authoritative
                continue
            return await self.connection(target)
        raise ServerError(f"too many lookup redirects for {topic}")

    async def topic_partitions(self, topic: str) -> list[str]:
        """The partition topics of `topic` (itself alone when it is not partitioned)."""
        if self._http is not None:
            partitions = await self._http.partitions(topic)
        else:
            conn = await self.connection(self._service)
            partitions = (await conn.request(conn.session.partitioned_metadata, topic)).partitions
        if partitions > 0:
            return [partition_name(topic, i) for i in range(partitions)]
        return [topic]

    async def topics_of_namespace(self, namespace: str, mode: int, topics_pattern: str | None = None,
                                  topics_hash: str | None = None) -> pb.CommandGetTopicsOfNamespaceResponse:
        """The broker's GetTopicsOfNamespace answer (topics, filtered, topics_hash, changed)."""
        if self._http is not None:  # the admin API's list: unfiltered, always "changed"
            mode_name = {int(pb.CommandGetTopicsOfNamespace.NON_PERSISTENT): "NON_PERSISTENT",
                         pb.CommandGetTopicsOfNamespace.ALL: "ALL"}.get(mode, "PERSISTENT")
            topics = await self._http.namespace_topics(namespace, mode_name)
            return pb.CommandGetTopicsOfNamespaceResponse(request_id=0, topics=topics, filtered=False, changed=True)
        conn = await self.connection(self._service)
        if broker_leaves_unanswered(conn, "GetTopicsOfNamespace"):
            raise UnsupportedByBrokerError(f"the broker ({conn.session.server_version}) does not list a namespace's "
                                           f"topics (GetTopicsOfNamespace): name the topics instead")
        return await conn.request(conn.session.get_topics_of_namespace, namespace, mode,
                                  topics_pattern, topics_hash)

    def close_all(self) -> None:
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()
