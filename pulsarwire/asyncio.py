"""The official client's asyncio surface: `import pulsarwire.asyncio` where a program has
`import pulsar.asyncio` (or `from pulsar.asyncio import Client`) runs unchanged.

As in `pulsar.asyncio`: `Client(service_url, **kwargs)` takes the blocking client's keyword
arguments; producers batch by default; every failure raises `PulsarException` whose `error()`
is the official `Result` (the class raised is a subclass per result that is also the pulsarwire
error it stands for, so `except pulsarwire.TimeoutError` works as well). The work is done by
pulsarwire's asyncio client on the caller's event loop: no extra thread.
"""
from __future__ import annotations

import asyncio
import weakref
from datetime import timedelta  # noqa: F401 - the official module offers it
from typing import Any, Callable

from . import client as aio
from . import errors
from . import official
from .official import (  # noqa: F401 - the official module offers these names
    BatchingType, CompressionType, ConsumerCryptoFailureAction, ConsumerType, InitialPosition, Message, MessageId,
    PartitionsRoutingMode, ProducerAccessMode, RegexSubscriptionMode, Result,
)


class PulsarException(Exception):
    """The error of a failed operation; `error()` is its official Result."""

    def __init__(self, result, msg: str | None = None) -> None:
        # not super(): the pulsarwire error mixed into each subclass takes other arguments
        # (ServerError(message, code=...), CodecError(message, command=...))
        Exception.__init__(self, result, msg)
        self._result = Result(result)
        self._msg = msg

    def error(self):
        return self._result

    def __str__(self) -> str:
        if self._msg:
            return f"{self._result.value} {self._result.name}: {self._msg}"
        return f"{self._result.value} {self._result.name}"


_EXCEPTIONS = official.exception_classes(PulsarException, named_as_base=True)


def _checked_topic(topic) -> None:
    official.check_type(str, topic, "topic")
    try:
        official.check_topic(topic)
    except official.BadTopicName as exc:
        raise _EXCEPTIONS[Result.InvalidTopicName](Result.InvalidTopicName, str(exc)) from None


def _raise_official(exc: BaseException, closed: bool = False):
    if isinstance(exc, PulsarException):
        raise exc
    if isinstance(exc, official.BadTopicName):
        raise _EXCEPTIONS[Result.InvalidTopicName](Result.InvalidTopicName, str(exc)) from None
    if isinstance(exc, official.Unsupported):
        raise _EXCEPTIONS[Result.OperationNotSupported](Result.OperationNotSupported, str(exc)) from exc
    result = official.official_result(exc, closed)
    if result is None or (isinstance(exc, asyncio.CancelledError) and not closed):
        raise exc  # a cancelled caller stays cancelled
    raise _EXCEPTIONS[result](result, str(exc) or None) from exc


class _Handle:
    _closed = False

    async def _await(self, coro):
        if self._closed:
            coro.close()
            raise _EXCEPTIONS[Result.AlreadyClosed](Result.AlreadyClosed)
        try:
            return await coro
        except BaseException as exc:  # noqa: BLE001 - translated, never swallowed
            _raise_official(exc, self._closed)

    def _now(self, fn: Callable, *args):
        if self._closed:
            raise _EXCEPTIONS[Result.AlreadyClosed](Result.AlreadyClosed)
        try:
            return fn(*args)
        except (errors.PulsarWireError, RuntimeError) as exc:
            _raise_official(exc, self._closed)


class Producer(_Handle):
    """Publishes messages; `await producer.send(content)` returns the message id."""

    def __init__(self, producer: aio.Producer, schema) -> None:
        self._producer = producer
        self._schema = schema

    async def send(self, content: Any, properties: dict | None = None, partition_key: str | None = None,
                   ordering_key: str | None = None, sequence_id: int | None = None,
                   replication_clusters: list[str] | None = None, disable_replication: bool | None = None,
                   event_timestamp: int | None = None, deliver_at: int | None = None,
                   deliver_after=None) -> MessageId:
        official.check_content(content, self._schema)
        options = official.send_options(properties, partition_key, ordering_key, sequence_id, replication_clusters,
                                        bool(disable_replication), event_timestamp, deliver_at, deliver_after)
        return MessageId.wrap(await self._await(self._queue_and_wait(content, options)))

    async def _queue_and_wait(self, content: Any, options: dict):
        # as the official client: the message waits in its batch (full, or the publish delay
        # over), so concurrent sends share a batch; pulsarwire's own send() flushes at once
        receipt = await self._producer.send_async(content, **options)
        return await receipt

    async def flush(self) -> None:
        await self._await(self._producer.flush())

    async def close(self) -> None:
        await self._await(self._producer.close())
        self._closed = True

    def topic(self) -> str:
        return self._producer.topic()

    def producer_name(self) -> str:
        return self._producer.producer_name()

    def last_sequence_id(self) -> int:
        return self._producer.last_sequence_id()

    def is_connected(self) -> bool:
        return not self._closed and self._producer.is_connected()


def _native_target(message):
    if isinstance(message, Message):
        return message.native
    return official.native_id(message)


class Consumer(_Handle):
    """Receives messages of a subscription; `await consumer.receive()`."""

    def __init__(self, consumer: aio.Consumer, consumer_type) -> None:
        self._consumer = consumer
        self._type = consumer_type

    async def receive(self) -> Message:
        return Message(await self._await(self._consumer.receive()))

    async def acknowledge(self, message) -> None:
        self._now(self._consumer.acknowledge, _native_target(message))

    async def acknowledge_cumulative(self, message) -> None:
        if self._type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise _EXCEPTIONS[Result.CumulativeAcknowledgementNotAllowedError](
                Result.CumulativeAcknowledgementNotAllowedError)
        self._now(self._consumer.acknowledge_cumulative, _native_target(message))

    async def negative_acknowledge(self, message) -> None:
        self._now(self._consumer.negative_acknowledge, _native_target(message))

    async def unsubscribe(self) -> None:
        await self._await(self._consumer.unsubscribe())
        self._closed = True

    async def seek(self, messageid) -> None:
        await self._await(self._consumer.seek(official.seek_target(messageid)))

    async def close(self) -> None:
        await self._await(self._consumer.close())
        self._closed = True

    async def get_last_message_id(self) -> MessageId:
        return MessageId.wrap(await self._await(self._consumer.get_last_message_id()))

    def redeliver_unacknowledged_messages(self) -> None:
        self._now(self._consumer.redeliver_unacknowledged_messages)

    def topic(self) -> str:
        return self._consumer.topic()

    def subscription_name(self) -> str:
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        return self._consumer.consumer_name()


class Reader(_Handle):
    """Reads a topic from a message id; `await reader.read_next()`."""

    def __init__(self, reader: aio.Reader) -> None:
        self._reader = reader

    async def read_next(self) -> Message:
        return Message(await self._await(self._reader.read_next()))

    async def has_message_available(self) -> bool:
        return await self._await(self._reader.has_message_available())

    async def seek(self, messageid) -> None:
        await self._await(self._reader.seek(official.seek_target(messageid)))

    async def close(self) -> None:
        await self._await(self._reader.close())
        self._closed = True

    def topic(self) -> str:
        return self._reader.topic()

    def is_connected(self) -> bool:
        return not self._closed and self._reader.is_connected()


_CLIENT_ONLY_OPTIONS = ("io_threads", "message_listener_threads", "concurrent_lookup_requests", "log_conf_file_path",
                        "stats_interval_in_seconds", "use_tls", "logger")


class Client(_Handle):
    """The asyncio client: `Client(service_url, **kwargs)` with `pulsar.Client`'s keyword arguments.
    It may be made outside a running loop; it starts on the loop of its first call."""

    _shut_down = False

    def __init__(self, service_url, **kwargs) -> None:
        if not isinstance(service_url, str):
            raise ValueError("Argument service_url is expected to be of type 'str'")
        defaults = dict(authentication=None, operation_timeout_seconds=30, connection_timeout_ms=10000,
                        tls_trust_certs_file_path=None, tls_allow_insecure_connection=False,
                        tls_validate_hostname=False, listener_name=None, tls_private_key_file_path=None,
                        tls_certificate_file_path=None)
        unknown = set(kwargs) - set(defaults) - set(_CLIENT_ONLY_OPTIONS)
        if unknown:
            raise TypeError(f"Client() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        for name in _CLIENT_ONLY_OPTIONS:  # accepted and ignored, as in the blocking client
            kwargs.pop(name, None)
        self._service_url = service_url
        self._options = official.client_options(**{**defaults, **kwargs})
        aio.Address.parse_service_url(service_url)  # a bad URL fails here, as in the official client
        self._client: aio.Client | None = None
        # closed with the client, so that later calls raise AlreadyClosed (weak: no growth)
        self._handles: weakref.WeakSet[_Handle] = weakref.WeakSet()

    def _made(self, handle):
        self._handles.add(handle)
        return handle

    def _native(self) -> aio.Client:
        if self._closed:
            raise _EXCEPTIONS[Result.AlreadyClosed](Result.AlreadyClosed)
        if self._client is None:
            self._client = aio.Client(self._service_url, **self._options)
        return self._client

    async def create_producer(self, topic: str, producer_name: str | None = None, schema=None,
                              initial_sequence_id: int | None = None, send_timeout_millis: int = 30000,
                              compression_type=CompressionType.NONE, max_pending_messages: int = 1000,
                              max_pending_messages_across_partitions: int = 50000, block_if_queue_full: bool = False,
                              batching_enabled: bool = True, batching_max_messages: int = 1000,
                              batching_max_allowed_size_in_bytes: int = 128 * 1024,
                              batching_max_publish_delay_ms: int = 10, chunking_enabled: bool = False,
                              message_routing_mode=PartitionsRoutingMode.RoundRobinDistribution,
                              lazy_start_partitioned_producers: bool = False, properties: dict | None = None,
                              batching_type=BatchingType.Default, encryption_key: str | None = None,
                              crypto_key_reader=None, access_mode=ProducerAccessMode.Shared,
                              message_router: Callable | None = None) -> Producer:
        _checked_topic(topic)
        try:
            options = official.producer_options(
                producer_name=producer_name, schema=schema, initial_sequence_id=initial_sequence_id,
                send_timeout_millis=send_timeout_millis, compression_type=compression_type,
                max_pending_messages=max_pending_messages,
                max_pending_messages_across_partitions=max_pending_messages_across_partitions,
                block_if_queue_full=block_if_queue_full, batching_enabled=batching_enabled,
                batching_max_messages=batching_max_messages,
                batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
                batching_max_publish_delay_ms=batching_max_publish_delay_ms, chunking_enabled=chunking_enabled,
                message_routing_mode=message_routing_mode,
                lazy_start_partitioned_producers=lazy_start_partitioned_producers, properties=properties,
                batching_type=batching_type, encryption_key=encryption_key, crypto_key_reader=crypto_key_reader,
                access_mode=access_mode, message_router=message_router)
        except official.Unsupported as exc:
            _raise_official(exc)
        return self._made(Producer(await self._await(official.create_producer(self._native(), topic, options)),
                                   schema))

    async def subscribe(self, topic, subscription_name: str, consumer_type=ConsumerType.Exclusive, schema=None,
                        receiver_queue_size: int = 1000, max_total_receiver_queue_size_across_partitions: int = 50000,
                        consumer_name: str | None = None, unacked_messages_timeout_ms: int | None = None,
                        broker_consumer_stats_cache_time_ms: int = 30000,
                        negative_ack_redelivery_delay_ms: int = 60000, is_read_compacted: bool = False,
                        properties: dict | None = None, initial_position=InitialPosition.Latest,
                        crypto_key_reader=None, replicate_subscription_state_enabled: bool = False,
                        max_pending_chunked_message: int = 10,
                        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                        start_message_id_inclusive: bool = False, batch_receive_policy=None,
                        key_shared_policy=None, batch_index_ack_enabled: bool = False,
                        regex_subscription_mode=RegexSubscriptionMode.PersistentOnly, dead_letter_policy=None,
                        crypto_failure_action=ConsumerCryptoFailureAction.FAIL,
                        is_pattern_topic: bool = False) -> Consumer:
        official.check_type(str, subscription_name, "subscription_name")
        if is_pattern_topic:
            if not isinstance(topic, str):
                raise ValueError("Argument 'topic' must be a string when 'is_pattern_topic' is True; lists of "
                                 "topics do not support pattern subscriptions")
            import re
            topic = re.compile(topic)
        elif not isinstance(topic, (str, list)):
            raise ValueError("Argument 'topic' is expected to be of type 'str' or 'list'")
        try:
            topics = official.subscribe_topic(topic)
        except official.BadTopicName as exc:
            _raise_official(exc)
        try:
            options = official.consumer_options(
                topic=topics, consumer_type=consumer_type, schema=schema, receiver_queue_size=receiver_queue_size,
                max_total_receiver_queue_size_across_partitions=max_total_receiver_queue_size_across_partitions,
                consumer_name=consumer_name, unacked_messages_timeout_ms=unacked_messages_timeout_ms,
                broker_consumer_stats_cache_time_ms=broker_consumer_stats_cache_time_ms,
                negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                is_read_compacted=is_read_compacted, properties=properties,
                pattern_auto_discovery_period=60, initial_position=initial_position,
                crypto_key_reader=crypto_key_reader,
                replicate_subscription_state_enabled=replicate_subscription_state_enabled,
                max_pending_chunked_message=max_pending_chunked_message,
                auto_ack_oldest_chunked_message_on_queue_full=auto_ack_oldest_chunked_message_on_queue_full,
                start_message_id_inclusive=start_message_id_inclusive, key_shared_policy=key_shared_policy,
                batch_index_ack_enabled=batch_index_ack_enabled, regex_subscription_mode=regex_subscription_mode,
                dead_letter_policy=dead_letter_policy)
        except official.Unsupported as exc:
            _raise_official(exc)
        native = await self._await(self._native().subscribe(topics, subscription_name, **options))
        return self._made(Consumer(native, ConsumerType(consumer_type)))

    async def create_reader(self, topic: str, start_message_id, schema=None, receiver_queue_size: int = 1000,
                            reader_name: str | None = None, subscription_role_prefix: str | None = None,
                            is_read_compacted: bool = False, crypto_key_reader=None,
                            start_message_id_inclusive: bool = False,
                            crypto_failure_action=ConsumerCryptoFailureAction.FAIL) -> Reader:
        _checked_topic(topic)
        start = official.native_id(start_message_id)
        try:
            options = official.reader_options(schema=schema, receiver_queue_size=receiver_queue_size,
                                              reader_name=reader_name,
                                              subscription_role_prefix=subscription_role_prefix,
                                              is_read_compacted=is_read_compacted, crypto_key_reader=crypto_key_reader,
                                              start_message_id_inclusive=start_message_id_inclusive)
        except official.Unsupported as exc:
            _raise_official(exc)
        return self._made(Reader(await self._await(self._native().create_reader(topic, start, **options))))

    async def get_topic_partitions(self, topic: str) -> list[str]:
        official.check_type(str, topic, "topic")
        return await self._await(self._native().get_topic_partitions(topic))

    def shutdown(self) -> None:
        """Close at once, without waiting for what is in flight."""
        if self._closed:
            return
        self._closed = self._shut_down = True
        for handle in self._handles:
            handle._closed = True
        if self._client is not None:
            self._client._closed = True
            self._client._pool.close_all()

    async def close(self) -> None:
        if self._shut_down:  # as the official client: closing once what shutdown() closed is no error
            self._shut_down = False
            return
        client = self._native()
        await self._await(client.close())
        self._closed = True
        for handle in self._handles:
            handle._closed = True

