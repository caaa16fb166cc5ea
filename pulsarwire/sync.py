"""The official client's blocking surface: `import pulsarwire.sync as pulsar` runs programs
written for `pulsar-client` unchanged, with the same meaning.

Names, keyword arguments and defaults are the official client's (batching off,
`block_if_queue_full=False` with a full queue reported through the `send_async` callback as
`Result.ProducerQueueIsFull`, `callback(result, message_id)`, ...); errors are raised as the
official exception classes, each also a subclass of the pulsarwire error it stands for. The
asyncio client does the work on a private event loop in a thread (`blocking.LoopThread`);
message and reader listeners run on listener threads (`message_listener_threads`, one by
default), one message of a consumer at a time. Options that mean nothing here (`io_threads`,
`concurrent_lookup_requests`, `stats_interval_in_seconds`, `log_conf_file_path`, `use_tls`,
`logger`, `broker_consumer_stats_cache_time_ms`, `batching_type`,
`max_total_receiver_queue_size_across_partitions`, `crypto_failure_action`) are accepted and
ignored; README's "Switching from pulsar-client" lists every difference.
"""
from __future__ import annotations

import asyncio as _asyncio  # `asyncio` here is the official async surface (below)
import collections
import dataclasses
import functools
import inspect
import itertools
import logging
import queue
import re
import threading
import time
from datetime import timedelta  # noqa: F401 - the official module offers it
from typing import Any, Callable, Coroutine, cast
from typing import TypeVar as _TypeVar  # private: __all__ below offers this module's classes

from . import client as aio
from . import errors, messages, timers
from .blocking import LoopThread
from .client import receiving
from .client.producer import Receipt
from . import official, official_options
from .official import (  # noqa: F401 - the official names, offered from here
    Authentication, AuthenticationAthenz, AuthenticationBasic, AuthenticationOauth2, AuthenticationTLS,
    AuthenticationToken, BatchingType, BatchReceivePolicy, CompressionType, ConsumerBatchReceivePolicy,
    ConsoleLogger, ConsumerCryptoFailureAction, ConsumerDeadLetterPolicy, ConsumerKeySharedPolicy, ConsumerType,
    CryptoKeyReader, FileLogger, InitialPosition, KeySharedMode, KeySharedPolicy, LoggerLevel, Message, MessageId,
    PartitionsRoutingMode, ProducerAccessMode, RegexSubscriptionMode, Result,
)

from . import schema  # noqa: F401 - `pulsar.schema`
from . import schema as _schema
from .schema import BytesSchema  # noqa: F401 - the default schema, offered by the official module too

__version__ = "3.13.0-pulsarwire"  # the official API version this surface follows

log = logging.getLogger("pulsarwire")
_T = _TypeVar("_T")


class PulsarException(Exception):
    """Base of every error the official surface raises; `result` is the official Result."""

    result = Result.UnknownError

    def error(self) -> Result:
        return self.result


_EXCEPTIONS = official.exception_classes(PulsarException)
globals().update({cls.__name__: cls for cls in _EXCEPTIONS.values()})
UnknownError = _EXCEPTIONS[Result.UnknownError]
InvalidConfiguration = _EXCEPTIONS[Result.InvalidConfiguration]
Timeout = _EXCEPTIONS[Result.Timeout]
AlreadyClosed = _EXCEPTIONS[Result.AlreadyClosed]
OperationNotSupported = _EXCEPTIONS[Result.OperationNotSupported]
ProducerQueueIsFull = _EXCEPTIONS[Result.ProducerQueueIsFull]
CumulativeAcknowledgementNotAllowedError = _EXCEPTIONS[Result.CumulativeAcknowledgementNotAllowedError]
TopicNotFound = _EXCEPTIONS[Result.TopicNotFound]
InvalidTopicName = _EXCEPTIONS[Result.InvalidTopicName]


def _official_error(exc: BaseException, closed: bool = False) -> BaseException:
    """`exc` as the official exception class (errors with no official counterpart stay as they are)."""
    if isinstance(exc, PulsarException):
        return exc
    if isinstance(exc, official.Unsupported):
        return OperationNotSupported(str(exc))
    # Ctrl-C (or any signal handler raising KeyboardInterrupt) while a call waits: the official
    # client checks for signals as it waits and raises Interrupted
    result = Result.Interrupted if isinstance(exc, KeyboardInterrupt) else official.official_result(exc, closed)
    if result is None:
        return exc
    # the official message; pulsarwire's detail stays in the chained cause
    error = _EXCEPTIONS[result](official.error_text(result))
    error.__cause__ = exc
    return error


class _Facade:
    """What the blocking objects share: the loop, a closed flag and the error translation."""

    _loop: LoopThread
    _closed: bool = False

    def _run(self, coro: Coroutine[Any, Any, _T], closed_check: bool = True) -> _T:
        if closed_check and self._closed:
            coro.close()
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        try:
            return self._loop.run(coro)
        except BaseException as exc:  # noqa: BLE001 - translated, never swallowed
            raise _official_error(exc, self._closed) from exc

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        try:
            return self._loop.call(fn, *args)
        except BaseException as exc:  # noqa: BLE001
            raise _official_error(exc, self._closed) from exc


class _Handover:
    """What a consumer's callers hand to the event loop without waiting for an answer, in runs:
    one wake-up of the loop's thread for many items instead of a round trip each. Items: a
    message to acknowledge (the common case, queued bare), or a (function, argument) call. The
    permits of taken messages are counted apart (`taken`) and returned after the
    acknowledgements.

    Acknowledgements go when `step` of them are queued, or at the latest `HOLD` after the loop's
    thread last took some (its `_tick`; a caller about to wait for a message wakes the loop for
    them only when no tick is armed, `before_wait`), then wait out the consumer's own grouping
    (ack_group_time_ms, 100 ms, as the official client's acknowledgmentGroupTime).
    Waking the loop's thread at the first one of a run of receive() + acknowledge(), the next
    receive() waited for that wake-up (the write to the loop's pipe, then the GIL taken back
    from the woken thread: 16-60 us). Whatever is later handed to the loop (the consumer's
    `_run`, `_call`) flushes first, so it runs after what was queued before it."""

    __slots__ = ("_items", "taken", "_scheduled", "_loop", "_consumer", "_step", "_tick")

    HOLD = 0.01  # seconds: the longest an item waits here for a caller that stopped receiving

    def __init__(self, loop: LoopThread, consumer: aio.Consumer, step: int) -> None:
        self._items: collections.deque[Any] = collections.deque()  # messages, (function, argument) calls
        # the owner of each message taken, or (owner, count) for a run of them
        self.taken: collections.deque[Any] = collections.deque()
        self._scheduled = False
        self._loop = loop.loop
        self._consumer = consumer
        self._step = max(1, step)
        # the loop's timer that takes what is queued at the latest HOLD after the last run
        # (None: none armed, so the next item wakes the loop's thread itself); loop thread only
        self._tick: _asyncio.TimerHandle | None = None

    def put(self, item: Any) -> None:
        items = self._items
        items.append(item)  # first: a tick that finds none queued has let go of _tick already
        if not self._scheduled and (self._tick is None or len(items) >= self._step):
            self._schedule()

    def flush(self) -> None:
        """Hand over now whatever is queued (a step of permits taken, a run taken or a listener's
        drain done, or the caller is about to ask the loop)."""
        if (self.taken or self._items) and not self._scheduled:
            self._schedule()

    def before_wait(self) -> None:
        """The caller is about to wait for a message: hand over only what no timer of the loop's
        would take within HOLD. Acknowledgements wait out the consumer's grouping anyway, and
        the permits of taken messages cannot be what the broker waits for: fewer than `step` are
        held here (see Consumer._take) and the consumer returns them once half its receiver
        queue is used, so the broker still holds more than a third of the queue's permits."""
        if self._tick is None:
            self.flush()

    def _schedule(self) -> None:
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self.run)
        except RuntimeError:  # the loop is closed: there is nothing left to hand them to
            self._items.clear()

    def _on_tick(self) -> None:
        self._tick = None  # first: put() now wakes the loop itself for what comes after this look
        if (self._items or self.taken) and not self._scheduled:
            self.run()

    def run(self) -> None:
        self._scheduled = False  # first: an item queued from now on schedules another run
        items, consumer = self._items, self._consumer
        if self._tick is None and not consumer._closed:
            self._tick = self._loop.call_later(self.HOLD, self._on_tick)
        for item in receiving.fold_acks(items):  # only this thread takes from it
            try:
                if len(item) == 2:  # (function, argument)
                    item[0](item[1])
                elif not consumer._closed:  # (entry, first, last): a run of its messages
                    unit = item[0]
                    unit.owner.ack_run(unit, item[1], item[2])
            except Exception as exc:  # noqa: BLE001 - nobody waits for these; the consumer goes on
                log.debug("acknowledgement handed over failed: %s", exc)
        taken = self.taken
        if taken:
            counts: dict[Any, int] = {}
            take = taken.popleft
            while taken:
                owner = take()
                if type(owner) is tuple:  # (owner, count): a run taken together
                    owner, count = owner
                    counts[owner] = counts.get(owner, 0) + count
                else:
                    counts[owner] = counts.get(owner, 0) + 1
            for owner, count in counts.items():
                owner._message_consumed(count)


class _ListenerThreads:
    """The threads that run message and reader listeners; each listening consumer is bound to
    one of them, so its listener is called one message at a time, in order."""

    def __init__(self, count: int) -> None:
        self._count = max(1, count)
        self._queues: list[queue.SimpleQueue[Callable[[], None] | None]] = []
        self._threads: list[threading.Thread] = []
        self._next = itertools.count()
        self._lock = threading.Lock()

    def queue_for_next_consumer(self) -> queue.SimpleQueue[Callable[[], None] | None]:
        with self._lock:
            if not self._threads:
                for index in range(self._count):
                    work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
                    thread = threading.Thread(target=self._serve, args=(work,), daemon=True,
                                              name=f"pulsarwire-listener-{index}")
                    thread.start()
                    self._queues.append(work)
                    self._threads.append(thread)
            return self._queues[next(self._next) % self._count]

    @staticmethod
    def _serve(work: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while True:
            job = work.get()
            if job is None:
                return
            job()

    def stop(self) -> None:
        for work in self._queues:
            work.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)


class Client(_Facade):
    """The client: `Client("pulsar://localhost:6650")`, with the official keyword arguments."""

    _shut_down = False

    @official_options.CLIENT.method("sync")
    def __init__(self, service_url: str, values: dict[str, Any]) -> None:
        if not isinstance(service_url, str):
            raise ValueError("Argument service_url is expected to be of type 'str' (pulsarwire has no "
                             "AutoClusterFailover or ServiceInfoProvider)")
        options = official_options.CLIENT.translate(values)
        self._loop = LoopThread()
        self._listeners = _ListenerThreads(values["message_listener_threads"])
        self._handles: list[Producer | Consumer | Reader | TableView] = []

        async def make() -> aio.Client:
            return aio.Client(service_url, **options)
        try:
            self._client = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise  # a bad service URL: ValueError, as from the official client

    @official_options.PRODUCER.method("sync")
    def create_producer(self, topic: str, values: dict[str, Any]) -> "Producer":
        _checked_topic(topic)
        try:
            options = official_options.PRODUCER.translate(values)
        except official.Unsupported as exc:
            raise OperationNotSupported(str(exc)) from exc
        producer = Producer(self, self._run(official_options.create_producer(self._client, topic, options)),
                            values["schema"])
        self._handles.append(producer)
        return producer

    @official_options.CONSUMER.method("sync")
    def subscribe(self, topic: str | list[str] | re.Pattern[str], subscription_name: str,
                  values: dict[str, Any]) -> "Consumer":
        official.check_type(str, subscription_name, "subscription_name")
        try:
            topics = official.subscribe_topic(topic)
        except official.BadTopicName as exc:
            raise InvalidTopicName(official.error_text(Result.InvalidTopicName)) from None
        try:
            options = official_options.CONSUMER.translate(values, topic=topics)
        except official.Unsupported as exc:
            raise OperationNotSupported(str(exc)) from exc
        native = self._run(self._client.subscribe(topics, subscription_name, **options))
        self._resolve_writer_schemas(values["schema"])
        batch_receive_policy = values["batch_receive_policy"]
        policy = batch_receive_policy.policy() if batch_receive_policy is not None else BatchReceivePolicy()
        consumer = Consumer(self, native, ConsumerType(values["consumer_type"]), policy)
        # as the official client's MultiTopicsConsumer: a list of topics, a pattern, a partitioned
        # topic (or one with its retry letter topic) takes only ids that name their topic
        consumer._multi_topics = not isinstance(topic, str) or native.topics() != [aio.topic_name(topic)]
        self._handles.append(consumer)
        if values["message_listener"] is not None:
            consumer._listen(values["message_listener"])
        return consumer

    @official_options.READER.method("sync")
    def create_reader(self, topic: str, start_message_id: MessageId, values: dict[str, Any]) -> "Reader":
        _checked_topic(topic)
        start = official.start_id(start_message_id)
        try:
            options = official_options.READER.translate(values)
        except official.Unsupported as exc:
            raise OperationNotSupported(str(exc)) from exc
        reader = Reader(self, self._run(self._client.create_reader(topic, start, **options)))
        self._resolve_writer_schemas(values["schema"])
        self._handles.append(reader)
        if values["reader_listener"] is not None:
            reader._listen(values["reader_listener"])
        return reader

    def _resolve_writer_schemas(self, schema: object) -> None:
        """An Avro schema of a consumer or reader decodes a message by the schema version it was
        written with (fetched once per version), as the official client does."""
        if isinstance(schema, _schema.AvroSchema) and schema.fetch_writer_schema is None:
            schema.fetch_writer_schema = self._writer_schema_info

    def _writer_schema_info(self, topic: str, version: bytes) -> _schema.SchemaInfo | None:
        if threading.current_thread() is self._loop.thread or self._closed:
            return None  # the loop cannot wait on itself: decoded with the reader's schema
        return self._run(self._client.get_schema_info(topic, version))

    def create_table_view(self, topic: str, subscription_name: str | None = None, schema: Any = None) -> "TableView":
        """The latest value of every key of a topic (from the asyncio client's table view)."""
        official.check_type(str, topic, "topic")
        official.check_type_or_none(str, subscription_name, "subscription_name")
        factory = getattr(self._client, "create_table_view", None)
        if factory is None:
            raise OperationNotSupported(official.error_text(Result.OperationNotSupported))
        options: dict[str, Any] = {}
        if subscription_name is not None:
            options["subscription_name"] = subscription_name
        if schema is not None and type(schema).__name__ != "BytesSchema":
            options["schema"] = schema
        view = TableView(self, self._run(factory(topic, **options)), topic, subscription_name, schema)
        self._handles.append(view)
        return view

    def get_topic_partitions(self, topic: str) -> list[str]:
        official.check_type(str, topic, "topic")
        return self._run(self._client.get_topic_partitions(topic))

    def shutdown(self) -> None:
        """Close at once, without waiting for what is in flight (which fails with AlreadyClosed)."""
        if self._closed:
            return
        self._closed = self._shut_down = True
        for handle in self._handles:
            handle._closed = True

        def abort() -> None:
            self._client._closed = True
            self._client._pool.close_all()
            closed = errors.AlreadyClosedError("client is closed")
            for handle in self._handles:  # what sends are in flight fail now, not never
                if isinstance(handle, Producer):
                    handle._fail_handing(closed)
                    for partition in handle._producer._partitions:
                        partition._fail_all(closed)
        try:
            self._loop.call(abort)  # at once when called from a callback on the loop's thread
        finally:
            self._listeners.stop()
            self._loop.stop()

    def close(self) -> None:
        """Close every producer, consumer and reader of this client, then the client."""
        if self._shut_down:  # as the official client: closing once what shutdown() closed is no error
            self._shut_down = False
            return
        if self._closed:
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        if threading.current_thread() is self._loop.thread:  # before anything is marked closed
            raise RuntimeError("close() waits for the event loop it was called from: call it from another "
                               "thread, or shutdown() to close at once")
        for handle in list(self._handles):
            handle._stop_listening()
            handle._closed = True
        self._closed = True

        async def close() -> None:
            for handle in self._handles:  # what send_async queued goes out first, as producer.close() does
                if isinstance(handle, Producer):
                    await handle._handed_over()
                elif isinstance(handle, Consumer):  # and the acknowledgements consumer.close() would send
                    handle._handover.run()
            await self._client.close()
        try:
            self._run(close(), closed_check=False)
        finally:
            self._listeners.stop()
            self._loop.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.close()


def _checked_topic(topic: str) -> None:
    official.check_type(str, topic, "topic")
    try:
        official.check_topic(topic)
    except official.BadTopicName as exc:
        raise InvalidTopicName(official.error_text(Result.InvalidTopicName)) from None


def _default_message_id() -> MessageId:
    return MessageId()


def _sent_id(native: Any) -> MessageId:
    """The id send() gives for `native` (the receipt's pulsarwire MessageId, there whenever no error
    is): without its topic, as the official client's (so a multi-topic consumer refuses to
    acknowledge it, as the official client does)."""
    if native.first_chunk is not None:  # a chunked message's (not the hot path: make_message_id's)
        return MessageId.wrap(dataclasses.replace(native, topic=None))
    return MessageId.wrap(messages.make_message_id(native.ledger_id, native.entry_id, native.partition,
                                                   native.batch_index, native.batch_size))


class _Sent(Receipt):
    """The answer to one accepted send: counted as answered (room under max_pending_messages),
    then `callback(result, message_id)` on the loop's thread, as send_async's callback; the
    producer's asyncio half answers it where it would set a send's future."""

    __slots__ = ("_producer",)

    def __init__(self, producer: "Producer", callback: Any) -> None:  # (Result, MessageId), not Receipt's
        self.callback = callback
        self._done = False
        self._waiter = None
        self.quiet = callback is None  # send_async without a callback: its receipt's id is not made
        self._producer = producer

    def _answer(self, error: BaseException | None, message_id: messages.MessageId | None) -> None:
        if self._done:
            return
        producer = self._producer
        # answered at once in a caller's thread, or while a caller reads for the loop: the callback
        # runs on the loop's thread, later; and so does every answer read while such callbacks
        # wait there (a send() returns after the callbacks of the sends before it, as in the
        # official client, whose answers all come in order on its I/O thread)
        loop = producer._loop
        if producer._lent or (loop.reading_borrowed and (self.callback is not None or loop.answers_deferred)):
            loop.answers_deferred += 1  # (borrowed: the loop's thread, which counts down, waits)
            loop.loop.call_soon(self._deferred_answer, error, message_id)
            return
        self._done = True
        producer._one_answered()
        try:
            self._report(error, message_id)
        finally:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    def _deferred_answer(self, error: BaseException | None, message_id: messages.MessageId | None) -> None:
        self._producer._loop.answers_deferred -= 1  # on the loop's thread
        self._answer(error, message_id)

    def _report(self, error: BaseException | None, message_id: messages.MessageId | None) -> None:
        callback: Any = self.callback  # the official signature: (Result, official MessageId)
        if callback is None:
            return
        try:
            if error is None:
                callback(Result.Ok, _sent_id(message_id))
            else:
                callback(_result_of(error, self._producer._closed), _default_message_id())
        except Exception:  # noqa: BLE001 - a callback's error must not break the producer
            log.exception("send_async callback raised")

    def refused(self, result: Result) -> None:
        """Not accepted (a full queue, a closed producer): the callback alone."""
        self._done = True
        self._report_result(result)

    def _report_result(self, result: Result) -> None:
        callback: Any = self.callback  # the official signature: (Result, official MessageId)
        if callback is not None:
            try:
                callback(result, _default_message_id())
            except Exception:  # noqa: BLE001
                log.exception("send_async callback raised")


class _Awaited(_Sent):
    """The answer to a send() its caller waits for."""

    __slots__ = ("_finished", "error", "message_id", "wake_fd", "wake_thread")

    def __init__(self, producer: "Producer") -> None:
        super().__init__(producer, None)
        self.quiet = False  # send() returns the id
        self._finished = threading.Lock()
        self._finished.acquire()
        self.error: BaseException | None = None
        self.message_id: messages.MessageId | None = None
        self.wake_fd = -1  # while the caller reads its socket itself (LoopThread.read_while_waiting)
        self.wake_thread = 0

    def _report(self, error: BaseException | None, message_id: messages.MessageId | None) -> None:
        self.error, self.message_id = error, message_id
        self._finished.release()
        timers.wake_reader(self)

    def answered(self) -> bool:
        return not self._finished.locked()

    def wait(self, timeout: float) -> bool:
        return self._finished.acquire(timeout=timeout)


_NO_SEND_OPTIONS: dict[str, Any] = {}


def _only_socket(partitions: list[Any]) -> Any:
    """The socket of the connection of a producer's or consumer's one partition, or None (several
    partitions, not connected): what a caller reads itself while it waits."""
    if len(partitions) != 1:
        return None
    conn = partitions[0].conn
    transport = None if conn is None else conn.transport
    return None if transport is None else transport.get_extra_info("socket")


def _send_options(properties: dict[str, str] | None, partition_key: str | None, ordering_key: str | None,
                  sequence_id: int | None, replication_clusters: list[str] | None, disable_replication: bool,
                  event_timestamp: int | None, deliver_at: int | None,
                  deliver_after: timedelta | None) -> dict[str, Any]:
    """A send's checked options; _NO_SEND_OPTIONS (shared, never changed) when there are none (send_async
    checks inline: its per-message path)."""
    if properties is None and partition_key is None and ordering_key is None and sequence_id is None \
            and replication_clusters is None and not disable_replication and event_timestamp is None \
            and deliver_at is None and deliver_after is None:
        return _NO_SEND_OPTIONS
    return official.send_options(properties, partition_key, ordering_key, sequence_id, replication_clusters,
                                 disable_replication, event_timestamp, deliver_at, deliver_after)
# seconds that a receive(0) finding nothing sleeps before its Timeout (Consumer._pause_empty_poll)
EMPTY_POLL_PAUSE = 20e-6
# A held queue of sends is handed to the producer this long before its batch is due (a quarter of
# the delay when that is shorter), and at once once this many are queued.
_HOLD_LEAD = 100e-6
_HOLD_FRACTION = 0.25
_HOLD_MAX_MESSAGES = 128


class Producer(_Facade):
    """Publishes messages on a topic (all partitions of it when partitioned)."""

    def __init__(self, client: Client, producer: aio.Producer, schema: Any) -> None:
        self._client = client
        self._loop = client._loop
        self._producer = producer
        self._schema = schema
        # As in the official client, a send is queued in the caller's thread: the bound on pending
        # messages is applied here, at the call, and the loop takes the queue over in runs (one
        # wake-up each), giving each send to the producer in the order it was accepted.
        # taken as `with self._gate_lock` (a lock's own __enter__, in C): a KeyboardInterrupt right
        # after Condition.__enter__ (Python) took it would leave it taken for good
        self._gate_lock = threading.Lock()
        self._gate = threading.Condition(self._gate_lock)
        self._max_pending: int = producer._max_pending
        self._block: bool = producer._block
        self._accepted = 0  # sends accepted (under _gate)
        self._answered = 0  # of those, answered (on the loop's thread only)
        self._room_waiters = 0  # callers waiting for room (under _gate)
        # accepted, not yet on the producer: (content, send options, answer, when accepted)
        self._handing: collections.deque[tuple[Any, dict[str, Any], _Sent, float]] = collections.deque()
        self._handing_over = False  # a hand-over is scheduled, running or held: it takes what is queued
        self._hand_over_task: _asyncio.Task[None] | None = None  # the hand-over, when a send had to wait
        # With batching, the loop leaves accepted sends queued until just before the batch they
        # join is due (`_HOLD_LEAD`), so a steady stream of sends costs one loop wake-up a batch
        # rather than one a run: the queue is held (`_holding`, under _gate) until the loop's hold
        # timer, or until a caller wakes it: a blocking send() or a delayed message, enough queued
        # to fill the open batch, a caller about to wait for room.
        self._hold_delay: float = producer._batching_delay if producer._batching else 0.0
        self._hold_messages = min(producer._batching_max_messages, _HOLD_MAX_MESSAGES)
        self._hold_bytes: int = producer._batching_max_bytes
        self._holding = False
        # while holding: a caller's send hands the queue over once this many (bytes) are queued,
        # what fills the open batch (under _gate, set by the loop as it holds)
        self._release_messages = self._hold_messages
        self._release_bytes = self._hold_bytes
        self._queued_bytes = 0  # of the bytes contents queued (under _gate)
        self._urgent_queued = False  # a blocking send() or a delayed message is queued (under _gate)
        self._hold_timer: Any = None  # on the loop's thread only
        self._lent = False  # a caller's thread runs a send with the loop borrowed (_send_direct)
        producer.before_batch_due = self._hand_over_before_due

    def _stop_listening(self) -> None:
        with self._gate_lock:
            self._closed = True
            self._gate.notify_all()  # a send blocked on a full queue answers AlreadyClosed

    def topic(self) -> str:
        return self._producer.topic()

    def producer_name(self) -> str:
        return self._loop.call(self._producer.producer_name)

    def last_sequence_id(self) -> int:
        return self._loop.call(self._producer.last_sequence_id)

    def is_connected(self) -> bool:
        if self._closed:
            return False
        return self._loop.call(self._producer.is_connected)

    def send(self, content: Any, properties: dict[str, str] | None = None, partition_key: str | None = None,
             ordering_key: str | None = None, sequence_id: int | None = None,
             replication_clusters: list[str] | None = None, disable_replication: bool = False,
             event_timestamp: int | None = None, deliver_at: int | None = None,
             deliver_after: timedelta | None = None) -> MessageId:
        """Publish one message and wait until the broker has it; returns its id. `None` content
        sends a null value (a tombstone: compaction and table views drop the key). With batching,
        its batch goes out at once (with what other threads added to it), as the Java client's
        send() does: waiting out the batching delay would only hold the caller."""
        if content is not None:
            official.check_content(content, self._schema)
        options = _send_options(properties, partition_key, ordering_key, sequence_id, replication_clusters,
                                disable_replication, event_timestamp, deliver_at, deliver_after)
        if self._closed:
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        self._loop.refuse_own_thread()
        answer = _Awaited(self)
        if not self._accept(content, options, answer):
            raise self._refusal
        try:
            self._loop.read_while_waiting(self._socket(), answer.answered, answer)
            while not answer.wait(0.1):
                if self._loop.stopped:  # the client was shut down under this send
                    raise errors.AlreadyClosedError("client is closed")
            if answer.error is not None:
                raise answer.error
            return _sent_id(answer.message_id)
        except BaseException as exc:  # noqa: BLE001 - translated, never swallowed
            raise _official_error(exc, self._closed) from exc

    def _socket(self) -> Any:
        """The socket of the connection a send() waits on (a producer of one partition), or None."""
        return _only_socket(self._producer._partitions)

    def send_async(self, content: Any, callback: Callable[[Result, MessageId], None] | None,
                   properties: dict[str, str] | None = None, partition_key: str | None = None,
                   ordering_key: str | None = None, sequence_id: int | None = None,
                   replication_clusters: list[str] | None = None, disable_replication: bool = False,
                   event_timestamp: int | None = None, deliver_at: int | None = None,
                   deliver_after: timedelta | None = None) -> None:
        """Queue a message; `callback(result, message_id)` runs once the broker has it, or with the
        error's Result (and MessageId(-1, -1, -1, -1)) when it fails - a full queue included."""
        if callback is not None and not callable(callback):  # refused at the call, as the official client does
            raise TypeError(f"send_async callback must be callable(result, message_id), not {type(callback).__name__}")
        if content is not None:  # None: a null value, as send()
            official.check_content(content, self._schema)
        if properties is None and partition_key is None and ordering_key is None and sequence_id is None \
                and replication_clusters is None and not disable_replication and event_timestamp is None \
                and deliver_at is None and deliver_after is None:
            options = _NO_SEND_OPTIONS  # inline, not _send_options(): this is the per-message path
        else:
            options = official.send_options(properties, partition_key, ordering_key, sequence_id,
                                            replication_clusters, disable_replication, event_timestamp,
                                            deliver_at, deliver_after)
        sent = _Sent(self, callback)
        if self._closed:
            sent.refused(Result.AlreadyClosed)
        elif not self._accept(content, options, sent):
            sent.refused(self._refusal.result)

    @property
    def _refusal(self) -> Any:  # an official exception class's instance
        if self._closed or self._loop.stopped:
            return AlreadyClosed(official.error_text(Result.AlreadyClosed))
        return ProducerQueueIsFull(official.error_text(Result.ProducerQueueIsFull))

    def _accept(self, content: Any, options: dict[str, Any], sent: _Sent) -> bool:
        """Queue one send if the bound on pending messages lets it in, waiting for room when the
        producer blocks; False when it is refused (see `_refusal`). `sent` is answered on the
        loop's thread once the broker has the message (or it failed)."""
        loop_thread = self._loop.thread
        with self._gate_lock:
            if self._accepted - self._answered >= self._max_pending:
                if not self._block:
                    return False
                # the loop's own thread cannot wait for room it has to make: the producer waits instead
                if threading.current_thread() is not loop_thread:
                    if self._holding:  # what is held makes room only once it is sent
                        self._holding = False
                        self._wake_hand_over()
                    self._room_waiters += 1
                    try:
                        while self._accepted - self._answered >= self._max_pending:
                            if self._closed or self._loop.stopped:
                                return False
                            self._gate.wait(0.1)
                    finally:
                        self._room_waiters -= 1
            if self._closed:
                return False
            # Alone (nothing queued or in flight before it: a send() loop, sends far apart) while
            # the loop's thread waits for I/O: this thread does the hand-over itself, with the
            # loop borrowed (no wake-up; written at once when unbatched), signal handlers held
            # back on the main thread (a KeyboardInterrupt must not cut the loop's work in two).
            # A stream of sends is handed over by the loop's thread, in runs (one write for many).
            alone = self._accepted == self._answered and not self._handing_over
            held = timers.hold_signals() if alone else None
            self._accepted += 1
            direct = alone and self._loop.borrow()
            if not direct:
                start = self._queue_send(content, options, sent)
            self._handing_over = True  # what others accept meanwhile queues behind this one
        try:
            if direct:
                self._send_direct(content, options, sent)
            elif start:
                self._wake_hand_over()
        finally:
            timers.release_signals(held)
        return True

    def _queue_send(self, content: Any, options: dict[str, Any], sent: _Sent) -> bool:
        """Under _gate: queue an accepted send for the loop's hand-over; True when the loop must
        be woken for it."""
        handing = self._handing
        handing.append((content, options, sent, time.monotonic()))  # the loop's clock
        if type(content) is bytes:
            self._queued_bytes += len(content)
        start = not self._handing_over
        # a blocking send() waits for its answer, a delayed message goes alone: neither is held
        if type(sent) is _Awaited or (options is not _NO_SEND_OPTIONS and
                                      ("deliver_at" in options or "deliver_after_ms" in options)):
            self._urgent_queued = True
            if self._holding:
                self._holding = False
                start = True
        if self._holding and (len(handing) >= self._release_messages or self._queued_bytes >= self._release_bytes):
            self._holding = False
            start = True
        return start

    def _send_direct(self, content: Any, options: dict[str, Any], sent: _Sent) -> None:
        """In the caller's thread, the loop borrowed: what the loop's hand-over does for one send,
        then the loop is given back. Answers that come at once (a failure) go through the loop's
        thread, as every answer does: no callback runs while the loop is borrowed. (Running
        `_hand_over()` itself here, through the queue, made a send() loop 15 % slower.)"""
        producer = self._producer
        requeue = False
        accepted = time.monotonic()
        self._lent = True
        try:
            producer.accepted_at = None  # its batch's delay runs from now: the call
            try:
                queued = producer.send_nowait(content, sent, **options)
            except Exception as exc:  # noqa: BLE001 - this send's answer
                sent.set_exception(exc)
                queued = True
            if not queued:  # it would have to wait (no room yet, a partition not attached): the loop's task
                requeue = True
            elif type(sent) is _Awaited:
                producer.flush_batches(write_now=True)
            else:
                producer.write_now()
        finally:
            self._lent = False
            with self._gate_lock:
                if requeue:
                    self._handing.appendleft((content, options, sent, accepted))
                wake = bool(self._handing)
                if not wake:
                    self._handing_over = False
            self._loop.give_back()
        if wake:  # what others queued meanwhile; or this send, first, at once (it may be a send())
            self._wake_hand_over(may_hold=not requeue)

    def _wake_hand_over(self, may_hold: bool = True) -> None:
        """Have the loop take the queued sends (or, `may_hold`, hold them until their batch is
        nearly due)."""
        try:
            if threading.current_thread() is self._loop.thread:
                self._loop.loop.call_soon(self._hand_over, may_hold)
            else:
                self._loop.loop.call_soon_threadsafe(self._hand_over, may_hold)
        except RuntimeError:  # the loop closed meanwhile
            self._fail_handing(errors.AlreadyClosedError("client is closed"))

    def _one_answered(self) -> None:
        """On the loop: one accepted send was answered; a caller waiting for room may go on."""
        self._answered += 1
        if self._room_waiters:
            with self._gate_lock:
                self._gate.notify()

    def _hand_over(self, may_hold: bool = False) -> None:
        """On the loop: give the accepted sends to the producer, in the order they were accepted,
        without waiting; the first one that would have to wait goes on a task, with what follows.
        `may_hold`: leave them queued while their batch is not nearly due (see `_holding`)."""
        if self._hand_over_task is not None:
            return  # the task takes what is queued, in order
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        producer = self._producer
        send_nowait = producer.send_nowait
        awaited = False  # a blocking send() among them: its batch goes out now
        while True:
            with self._gate_lock:
                runs = self._handing
                if not runs:
                    self._handing_over = self._holding = False
                    producer.accepted_at = None
                    if awaited:
                        producer.flush_batches(write_now=True)
                    return
                if may_hold and self._hold_delay and not self._urgent_queued and not self._room_waiters \
                        and self._hold_for_open_batch(len(runs)):
                    due = runs[0][3] + self._hold_delay
                    open_due = producer.next_batch_due()
                    if open_due is not None and open_due < due:
                        due = open_due  # what is queued joins the open batch: hand it over before it goes
                    due -= min(self._hold_delay * _HOLD_FRACTION, _HOLD_LEAD)
                    if due > time.monotonic():
                        self._holding = True
                        self._hold_timer = self._loop.loop.call_at(due, self._hand_over)
                        return
                self._holding = self._urgent_queued = False
                self._queued_bytes = 0
                self._handing = collections.deque()
                may_hold = False
            while runs:
                content, options, sent, producer.accepted_at = runs[0]  # a batch's delay runs from the call
                if type(sent) is _Awaited:
                    awaited = True
                try:
                    queued = send_nowait(content, sent, **options)
                except Exception as exc:  # noqa: BLE001 - this send's answer
                    runs.popleft()
                    sent.set_exception(exc)
                    continue
                if not queued:
                    producer.accepted_at = None
                    with self._gate_lock:
                        runs.extend(self._handing)
                        self._handing = runs
                    if awaited:
                        self._producer.flush_batches()
                    self._hand_over_task = _asyncio.ensure_future(self._hand_over_waiting())
                    return
                runs.popleft()

    def _hold_for_open_batch(self, queued: int) -> bool:
        """Under _gate, on the loop: whether `queued` sends may be held, that is, would not fill
        the open batch (counting from the open batch, not from an empty one: a run held for a
        batch's worth after one sent alone would leave a full batch waiting out its delay).
        Sets the count and bytes at which a caller's send hands the held queue over."""
        room_messages, room_bytes = self._producer.batch_room()
        self._release_messages = min(self._hold_messages, room_messages)
        self._release_bytes = min(self._hold_bytes, room_bytes)
        return queued < self._release_messages and self._queued_bytes < self._release_bytes

    def _hand_over_before_due(self) -> None:
        """On the loop, as a batch's delay runs out: the sends queued by now join it (a send made
        before the official client's batch timer fires is in that batch)."""
        if self._handing and self._hand_over_task is None:
            self._hand_over()

    async def _hand_over_waiting(self) -> None:
        """On the loop: the first queued send, through send_async's waits; then the rest as usual."""
        with self._gate_lock:
            if not self._handing:  # failed meanwhile (the client closed)
                self._hand_over_task = None
                self._handing_over = False
                return
            content, options, sent, _ = self._handing.popleft()
        try:
            future = await self._producer.send_async(content, **options)
        except _asyncio.CancelledError:
            sent.set_exception(errors.AlreadyClosedError("client is closed"))
            self._fail_handing(errors.AlreadyClosedError("client is closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - this send's answer
            sent.set_exception(exc)
        else:
            future.add_done_callback(functools.partial(_future_answered, sent))
            if type(sent) is _Awaited:
                self._producer.flush_batches()
        self._hand_over_task = None
        self._hand_over()

    def _fail_handing(self, error: Exception) -> None:
        with self._gate_lock:
            failed = list(self._handing)
            self._handing.clear()
            self._handing_over = self._holding = self._urgent_queued = False
            self._queued_bytes = 0
        for _, _, sent, _ in failed:
            sent.set_exception(error)

    async def _handed_over(self) -> None:
        """Wait until every send accepted so far is on the producer."""
        while True:
            task = self._hand_over_task
            if task is not None:
                await _asyncio.wait([task])  # its sends' errors went to their callers
                continue
            with self._gate_lock:
                if not self._handing:
                    return
            self._hand_over()

    def flush(self) -> None:
        """Send what is batched and wait until the broker has every pending message."""
        async def flush() -> None:
            await self._handed_over()
            await self._producer.flush()
        self._run(flush())

    def close(self) -> None:
        """Close the producer once every pending message is acknowledged."""
        if self._closed:
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        self._stop_listening()  # first: a call blocked meanwhile reads AlreadyClosed

        async def close() -> None:
            await self._handed_over()
            await self._producer.close()
        self._run(close(), closed_check=False)


# a caller's thread holds the loop it borrowed until _send_direct returns (see Borrowing.take_back)
timers.Borrowing.sections.add(Producer._send_direct.__code__)


def _future_answered(sent: _Sent, future: _asyncio.Future[messages.MessageId]) -> None:
    if future.cancelled():
        sent.set_exception(errors.AlreadyClosedError("producer is closed"))
    elif (error := future.exception()) is not None:
        sent.set_exception(error)
    else:
        sent.set_result(future.result())


def _result_of(exc: BaseException, closed: bool) -> Result:
    if isinstance(exc, PulsarException):
        return exc.result
    return official.official_result(exc, closed) or Result.UnknownError


class _Listening(_Facade):
    """A consumer or reader whose messages may go to a listener instead of receive()."""

    _client: Client
    _listener_task: _asyncio.Task[None] | None = None
    _resumed: _asyncio.Event | None = None

    async def _receive_native(self) -> messages.Message:
        raise NotImplementedError

    def topic(self) -> str:
        raise NotImplementedError

    def _listen(self, listener: Callable) -> None:
        work = self._client._listeners.queue_for_next_consumer()

        async def start() -> None:
            resumed = self._resumed = _asyncio.Event()
            resumed.set()
            self._listener_task = _asyncio.ensure_future(self._pump(listener, work, resumed))
        self._loop.run(start())

    async def _pump(self, listener: Callable[..., Any], work: queue.SimpleQueue[Callable[[], None] | None],
                    resumed: _asyncio.Event) -> None:
        """Hand each message to the listener thread and wait for the listener to return, so that a
        slow listener holds back the consumer (its receiver queue) instead of piling up messages;
        `resumed` is cleared while the listener is paused."""
        loop = _asyncio.get_running_loop()
        while True:
            await resumed.wait()
            try:
                native = await self._receive_native()
            except (errors.ConnectionClosedError, errors.TopicTerminatedError, _asyncio.CancelledError):
                return
            except Exception as exc:  # noqa: BLE001 - the consumer failed for good
                log.warning("listener of %s stops: %s", self.topic(), exc)
                return
            await resumed.wait()  # paused while this one was on its way: hold it
            finished: _asyncio.Future[None] = loop.create_future()
            message = Message(native)

            def call(message: Message = message, finished: _asyncio.Future[None] = finished) -> None:
                try:
                    listener(self, message)
                except Exception:  # noqa: BLE001 - as the official client: log and go on
                    log.exception("message listener raised")
                finally:
                    try:
                        loop.call_soon_threadsafe(_finish, finished)
                    except RuntimeError:  # the loop is gone: the client was closed
                        pass
            work.put(call)
            await finished

    def _stop_listening(self) -> None:
        task = self._listener_task
        if task is not None and not self._loop.loop.is_closed():
            self._listener_task = None
            try:
                self._loop.call(task.cancel)
            except RuntimeError:
                pass

    def _set_listening(self, resumed: bool) -> None:
        if self._resumed is not None:
            self._call(self._resumed.set if resumed else self._resumed.clear)

    def _check_no_listener(self) -> None:
        if self._listener_task is not None:
            raise InvalidConfiguration(official.error_text(Result.InvalidConfiguration))


def _finish(future: _asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Consumer(_Listening):
    """Receives messages of a subscription."""

    def __init__(self, client: Client, consumer: aio.Consumer, consumer_type: ConsumerType,
                 batch_policy: BatchReceivePolicy) -> None:
        self._client = client
        self._loop = client._loop
        self._consumer = consumer
        self._type = consumer_type
        self._batch_policy = batch_policy
        # a message batch_receive() took but left for the next call, as the official client
        # leaves in its queue the message that would take a batch over max_num_bytes
        self._held: messages.Message | None = None
        # receive() takes from the asyncio consumer's queue in the caller's thread; permits and
        # acknowledgements go to the loop in batches (see _Handover)
        self._queue = consumer._queue
        self._loop_ident = client._loop.thread.ident
        self._taken = 0  # taken since the loop's thread last had a turn (roughly: threads may race)
        self._refill_at = consumer._refill_at
        self._permit_step = max(1, consumer._refill_at // 4)  # permits handed over this many at a time
        self._handover = _Handover(client._loop, consumer, self._permit_step)
        # a message listener: called on its listener thread, which takes the messages itself
        self._listener: Callable | None = None
        self._listener_work: queue.SimpleQueue[Callable[[], None] | None] | None = None
        self._listener_paused = False
        self._listener_armed = False  # a drain is queued or running on the listener thread
        self._listener_lock = threading.Lock()
        self._multi_topics = False  # set by subscribe()

    def _run(self, coro: Coroutine[Any, Any, _T], closed_check: bool = True) -> _T:
        self._handover.flush()  # what was queued before goes first
        return super()._run(coro, closed_check)

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        self._handover.flush()
        return super()._call(fn, *args)

    def _ack_target(self, message: Message | MessageId | messages.MessageId) -> messages.Message | messages.MessageId:
        """What acknowledge() hands on; a multi-topic consumer refuses an id that does not name
        its topic (from send(), made by hand, deserialized), as the official client does."""
        target = _native_target(message)
        if self._multi_topics and isinstance(target, messages.MessageId) and target.topic is None:
            raise OperationNotSupported(official.error_text(Result.OperationNotSupported))
        return target

    def _listen(self, listener: Callable) -> None:
        self._listener_work = self._client._listeners.queue_for_next_consumer()
        self._listener = listener
        self._queue.arrival_hook = self._arm_listener  # on the loop, once per delivered entry
        self._arm_listener()  # what is queued already

    def _arm_listener(self) -> None:
        """Have the listener thread drain the queue, unless it is at it (any thread)."""
        with self._listener_lock:
            if self._listener_armed or self._listener is None or self._listener_paused:
                return
            self._listener_armed = True
        assert self._listener_work is not None  # set with the listener
        self._listener_work.put(self._drain_to_listener)

    def _drain_to_listener(self) -> None:
        """On the listener thread: the listener gets each queued message in turn, taken here
        (no thread hop per message), until the queue is empty or listening pauses or stops."""
        listener = self._listener
        lock = self._listener_lock
        while True:
            while listener is not None and not self._closed:
                with lock:  # paused and taken at once: once pause returns, nothing more is taken
                    if self._listener_paused:
                        break
                    native = self._take()
                if native is None:
                    break
                try:
                    listener(self, Message(native))
                except Exception:  # noqa: BLE001 - as the official client: log and go on
                    log.exception("message listener raised")
                listener = self._listener
            self._handover.flush()
            with self._listener_lock:
                self._listener_armed = False
            # a message that came after the last take found the drain armed: look once more
            if self._listener is None or self._listener_paused or self._closed or not len(self._queue):
                return
            with self._listener_lock:
                if self._listener_armed:
                    return
                self._listener_armed = True
            listener = self._listener

    def _stop_listening(self) -> None:
        self._listener = None
        self._queue.arrival_hook = None

    def _set_listening(self, resumed: bool) -> None:
        if self._listener is None:
            return
        with self._listener_lock:  # against the drain's take: see _drain_to_listener
            self._listener_paused = not resumed
        if resumed:
            self._arm_listener()

    def _check_no_listener(self) -> None:
        if self._listener is not None:
            raise InvalidConfiguration("Pulsar error: InvalidConfiguration: messages go to the listener")

    async def _receive_native(self) -> messages.Message:
        return await self._consumer.receive()

    def topic(self) -> str:
        return self._consumer.topic()

    def subscription_name(self) -> str:
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        return self._consumer.consumer_name()

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises Timeout when none comes within timeout_millis."""
        if timeout_millis is not None and type(timeout_millis) is not int:
            official.check_type(int, timeout_millis, "timeout_millis")
        if self._listener is not None:
            self._check_no_listener()
        if self._closed:
            raise AlreadyClosed("Pulsar error: AlreadyClosed")
        if threading.get_ident() == self._loop_ident:
            self._loop.refuse_own_thread()  # at once, as every blocking call there, message or not
        native = self._held
        if native is None:
            native = self._take()
            if native is None:
                try:
                    native = self._wait_and_take(timeout_millis)
                except BaseException as exc:  # noqa: BLE001 - translated, never swallowed
                    raise _official_error(exc, self._closed) from exc
        else:
            self._held = None
        return receiving.make_one_untracked(Message, native)

    def _take(self) -> messages.Message | None:
        """The next queued message (None when there is none), taken in the caller's thread; its
        permit goes back to the broker through the loop, with others."""
        native = self._queue.take()
        if native is None:
            return None
        owner = native._ack_unit.owner
        owner._last_message = native
        taken = self._handover.taken
        taken.append(owner)
        if len(taken) >= self._permit_step:
            self._handover.flush()
        self._taken += 1
        if self._taken >= self._refill_at:
            # a refill's worth of permits is due: let the loop's thread send them now rather
            # than when this thread next blocks (a busy caller holds the GIL for 5 ms at a time,
            # long enough to empty the receiver queue while the broker waits for permits)
            self._taken = 0
            time.sleep(0)
        return native

    def _took(self, taken: list[messages.Message]) -> None:
        """What _take() does for each message, for messages taken together: one count per run
        of one partition's messages."""
        handover = self._handover
        owners = handover.taken
        for owner, count, last in receiving.count_taken(taken):
            owner._last_message = last
            owners.append((owner, count))
        handover.flush()  # one wake-up for the run (its permits may be what the broker waits for)
        self._taken += len(taken)
        if self._taken >= self._refill_at:
            self._taken = 0
            time.sleep(0)  # as in _take

    def _wait_and_take(self, timeout_millis: int | None) -> messages.Message:
        """_take(), waiting for a message; the asyncio consumer's errors when none can come."""
        self._loop.refuse_own_thread()
        self._handover.before_wait()
        consumer, queue_ = self._consumer, self._queue
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        native = self._read_while_waiting(deadline)
        if native is not None:
            return native
        waited = timeout_millis != 0  # a receive(0) has not: see _pause_empty_poll
        with queue_.ready_lock:  # (not `with queue_.ready`: see Producer._gate_lock)
            queue_.threads_waiting += 1
            try:
                while True:
                    native = self._take()
                    if native is not None:
                        return native
                    if consumer._error is not None:
                        raise consumer._error
                    if self._closed or consumer._closed or self._loop.stopped:
                        raise errors.AlreadyClosedError("consumer is closed")
                    if consumer._ended():
                        raise errors.TopicTerminatedError("reached the end of the topic")
                    wait = 0.1  # now and then: a client shut down under this call answers it
                    if deadline is not None:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            if not waited:
                                self._pause_empty_poll()
                            raise errors.TimeoutError("no message received within the timeout")
                        wait = min(wait, remaining)
                    queue_.ready.wait(wait)
                    waited = True
            finally:
                queue_.threads_waiting -= 1

    def _pause_empty_poll(self) -> None:
        """A receive(0) that found nothing sleeps for a moment before its Timeout: a thread polling
        an empty queue that way held the GIL all but every 5 ms (the interpreter's switch
        interval), and a send() loop on another thread of the client fell from some 10 500 to
        100 a second (the official client's receive(0) releases the GIL for its wait: 8 200)."""
        self._queue.ready_lock.release()
        try:
            time.sleep(EMPTY_POLL_PAUSE)
        finally:
            self._queue.ready_lock.acquire()

    def _read_while_waiting(self, deadline: float | None) -> messages.Message | None:
        """Wait for the next message by reading the connection's socket in this thread while the
        loop's thread waits for I/O (LoopThread.read_while_waiting): the message is parsed,
        queued and taken here, without a wake-up of the loop's thread and then of this one.
        None when this cannot go on (another thread reads the socket, the loop's thread is
        busy, the consumer has several connections), once the consumer closed or failed, or at
        the deadline: the caller waits its own way and sees to those."""
        sock = self._socket()
        if sock is None:
            return None
        consumer, queue_, loop = self._consumer, self._queue, self._loop

        def done() -> bool:
            return bool(len(queue_)) or self._closed or consumer._closed or consumer._error is not None

        while True:
            timeout = None
            if deadline is not None:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    return None
            if not loop.read_while_waiting(sock, done, queue_, timeout):
                return None
            native = self._take()
            if native is not None:
                return native
            if done() or loop.stopped or consumer._ended():  # closed, failed (or a message just came)
                return None

    def _socket(self) -> Any:
        """The socket of the consumer's one connection, or None (several partitions, none yet)."""
        return _only_socket(self._consumer._partitions)

    def batch_receive(self) -> list[Message]:
        """Messages up to the batch receive policy's count or bytes, or what came within its timeout."""
        self._check_no_listener()
        if self._closed:
            raise AlreadyClosed("Pulsar error: AlreadyClosed")
        self._loop.refuse_own_thread()
        policy = self._batch_policy
        max_messages, max_bytes = policy.getMaxNumMessages(), policy.getMaxNumBytes()
        timeout_ms = policy.getTimeoutMs()
        deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms > 0 else None
        batch: list[messages.Message] = []
        size = 0
        while (max_messages <= 0 or len(batch) < max_messages) and (max_bytes <= 0 or size < max_bytes):
            native = self._held
            if native is not None:
                self._held = None
            else:
                want = 1000 if max_messages <= 0 else max_messages - len(batch)
                taken, size, full = self._queue.take_many(want, max_bytes, size, bool(batch))
                if taken:
                    self._took(taken)
                    batch.extend(taken)
                    if full:
                        break  # the next one would cross max_num_bytes: it stays queued
                    continue
                native = self._take()
                if native is None:
                    remaining = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                    try:
                        native = self._wait_and_take(remaining)
                    except errors.TimeoutError:
                        break
                    except BaseException as exc:  # noqa: BLE001 - translated, never swallowed
                        raise _official_error(exc, self._closed) from exc
            length = native._single.payload_size
            if batch and max_bytes > 0 and size + length > max_bytes:
                self._held = native  # it would cross max_num_bytes: the next call's first
                break
            batch.append(native)
            size += length
        return receiving.make_untracked(Message, batch)

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (or message id): queued here, sent with others (as the
        official client groups acknowledgements for acknowledgmentGroupTime)."""
        if self._closed:
            raise AlreadyClosed("Pulsar error: AlreadyClosed")
        if type(message) is Message:
            self._handover.put(message._message)
        else:
            self._handover.put((self._consumer.acknowledge, self._ack_target(message)))

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message up to and including this one (not on Shared or Key_Shared)."""
        if self._type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise CumulativeAcknowledgementNotAllowedError(
                official.error_text(Result.CumulativeAcknowledgementNotAllowedError))
        if self._closed:
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        self._handover.put((self._consumer.acknowledge_cumulative, self._ack_target(message)))

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have this message redelivered after negative_ack_redelivery_delay_ms. On a closed
        consumer, nothing (as the official client: the broker redelivers what was not acknowledged)."""
        target = _native_target(message)
        if self._closed:
            return
        self._handover.put((self._consumer.negative_acknowledge, target))

    def pause_message_listener(self) -> None:
        self._set_listening(False)

    def resume_message_listener(self) -> None:
        self._set_listening(True)

    def redeliver_unacknowledged_messages(self) -> None:
        """Have every message delivered and not acknowledged delivered again; on a closed consumer,
        nothing (as the official client)."""
        if self._closed:
            return
        self._held = None  # the broker delivers it again
        self._call(self._consumer.redeliver_unacknowledged_messages)

    def seek(self, messageid: MessageId | int) -> None:
        """Move the subscription to a message id or a publish time (ms)."""
        self._held = None
        self._run(self._consumer.seek(official.seek_target(messageid)))

    def get_last_message_id(self) -> MessageId:
        return MessageId.wrap(self._run(self._consumer.get_last_message_id()))

    def is_connected(self) -> bool:
        if self._closed:
            return False
        return self._loop.call(self._consumer.is_connected)

    def unsubscribe(self) -> None:
        if self._closed:
            raise AlreadyClosed(official.error_text(Result.AlreadyClosed))
        self._stop_listening()
        self._closed = True
        self._run(self._consumer.unsubscribe(), closed_check=False)

    def close(self) -> None:
        """Close the consumer; no error when it is closed already (unsubscribed, its client
        closed), as the official client's consumers close quietly then."""
        if self._closed:
            return
        self._stop_listening()
        self._closed = True
        self._run(self._consumer.close(), closed_check=False)


def _native_target(message: Message | MessageId | messages.MessageId) -> messages.Message | messages.MessageId:
    if isinstance(message, Message):
        return message.native
    return official.native_id(message)


class Reader(_Listening):
    """Reads a topic from a message id, without a durable subscription."""

    def __init__(self, client: Client, reader: aio.Reader) -> None:
        self._client = client
        self._loop = client._loop
        self._reader = reader

    async def _receive_native(self) -> messages.Message:
        return await self._reader.read_next()

    def topic(self) -> str:
        return self._reader.topic()

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises Timeout when none comes within timeout_millis."""
        if timeout_millis is not None:
            official.check_type(int, timeout_millis, "timeout_millis")
        self._check_no_listener()
        return Message(self._run(self._reader.read_next(timeout_millis)))

    def has_message_available(self) -> bool:
        return self._run(self._reader.has_message_available())

    def seek(self, messageid: MessageId | int) -> None:
        self._run(self._reader.seek(official.seek_target(messageid)))

    def is_connected(self) -> bool:
        if self._closed:
            return False
        return self._loop.call(self._reader.is_connected)

    def close(self) -> None:
        """Close the reader; no error when it is closed already (its client closed), as the
        official client's readers close quietly then."""
        if self._closed:
            return
        self._stop_listening()
        self._closed = True
        self._run(self._reader.close(), closed_check=False)


class TableView(_Facade):
    """Blocking view over the asyncio client's table view (what it returns awaitable is awaited)."""

    def __init__(self, client: Client, view: Any, topic: str, subscription_name: str | None,
                 schema: Any = None) -> None:
        self._client = client
        self._loop = client._loop
        self._view = view
        self._topic = topic
        self._subscription = subscription_name
        self._schema = schema

    def _removed_value(self) -> Any:
        """What a listener gets for a removed key: the official client decodes the empty value
        (b'' without a schema, '' with a StringSchema)."""
        if self._schema is None:
            return b""
        try:
            return self._schema.decode(b"")
        except Exception:  # noqa: BLE001 - a schema with no empty value: the raw empty value
            return b""

    def _official_values(self, callback: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
        def call(key: str, value: Any) -> None:
            callback(key, self._removed_value() if value is None else value)
        return call

    def _stop_listening(self) -> None:
        pass

    def _blocking(self, method: str, *args: Any) -> Any:
        result = self._call(getattr(self._view, method), *args)
        # the view's async methods give coroutines (what the loop thread runs)
        return self._run(cast(Coroutine[Any, Any, Any], result)) if inspect.isawaitable(result) else result

    def get(self, key: str) -> Any:
        return self._blocking("get", key)

    def for_each(self, callback: Callable) -> None:
        self._blocking("for_each", callback)

    def for_each_and_listen(self, callback: Callable) -> None:
        self._blocking("for_each_and_listen", self._official_values(callback))

    def close(self) -> None:
        self._blocking("close")
        self._closed = True  # after: closing goes through the same checked call

    def __len__(self) -> int:
        return self._blocking("__len__")

    def __str__(self) -> str:
        if self._subscription is None:
            return f"TableView(topic={self._topic})"
        return f"TableView(topic={self._topic}, subscription={self._subscription})"

    __repr__ = __str__


def __getattr__(name: str) -> Any:
    if name == "asyncio":  # `pulsar.asyncio`, as after `import pulsar.asyncio`
        from . import asyncio as official_asyncio
        return official_asyncio
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the official module's names: its classes and enums, and `schema`
__all__ = sorted([name for name, value in globals().items() if name[:1].isupper() and isinstance(value, type)
                  and name not in ("LoopThread", "Any", "Callable")] + ["schema"])
