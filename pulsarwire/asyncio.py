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
import re
import weakref
from datetime import timedelta  # noqa: F401 - the official module offers it
from typing import Any, Callable, Coroutine, NoReturn, TypeVar

from . import client as aio
from . import errors
from . import official, official_options
from .official import (  # noqa: F401 - the official module offers these names
    BatchingType, CompressionType, ConsumerCryptoFailureAction, ConsumerType, InitialPosition, Message, MessageId,
    PartitionsRoutingMode, ProducerAccessMode, RegexSubscriptionMode, Result,
)


_T = TypeVar("_T")
_H = TypeVar("_H", bound="_Handle")


class PulsarException(Exception):
    """The error of a failed operation; `error()` is its official Result."""

    def __init__(self, result: Result | int, msg: str | None = None) -> None:
        # not super(): the pulsarwire error mixed into each subclass takes other arguments
        # (ServerError(message, code=...), CodecError(message, command=...))
        Exception.__init__(self, result, msg)
        self._result = Result(result)
        self._msg = msg

    def error(self) -> Result:
        return self._result

    def __str__(self) -> str:
        if self._msg:
            return f"{self._result.value} {self._result.name}: {self._msg}"
        return f"{self._result.value} {self._result.name}"


_EXCEPTIONS = official.exception_classes(PulsarException, named_as_base=True)


def _checked_topic(topic: str) -> None:
    official.check_type(str, topic, "topic")
    try:
        official.check_topic(topic)
    except official.BadTopicName as exc:
        raise _EXCEPTIONS[Result.InvalidTopicName](Result.InvalidTopicName, str(exc)) from None


def _raise_official(exc: BaseException, closed: bool = False) -> NoReturn:
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

    async def _await(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._closed:
            coro.close()
            raise _EXCEPTIONS[Result.AlreadyClosed](Result.AlreadyClosed)
        try:
            return await coro
        except BaseException as exc:  # noqa: BLE001 - translated, never swallowed
            _raise_official(exc, self._closed)

    def _now(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise _EXCEPTIONS[Result.AlreadyClosed](Result.AlreadyClosed)
        try:
            return fn(*args)
        except (errors.PulsarWireError, RuntimeError) as exc:
            _raise_official(exc, self._closed)


class Producer(_Handle):
    """Publishes messages; `await producer.send(content)` returns the message id."""

    def __init__(self, producer: aio.Producer, schema: Any) -> None:
        self._producer = producer
        self._schema = schema

    async def send(self, content: Any, properties: dict[str, str] | None = None, partition_key: str | None = None,
                   ordering_key: str | None = None, sequence_id: int | None = None,
                   replication_clusters: list[str] | None = None, disable_replication: bool | None = None,
                   event_timestamp: int | None = None, deliver_at: int | None = None,
                   deliver_after: timedelta | None = None) -> MessageId:
        official.check_content(content, self._schema)
        options = official.send_options(properties, partition_key, ordering_key, sequence_id, replication_clusters,
                                        bool(disable_replication), event_timestamp, deliver_at, deliver_after)
        return MessageId.wrap(await self._await(self._queue_and_wait(content, options)))

    async def _queue_and_wait(self, content: Any, options: dict[str, Any]) -> aio.MessageId:
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


def _native_target(message: Message | MessageId | aio.MessageId) -> aio.Message | aio.MessageId:
    if isinstance(message, Message):
        return message.native
    return official.native_id(message)


class Consumer(_Handle):
    """Receives messages of a subscription; `await consumer.receive()`."""

    def __init__(self, consumer: aio.Consumer, consumer_type: ConsumerType) -> None:
        self._consumer = consumer
        self._type = consumer_type

    async def receive(self) -> Message:
        return Message(await self._await(self._consumer.receive()))

    async def acknowledge(self, message: Message | MessageId) -> None:
        self._now(self._consumer.acknowledge, _native_target(message))

    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        if self._type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise _EXCEPTIONS[Result.CumulativeAcknowledgementNotAllowedError](
                Result.CumulativeAcknowledgementNotAllowedError)
        self._now(self._consumer.acknowledge_cumulative, _native_target(message))

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        self._now(self._consumer.negative_acknowledge, _native_target(message))

    async def unsubscribe(self) -> None:
        await self._await(self._consumer.unsubscribe())
        self._closed = True

    async def seek(self, messageid: MessageId | int) -> None:
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

    async def seek(self, messageid: MessageId | int) -> None:
        await self._await(self._reader.seek(official.seek_target(messageid)))

    async def close(self) -> None:
        await self._await(self._reader.close())
        self._closed = True

    def topic(self) -> str:
        return self._reader.topic()

    def is_connected(self) -> bool:
        return not self._closed and self._reader.is_connected()


class Client(_Handle):
    """The asyncio client: `Client(service_url, **kwargs)` with `pulsar.Client`'s keyword arguments.
    It may be made outside a running loop; it starts on the loop of its first call."""

    _shut_down = False

    def __init__(self, service_url: str, **kwargs: Any) -> None:
        if not isinstance(service_url, str):
            raise ValueError("Argument service_url is expected to be of type 'str'")
        values = official_options.CLIENT.keywords(kwargs, "asyncio")
        self._service_url = service_url
        self._options = official_options.CLIENT.translate(values)
        aio.Address.parse_service_url(service_url)  # a bad URL fails here, as in the official client
        self._client: aio.Client | None = None
        # closed with the client, so that later calls raise AlreadyClosed (weak: no growth)
        self._handles: weakref.WeakSet[_Handle] = weakref.WeakSet()

    def _made(self, handle: _H) -> _H:
        self._handles.add(handle)
        return handle

    def _native(self) -> aio.Client:
        if self._closed:
            raise _EXCEPTIONS[Result.AlreadyClosed](Result.AlreadyClosed)
        if self._client is None:
            self._client = aio.Client(self._service_url, **self._options)
        return self._client

    @official_options.PRODUCER.method("asyncio")
    async def create_producer(self, topic: str, values: dict[str, Any]) -> Producer:
        _checked_topic(topic)
        try:
            options = official_options.PRODUCER.translate(values)
        except official.Unsupported as exc:
            _raise_official(exc)
        producer = await self._await(official_options.create_producer(self._native(), topic, options))
        return self._made(Producer(producer, values["schema"]))

    @official_options.CONSUMER.method("asyncio")
    async def subscribe(self, topic: str | list[str], subscription_name: str, values: dict[str, Any]) -> Consumer:
        official.check_type(str, subscription_name, "subscription_name")
        target: str | list[str] | re.Pattern[str] = topic
        if values["is_pattern_topic"]:
            if not isinstance(topic, str):
                raise ValueError("Argument 'topic' must be a string when 'is_pattern_topic' is True; lists of "
                                 "topics do not support pattern subscriptions")
            target = re.compile(topic)
        elif not isinstance(topic, (str, list)):
            raise ValueError("Argument 'topic' is expected to be of type 'str' or 'list'")
        try:
            topics = official.subscribe_topic(target)
        except official.BadTopicName as exc:
            _raise_official(exc)
        try:
            options = official_options.CONSUMER.translate(values, topic=topics)
        except official.Unsupported as exc:
            _raise_official(exc)
        native = await self._await(self._native().subscribe(topics, subscription_name, **options))
        return self._made(Consumer(native, ConsumerType(values["consumer_type"])))

    @official_options.READER.method("asyncio")
    async def create_reader(self, topic: str, start_message_id: MessageId, values: dict[str, Any]) -> Reader:
        _checked_topic(topic)
        start = official.start_id(start_message_id)
        try:
            options = official_options.READER.translate(values)
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

