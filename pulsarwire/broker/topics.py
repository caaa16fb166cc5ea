"""The broker's domain: topics, subscriptions, cursors in use and dispatch.

This layer knows no wire protocol. A subscription delivers to `ConsumerLink`s
and a topic tracks `ProducerLink`s; each front end (Pulsar binary, V1 text)
implements those two small interfaces. Entries are kept as producers framed
them (`[u32 metadata size][MessageMetadata][payload]`), so the domain can read
their metadata but never re-encodes them.
"""
from __future__ import annotations

import abc
import asyncio
import heapq
import logging
import os
import time
from typing import Callable

from .. import codec
from .._proto import PulsarApi_pb2 as pb
from ..errors import PulsarWireError
from ..messages import ack_set_words
from ..routing import murmur3_32
from .storage import Cursor, TopicLog, read_json, write_json

log = logging.getLogger("pulsarwire.broker")

LEDGER_ID = 0
COUNT_MAX_UNCOMPRESSED = 8 * 1024 * 1024  # a compressed batch larger than this is not counted (CPU bound)
EARLIEST = -1  # a start position before every entry
LATEST = 1 << 63  # a start position after every entry
_SubType = pb.CommandSubscribe


def start_entry(entry_id: int, topic_log: TopicLog) -> int:
    """Where a start position leaves a reader: EARLIEST, LATEST, or that entry (clamped to the log)."""
    if entry_id == EARLIEST:
        return topic_log.first_entry_id
    if entry_id >= LATEST:
        return topic_log.next_entry_id
    return min(max(entry_id, topic_log.first_entry_id), topic_log.next_entry_id)


class ConsumerLink(abc.ABC):
    """A consumer as the domain sees it: permits, what it holds, and how to reach it.

    A front end subclasses this for its own connections."""

    def __init__(self, subscription: "Subscription", name: str, priority: int) -> None:
        self.subscription = subscription
        self.name = name
        self.priority = priority
        self.permits = 0
        self.pending: set[int] = set()  # entries dispatched to it and not yet acknowledged
        self.told_end = False

    @property
    @abc.abstractmethod
    def writable(self) -> bool:
        """False while the consumer's connection has too much unsent output."""

    @abc.abstractmethod
    def deliver(self, entry, redelivery_count: int, ack_set: list[int] | None) -> None:
        """Send one stored entry (`ack_set`: the batch indexes still unacknowledged, as words)."""

    def active_changed(self, active: bool) -> None:
        """A Failover subscription made this consumer (in)active."""

    @abc.abstractmethod
    def reached_end_of_topic(self) -> None:
        """The topic is terminated and this consumer has everything."""

    @abc.abstractmethod
    def evict(self) -> None:
        """Close it from the broker's side (seek, unload); the client re-attaches."""


class ProducerLink(abc.ABC):
    """A producer attached to a topic, as the domain sees it."""

    closed: bool

    @abc.abstractmethod
    def evict(self) -> None:
        """Close it from the broker's side (unload); the client re-attaches."""


class Subscription:
    def __init__(self, topic: "Topic", name: str, sub_type: int, durable: bool, cursor: Cursor) -> None:
        self.topic = topic
        self.name = name
        self.type = sub_type
        self.durable = durable
        self.cursor = cursor
        self.consumers: list[ConsumerLink] = []
        self.read_position = cursor.mark_delete + 1
        self._redeliver: list[int] = []  # heap of entries to send again
        self._delayed: list[tuple[int, int]] = []  # heap of (deliver_at ms, entry) held back
        self._redeliver_set: set[int] = set()
        self.owner: dict[int, ConsumerLink] = {}  # dispatched entry -> consumer
        self.redelivery_counts: dict[int, int] = {}
        self._round_robin = 0
        self._dispatching = False
        self.dirty = False
        self.active: ConsumerLink | None = None

    # consumers

    def add_consumer(self, consumer: ConsumerLink) -> None:
        self.consumers.append(consumer)
        self._update_active()

    def detach(self, consumer: ConsumerLink) -> None:
        """The consumer is gone: what it held goes to the others. A non-durable subscription
        lives only while it has consumers."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        self._requeue(list(consumer.pending), consumer)
        self._update_active()
        self.dispatch()
        if not self.durable and not self.consumers:
            self.topic.subscriptions.pop(self.name, None)

    def _update_active(self) -> None:
        if self.type not in (_SubType.Failover, _SubType.Exclusive):
            return
        ordered = sorted(self.consumers, key=lambda c: (c.priority, c.name))
        if not ordered:
            self.active = None
            return
        index = max(self.topic.partition, 0) % len(ordered) if self.type == _SubType.Failover else 0
        active = ordered[index]
        if active is not self.active:
            previous = self.active
            self.active = active
            if previous is not None and previous in self.consumers:
                self._requeue(list(previous.pending), previous)
            if self.type == _SubType.Failover:
                for consumer in self.consumers:
                    consumer.active_changed(consumer is active)

    # acknowledgement

    def ack(self, entry_id: int, unacked_indexes: int | None, cumulative: bool) -> bool:
        """Acknowledge an entry (or, with `unacked_indexes`, all of its batch but those bits).

        Returns False, changing nothing, for an entry the topic does not have yet: a cursor moved
        past the end would silently skip every message published later."""
        if not 0 <= entry_id < self.topic.log.next_entry_id:
            return False
        cursor = self.cursor
        if cumulative:
            if unacked_indexes is not None:
                cursor.ack_cumulative(entry_id - 1)
                cursor.ack_partial(entry_id, unacked_indexes)
            else:
                cursor.ack_cumulative(entry_id)
            for done in [e for e in self.owner if cursor.is_acked(e)]:
                self._settle(done)
        elif unacked_indexes is not None:
            cursor.ack_partial(entry_id, unacked_indexes)
            if cursor.is_acked(entry_id):
                self._settle(entry_id)
        else:
            cursor.ack(entry_id)
            self._settle(entry_id)
        self.dirty = True
        return True

    def _settle(self, entry_id: int) -> None:
        consumer = self.owner.pop(entry_id, None)
        if consumer is not None:
            consumer.pending.discard(entry_id)
        self.redelivery_counts.pop(entry_id, None)

    def redeliver(self, consumer: ConsumerLink, entry_ids: list[int] | None) -> None:
        """Send again what `consumer` holds (all of it when `entry_ids` is None)."""
        entries = entry_ids if entry_ids else list(consumer.pending)
        self._requeue([e for e in entries if self.owner.get(e) is consumer], consumer)
        self.dispatch()

    def _requeue(self, entries, consumer: ConsumerLink) -> None:
        for entry_id in entries:
            if self.owner.get(entry_id) is consumer:
                del self.owner[entry_id]
            consumer.pending.discard(entry_id)
            if entry_id not in self._redeliver_set and not self.cursor.is_acked(entry_id):
                self._redeliver_set.add(entry_id)
                heapq.heappush(self._redeliver, entry_id)
                self.redelivery_counts[entry_id] = self.redelivery_counts.get(entry_id, 0) + 1

    def seek(self, entry_id: int) -> None:
        self.cursor.reset(entry_id)
        self.read_position = entry_id
        self._redeliver.clear()
        self._redeliver_set.clear()
        self._delayed.clear()
        self.owner.clear()
        self.redelivery_counts.clear()
        for consumer in self.consumers:
            consumer.pending.clear()
            consumer.permits = 0
        self.dirty = True

    def check_end_of_topic(self) -> None:
        """Tell each consumer once when the topic is terminated and it has been sent everything."""
        if not self.topic.terminated or self.read_position < self.topic.log.next_entry_id or \
                self._redeliver:
            return
        for consumer in self.consumers:
            if not consumer.told_end:
                consumer.told_end = True
                consumer.reached_end_of_topic()

    def backlog(self) -> int:
        return sum(1 for e in range(self.cursor.mark_delete + 1, self.topic.log.next_entry_id)
                   if not self.cursor.is_acked(e))

    # dispatch

    def _held(self, entry_id: int) -> bool:
        """Shared subscriptions hold a delayed message until its time (exclusive ones do not, as in Pulsar)."""
        due = self.topic.deliver_at.get(entry_id)
        if due is None or self.type not in (_SubType.Shared, _SubType.Key_Shared):
            return False
        now_ms = time.time() * 1000
        if due <= now_ms:
            del self.topic.deliver_at[entry_id]  # its time has come for every subscription
            return False
        if entry_id not in self._redeliver_set:
            self._redeliver_set.add(entry_id)
            heapq.heappush(self._delayed, (due, entry_id))
            asyncio.get_running_loop().call_later((due - now_ms) / 1000 + 0.001, self._release_delayed)
        return True

    def _release_delayed(self) -> None:
        now_ms = time.time() * 1000
        while self._delayed and self._delayed[0][0] <= now_ms:
            _, entry_id = heapq.heappop(self._delayed)
            heapq.heappush(self._redeliver, entry_id)  # still marked in _redeliver_set
        self.dispatch()

    def _next_entry(self) -> tuple[int, bool] | None:
        while self._redeliver:
            entry_id = self._redeliver[0]
            if self.cursor.is_acked(entry_id) or entry_id in self.owner:
                heapq.heappop(self._redeliver)
                self._redeliver_set.discard(entry_id)
                continue
            return entry_id, True
        while self.read_position < self.topic.log.next_entry_id:
            position = self.read_position
            if self.cursor.is_acked(position) or position in self.owner or self._held(position):
                self.read_position += 1
                continue
            return position, False
        return None

    def _pick(self, entry) -> ConsumerLink | None:
        if self.type in (_SubType.Exclusive, _SubType.Failover):
            active = self.active
            return active if active is not None and active.permits > 0 and active.writable else None
        candidates = self.consumers
        if not candidates:
            return None
        if self.type == _SubType.Key_Shared:
            key = _entry_key(entry)
            slot = (murmur3_32(key) if key else entry.entry_id) % 65536
            consumer = candidates[slot * len(candidates) // 65536]
            return consumer if consumer.permits > 0 and consumer.writable else None
        for step in range(len(candidates)):
            consumer = candidates[(self._round_robin + step) % len(candidates)]
            if consumer.permits > 0 and consumer.writable:
                self._round_robin = (self._round_robin + step + 1) % len(candidates)
                return consumer
        return None

    def dispatch(self) -> None:
        if self._dispatching or not self.consumers:
            return
        self._dispatching = True
        try:
            topic_log = self.topic.log
            while True:
                found = self._next_entry()
                if found is None:
                    return
                entry_id, redelivery = found
                entry = topic_log.read(entry_id)
                consumer = self._pick(entry)
                if consumer is None:
                    return
                if redelivery:
                    heapq.heappop(self._redeliver)
                    self._redeliver_set.discard(entry_id)
                else:
                    self.read_position = entry_id + 1
                partial = self.cursor.partial.get(entry_id)
                consumer.deliver(entry, self.redelivery_counts.get(entry_id, 0),
                              ack_set_words(partial, entry.num_messages) if partial else None)
                consumer.permits -= entry.num_messages
                consumer.pending.add(entry_id)
                self.owner[entry_id] = consumer
        finally:
            self._dispatching = False


def _entry_key(entry) -> bytes | None:
    metadata = entry_metadata(entry)
    if metadata.HasField("ordering_key"):
        return metadata.ordering_key
    if metadata.HasField("partition_key"):
        return metadata.partition_key.encode()
    return None


def entry_message_count(body, claimed: int, batch: tuple[int | None, int] | None = None) -> int:
    """How many messages an entry holds, which consumers' permits are charged: 1 unless it is a
    batch, else the messages its payload really splits into. A producer's claim above 1 is never
    trusted (10**9 would stall every consumer); a batch that does not split, or is too big to
    decompress cheaply, counts as 1. `batch` is (num_messages_in_batch or None, compression) from
    the metadata when the caller has read them, which spares parsing it again."""
    if claimed <= 1:
        return 1
    try:
        end = 4 + int.from_bytes(body[:4], "big")
        if batch is not None and not batch[1]:
            return 1 if batch[0] is None else codec.count_batch(body[end:], batch[0]) or 1
        metadata = _parse_metadata(body[4:end])
        if not metadata.HasField("num_messages_in_batch"):
            return 1
        payload = body[end:]
        if metadata.compression:
            payload = codec.decompress_payload(metadata, payload, COUNT_MAX_UNCOMPRESSED)
        return codec.count_batch(payload, metadata.num_messages_in_batch) or 1
    except (PulsarWireError, ValueError):  # DecodeError is a ValueError
        return 1


_parse_metadata = pb.MessageMetadata.FromString


def entry_metadata(entry) -> pb.MessageMetadata:
    size = int.from_bytes(entry.body[:4], "big")
    return pb.MessageMetadata.FromString(entry.body[4:4 + size])



class Topic:
    """One topic-partition: its log, producers, subscriptions and dedup state.

    `on_append(log)` is called after each append so that the owner can group-commit
    every log written in one event-loop turn before any receipt leaves the broker."""

    def __init__(self, name: str, directory: str, *, segment_bytes: int, sync_policy: str,
                 on_append: Callable[[TopicLog], None]) -> None:
        self.name = name
        self.partition = _partition_index(name)
        self.directory = directory
        self.log = TopicLog(self.directory, segment_bytes=segment_bytes, sync_policy=sync_policy)
        self._on_append = on_append
        self.producers: dict[str, ProducerLink] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.deliver_at: dict[int, int] = {}  # entry -> epoch ms before which Shared subs hold it
        state = read_json(os.path.join(self.directory, "state.json"), {})
        self.terminated = state.get("terminated", False)
        self.last_sequence: dict[str, int] = state.get("dedup", {})
        self._recover_dedup(state.get("dedup_upto", -1))
        for sub_name, data in read_json(os.path.join(self.directory, "cursors.json"), {}).items():
            self.subscriptions[sub_name] = Subscription(self, sub_name, data.get("type", 0), True,
                                                        Cursor.from_json(data))
        self._state_dirty = False

    def _recover_dedup(self, upto: int) -> None:
        """Producers' last sequence ids, from the snapshot plus the entries after it."""
        for entry_id in range(max(upto + 1, self.log.first_entry_id), self.log.next_entry_id):
            try:
                md = entry_metadata(self.log.read(entry_id))
            except Exception:  # noqa: BLE001 - an unreadable entry carries no dedup state
                continue
            if md.HasField("deliver_at_time") and md.deliver_at_time > time.time() * 1000:
                self.deliver_at[entry_id] = md.deliver_at_time
            highest = md.highest_sequence_id if md.HasField("highest_sequence_id") else md.sequence_id
            if highest > self.last_sequence.get(md.producer_name, -1):
                self.last_sequence[md.producer_name] = highest

    def append(self, body, checksum: int | None, publish_time: int, deliver_at_time: int | None,
               num_messages: int, producer_name: str, highest_sequence_id: int,
               batch: tuple[int | None, int] | None = None) -> int:
        """Store an entry, remember the producer's sequence id, and dispatch it. Consumers are charged
        what it really holds (`entry_message_count`), whatever `num_messages` claims."""
        entry_id = self.log.append(body, checksum, publish_time, entry_message_count(body, num_messages, batch))
        self._on_append(self.log)
        if deliver_at_time is not None and deliver_at_time > time.time() * 1000:
            self.deliver_at[entry_id] = deliver_at_time
        self.last_sequence[producer_name] = highest_sequence_id
        self._state_dirty = True
        for subscription in self.subscriptions.values():
            subscription.dispatch()
        return entry_id

    def subscription(self, name: str, sub_type: int, durable: bool, initial_earliest: bool,
                     start: int | None) -> Subscription:
        """The subscription `name`, created at its initial position (or `start`, for a
        non-durable one: EARLIEST, LATEST or an entry id) if it does not exist."""
        existing = self.subscriptions.get(name)
        if existing is not None:
            return existing
        if durable:
            mark = self.log.first_entry_id - 1 if initial_earliest else self.log.next_entry_id - 1
        else:
            position = start_entry(start, self.log) if start is not None else \
                (self.log.first_entry_id if initial_earliest else self.log.next_entry_id)
            mark = position - 1
        subscription = Subscription(self, name, sub_type, durable, Cursor(mark))
        self.subscriptions[name] = subscription
        subscription.dirty = durable
        return subscription

    def drop_subscription(self, name: str) -> None:
        self.subscriptions.pop(name, None)
        self._state_dirty = True
        self.save()

    def last_position(self) -> tuple[int, int]:
        """(entry id, batch index) of the last message; (-1, -1) when the topic is empty."""
        last = self.log.last_entry_id
        batch_index = -1
        if last >= self.log.first_entry_id:
            md = entry_metadata(self.log.read(last))
            if md.HasField("num_messages_in_batch"):
                batch_index = md.num_messages_in_batch - 1
        return last, batch_index

    def save(self) -> None:
        """Persist cursors and dedup state when they changed."""
        if any(s.dirty for s in self.subscriptions.values()) or self._state_dirty:
            cursors = {}
            for name, s in self.subscriptions.items():
                if s.durable:
                    cursors[name] = dict(s.cursor.to_json(), type=s.type)
                s.dirty = False
            write_json(os.path.join(self.directory, "cursors.json"), cursors)
        if self._state_dirty:
            write_json(os.path.join(self.directory, "state.json"),
                       {"terminated": self.terminated, "dedup": self.last_sequence,
                        "dedup_upto": self.log.last_entry_id})
            self._state_dirty = False

    def terminate(self) -> int:
        """No more appends; consumers that have everything are told so. Returns the last entry id."""
        self.terminated = True
        self._state_dirty = True
        self.save()
        for subscription in self.subscriptions.values():
            subscription.check_end_of_topic()
        return self.log.last_entry_id

    def evict_all(self) -> int:
        """Close every producer and consumer attached here (unload); returns how many."""
        closed = 0
        for producer in list(self.producers.values()):
            producer.evict()
            closed += 1
        self.producers.clear()
        for subscription in list(self.subscriptions.values()):
            for consumer in list(subscription.consumers):
                consumer.evict()
                closed += 1
        return closed

    def close(self) -> None:
        self.save()
        self.log.close()


def _partition_index(name: str) -> int:
    marker = "-partition-"
    if marker in name:
        tail = name.rsplit(marker, 1)[1]
        if tail.isdigit():
            return int(tail)
    return -1
