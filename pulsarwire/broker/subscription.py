"""A subscription: its cursor in use, the consumers attached and dispatch to them.

A subscription delivers to `ConsumerLink`s, which each front end implements for its own
connections; it knows the topic it belongs to only as `SubscribedTopic`."""
from __future__ import annotations

import abc
import asyncio
import bisect
import concurrent.futures
import heapq
import logging
import time
from operator import attrgetter
from typing import Any, Generic, Iterable, NamedTuple, Protocol, TypeVar, cast

from .._proto import PulsarApi_pb2 as pb
from ..messages import ack_set_words
from ..routing import murmur3_32
from .entries import entry_key
from .storage import CorruptEntryError, Cursor, Entry, StorageError, TopicLog
from .topic_files import Compaction

log = logging.getLogger("pulsarwire.broker")

# A seek closes the consumers so they re-subscribe at the new position; a non-durable
# subscription (a reader) is kept this long for them instead of ending with its last consumer.
SEEK_RETAIN_SECONDS = 30.0
# An Exclusive or Failover subscription tracks at most this many delivered, unacknowledged entries
# one by one (about 200 bytes each); past it, what the active consumer is sent is remembered as
# one range, sent again from its start when that consumer asks for redelivery or goes (entries
# of that range it asks for one by one are tracked again, up to twice this many).
MAX_TRACKED_ENTRIES = 100_000

_SubType = pb.CommandSubscribe
_SINGLE_ACTIVE = (_SubType.Exclusive, _SubType.Failover)


class ConsumerLink(abc.ABC):
    """A consumer as the domain sees it: permits, what it holds, and how to reach it.

    A front end subclasses this for its own connections."""

    def __init__(self, subscription: Subscription[Any], name: str, priority: int) -> None:
        self.subscription = subscription
        self.name = name
        self.priority = priority
        self.permits = 0
        self.pending: dict[int, int] = {}  # entry dispatched to it and not yet acknowledged -> its messages
        self.unacked_messages = 0  # the messages of those entries
        self.blocked = False  # at the topic's max_unacked_messages: nothing is dispatched to it
        self.told_end = False
        self.hash_ranges: list[tuple[int, int]] = []  # Key_Shared sticky: the key hashes it owns

    @property
    @abc.abstractmethod
    def writable(self) -> bool:
        """False while the consumer's connection has too much unsent output."""

    @abc.abstractmethod
    def deliver(self, entry: Entry, redelivery_count: int, ack_set: list[int] | None) -> None:
        """Send one stored entry (`ack_set`: the batch indexes still unacknowledged, as words)."""

    def active_changed(self, active: bool) -> None:
        """A Failover subscription made this consumer (in)active."""

    @abc.abstractmethod
    def reached_end_of_topic(self) -> None:
        """The topic is terminated and this consumer has everything."""

    @abc.abstractmethod
    def evict(self) -> None:
        """Close it from the broker's side (seek, unload); the client re-attaches."""


KEY_HASH_RANGE = 65536  # Key_Shared hashes keys (Murmur3) into 0..65535, as Pulsar
_UNASSIGNED = object()  # _pick: no sticky consumer owns this entry's key hash


def key_hash(entry: Entry) -> int:
    key = entry_key(entry)
    return (murmur3_32(key) if key else entry.entry_id) % KEY_HASH_RANGE


class OwnedRange(NamedTuple):
    """Sticky Key_Shared: key hashes `start` to `end` (inclusive) belong to `consumer`."""

    start: int
    end: int
    consumer: ConsumerLink


_range_start = attrgetter("start")


class SubscribedTopic(Protocol):
    """What a subscription reads and changes of its topic (a Topic)."""

    name: str
    partition: int
    log: TopicLog
    subscriptions: dict[str, Subscription[Any]]
    max_unacked_messages: int
    max_tracked_entries: int
    terminated: bool
    compacted: Compaction | None
    deliver_at: dict[int, int]



TopicT = TypeVar("TopicT", bound=SubscribedTopic)


class Subscription(Generic[TopicT]):
    """One subscription of a topic (`TopicT`: a Topic, known here only as a SubscribedTopic)."""

    def __init__(self, topic: TopicT, name: str, sub_type: int, durable: bool, cursor: Cursor) -> None:
        end = topic.log.committed_entry_id
        if cursor.mark_delete >= end or any(e >= end for e in cursor.acked):
            # recovery cut the log below this persisted cursor: entries appended from now on
            # must not count as acknowledged
            log.error("topic %s, subscription %s: the cursor is past the end of the log (%d); moved back "
                      "to it", topic.name, name, end - 1)
            cursor = Cursor(min(cursor.mark_delete, end - 1), [e for e in cursor.acked if e < end],
                            {e: b for e, b in cursor.partial.items() if e < end})
        self.topic = topic
        self.name = name
        self.type = sub_type
        self.durable = durable
        self.cursor = cursor
        self.reader = topic.log.reader()  # reads ahead in a backlog for this subscription alone
        self.consumers: list[ConsumerLink] = []
        self.read_position = cursor.mark_delete + 1
        self._redeliver: list[int] = []  # heap of entries to send again
        self._delayed: list[tuple[int, int]] = []  # heap of (deliver_at ms, entry) held back
        self._redeliver_set: set[int] = set()
        self.owner: dict[int, ConsumerLink] = {}  # dispatched entry -> consumer
        self.redelivery_counts: dict[int, int] = {}
        self._round_robin = 0
        self._dispatching = False
        self._retry_scheduled = False
        self._reading = False  # a disk read is in flight on the reader thread: dispatch() resumes when it lands
        self.dirty = False
        self.stored: concurrent.futures.Future | None = None  # the write of a new one, until it is on disk
        self.active: ConsumerLink | None = None
        self.retained_until = 0.0  # monotonic time; a seek keeps a non-durable subscription
        self.sticky = False  # Key_Shared: consumers own the hash ranges they asked for
        self._parked: list[int] = []  # sticky: entries whose key hash no consumer owns yet
        self._ranges: list[OwnedRange] = []  # sorted by start
        # Exclusive and Failover past topic.max_tracked_entries: entries from _untracked_from up to
        # read_position were sent to _untracked_consumer without being tracked one by one
        self._untracked_from: int | None = None
        self._untracked_consumer: ConsumerLink | None = None
        self.read_compacted = False  # skips what the topic's last compaction left out (see Topic.compacted)
        self.messages_out = self.bytes_out = 0  # dispatched, redeliveries included (admin stats, metrics)

    # consumers

    def key_shared_refusal(self, sticky: bool, ranges: list[tuple[int, int]]) -> str | None:
        """Why a Key_Shared consumer asking for this mode and these hash ranges cannot join
        (None when it can): sticky ranges must be valid and overlap no other consumer's."""
        if self.consumers and sticky != self.sticky:
            return f"subscription {self.name} uses the {'sticky' if self.sticky else 'auto-split'} key-shared mode"
        if not sticky:
            return None
        if not ranges:
            return "a sticky key-shared consumer needs hash ranges"
        for start, end in ranges:
            if not 0 <= start <= end < KEY_HASH_RANGE:
                return f"hash range [{start}, {end}] is not within 0..{KEY_HASH_RANGE - 1}"
        claimed = sorted([(s, e, c.name) for c in self.consumers for s, e in c.hash_ranges] +
                         [(s, e, "the new consumer") for s, e in ranges])
        for (start, end, owner), (next_start, next_end, next_owner) in zip(claimed, claimed[1:]):
            if next_start <= end:
                return f"hash range [{start}, {end}] of {owner} overlaps [{next_start}, {next_end}] of {next_owner}"
        return None

    def add_consumer(self, consumer: ConsumerLink, sticky: bool = False) -> None:
        if not self.consumers:
            self.sticky = sticky
        self.consumers.append(consumer)
        self.retained_until = 0.0
        self._update_active()
        self._index_ranges()
        if self._parked:  # a new owner of some key hashes: try the held entries again
            for entry_id in self._parked:
                if entry_id not in self._redeliver_set:
                    self._redeliver_set.add(entry_id)
                    heapq.heappush(self._redeliver, entry_id)
            self._parked.clear()

    def detach(self, consumer: ConsumerLink) -> None:
        """The consumer is gone: what it held goes to the others. A non-durable subscription
        lives only while it has consumers."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        self._index_ranges()
        self._requeue(list(consumer.pending), consumer)
        self._rewind_untracked(consumer)
        self._update_active()
        self.dispatch()
        if not self.durable and not self.consumers and time.monotonic() >= self.retained_until:
            self._drop_if_unused()

    def _index_ranges(self) -> None:
        """Sticky Key_Shared: the consumers' hash ranges sorted by start, for a bisect per entry."""
        self._ranges = sorted((OwnedRange(start, end, c) for c in self.consumers for start, end in c.hash_ranges),
                              key=_range_start) if self.sticky else []

    def _drop_if_unused(self) -> None:
        if not self.durable and not self.consumers and self.topic.subscriptions.get(self.name) is self:
            del self.topic.subscriptions[self.name]
            self.reader.close()

    def _update_active(self) -> None:
        if self.type not in _SINGLE_ACTIVE:
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
                self._rewind_untracked(previous)
            if self.type == _SubType.Failover:
                for consumer in self.consumers:
                    consumer.active_changed(consumer is active)

    # acknowledgement

    def ack(self, entry_id: int, unacked_indexes: int | None, cumulative: bool) -> bool:
        """Acknowledge an entry (or, with `unacked_indexes`, all of its batch but those bits).

        Returns False, changing nothing, for an entry the topic does not have yet: a cursor moved
        past the end would silently skip every message published later."""
        if not 0 <= entry_id < self.topic.log.committed_entry_id:
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
        if self._untracked_from is not None and cursor.mark_delete >= self._untracked_from:
            # what the range held is acknowledged up to there: a rewind need not read it again
            self._untracked_from = cursor.mark_delete + 1
            if self._untracked_from >= self.read_position:
                self._untracked_from = self._untracked_consumer = None
        self.dirty = True
        return True

    def _settle(self, entry_id: int) -> None:
        consumer = self.owner.pop(entry_id, None)
        if consumer is not None:
            self._release(consumer, entry_id)
        self.redelivery_counts.pop(entry_id, None)

    def _release(self, consumer: ConsumerLink, entry_id: int) -> None:
        """`consumer` no longer holds the entry (acknowledged, or to be sent again). One blocked
        at max_unacked_messages takes entries again once it holds half of that (as Pulsar)."""
        consumer.unacked_messages -= consumer.pending.pop(entry_id, 0)
        if consumer.blocked and consumer.unacked_messages <= self.topic.max_unacked_messages // 2:
            consumer.blocked = False

    def redeliver(self, consumer: ConsumerLink, entry_ids: list[int] | None) -> None:
        """Send again what `consumer` holds (all of it when `entry_ids` is None)."""
        entries = entry_ids if entry_ids else list(consumer.pending)
        self._requeue([e for e in entries if self.owner.get(e) is consumer], consumer)
        if self._untracked_consumer is consumer:
            # the untracked ones asked for are sent again one by one, and then tracked: while what
            # is tracked stays within twice the bound (past it, the whole range again)
            if entry_ids and len(self.owner) + len(self._redeliver) + len(entry_ids) <= \
                    2 * self.topic.max_tracked_entries:
                self._requeue_untracked(entry_ids)
            else:
                self._rewind_untracked(consumer)
        self.dispatch()

    def _rewind_untracked(self, consumer: ConsumerLink) -> None:
        """What `consumer` was sent untracked is read again from the log from where that began
        (entries acknowledged meanwhile are skipped there)."""
        if self._untracked_consumer is consumer:
            self.read_position = min(self.read_position, cast(int, self._untracked_from))
            self._untracked_from = self._untracked_consumer = None

    def _requeue_untracked(self, entry_ids: list[int]) -> None:
        start, end = cast(int, self._untracked_from), self.read_position
        for entry_id in entry_ids:
            if start <= entry_id < end and entry_id not in self._redeliver_set and \
                    not self.cursor.is_acked(entry_id):
                self._redeliver_set.add(entry_id)
                heapq.heappush(self._redeliver, entry_id)
                self.redelivery_counts[entry_id] = self.redelivery_counts.get(entry_id, 0) + 1

    def _requeue(self, entries: Iterable[int], consumer: ConsumerLink) -> None:
        for entry_id in entries:
            if self.owner.get(entry_id) is consumer:
                del self.owner[entry_id]
            self._release(consumer, entry_id)
            if entry_id not in self._redeliver_set and not self.cursor.is_acked(entry_id):
                self._redeliver_set.add(entry_id)
                heapq.heappush(self._redeliver, entry_id)
                self.redelivery_counts[entry_id] = self.redelivery_counts.get(entry_id, 0) + 1

    def seek(self, entry_id: int) -> None:
        if not self.durable:
            self.retained_until = time.monotonic() + SEEK_RETAIN_SECONDS
            asyncio.get_running_loop().call_later(SEEK_RETAIN_SECONDS + 0.01, self._drop_if_unused)
        self.cursor.reset(entry_id)
        self.read_position = entry_id
        self._redeliver.clear()
        self._redeliver_set.clear()
        self._delayed.clear()
        self._parked.clear()
        self.owner.clear()
        self.redelivery_counts.clear()
        self._untracked_from = self._untracked_consumer = None
        for consumer in self.consumers:
            consumer.pending.clear()
            consumer.unacked_messages = 0
            consumer.blocked = False
            consumer.permits = 0
        self.dirty = True

    def check_end_of_topic(self) -> None:
        """Tell each consumer once when the topic is terminated and it has been sent everything."""
        if not self.topic.terminated or self.read_position < self.topic.log.committed_entry_id or \
                self._redeliver or self._parked:
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
        if self.read_position < self.topic.log.first_entry_id:
            self._skip_missing(self.topic.log.first_entry_id)
        while self._redeliver:
            entry_id = self._redeliver[0]
            if self.cursor.is_acked(entry_id) or entry_id in self.owner:
                heapq.heappop(self._redeliver)
                self._redeliver_set.discard(entry_id)
                continue
            return entry_id, True
        end = self.topic.log.committed_entry_id  # never an entry the OS has not taken yet
        compacted = self.topic.compacted if self.read_compacted else None
        while self.read_position < end:
            position = self.read_position
            if self.cursor.is_acked(position) or position in self.owner or self._held(position):
                self.read_position += 1
                continue
            if compacted is not None and position <= compacted.horizon and position not in compacted.kept:
                self.read_position += 1  # superseded by a later value of its key: settled unread
                self.cursor.ack(position)
                self._settle(position)
                self.dirty = True
                continue
            return position, False
        return None

    def _pick(self, entry: Entry) -> ConsumerLink | object | None:
        """The consumer to send `entry` to; None when that consumer cannot take it now;
        _UNASSIGNED when no sticky consumer owns its key hash."""
        if self.type in _SINGLE_ACTIVE:
            active = self.active
            return active if active is not None and active.permits > 0 and active.writable and not active.blocked \
                else None
        candidates = self.consumers
        if not candidates:
            return None
        if self.type == _SubType.Key_Shared:
            slot = key_hash(entry)
            if self.sticky:
                i = bisect.bisect_right(self._ranges, slot, key=_range_start) - 1
                if i < 0 or self._ranges[i].end < slot:
                    return _UNASSIGNED
                consumer = self._ranges[i].consumer
            else:  # auto-split: the hash range split evenly among the consumers
                consumer = candidates[slot * len(candidates) // KEY_HASH_RANGE]
            return consumer if consumer.permits > 0 and consumer.writable and not consumer.blocked else None
        for step in range(len(candidates)):
            consumer = candidates[(self._round_robin + step) % len(candidates)]
            if consumer.permits > 0 and consumer.writable and not consumer.blocked:
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
                pending = topic_log.read_pending(entry_id, self.reader)
                if pending is not None and self._resume_after(pending):
                    return
                try:
                    entry = topic_log.read(entry_id, self.reader)
                except CorruptEntryError:
                    self._skip_unreadable(entry_id, redelivery)
                    continue
                except StorageError as exc:
                    self._retry_later(exc)
                    return
                picked = self._pick(entry)
                if picked is None:
                    return
                if redelivery:
                    heapq.heappop(self._redeliver)
                    self._redeliver_set.discard(entry_id)
                else:
                    self.read_position = entry_id + 1
                if picked is _UNASSIGNED:  # held until a consumer owns its key hash
                    self._parked.append(entry_id)
                    continue
                consumer = cast(ConsumerLink, picked)
                partial = self.cursor.partial.get(entry_id)
                consumer.deliver(entry, self.redelivery_counts.get(entry_id, 0),
                              ack_set_words(partial, entry.num_messages) if partial else None)
                messages = entry.num_messages
                consumer.permits -= messages
                self.messages_out += messages
                self.bytes_out += len(entry.body)
                if not redelivery and self.type in _SINGLE_ACTIVE and (
                        self._untracked_from is not None or len(self.owner) >= self.topic.max_tracked_entries):
                    if self._untracked_from is None:  # past the bound: the rest is one range
                        self._untracked_from = entry_id
                        self._untracked_consumer = consumer
                    continue
                consumer.pending[entry_id] = messages
                consumer.unacked_messages += messages
                if consumer.unacked_messages >= self.topic.max_unacked_messages > 0 and \
                        self.type in (_SubType.Shared, _SubType.Key_Shared):  # as Pulsar: shared ones only
                    consumer.blocked = True
                self.owner[entry_id] = consumer
        finally:
            self._dispatching = False


    def _resume_after(self, pending: concurrent.futures.Future[int]) -> bool:
        """Dispatch again once the disk read `pending` has landed, rather than wait for it on the
        event loop; False outside a running loop (then read() waits for it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if not self._reading:
            self._reading = True

            def landed(_: object) -> None:
                try:
                    loop.call_soon_threadsafe(self._read_landed)
                except RuntimeError:  # the loop closed meanwhile: nothing to dispatch to
                    pass
            pending.add_done_callback(landed)
        return True

    def _read_landed(self) -> None:
        self._reading = False
        self.dispatch()

    def _skip_unreadable(self, entry_id: int, redelivery: bool) -> None:
        """A corrupt entry costs that entry alone: logged, counted, skipped and settled in the
        cursor so that the subscription moves on (the read already logged the cause)."""
        log.error("topic %s, subscription %s: entry %d is corrupt on disk and is skipped",
                  self.topic.name, self.name, entry_id)
        self.topic.log.stats.skipped_entries += 1
        if redelivery:
            heapq.heappop(self._redeliver)
            self._redeliver_set.discard(entry_id)
        elif self.read_position == entry_id:
            self.read_position = entry_id + 1
        self.cursor.ack(entry_id)
        self._settle(entry_id)
        self.dirty = True

    def _skip_missing(self, first: int) -> None:
        """The log starts at `first` (the segments before it are gone from the disk, which the
        log reported when it opened): what this subscription had not acknowledged before it is
        lost; logged, counted and settled, so that it goes on from `first`."""
        cursor = self.cursor
        lost = sum(1 for entry_id in range(cursor.mark_delete + 1, first) if entry_id not in cursor.acked) \
            if first - cursor.mark_delete <= 1_000_000 else first - cursor.mark_delete - 1
        log.error("topic %s, subscription %s: entries %d to %d are gone from the disk (%d not acknowledged); "
                  "going on from entry %d", self.topic.name, self.name, cursor.mark_delete + 1, first - 1, lost, first)
        self.topic.log.stats.skipped_entries += lost
        cursor.ack_cumulative(first - 1)
        for entry_id in [e for e in self.owner if e < first]:
            self._settle(entry_id)
        self.read_position = max(self.read_position, first)
        self.dirty = True

    def _retry_later(self, exc: StorageError) -> None:
        """The file system refused a read (no descriptors, I/O error): try again in a second."""
        if self._retry_scheduled:
            return
        log.error("topic %s, subscription %s: cannot read the log (%s); retrying", self.topic.name,
                  self.name, exc)
        self._retry_scheduled = True

        def retry() -> None:
            self._retry_scheduled = False
            self.dispatch()
        asyncio.get_running_loop().call_later(1.0, retry)
