"""The client entry point: options, the connection pool, and the factories for
producers, consumers and readers (which it closes with itself)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import uuid

from .. import codec
from ..messages import MessageId
from .connection import Connection, ConnectionPool
from .consumer import Consumer
from .entries import EntryReader
from .options import Address, AuthenticationToken, ConsumerType, topic_name
from .producer import Producer
from .reader import Reader

log = logging.getLogger("pulsarwire")


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
        self._initial_backoff = initial_backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._max_frame_size = max_frame_size
        self._loop = asyncio.get_running_loop()
        self._pool = ConnectionPool(self, self._service, connection_timeout=self._connection_timeout,
                                    tls_trust_certs_file_path=tls_trust_certs_file_path,
                                    tls_allow_insecure_connection=tls_allow_insecure_connection,
                                    tls_validate_hostname=tls_validate_hostname)
        self._ids = itertools.count()
        self._handles: set = set()
        self._closed = False

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # connections (the pool owns them; producers and consumers ask the client)

    async def _connection(self, address: Address) -> Connection:
        return await self._pool.connection(address)

    def _connection_closed(self, conn: Connection) -> None:
        self._pool.discard(conn)

    async def _lookup(self, topic: str) -> Connection:
        return await self._pool.lookup(topic)

    async def connect(self) -> None:
        """Open the connection to the service URL now (raising what the first request would)."""
        await self._pool.connection(self._service)

    async def get_topic_partitions(self, topic: str) -> list[str]:
        return await self._pool.topic_partitions(topic_name(topic))

    async def get_topics_of_namespace(self, namespace: str) -> list[str]:
        """The persistent topics of `namespace` ("tenant/namespace"); partitions by partition name."""
        return await self._pool.topics_of_namespace(namespace)

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self._max_backoff, self._initial_backoff * (2 ** min(attempt, 20))))

    # public API

    async def create_producer(self, topic: str, **options) -> Producer:
        producer = Producer(self, topic_name(topic), **options)
        await producer._start()
        self._handles.add(producer)
        return producer

    async def subscribe(self, topic: str | list[str], subscription_name: str, **options) -> Consumer:
        topics = [topic_name(t) for t in ([topic] if isinstance(topic, str) else topic)]
        consumer = Consumer(self, topics, subscription_name, **options)
        await consumer._start()
        self._handles.add(consumer)
        return consumer

    async def create_reader(self, topic: str, start_message_id: MessageId, *,
                            reader_name: str | None = None, receiver_queue_size: int = 1000,
                            subscription_role_prefix: str = "reader",
                            start_message_id_inclusive: bool = False) -> Reader:
        consumer = Consumer(self, [topic_name(topic)], f"{subscription_role_prefix}-{uuid.uuid4().hex[:10]}",
                            consumer_type=ConsumerType.Exclusive, consumer_name=reader_name,
                            receiver_queue_size=receiver_queue_size, _durable=False,
                            _start_message_id=start_message_id,
                            _start_inclusive=start_message_id_inclusive)
        await consumer._start()
        self._handles.add(consumer)
        return Reader(consumer)

    async def create_entry_reader(self, topic: str, start: MessageId, *, receiver_queue_size: int = 1000,
                                  max_queued_bytes: int = 64 << 20) -> EntryReader:
        """Whole entries of one (partition) topic from entry `start` (inclusive), for bulk readers."""
        reader = EntryReader(self, topic_name(topic), start, receiver_queue_size=receiver_queue_size,
                             max_queued_bytes=max_queued_bytes)
        await reader.start()
        self._handles.add(reader)
        return reader

    async def close(self) -> None:
        if self._closed:
            return
        for handle in list(self._handles):
            try:
                await asyncio.wait_for(handle.close(), self._operation_timeout)
            except Exception as exc:  # noqa: BLE001 - closing must go on
                log.debug("error closing %r: %s", handle, exc)
        self._closed = True
        self._pool.close_all()
