"""Consumers: the per-partition consumer (flow control, batch and chunk
reassembly, grouped acks, negative acks, ack timeout, seek) and the user-facing
`Consumer` over all partitions of its topics, with the receiver queue they share."""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any, Callable

from .. import codec, timers
from .._proto import PulsarApi_pb2 as pb
from ..errors import (
    AlreadyClosedError, CodecError, ConnectionClosedError, CumulativeAcknowledgementNotAllowedError,
    PulsarWireError, TimeoutError, TopicTerminatedError,
)
from ..messages import Delivery, Message, MessageId, ack_set_bits, ack_set_words, entry_id_data, signed64
from ..schema import Schema, as_schema
from . import receiving
from .connection import ClientContext, Connection
from .dead_letter import DeadLetterRouter, EntryKey, backoff_delay_ms
from .options import (
    ConsumerType, InitialPosition, KeySharedPolicy, RegexSubscriptionMode, TopicsPattern, topic_name,
)
from .reconnect import Reconnecting

log = logging.getLogger("pulsarwire")


class AckUnit(Delivery):
    """Acknowledgement state of one delivered entry (a batch, a message, or a chunked message),
    and the Delivery its messages share."""

    __slots__ = ("owner", "batch_size", "remaining", "delivered_at", "chunk_entries")

    def __init__(self, owner: PartitionConsumer, ledger_id: int, entry_id: int, batch_size: int, remaining: int,
                 chunk_entries: list[tuple[int, int]] | None = None, metadata: Any = None,
                 redelivery_count: int = 0) -> None:
        self.owner = owner
        self.metadata = metadata
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.partition = owner.partition
        self.topic = owner.topic
        self.redelivery_count = redelivery_count
        self.schema = owner.parent._schema
        self.batch_size = batch_size
        self.remaining = remaining  # bitmask of batch indexes not yet acknowledged
        self.delivered_at = time.monotonic()
        self.chunk_entries = chunk_entries

    def ids(self) -> list[pb.MessageIdData]:
        entries = self.chunk_entries or [(self.ledger_id, self.entry_id)]
        return [entry_id_data(ledger, entry) for ledger, entry in entries]


class MessageQueue:
    """The consumer's receiver queue, shared by all of its partitions.

    Filled on the event loop. Other threads (the blocking surface's callers) may take from it
    directly with `take()` (lock-free), waiting on `ready` (a threading.Condition, notified once
    per delivered entry while `threads_waiting`: `notify_threads`); `take_many` and
    `remove_from` hold `lock` against each other."""

    def __init__(self) -> None:
        self._items: collections.deque[Message] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.lock = threading.Lock()
        self.ready_lock = threading.Lock()  # `with ready_lock`, not `with ready` (see sync.Producer._gate_lock)
        self.ready = threading.Condition(self.ready_lock)
        self.threads_waiting = 0
        self.arrival_hook: Callable[[], None] | None = None  # called on the loop once per delivered entry
        # while a caller reads the connection's socket itself for its next message
        # (LoopThread.read_while_waiting): the eventfd that wakes it, and its thread
        self.wake_fd = -1
        self.wake_thread = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: Message) -> None:
        self._items.append(message)
        if self._waiters:
            self._wake()

    def put_many(self, messages: list[Message]) -> None:
        self._items.extend(messages)
        if self._waiters:  # one waiter woken per message, as put() does
            for _ in range(len(messages)):
                if not self._waiters:
                    break
                self._wake()

    def clear(self) -> None:
        """Drop every queued message (a closed consumer's)."""
        with self.lock:  # against take_many; a take() pops atomically
            self._items.clear()

    def take(self) -> Message | None:
        """pop() for a thread other than the loop's, without a lock (a popleft is atomic; see
        remove_from): a lock here cost a quarter of receive()'s time."""
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def take_many(self, count: int, max_bytes: int = 0, size: int = 0,
                  have: bool = False) -> tuple[list[Message], int, bool]:
        """Up to `count` messages in order, for a thread other than the loop's, and the payload
        bytes then held (`size` before). With max_bytes > 0 it stops before the message that
        would go past it (which stays queued), unless none is held yet (`have` false, none
        taken); the third value says whether it stopped there."""
        with self.lock:
            return receiving.take_messages(self._items, count, max_bytes, size, have)

    def notify_threads(self) -> None:
        if self.threads_waiting:
            with self.ready:
                self.ready.notify_all()
        timers.wake_reader(self)
        hook = self.arrival_hook
        if hook is not None:
            hook()

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
        self.notify_threads()

    def pop(self) -> Message | None:
        try:  # not `if self._items`: another thread may take() the last one in between
            return self._items.popleft()
        except IndexError:
            return None

    def waiter(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future set when a message arrives; registered now, so no arrival is missed."""
        waiter = loop.create_future()
        self._waiters.append(waiter)
        return waiter

    def remove_from(self, owner: PartitionConsumer) -> int:
        """Drop `owner`'s queued messages (on the loop's thread). take() pops without a lock, so
        they are moved out one popleft at a time: each message is either taken by a caller or
        moved here, never both nor neither."""
        with self.lock:  # against take_many
            old = self._items
            self._items = collections.deque()
            kept: list[Message] = []
            removed = 0
            while True:
                try:
                    message = old.popleft()
                except IndexError:
                    break
                if message._ack_unit.owner is owner:
                    removed += 1
                else:
                    kept.append(message)
            self._items.extendleft(reversed(kept))  # only this thread adds: it is still empty
        if kept and self.threads_waiting:  # a caller may have found it empty meanwhile
            with self.ready:
                self.ready.notify_all()
        return removed


class PartitionConsumer(Reconnecting):
    """Consumer on one (partition) topic."""

    def __init__(self, parent: "Consumer", topic: str, partition: int) -> None:
        self.parent = parent
        self.context = parent.context
        self.topic = topic
        self.partition = partition
        self.consumer_id = next(self.context.ids)
        self.conn: Connection | None = None
        self.is_active = True
        self.end_of_topic = False
        self._permits_used = 0
        self._unacked: dict[tuple[int, int], AckUnit] = {}
        self._pending_acks: list[pb.MessageIdData] = []
        self._pending_cumulative: pb.MessageIdData | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._nacks: dict[tuple[int, int], float] = {}
        self._nack_timer: asyncio.TimerHandle | None = None
        self._nack_timer_at = 0.0
        # uuid -> (first chunk's arrival, [(ledger, entry, payload), ...]), oldest first
        self._chunks: collections.OrderedDict[str, tuple[float, list[tuple[int, int, bytes]]]] = \
            collections.OrderedDict()
        self._chunk_timer: asyncio.TimerHandle | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self._last_message: Message | None = None  # the last one handed to the application
        self._start_message_id = parent._start_message_id
        self._start_inclusive = parent._start_inclusive

    async def start(self) -> None:
        await self._connect()
        if not self.parent._durable and self._start_inclusive and self._start_message_id == MessageId.latest:
            # a reader from latest, inclusive, reads the topic's last message too (as the
            # official client: it seeks to the last message id once subscribed)
            last = await self.get_last_message_id()
            if last.entry_id >= 0:
                await self.seek(last, None)

    async def _connect(self) -> None:
        parent = self.parent
        conn = await self.context.pool.lookup(self.topic)
        if not parent._durable and self._last_message is not None:
            # resume after what the application already has
            self._start_message_id, self._start_inclusive = self._last_message.message_id(), False
        await conn.subscribe(
            self, self.topic, parent._subscription, parent._type, durable=parent._durable,
            initial_position=parent._initial_position,
            start=None if self._start_message_id is None else self._start_message_id.start(self._start_inclusive),
            read_compacted=parent._read_compacted, consumer_name=parent._consumer_name,
            key_shared=parent._key_shared_policy if parent._type == ConsumerType.KeyShared else None,
            properties=parent._properties, replicate_state=parent._replicate_subscription_state,
            schema=parent._wire_schema)
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

    # incoming (ConsumerHandler: called by the connection)

    def on_message(self, command: pb.CommandMessage, frame: codec.Frame) -> None:
        md = frame.metadata
        assert md is not None  # the session delivers only Message frames that carry a payload
        mid = command.message_id
        ledger, entry = signed64(mid.ledgerId), signed64(mid.entryId)
        if md.HasField("num_chunks_from_msg") and md.num_chunks_from_msg > 1:
            self._on_chunk(command, frame)
            return
        try:
            singles = frame.messages()
        except CodecError as exc:
            self.on_corrupt(mid, exc)
            return
        self._deliver(singles, md, ledger, entry, command, None)

    def _deliver(self, singles: list[codec.SingleMessage], md: pb.MessageMetadata, ledger: int, entry: int,
                 command: pb.CommandMessage, chunk_entries: list[tuple[int, int]] | None) -> None:
        parent = self.parent
        batch_size = singles[0].batch_size if singles else 0
        ack_set = command.ack_set
        skip = 0
        if ack_set:
            bits = ack_set_bits(ack_set)
        else:
            bits = (1 << max(batch_size, 1)) - 1
        redelivery = command.redelivery_count
        unit = AckUnit(self, ledger, entry, batch_size, bits, chunk_entries, md, redelivery)
        filtered = self._start_message_id is not None
        compacted = parent._read_compacted
        partition = self.partition
        dead_letter = parent._dead_letter
        remember = dead_letter.remember if dead_letter is not None and dead_letter.diverts and \
            redelivery >= dead_letter.max_redeliver_count else None
        if not (ack_set or filtered or compacted or remember is not None):
            # the common case, every message of the entry delivered: one pass, queued together
            parent._queue.put_many(receiving.make_untracked(Message, singles, unit))
            singles = []
        put = parent._queue.put
        for single in singles:
            index = single.batch_index
            if batch_size and not (bits >> index) & 1:
                skip += 1
                continue
            if (filtered and self._before_start(
                    MessageId(ledger, entry, partition, index, batch_size), batch_size)) or \
                    (compacted and single.compacted_out):
                skip += 1
                unit.remaining &= ~(1 << max(index, 0))
                continue
            message = Message(single, unit)
            put(message)
            if remember is not None:  # past the limit: the next redelivery goes to the dead letter topic
                remember(unit, message)
        parent._queue.notify_threads()
        if unit.remaining:
            self._unacked[(ledger, entry)] = unit
        elif parent._durable:
            self.ack_ids(unit.ids())  # all of it lies before the seek position: done with it
        if skip:
            self._message_consumed(skip)

    def _before_start(self, mid: MessageId, batch_size: int) -> bool:
        """What lies before the start position (a reader's start, or the last seek) is skipped, and
        the start itself too unless start_message_id_inclusive, as in the official client."""
        start = self._start_message_id
        if start is None or start.ledger_id < 0 or start == MessageId.latest:
            return False
        key, start_key = (mid.ledger_id, mid.entry_id), start.start(self._start_inclusive)
        if key != start_key:
            return key < start_key
        if start.batch_index < 0 or batch_size == 0:
            return not self._start_inclusive
        return mid.batch_index < start.batch_index or \
            (mid.batch_index == start.batch_index and not self._start_inclusive)

    def _on_chunk(self, command: pb.CommandMessage, frame: codec.Frame) -> None:
        md, chunk = frame.metadata, frame.payload
        assert md is not None and chunk is not None  # as on_message
        mid = command.message_id
        ledger, entry = signed64(mid.ledgerId), signed64(mid.entryId)
        key = md.uuid
        parent = self.parent
        pending = self._chunks.get(key)
        if md.chunk_id == 0:
            if pending is not None:  # the message again from its start (a redelivery)
                del self._chunks[key]
            # Bound what incomplete messages hold, as the official client: the oldest go first.
            limit = parent._max_pending_chunked
            while limit and len(self._chunks) >= limit:
                _, (_, dropped) = self._chunks.popitem(last=False)
                self._drop_chunks(dropped, parent._auto_ack_oldest_chunked, "too many incomplete chunked messages")
            pending = self._chunks[key] = (time.monotonic(), [])
            self._schedule_chunk_expiry()
        parts = pending[1] if pending is not None else []
        if md.chunk_id != len(parts):
            self._chunks.pop(key, None)
            self._drop_chunks(parts + [(ledger, entry, b"")], False,
                              f"chunk {md.chunk_id} of {key} arrived without the chunks before it")
            self._message_consumed(1)
            return
        parts.append((ledger, entry, bytes(chunk)))
        if len(parts) < md.num_chunks_from_msg:
            self._message_consumed(1)  # each chunk took a permit; only the last is delivered
            return
        del self._chunks[key]
        for chunk_ledger, chunk_entry, _ in parts:  # tracked when an earlier attempt was given up
            self._unacked.pop((chunk_ledger, chunk_entry), None)
        whole = b"".join(p for _, _, p in parts)
        md_whole = pb.MessageMetadata()
        md_whole.CopyFrom(md)
        md_whole.ClearField("num_chunks_from_msg")
        try:
            payload = codec.decompress_payload(md_whole, whole)
            singles = codec.split_messages(md_whole, payload)
        except CodecError as exc:
            self.on_corrupt(mid, exc)
            return
        last_ledger, last_entry = parts[-1][0], parts[-1][1]
        self._deliver(singles, md, last_ledger, last_entry, command, [(l, e) for l, e, _ in parts])

    def _drop_chunks(self, parts: list[tuple[int, int, bytes]], acknowledge: bool, why: str) -> None:
        """Give up an incomplete chunked message: acknowledge its chunks, or leave them
        unacknowledged (tracked, so the ack timeout or redeliver_unacknowledged_messages brings
        them back, as the official client does)."""
        log.warning("%s on %s: %s %d chunk(s)", why, self.topic,
                    "acknowledging" if acknowledge else "leaving unacknowledged", len(parts))
        self.parent.dropped_chunked_messages += 1
        for ledger, entry, _ in parts:
            if acknowledge:
                self._queue_ack(entry_id_data(ledger, entry))
            else:
                self._unacked[(ledger, entry)] = AckUnit(self, ledger, entry, 0, 1)

    def _schedule_chunk_expiry(self) -> None:
        expiry = self.parent._chunk_expiry
        if expiry and self._chunk_timer is None and self._chunks:
            oldest = next(iter(self._chunks.values()))[0]
            delay = max(0.0, oldest + expiry - time.monotonic())
            self._chunk_timer = self.context.loop.call_later(delay, self._expire_chunks)

    def _expire_chunks(self) -> None:
        """Incomplete chunked messages older than the expiry are acknowledged and dropped (the
        official client's expire_time_of_incomplete_chunked_message)."""
        self._chunk_timer = None
        deadline = time.monotonic() - self.parent._chunk_expiry
        while self._chunks:
            key, (started, parts) = next(iter(self._chunks.items()))
            if started > deadline:
                break
            del self._chunks[key]
            self._drop_chunks(parts, True, "incomplete chunked message expired")
        self._schedule_chunk_expiry()

    def on_corrupt(self, message_id: pb.MessageIdData, error: CodecError) -> None:
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

    def on_end_of_topic(self) -> None:
        self.end_of_topic = True
        self.parent._queue.wake_all()

    def _message_consumed(self, count: int) -> None:
        """Return permits: refill the broker's window once half of it is used."""
        self._permits_used += count
        if self._permits_used >= self.parent._refill_at and self.conn is not None:
            if self._pending_acks or self._pending_cumulative is not None:
                # acknowledgements go before the permits: a broker that dispatches from its
                # acknowledged position when permits arrive (pulsar-lite 0.2.0) would otherwise
                # send again what this consumer already has (65% duplicates in a 1 KiB backlog)
                self.flush_acks()
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
            self._queue_ack(entry_id_data(message_id.ledger_id, message_id.entry_id))
        else:
            self.ack_in(unit, message_id.batch_index)

    def ack_in(self, unit: AckUnit, batch_index: int) -> None:
        """Individual ack of message `batch_index` of a delivered entry (-1: not a batch)."""
        self.ack_run(unit, batch_index, batch_index)

    def ack_run(self, unit: AckUnit, first: int, last: int) -> None:
        """Individual acks of messages `first` to `last` of a delivered entry (-1, -1: not a
        batch): one step for a run of them, as acknowledged one after another."""
        if first >= 0 and unit.batch_size:
            unit.remaining &= ~(((1 << (last + 1)) - 1) ^ ((1 << first) - 1))
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
        data: pb.MessageIdData | None = entry_id_data(message_id.ledger_id, message_id.entry_id)
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
            self._ack_timer = self.context.loop.call_later(delay, self.flush_acks)

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

    def negative_ack(self, message_id: MessageId, delay: float | None = None) -> None:
        key = (message_id.ledger_id, message_id.entry_id)
        delay = self.parent._nack_delay if delay is None else delay
        deadline = time.monotonic() + delay
        self._nacks[key] = deadline
        if self._nack_timer is not None and deadline < self._nack_timer_at:
            self._nack_timer.cancel()  # a backoff gave this one an earlier time
            self._nack_timer = None
        if self._nack_timer is None:
            self._nack_timer_at = deadline
            self._nack_timer = self.context.loop.call_later(delay, self._redeliver_nacked)

    def _redeliver_nacked(self) -> None:
        self._nack_timer = None
        now = time.monotonic()
        due = [k for k, deadline in self._nacks.items() if deadline <= now]
        for key in due:
            del self._nacks[key]
        self.redeliver_keys(due)
        if self._nacks:
            self._nack_timer_at = min(self._nacks.values())
            self._nack_timer = self.context.loop.call_later(max(0.0, self._nack_timer_at - now),
                                                            self._redeliver_nacked)

    def is_unacked(self, ledger_id: int, entry_id: int) -> bool:
        return (ledger_id, entry_id) in self._unacked

    def redeliver_keys(self, keys: list[EntryKey]) -> None:
        """Redeliver the entries (ledger, entry) of `keys` (those past the dead letter limit go there)."""
        dead_letter = self.parent._dead_letter
        if keys and dead_letter is not None and dead_letter.diverts:
            keys = dead_letter.divert(self, keys)
        if not keys or self.conn is None:
            return
        self.flush_acks()  # the broker must know what was acknowledged before it redelivers
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
            self.redeliver_keys(expired)

    def redeliver_unacknowledged(self) -> None:
        if self.conn is None:
            return
        if self.parent._dead_letter is not None and self.parent._dead_letter.diverts and self._unacked:
            # by id, as the official client does with a dead letter policy: what has been
            # redelivered max_redeliver_count times goes to the dead letter topic instead
            removed = self.parent._queue.remove_from(self)
            self.redeliver_keys(list(self._unacked))
            if removed:
                self._message_consumed(removed)
            return
        self.flush_acks()  # what was just acknowledged must not come back
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
        # a chunked message's first chunk, where delivery resumes at it (inclusive)
        data = None if message_id is None else entry_id_data(*message_id.start(self.parent._start_inclusive))
        await conn.request(conn.session.seek, self.consumer_id, data, timestamp)
        self.parent._queue.remove_from(self)
        self._unacked.clear()
        self._last_message = None
        # Delivery resumes after the sought message (at it with start_message_id_inclusive).
        self._start_message_id, self._start_inclusive = message_id, self.parent._start_inclusive
        reconnecting = self._reconnecting
        if reconnecting is not None:
            # the broker closed this consumer to restart it from the seek position: the seek is
            # done once it is attached again (as in the official client), so that what follows
            # (has_message_available, get_last_message_id) does not find it unconnected
            await asyncio.shield(reconnecting)

    async def get_last_message_id(self) -> MessageId:
        conn = self.conn
        if conn is None:
            raise ConnectionClosedError("consumer is not connected")
        return await conn.last_message_id(self.consumer_id, self.topic)

    async def has_message_after_position(self) -> bool:
        """Whether the topic holds a message after what this consumer has handed out (or at or
        after its start position, before it has handed out any)."""
        last = await self.get_last_message_id()
        if last.entry_id < 0:
            return False
        seen = self._last_message.message_id() if self._last_message is not None else None
        if seen is None:
            start = self._start_message_id
            if start is None or start == MessageId.earliest:
                return True
            if start == MessageId.latest:
                return False
            return (last.ledger_id, last.entry_id) > (start.ledger_id, start.entry_id) or \
                (self.parent._start_inclusive and
                 (last.ledger_id, last.entry_id) >= (start.ledger_id, start.entry_id))
        if (last.ledger_id, last.entry_id) > (seen.ledger_id, seen.entry_id):
            return True
        return (last.ledger_id, last.entry_id) == (seen.ledger_id, seen.entry_id) and bool(seen.batch_size) and \
            seen.batch_index < seen.batch_size - 1

    async def close(self, unsubscribe: bool = False) -> None:
        self.flush_acks()
        self._closed = True
        for timer in (self._ack_timer, self._nack_timer, self._chunk_timer):
            if timer is not None:
                timer.cancel()
        self._chunks.clear()
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


async def open_consumer(context: ClientContext, topics: list[str], subscription_name: str,
                        **options: Any) -> Consumer:
    """A started consumer of `topics` (or of a pattern's, in `options`), among the client's open handles."""
    consumer = Consumer(context, topics, subscription_name, **options)
    await consumer._start()
    context.handles.add(consumer)
    return consumer


class Consumer:
    """Receives messages from one or more topics (and every partition of each)."""

    def __init__(self, context: ClientContext, topics: list[str], subscription_name: str, *,
                 consumer_type: ConsumerType = ConsumerType.Exclusive,
                 initial_position: InitialPosition = InitialPosition.Latest,
                 receiver_queue_size: int = 1000, consumer_name: str | None = None,
                 unacked_messages_timeout_ms: int | None = None,
                 negative_ack_redelivery_delay_ms: int = 60_000, ack_group_time_ms: int = 100,
                 batch_index_ack_enabled: bool = False, read_compacted: bool = False,
                 properties: dict[str, str] | None = None, max_pending_chunked_message: int = 10,
                 key_shared_policy: KeySharedPolicy | None = None,
                 pattern_auto_discovery_period: float = 60,
                 regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly,
                 _pattern: TopicsPattern | None = None,
                 auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                 expire_time_of_incomplete_chunked_message_ms: int = 60_000,
                 start_message_id_inclusive: bool = False,
                 schema: Schema | None = None, dead_letter_policy: Any = None, retry_enable: bool = False,
                 negative_ack_redelivery_backoff: Any = None,
                 replicate_subscription_state_enabled: bool = False,
                 _durable: bool = True, _start_message_id: MessageId | None = None,
                 _start_inclusive: bool = False) -> None:
        if receiver_queue_size < 1:
            raise ValueError("receiver_queue_size must be at least 1")
        if key_shared_policy is not None and not isinstance(key_shared_policy, KeySharedPolicy):
            raise TypeError("key_shared_policy must be a KeySharedPolicy")
        if pattern_auto_discovery_period <= 0:
            raise ValueError("pattern_auto_discovery_period must be positive (seconds)")
        self._key_shared_policy = key_shared_policy or KeySharedPolicy()
        self._pattern = _pattern
        self._discovery_period = float(pattern_auto_discovery_period)
        self._regex_mode = RegexSubscriptionMode(regex_subscription_mode)
        self._topics_hash: str | None = None
        self._discovery: asyncio.Task[None] | None = None
        self.context = context
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
        # asks a geo-replicated cluster to replicate the subscription's position (the embedded
        # broker has no other cluster and ignores it)
        self._replicate_subscription_state = bool(replicate_subscription_state_enabled)
        self._properties = properties or {}
        if max_pending_chunked_message < 0 or expire_time_of_incomplete_chunked_message_ms < 0:
            raise ValueError("max_pending_chunked_message and expire_time_of_incomplete_chunked_message_ms "
                             "must not be negative (0: no bound)")
        self._max_pending_chunked = max_pending_chunked_message  # 0: no bound
        self._auto_ack_oldest_chunked = auto_ack_oldest_chunked_message_on_queue_full
        self._chunk_expiry = expire_time_of_incomplete_chunked_message_ms / 1000  # 0: never
        self.dropped_chunked_messages = 0
        self._durable = _durable
        self._start_message_id = _start_message_id
        self._start_inclusive = start_message_id_inclusive or _start_inclusive
        self._schema = schema = as_schema(schema)
        self._wire_schema = schema.wire_schema() if schema is not None else None
        self._nack_backoff = negative_ack_redelivery_backoff
        retry_enable = retry_enable or getattr(dead_letter_policy, "retry_letter_topic", None) is not None
        if retry_enable and dead_letter_policy is None:
            raise ValueError("retry_enable needs a dead_letter_policy (its max_redeliver_count bounds retries)")
        self._dead_letter = DeadLetterRouter(
            dead_letter_policy, retry_enable, topic=self._topics[0], subscription=subscription_name,
            receiver_queue_size=receiver_queue_size, acknowledge=self.acknowledge,
            create_producer=context.create_producer,
            diverts=self._type in (ConsumerType.Shared, ConsumerType.KeyShared)) if dead_letter_policy is not None else None
        if self._dead_letter is not None and self._dead_letter.retry_letter_topic is not None:
            retry_topic = topic_name(self._dead_letter.retry_letter_topic)
            if retry_topic not in self._topics:
                self._topics = [*topics, retry_topic]  # the consumer also reads its retry letters
        self._queue = MessageQueue()
        self._partitions: list[PartitionConsumer] = []
        self._by_topic: dict[str, PartitionConsumer] = {}
        self._ack_timeout_task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.corrupt_messages = 0

    async def _start(self) -> None:
        if self._pattern is not None:
            self._topics = await self._matching_topics() or []
            for name in self._topics:  # the broker lists topic-partitions by their own names
                self._add_partition(name, _partition_index(name))
        else:
            for topic in self._topics:
                names = await self.context.pool.topic_partitions(topic)
                partitioned = len(names) > 1 or names[0] != topic
                for index, name in enumerate(names):
                    # one partition named on its own keeps its index in message ids, as Pulsar gives it
                    self._add_partition(name, index if partitioned else _partition_index(name))
        try:
            await asyncio.gather(*(p.start() for p in self._partitions))
        except BaseException:
            await asyncio.gather(*(p.close() for p in self._partitions if p.conn), return_exceptions=True)
            raise
        if self._ack_timeout:
            self._ack_timeout_task = asyncio.ensure_future(self._check_ack_timeouts())
        if self._pattern is not None:
            self._discovery = asyncio.ensure_future(self._discover_periodically())

    def _add_partition(self, name: str, index: int) -> PartitionConsumer:
        pc = PartitionConsumer(self, name, index)
        self._partitions.append(pc)
        self._by_topic[name] = pc
        return pc

    # pattern subscriptions

    async def _matching_topics(self) -> list[str] | None:
        """The topics of the pattern's namespace that match it; None when unchanged since the
        last answer (the broker compares the topic-list hash we send back)."""
        pattern = self._pattern
        assert pattern is not None
        response = await self.context.pool.topics_of_namespace(
            pattern.namespace, int(self._regex_mode), pattern.text, self._topics_hash)
        if response.HasField("topics_hash"):
            self._topics_hash = response.topics_hash
        if not response.changed:
            return None
        # filter here as well: a broker may leave the pattern to the client (filtered = false)
        return [topic for topic in response.topics if pattern.matches(topic)]

    async def _discover_periodically(self) -> None:
        """Every `pattern_auto_discovery_period` seconds: subscribe to new matching topics and
        drop those that went away."""
        while not self._closed:
            await asyncio.sleep(self._discovery_period)
            try:
                topics = await self._matching_topics()
                if topics is not None and not self._closed:
                    await self._update_topics(topics)
            except asyncio.CancelledError:
                raise
            except (PulsarWireError, OSError) as exc:
                log.info("pattern %s: topic discovery failed, trying again later: %s", self.topic(), exc)

    async def _update_topics(self, topics: list[str]) -> None:
        wanted = set(topics)
        gone = [p for p in self._partitions if p.topic not in wanted]
        added = [self._add_partition(name, _partition_index(name)) for name in topics if name not in self._by_topic]
        for pc in gone:
            self._remove_partition(pc)
        await asyncio.gather(*(pc.close() for pc in gone), return_exceptions=True)
        results = await asyncio.gather(*(pc.start() for pc in added), return_exceptions=True)
        for pc, result in zip(added, results):
            if isinstance(result, BaseException):  # tried again at the next discovery
                log.info("pattern %s: cannot subscribe to %s yet: %s", self.topic(), pc.topic, result)
                self._remove_partition(pc)
            elif self._closed:
                await pc.close()
        if added or gone:
            self._topics = sorted(self._by_topic)
            log.info("pattern %s: %d topics added, %d removed", self.topic(), len(added), len(gone))

    def _remove_partition(self, pc: PartitionConsumer) -> None:
        self._partitions.remove(pc)
        self._by_topic.pop(pc.topic, None)
        self._queue.remove_from(pc)

    def topic(self) -> str:
        if self._pattern is not None:
            return self._pattern.text
        return self._topics[0]

    def topics(self) -> list[str]:
        """The topic-partitions this consumer is subscribed to (for a pattern, as discovered so far)."""
        return [p.topic for p in self._partitions]

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        return self._consumer_name or ""

    @property
    def closed(self) -> bool:
        return self._closed

    async def has_message_available(self) -> bool:
        """Whether a message is queued, or the topic holds one after this consumer's position (a
        reader's question, one partition after another)."""
        if len(self._queue):
            return True
        for p in self._partitions:
            if await p.has_message_after_position():
                return True
        return False

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._queue.wake_all()

    def _ended(self) -> bool:
        return bool(self._partitions) and all(p.end_of_topic for p in self._partitions) and not len(self._queue)

    async def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; TimeoutError after timeout_millis, TopicTerminatedError at the end."""
        if self._closed:
            raise AlreadyClosedError("consumer is closed")
        message = self._queue.pop()
        if message is not None:  # the common case: something is already queued
            unit = message._ack_unit
            unit.owner._last_message = message
            unit.owner._message_consumed(1)
            return message
        loop = self.context.loop
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
                raise AlreadyClosedError("consumer is closed")
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

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except (TopicTerminatedError, ConnectionClosedError):
            raise StopAsyncIteration from None

    def _owner(self, message_id: MessageId) -> PartitionConsumer:
        if message_id.topic is not None and message_id.topic in self._by_topic:
            return self._by_topic[message_id.topic]
        if message_id.partition >= 0 and len(self._partitions) > message_id.partition:
            return self._partitions[message_id.partition]
        return self._partitions[0]

    @staticmethod
    def _id(message: Message | MessageId) -> MessageId:
        return message.message_id() if isinstance(message, Message) else message

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError("consumer is closed")

    def acknowledge(self, message: Message | MessageId) -> None:
        self._check_open()
        if isinstance(message, Message):
            unit = message._ack_unit
            unit.owner.ack_in(unit, message._single.batch_index)
            return
        self._owner(message).ack(message, cumulative=False)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        self._check_open()
        if self._type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise CumulativeAcknowledgementNotAllowedError(
                "cumulative acknowledgement is not allowed on Shared and Key_Shared subscriptions")
        mid = self._id(message)
        self._owner(mid).ack(mid, cumulative=True)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        self._check_open()
        mid = self._id(message)
        delay = None
        if self._nack_backoff is not None and isinstance(message, Message):
            delay = backoff_delay_ms(self._nack_backoff, message.redelivery_count()) / 1000
        self._owner(mid).negative_ack(mid, delay)

    async def reconsume_later(self, message: Message, delay_ms: int | float = 0,
                              properties: dict[str, str] | None = None) -> None:
        """Publish `message` to the retry letter topic, delivered again after `delay_ms` (a Shared
        subscription is needed for the delay), and acknowledge it; past `max_redeliver_count`
        reconsumes it goes to the dead letter topic."""
        if self._dead_letter is None:
            raise PulsarWireError("reconsume_later needs a dead_letter_policy and retry_enable=True")
        if hasattr(delay_ms, "total_seconds"):
            delay_ms = delay_ms.total_seconds() * 1000
        await self._dead_letter.reconsume_later(message, int(delay_ms), properties)

    def redeliver_unacknowledged_messages(self) -> None:
        self._check_open()
        for p in self._partitions:
            p.redeliver_unacknowledged()

    async def seek(self, target: MessageId | int) -> None:
        """Rewind or skip to a message id, or to a publish time in ms."""
        self._check_open()
        if isinstance(target, MessageId):
            owners = self._partitions if target in (MessageId.earliest, MessageId.latest) \
                else [self._owner(target)]
            await asyncio.gather(*(p.seek(target, None) for p in owners))
        else:
            await asyncio.gather(*(p.seek(None, int(target)) for p in self._partitions))

    async def get_last_message_id(self) -> MessageId:
        self._check_open()
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
                # at most a second late, as the official client's tracker (its tick: 1 s)
                await asyncio.sleep(max(0.05, min(1.0, self._ack_timeout / 4)))
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
        if self._discovery is not None:
            self._discovery.cancel()
        if self._dead_letter is not None:
            await self._dead_letter.close()
        results = await asyncio.gather(*(p.close(unsubscribe) for p in self._partitions),
                                       return_exceptions=True)
        # What refers back to received messages goes: the codec leaves them out of the garbage
        # collector's tracking (receiving.make_untracked), so a cycle through one is never freed.
        self._queue.clear()
        for p in self._partitions:
            p._last_message = None
        self._queue.wake_all()
        self.context.handles.discard(self)
        errors = [r for r in results if isinstance(r, BaseException)]
        if unsubscribe and errors:
            raise errors[0]


def _partition_index(name: str) -> int:
    """The partition index a topic-partition name ends with (-1 for a non-partitioned topic)."""
    head, marker, tail = name.rpartition("-partition-")
    return int(tail) if marker and head and tail.isdigit() else -1
