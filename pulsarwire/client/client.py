"""The client entry point: options, the connection pool, and the factories for
producers, consumers and readers (which it closes with itself)."""
from __future__ import annotations

import asyncio
import logging
import os
import re
from typing import Any

from .. import codec
from ..errors import AlreadyClosedError, TopicNotFoundError
from ..messages import MessageId
from .._proto import PulsarApi_pb2 as pb
from ..schema import Schema, SchemaInfo
from .connection import ClientContext, ConnectionPool, broker_leaves_unanswered
from .consumer import Consumer, open_consumer
from .entries import EntryReader
from .options import Address, AuthenticationToken, Backoff, ConsumerType, TopicsPattern, topic_name
from .producer import Producer, open_producer
from .reader import Reader
from .table_view import TableView, open_table_view

log = logging.getLogger("pulsarwire")


class Client:
    """Entry point: `async with Client("pulsar://127.0.0.1:6650") as client: ...`."""

    def __init__(self, service_url: str, *, authentication: AuthenticationToken | Any = None,
                 operation_timeout_seconds: float = 30, connection_timeout_ms: int = 10_000,
                 keep_alive_interval_seconds: float = 30,
                 tls_trust_certs_file_path: str | None = None,
                 tls_allow_insecure_connection: bool = False, tls_validate_hostname: bool = False,
                 initial_backoff_seconds: float = 0.1, max_backoff_seconds: float = 30,
                 max_frame_size: int = codec.DEFAULT_MAX_FRAME_SIZE, listener_name: str | None = None,
                 tls_certificate_file_path: str | None = None, tls_private_key_file_path: str | None = None) -> None:
        hosts = Address.parse_service_url(service_url)
        if bool(tls_certificate_file_path) != bool(tls_private_key_file_path):
            raise ValueError("tls_certificate_file_path and tls_private_key_file_path go together")
        # a client certificate shown in TLS handshakes whatever the authentication (as the official
        # client's), for brokers that require one; AuthenticationTLS's own takes precedence
        certificate = (tls_certificate_file_path, tls_private_key_file_path) \
            if tls_certificate_file_path and tls_private_key_file_path else None
        self.context = context = ClientContext(
            loop=asyncio.get_running_loop(), operation_timeout=operation_timeout_seconds,
            connection_timeout=connection_timeout_ms / 1000, keep_alive_interval=keep_alive_interval_seconds,
            backoff=Backoff(initial_backoff_seconds, max_backoff_seconds), max_frame_size=max_frame_size,
            authentication=authentication, tls_certificate=certificate,
            # the broker's advertised listener whose address lookups answer (None: the default one)
            listener_name=listener_name or None, create_producer=self.create_producer)
        self._pool = context.pool = ConnectionPool(
            context, hosts[0], other_service_hosts=hosts[1:], tls_trust_certs_file_path=tls_trust_certs_file_path,
            tls_allow_insecure_connection=tls_allow_insecure_connection, tls_validate_hostname=tls_validate_hostname)

    @property
    def _closed(self) -> bool:
        return self.context.closed

    @_closed.setter
    def _closed(self, closed: bool) -> None:  # the facades' shutdown() marks the client closed at once
        self.context.closed = closed

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the connection to the service URL now (raising what the first request would)."""
        await self._pool.connection(self._pool.service)

    async def get_topic_partitions(self, topic: str) -> list[str]:
        self._check_open()
        return await self._pool.topic_partitions(topic_name(topic))

    async def get_topics_of_namespace(self, namespace: str) -> list[str]:
        """The persistent topics of `namespace` ("tenant/namespace"); partitions by partition name."""
        response = await self._pool.topics_of_namespace(namespace, pb.CommandGetTopicsOfNamespace.PERSISTENT)
        return list(response.topics)

    # public API

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError("client is closed")

    async def create_producer(self, topic: str, **options: Any) -> Producer:
        self._check_open()
        return await open_producer(self.context, topic_name(topic), **options)

    async def subscribe(self, topic: "str | list[str] | re.Pattern[str] | None" = None,
                        subscription_name: str | None = None, *,
                        topics_pattern: "str | re.Pattern[str] | None" = None, **options: Any) -> Consumer:
        """Subscribe to a topic, a list of topics, or every topic of a namespace matching a
        regex (`re.compile(...)` as `topic`, or `topics_pattern=`); a pattern subscription
        looks for new matching topics every `pattern_auto_discovery_period` seconds (60)."""
        self._check_open()
        if not subscription_name:
            raise ValueError("subscribe needs a subscription_name")
        if isinstance(topic, re.Pattern):
            topic, topics_pattern = None, topic
        if topics_pattern is not None:
            if topic is not None:
                raise ValueError("give either topic(s) or topics_pattern, not both")
            return await open_consumer(self.context, [], subscription_name,
                                       _pattern=TopicsPattern.parse(topics_pattern), **options)
        if topic is None:
            raise ValueError("subscribe needs a topic, a list of topics or a topics pattern")
        topics = [topic_name(t) for t in ([topic] if isinstance(topic, str) else topic)]
        return await open_consumer(self.context, topics, subscription_name, **options)

    async def create_reader(self, topic: str, start_message_id: MessageId, *,
                            reader_name: str | None = None, receiver_queue_size: int = 1000,
                            subscription_role_prefix: str = "reader",
                            start_message_id_inclusive: bool = False, schema: Schema | None = None,
                            read_compacted: bool = False) -> Reader:
        """A reader from `start_message_id`; `read_compacted` reads a compacted topic's compacted
        view (the latest message of each key up to the compaction horizon, then every message)."""
        self._check_open()
        consumer = await open_consumer(
            self.context, [topic_name(topic)], f"{subscription_role_prefix}-{os.urandom(5).hex()}",
            consumer_type=ConsumerType.Exclusive, consumer_name=reader_name, read_compacted=read_compacted,
            receiver_queue_size=receiver_queue_size, _durable=False, schema=schema,
            _start_message_id=start_message_id, _start_inclusive=start_message_id_inclusive)
        return Reader(consumer)

    async def create_table_view(self, topic: str, subscription_name: str | None = None,
                                schema: Schema | None = None) -> TableView:
        """The latest value of each key of `topic`, read up to now before this returns and kept
        current in the background (an empty message removes its key)."""
        consumer = await open_consumer(
            self.context, [topic_name(topic)], subscription_name or f"tableview-{os.urandom(5).hex()}",
            consumer_type=ConsumerType.Exclusive, read_compacted=True, schema=schema,
            _durable=False, _start_message_id=MessageId.earliest, _start_inclusive=True)
        return await open_table_view(consumer)

    async def get_schema_info(self, topic: str, schema_version: bytes | None = None) -> SchemaInfo | None:
        """The schema the broker keeps for `topic` (the latest, or `schema_version`); None if none."""
        conn = await self._pool.connection(self._pool.service)
        if broker_leaves_unanswered(conn, "GetSchema"):
            return None  # pulsar-lite: it keeps no schemas
        try:
            response = await conn.request(conn.session.get_schema, topic_name(topic), schema_version)
        except TopicNotFoundError:
            return None
        return SchemaInfo.from_proto(response.schema)

    async def create_entry_reader(self, topic: str, start: MessageId, *, receiver_queue_size: int = 1000,
                                  max_queued_bytes: int = 64 << 20) -> EntryReader:
        """Whole entries of one (partition) topic from entry `start` (inclusive), for bulk readers."""
        reader = EntryReader(self.context, topic_name(topic), start, receiver_queue_size=receiver_queue_size,
                             max_queued_bytes=max_queued_bytes)
        await reader.start()
        self.context.handles.add(reader)
        return reader

    async def close(self) -> None:
        if self._closed:
            return
        for handle in list(self.context.handles):
            try:
                await asyncio.wait_for(handle.close(), self.context.operation_timeout)
            except Exception as exc:  # noqa: BLE001 - closing must go on
                log.debug("error closing %r: %s", handle, exc)
        self._closed = True
        self._pool.close_all()
