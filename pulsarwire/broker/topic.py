"""The broker's domain: a topic-partition, its producers and their access modes, deduplication,
and its subscriptions (subscription.py).

This layer knows no wire protocol. A subscription delivers to `ConsumerLink`s
and a topic tracks `ProducerLink`s; each front end (Pulsar binary, V1 text)
implements those two small interfaces. Entries are kept as producers framed
them (`[u32 metadata size][MessageMetadata][payload]`), so the domain can read
their metadata but never re-encodes them.
"""
from __future__ import annotations

import abc
import bisect
import concurrent.futures
import logging
import os
import time
from typing import Any, Callable, NamedTuple

from .._proto import PulsarApi_pb2 as pb
from . import metafile, staging
from .entries import entry_message_count, entry_metadata, start_entry
from .metafile import CURRENT, LOST, PREVIOUS_COPY, MetadataWriter, report_damage
from .storage import Body, Cursor, Entry, EntryCache, FilePool, StorageError, TopicLog
from .subscription import MAX_TRACKED_ENTRIES, Subscription
from .topic_files import (COMPACTION_FILE, CURSORS_FILE, EPOCH_FILE, LEDGERS_FILE, SCHEMA_FILE, STATE_FILE,
                          Compaction, _compaction, _cursors, _epoch, _ledger_ranges, _schemas, _topic_state)

DUPLICATE = -1  # the entry id a deduplicated send is answered with

log = logging.getLogger("pulsarwire.broker")

LEGACY_LEDGER_ID = 0  # the ledger of entries stored before topics had their own ledger ids
# Deduplication state is kept for at most this many producer names per topic (as Pulsar's
# brokerDeduplicationMaxNumberOfProducers): past it, names of producers not attached are
# forgotten, those attached longest ago first; a producer coming back under a forgotten name
# starts afresh (a resend of what it sent before is stored again, not answered as a duplicate).
MAX_DEDUP_PRODUCERS = 10_000


class ProducerLink(abc.ABC):
    """A producer attached to a topic, as the domain sees it."""

    closed: bool
    name: str

    @abc.abstractmethod
    def evict(self) -> None:
        """Close it from the broker's side (unload); the client re-attaches."""


class ProducerBusyError(Exception):
    """The topic's producer access mode refuses another producer now."""


class ProducerFencedError(Exception):
    """A newer exclusive producer took the topic over (its epoch moved on)."""


# Producer access modes, as Pulsar enforces them.
SHARED, EXCLUSIVE = pb.Shared, pb.Exclusive
WAIT_FOR_EXCLUSIVE, EXCLUSIVE_WITH_FENCING = pb.WaitForExclusive, pb.ExclusiveWithFencing


class WaitingProducer(NamedTuple):
    """A WaitForExclusive producer not yet granted the topic, with its callbacks."""

    producer: ProducerLink
    epoch: int | None
    on_granted: Callable[[int], None]
    on_refused: Callable[[Exception], None]


class Topic:
    """One topic-partition: its log, producers, subscriptions and dedup state.

    `on_append(topic)` is called after each append so that the owner can group-commit
    (`commit()`) every topic written in one event-loop turn before any receipt leaves the
    broker. Subscriptions see an entry only once it is committed; a failed commit takes
    back the dedup state of its sends."""

    def __init__(self, name: str, directory: str, *, segment_bytes: int, sync_policy: str,
                 on_append: Callable[[Topic], None], pool: FilePool | None = None,
                 cache: EntryCache | None = None,
                 new_ledger_id: Callable[[], int] = lambda: LEGACY_LEDGER_ID,
                 max_unacked_messages: int = 0, deduplication: bool = True,
                 metadata: MetadataWriter | None = None, preloaded: dict[str, metafile.Loaded] | None = None) -> None:
        self.name = name
        # its metadata files as read_topic_files read them off the event loop (each used once)
        self._preloaded = dict(preloaded or {})
        # whether a send at or below its producer's last sequence id is dropped (answered as a
        # duplicate); the sequence ids are tracked either way, for a policy switched on later
        self.deduplication = deduplication
        # a consumer holding this many unacknowledged messages gets no more until it holds half
        # (0: no limit): what the subscription tracks per consumer stays bounded
        self.max_unacked_messages = max_unacked_messages
        self.max_tracked_entries = MAX_TRACKED_ENTRIES
        self.max_dedup_producers = MAX_DEDUP_PRODUCERS
        self.partition = _partition_index(name)
        self.directory = directory
        self.log = TopicLog(self.directory, segment_bytes=segment_bytes, sync_policy=sync_policy, pool=pool,
                           cache=cache)
        self.metadata = metadata if metadata is not None else MetadataWriter(self.log.pool.ops)
        self._writes: dict[str, concurrent.futures.Future] = {}  # the last write of each of its files
        self._new_ledger_id: Callable[[], int] | None = None  # a new ledger is due at the first append
        try:
            self._open_ledgers(new_ledger_id)
        except BaseException:
            self.log.close()
            raise
        self._on_append = on_append
        self._dedup_undo: dict[str, int | None] = {}  # producer -> its sequence id before this batch
        # producers with sends in a failed commit: until they attach again, a send of theirs that
        # would leave a gap after their last stored sequence id is refused, else the resent ones
        # (lower ids) would look like duplicates
        self.fenced: dict[str, ProducerLink] = {}
        self.producers: dict[str, ProducerLink] = {}
        self.exclusive_producer: ProducerLink | None = None
        # WaitForExclusive producers in arrival order, each with its callbacks (granted epoch; error)
        self.waiting_producers: list[WaitingProducer] = []
        # bumped each time an exclusive producer takes the topic; kept on disk so that a fenced
        # producer stays fenced across restarts
        self.epoch = self._load_epoch()
        self.epoch_write: concurrent.futures.Future | None = None  # the last epoch write, None once on disk
        self.subscriptions: dict[str, Subscription[Topic]] = {}
        self.deliver_at: dict[int, int] = {}  # entry -> epoch ms before which Shared subs hold it
        self._state_dirty = False
        self._cursors_dirty = False
        state = self._load_state()
        self.terminated = state.get("terminated", False)
        # set when cursors.json was lost with no good copy: every durable subscription made from
        # then on starts at the earliest entry, as it may be one that was lost (redelivery, never a skip)
        self.cursors_lost = state.get("cursors_lost", False)
        self.last_sequence: dict[str, int] = state.get("dedup", {})
        counted = state.get("dedup_upto", -1)
        cursors = self._load(CURSORS_FILE, _cursors)
        self._preloaded[CURSORS_FILE] = cursors  # (read again by _load_cursors)
        seen = max([counted] + [max([data["mark_delete"], *data.get("acked", ()), *map(int, data.get("partial", {}))])
                                for data in (cursors.data or {}).values()])
        if seen >= self.log.next_entry_id:
            # the state or a cursor was written when the log held entries it no longer does
            # (segment files deleted or cut): lost entries, which may have been acknowledged;
            # their ids are kept from new messages
            log.error("topic %s: its %s counted entries up to %d but the log ends at %d: entries %d to %d "
                      "are lost; their ids are not given to new messages", self.name,
                      "state" if seen == counted else "subscriptions' cursors", seen, self.log.next_entry_id - 1,
                      self.log.next_entry_id, seen)
            self.log.skip_to(seen + 1)
        self._recover_dedup(counted, state.get("dedup_lost"))
        self._load_cursors()
        # schema versions, oldest first: {"type", "name", "data" (base64), "properties"}
        self.schemas: list[dict] = self._load_schemas()
        # a change of the versions being written: they change once it is on disk (one at a time)
        self.schema_write: concurrent.futures.Future | None = None
        if self._state_dirty or self._cursors_dirty:
            self.save()  # what recovery rebuilt, on disk again
        self.messages_in = self.bytes_in = 0  # stored since the topic opened (admin stats, metrics)
        # the last compaction: (the last entry it covered, the entries it kept: each the latest of a key)
        self.compacted: Compaction | None = self._load_compaction()

    def _open_ledgers(self, new_ledger_id: Callable[[], int]) -> None:
        """Which ledger id each entry's message id carries: `[first entry, ledger id]` ranges,
        persisted before any entry of a new range is committed. A topic gets a broker-unique ledger
        id when created; entries stored before ledger ids existed keep ledger 0."""
        loaded = self._load(LEDGERS_FILE, _ledger_ranges)
        ranges = loaded.data
        stored = len(ranges or ())
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, f"the ledger ids of topic {self.name}'s message ids",
                          "restored from the previous copy")
        if not ranges:
            ranges = []
            if self.log.next_entry_id > self.log.first_entry_id:
                ranges.append([0, LEGACY_LEDGER_ID])
            ranges.append([self.log.next_entry_id, new_ledger_id()])
            if loaded.source == LOST:
                report_damage(loaded, f"the ledger ids of topic {self.name}'s message ids",
                              f"rebuilt from the log: entries 0..{self.log.next_entry_id - 1} carry ledger "
                              f"{LEGACY_LEDGER_ID} in their message ids from now on, new ones ledger {ranges[-1][1]}")
        elif int(ranges[-1][0]) < self.log.next_entry_id:
            # a ledger of its own for what is stored from now on, as Pulsar opens a new ledger at
            # every load: a message id is never given twice, even where entries were lost with
            # nothing left on disk to count them (their entry ids are taken again, in a ledger
            # of their own). Made at the first append, so that a topic only read writes nothing.
            self._new_ledger_id = new_ledger_id
        elif int(ranges[-1][0]) > self.log.next_entry_id:
            # this ledger was opened with more entries than the log now holds: those were lost
            start = int(ranges[-1][0])
            log.error("topic %s: its ledger %s began at entry %d but the log ends at %d: entries %d to %d "
                      "are lost; their ids are not given to new messages", self.name, ranges[-1][1], start,
                      self.log.next_entry_id - 1, self.log.next_entry_id, start - 1)
            self.log.skip_to(start)
        if loaded.source != CURRENT or len(ranges) != stored:
            # on disk before an entry of the new range is committed (commit() waits for it, so
            # it goes before the writes queued)
            self._write(LEDGERS_FILE, ranges, urgent=True)
        self._ledger_starts = [int(first) for first, _ in ranges]
        self._ledger_ids = [int(ledger) for _, ledger in ranges]
        self.ledger_id = self._ledger_ids[-1]  # the ledger new entries go to
        self.ledger_start = self._ledger_starts[-1]

    def _open_new_ledger(self) -> None:
        """Before the first entry stored since the topic was opened: its ledger (on disk before
        that entry's commit, as a new topic's)."""
        new_ledger_id, self._new_ledger_id = self._new_ledger_id, None
        assert new_ledger_id is not None
        start = self.log.next_entry_id
        self._ledger_starts.append(start)
        self._ledger_ids.append(new_ledger_id())
        self.ledger_id, self.ledger_start = self._ledger_ids[-1], start
        self._write(LEDGERS_FILE, [[first, ledger] for first, ledger in zip(self._ledger_starts, self._ledger_ids)],
                    urgent=True)

    # its metadata files

    def _path(self, file_name: str) -> str:
        return os.path.join(self.directory, file_name)

    def _load(self, file_name: str, validate: Callable[[Any], Any]) -> metafile.Loaded:
        loaded = self._preloaded.pop(file_name, None)
        return loaded if loaded is not None else metafile.load(self._path(file_name), validate)

    def _write(self, file_name: str, data: Any, urgent: bool = False) -> concurrent.futures.Future[None]:
        future = self._writes[file_name] = self.metadata.write(self._path(file_name), data, urgent)
        return future

    def _written(self, file_name: str) -> None:
        """Wait until the last write of `file_name` is on disk (StorageError if it failed)."""
        future = self._writes.get(file_name)
        if future is not None:
            future.result()

    def _load_epoch(self) -> int:
        loaded = self._load(EPOCH_FILE, _epoch)
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, f"the producer epoch of topic {self.name}",
                          f"restored from the previous copy (epoch {loaded.data}): a producer fenced after "
                          "it may take the topic again")
            self._write(EPOCH_FILE, {"epoch": loaded.data})
        elif loaded.source == LOST:
            report_damage(loaded, f"the producer epoch of topic {self.name}",
                          "lost (no good copy): epoch 0, a fenced producer may take the topic again")
            self._write(EPOCH_FILE, {"epoch": 0})
        return loaded.data or 0

    def _load_state(self) -> dict:
        """Termination and the deduplication snapshot (the entries after the snapshot complete
        it, see _recover_dedup)."""
        loaded = self._load(STATE_FILE, _topic_state)
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, f"the termination and deduplication state of topic {self.name}",
                          "restored from the previous copy; deduplication state after it rebuilt from the log")
            self._state_dirty = True
        elif loaded.source == LOST:
            report_damage(loaded, f"the termination and deduplication state of topic {self.name}",
                          "deduplication state rebuilt from the log; a termination it held is lost")
            self._state_dirty = True
        return loaded.data or {}

    def _load_cursors(self) -> None:
        loaded = self._load(CURSORS_FILE, _cursors)
        for sub_name, data in (loaded.data or {}).items():
            self.subscriptions[sub_name] = Subscription(self, sub_name, data.get("type", 0), True,
                                                        Cursor.from_json(data))
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, f"the cursors of topic {self.name}'s durable subscriptions",
                          f"restored from the previous copy ({len(self.subscriptions)} subscriptions): what was "
                          "acknowledged after it is delivered again")
            self._cursors_dirty = True
        elif loaded.source == LOST:
            report_damage(loaded, f"the cursors of topic {self.name}'s durable subscriptions",
                          "lost (no good copy): each durable subscription starts again at the earliest entry "
                          "(everything is delivered again)")
            self.cursors_lost = self._state_dirty = self._cursors_dirty = True

    def _load_schemas(self) -> list[dict]:
        loaded = self._load(SCHEMA_FILE, _schemas)
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, f"the schema versions of topic {self.name}",
                          f"restored from the previous copy ({len(loaded.data)} versions): a version registered "
                          "after it is registered again by the next producer or consumer declaring it")
            self._write(SCHEMA_FILE, loaded.data)
        elif loaded.source == LOST:
            report_damage(loaded, f"the schema versions of topic {self.name}",
                          "lost (no good copy): the next producer or consumer declaring a schema registers it")
            self._write(SCHEMA_FILE, [])
        return loaded.data or []

    def ledger_of(self, entry_id: int) -> int:
        """The ledger id of entry `entry_id`'s message id."""
        if entry_id >= self.ledger_start:
            return self.ledger_id
        return self._ledger_ids[max(0, bisect.bisect_right(self._ledger_starts, entry_id) - 1)]

    def register_schema(self, record: dict) -> concurrent.futures.Future:
        """Write a new schema version; it becomes one (in `schemas`) once on disk, so nobody is
        answered a version that a crash could take back. One change at a time: callers wait for
        `schema_write` first. The future holds the StorageError if it cannot be written."""
        return self._change_schemas(self.schemas + [record])

    def clear_schemas(self) -> concurrent.futures.Future:
        """Delete every schema version (gone once that is on disk; callers wait for `schema_write` first)."""
        return self._change_schemas([])

    def _change_schemas(self, versions: list[dict]) -> concurrent.futures.Future:
        if self.schema_write is not None:
            raise RuntimeError(f"{self.name}: a schema change is being written")
        future = self.schema_write = self.metadata.write(self._path(SCHEMA_FILE), versions, urgent=True)

        def written(error: BaseException | None) -> None:
            if self.schema_write is future:
                self.schema_write = None
                if error is None:
                    self.schemas = versions
        metafile.when_written(future, written)
        return future

    async def find_by_publish_time(self, publish_time: int) -> int:
        """The first entry published at or after `publish_time`, by the publish times in the
        entries' metadata (covered by their checksums; a record header's copy is not)."""
        return await self.log.find_by_publish_time(publish_time, self._checked_publish_time)

    def _checked_publish_time(self, entry: Entry) -> int:
        try:
            stamp = entry_metadata(entry).publish_time
        except Exception:  # noqa: BLE001 - a body that is no Pulsar entry: the header's time
            return entry.publish_time
        if stamp != entry.publish_time:
            log.error("topic %s: entry %d's record header holds publish time %d, its metadata %d: the header "
                      "is damaged; the metadata's time is used", self.name, entry.entry_id, entry.publish_time, stamp)
        return stamp

    def _recover_dedup(self, upto: int, lost_before: int | None = None) -> None:
        """Producers' last sequence ids, from the snapshot plus the entries after it.
        `lost_before`: the log's first lost entry that the snapshot already left out."""
        lost = self.log.first_lost
        if upto >= self.log.next_entry_id or (lost is not None and upto >= lost and lost_before != lost):
            # recovery cut the log below what the snapshot counted, or lost entries it counted:
            # rebuilt from the log alone, else a resend of a lost entry would be answered as a duplicate
            log.error("topic %s: deduplication state counts entries up to %d but the log %s; rebuilt from the log",
                      self.name, upto, f"ends at {self.log.next_entry_id - 1}" if lost is None or
                      upto >= self.log.next_entry_id else f"lost entries from {lost} on")
            self.last_sequence, upto = {}, -1
            self._state_dirty = True  # the snapshot written next leaves the lost entries out
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

    def append(self, body: Body, checksum: int | None, publish_time: int, deliver_at_time: int | None,
               batch_count: int | None, producer_name: str, highest_sequence_id: int,
               compression: int | None = None) -> int:
        """Store an entry, remember the producer's sequence id, and dispatch it. `batch_count`: the
        metadata's num_messages_in_batch (None: not a batch); MalformedBatchError, before anything
        changes, when the payload does not hold that many."""
        if self._new_ledger_id is not None:
            self._open_new_ledger()
        batch = self.log.batch
        try:
            count = entry_message_count(body, batch_count, compression)
            entry_id = self.log.append(body, checksum, publish_time, count)
        finally:
            if self.log.batch is not batch:  # starting a new segment committed the batch before
                self._settled(batch.error is None)
        self._on_append(self)
        self.messages_in += count
        self.bytes_in += len(body)
        if deliver_at_time is not None and deliver_at_time > time.time() * 1000:
            self.deliver_at[entry_id] = deliver_at_time
        self._remember_sequence(producer_name, highest_sequence_id)
        return entry_id

    def _remember_sequence(self, producer_name: str, highest_sequence_id: int) -> None:
        """The producer's last stored sequence id, and what it was before this group commit (put
        back if the commit fails)."""
        undo = self._dedup_undo
        if producer_name not in undo:
            previous = undo[producer_name] = self.last_sequence.get(producer_name)
            if previous is None and len(self.last_sequence) >= self.max_dedup_producers:
                self._forget_idle_producers()
        self.last_sequence[producer_name] = highest_sequence_id
        self._state_dirty = True

    def append_sends(self, frames: list, start: int, end: int, producer_name: str) -> list[int]:
        """Store the plain Send frames (codec.SendFrame) frames[start:end] of one producer, as
        append() would one by one (the broker's hot path: one call for a run of frames). Stops
        before the first frame that needs append(): a chunk, a delayed message, a compressed or
        malformed batch, a new segment. Returns the entry ids of the frames taken, in order,
        DUPLICATE for a send the producer made before (only when the topic deduplicates)."""
        if self._new_ledger_id is not None:
            self._open_new_ledger()
        first_id = self.log.next_entry_id
        last = self.last_sequence.get(producer_name, -1) if self.deduplication else -1
        ids, bodies, checksums, publish_times, counts, highest_ids = staging.plan_send_run(
            frames, start, end, last, first_id, DUPLICATE)
        if not self.deduplication and DUPLICATE in ids:
            # the plan judges each frame against the ones before it in the run: without
            # deduplication the run ends before a lower id, which the next run then stores
            del ids[ids.index(DUPLICATE):]
            stored = len(ids)
            del bodies[stored:], checksums[stored:], publish_times[stored:], counts[stored:], highest_ids[stored:]
        if not bodies:
            return ids
        stored = self.log.append_many(bodies, checksums, publish_times, counts)
        if stored < len(bodies):  # the rest waits for append() to start a new segment
            del ids[ids.index(first_id + stored):]
        if stored:
            self._on_append(self)
            self._remember_sequence(producer_name, highest_ids[stored - 1])
            self.messages_in += sum(counts[:stored])
            self.bytes_in += sum(map(len, bodies[:stored]))
        return ids

    def append_plain(self, bodies: list, checksums: list[int], publish_times: list[int], producer_name: str,
                     last_sequence_id: int) -> int:
        """Store entries of one message each (not batches, not delayed) in order, as append() would
        one by one, up to one that must start a new segment (left to append()); how many were
        stored. The producer's last sequence id is that of the last body (a front end storing a
        run at once: V1)."""
        if self._new_ledger_id is not None:
            self._open_new_ledger()
        stored = self.log.append_many(bodies, checksums, publish_times, [1] * len(bodies))
        if stored:
            self._on_append(self)
            self._remember_sequence(producer_name, last_sequence_id - (len(bodies) - stored))
        return stored

    def _forget_idle_producers(self) -> None:
        """Make room in the deduplication state: drop the names of producers not attached, in the
        order they last attached (or first sent), down to 7/8 of the bound."""
        keep = self.max_dedup_producers - self.max_dedup_producers // 8 - 1
        idle = [name for name in self.last_sequence if name not in self.producers and name not in self._dedup_undo]
        forget = idle[:max(0, len(self.last_sequence) - keep)]
        for name in forget:
            del self.last_sequence[name]
        if forget:
            log.info("topic %s: deduplication state of %d idle producers forgotten (at most %d are kept)",
                     self.name, len(forget), self.max_dedup_producers)

    def _attached(self, producer: ProducerLink) -> None:
        """Its deduplication state is the last to be forgotten."""
        self.producers[producer.name] = producer
        last = self.last_sequence.pop(producer.name, None)
        if last is not None:
            self.last_sequence[producer.name] = last

    def refuses(self, producer: ProducerLink, sequence_id: int) -> bool:
        """Whether this send must be refused: its producer had sends in a failed commit, and this
        one is not the next after what is stored (the failed ones must be resent first)."""
        return self.fenced.get(producer.name) is producer and \
            sequence_id > self.last_sequence.get(producer.name, -1) + 1

    def commit(self, refusal: StorageError | None = None) -> bool:
        """Hand the appended entries to the OS; then subscriptions may send them. False when
        the file system refused, or `refusal` says the broker cannot write (the log is rolled
        back, and so is the dedup state)."""
        if not self.log.batch.count:
            return True
        if refusal is not None:
            self._settled(self.log.commit(refusal))
            return False
        ledgers = self._writes.get(LEDGERS_FILE)
        if ledgers is not None:  # the ledger ids of these entries' message ids on disk first
            try:
                ledgers.result()
                del self._writes[LEDGERS_FILE]
            except StorageError as exc:
                log.error("topic %s: its ledger ids could not be written (%s); trying again", self.name, exc)
                self._write(LEDGERS_FILE, [[first, ledger] for first, ledger in
                                           zip(self._ledger_starts, self._ledger_ids)], urgent=True)
        ok = self.log.commit()
        self._settled(ok)
        return ok

    def _settled(self, ok: bool) -> None:
        undo, self._dedup_undo = self._dedup_undo, {}
        if ok:
            for subscription in list(self.subscriptions.values()):
                subscription.dispatch()
            return
        for producer_name, previous in undo.items():
            if previous is None:
                self.last_sequence.pop(producer_name, None)
            else:
                self.last_sequence[producer_name] = previous
            link = self.producers.get(producer_name)
            if link is not None:
                self.fence(link)

    def fence(self, producer: ProducerLink) -> None:
        """A send of this producer was not stored: refuse its later ones until it resends that
        one (or attaches again)."""
        log.warning("topic %s: producer %s must resend what was not stored before anything later",
                    self.name, producer.name)
        self.fenced[producer.name] = producer
        end = self.log.next_entry_id
        for entry_id in [e for e in self.deliver_at if e >= end]:
            del self.deliver_at[entry_id]

    def subscription(self, name: str, sub_type: int, durable: bool, initial_earliest: bool,
                     start: int | None, wait: bool = True) -> Subscription[Topic]:
        """The subscription `name`, created at its initial position (or `start`, for a
        non-durable one: EARLIEST, LATEST or an entry id) if it does not exist. A new durable
        one is on disk when this returns; without `wait`, once `stored(subscription)` says so."""
        existing = self.subscriptions.get(name)
        if existing is not None:
            return existing
        if durable:
            earliest = initial_earliest or self.cursors_lost
            mark = self.log.first_entry_id - 1 if earliest else self.log.committed_entry_id - 1
        else:
            position = start_entry(start, self.log) if start is not None else \
                (self.log.first_entry_id if initial_earliest else self.log.committed_entry_id)
            mark = position - 1
        subscription = Subscription(self, name, sub_type, durable, Cursor(mark))
        self.subscriptions[name] = subscription
        subscription.dirty = durable
        if durable:
            # on disk before the subscribe is answered, as in Pulsar: after a crash, the subscription
            # must not be made again at its initial position, skipping what was published meanwhile
            try:
                self.save(wait=wait)
            except StorageError:
                del self.subscriptions[name]
                subscription.reader.close()
                raise
            if not wait:
                subscription.stored = self._writes.get(CURSORS_FILE)
        return subscription

    def set_compacted(self, horizon: int, kept: set[int]) -> concurrent.futures.Future:
        """Keep a compaction's result, in force once on disk: subscriptions that read compacted
        skip the entries up to `horizon` that are not in `kept`."""
        future = self.metadata.write(self._path(COMPACTION_FILE), {"horizon": horizon, "kept": sorted(kept)})

        def written(error: BaseException | None) -> None:
            if error is None:
                self.compacted = Compaction(horizon, kept)
        metafile.when_written(future, written)
        return future

    def _load_compaction(self) -> Compaction | None:
        loaded = self._load(COMPACTION_FILE, _compaction)
        if loaded.source == PREVIOUS_COPY:
            report_damage(loaded, f"topic {self.name}'s last compaction", "restored from the previous copy")
        elif loaded.source == LOST:
            report_damage(loaded, f"topic {self.name}'s last compaction",
                          "lost: compacted reads give every entry until the topic is compacted again")
        return loaded.data

    def stored(self, subscription: Subscription[Topic]) -> concurrent.futures.Future[None] | None:
        """None once a new subscription made without `wait` is on disk; else the write that puts
        it there (a new one when the last failed: the future then holds its StorageError)."""
        future = subscription.stored
        if future is None:
            return None
        if future.done():
            if future.exception() is None:
                subscription.stored = None
                return None
            self.save()  # writes the cursors again (a failed write marked them changed)
            future = subscription.stored = self._writes.get(CURSORS_FILE)
        return future

    def written_cursors(self) -> concurrent.futures.Future | None:
        """The last write of the cursors (None: none under way or failed to wait for)."""
        return self._writes.get(CURSORS_FILE)

    def drop_subscription(self, name: str) -> concurrent.futures.Future | None:
        """Drop subscription `name`; returns the cursors' write that makes it final on disk (a
        crash before it brings the subscription back, never loses one)."""
        dropped = self.subscriptions.pop(name, None)
        if dropped is not None:
            dropped.reader.close()
        self._cursors_dirty = True
        self.save()
        return self._writes.get(CURSORS_FILE)

    def last_position(self) -> tuple[int, int]:
        """(entry id, batch index) of the last message; (-1, -1) when the topic is empty."""
        last = self.log.last_entry_id
        batch_index = -1
        if last >= self.log.first_entry_id:
            try:
                md = entry_metadata(self.log.read(last))
            except StorageError:
                return last, batch_index  # logged by the read; the id is still the last one
            if md.HasField("num_messages_in_batch"):
                batch_index = md.num_messages_in_batch - 1
        return last, batch_index

    def save(self, wait: bool = False) -> None:
        """Persist cursors and dedup state when they changed (pending appends are committed
        first, so that no failed send's sequence id is saved), through the metadata writer; with
        `wait`, once they are on disk (StorageError if they cannot be). A write that failed
        leaves them marked changed, so the next save tries again."""
        self.commit()
        for file_name in (CURSORS_FILE, STATE_FILE):
            future = self._writes.get(file_name)
            if future is not None and future.done():
                del self._writes[file_name]
                if future.exception() is not None:  # logged by the writer
                    if file_name == CURSORS_FILE:
                        self._cursors_dirty = True
                    else:
                        self._state_dirty = True
        dirty = [s for s in self.subscriptions.values() if s.dirty]
        if dirty or self._cursors_dirty:
            cursors = {name: dict(s.cursor.to_json(), type=s.type)
                       for name, s in self.subscriptions.items() if s.durable}
            self._write(CURSORS_FILE, cursors, urgent=wait)
            for s in dirty:
                s.dirty = False
            self._cursors_dirty = False
        if self._state_dirty:
            state = {"terminated": self.terminated, "dedup": self.last_sequence,
                     "dedup_upto": self.log.committed_entry_id - 1}
            if self.log.first_lost is not None:
                state["dedup_lost"] = self.log.first_lost
            if self.cursors_lost:
                state["cursors_lost"] = True
            self._write(STATE_FILE, state, urgent=wait)
            self._state_dirty = False
        if wait:
            self._written(CURSORS_FILE)
            self._written(STATE_FILE)

    def terminate(self) -> tuple[int, concurrent.futures.Future | None]:
        """No more appends; consumers that have everything are told so. Returns the last entry id
        and the write that puts the termination on disk (the caller answers once it is)."""
        self.terminated = True
        self._state_dirty = True
        self.save()
        for subscription in self.subscriptions.values():
            subscription.check_end_of_topic()
        return self.log.last_entry_id, self._writes.get(STATE_FILE)

    # producers and their access modes

    def add_producer(self, producer: ProducerLink, mode: int, epoch: int | None,
                     on_granted: Callable[[int], None], on_refused: Callable[[Exception], None]) -> int | None:
        """Attach `producer` under access `mode` (SHARED, EXCLUSIVE, ...). Returns the topic epoch
        it holds the topic at (exclusive modes) or 0 (shared); None when it waits for exclusive
        access, granted later through `on_granted(epoch)` (or `on_refused(error)` if fenced out).
        Raises ProducerBusyError or ProducerFencedError when refused."""
        if mode == SHARED:
            if self.exclusive_producer is not None or self.waiting_producers:
                raise ProducerBusyError(f"{self.name} has an exclusive producer")
            self._attached(producer)
            return 0
        if mode == EXCLUSIVE_WITH_FENCING:
            for waiting in self.waiting_producers:
                waiting.on_refused(ProducerFencedError(f"fenced out of {self.name} by an exclusive producer"))
            self.waiting_producers.clear()
            for other in list(self.producers.values()):
                other.evict()
            self.producers.clear()
            self.exclusive_producer = None
            return self._grant(producer, max(self.epoch, epoch or 0) + 1)
        if epoch is not None and epoch < self.epoch:
            raise ProducerFencedError(f"{self.name}: topic epoch moved on to {self.epoch}")
        if self.exclusive_producer is not None or self.producers:
            if mode == WAIT_FOR_EXCLUSIVE:
                self.waiting_producers.append(WaitingProducer(producer, epoch, on_granted, on_refused))
                return None
            holder = "an exclusive producer" if self.exclusive_producer is not None else "shared producers"
            # as Pulsar answers an Exclusive producer that finds the topic taken
            raise ProducerFencedError(f"{self.name} has {holder}")
        return self._take_exclusive(producer, epoch)

    def _take_exclusive(self, producer: ProducerLink, epoch: int | None) -> int:
        if epoch is not None and epoch < self.epoch:
            # a producer coming back after another exclusive one held the topic meanwhile
            raise ProducerFencedError(f"{self.name}: topic epoch moved on to {self.epoch}")
        return self._grant(producer, self.epoch + 1 if epoch is None else epoch)

    def _grant(self, producer: ProducerLink, epoch: int) -> int:
        """Give `producer` the topic at `epoch`; a new epoch is written (`epoch_write`) and the
        producer answered once it is on disk. Fencing others needs no wait: it only refuses more."""
        if epoch != self.epoch or self.epoch_stored() is not None:
            self.epoch_write = self._write(EPOCH_FILE, {"epoch": epoch}, urgent=True)
            self.epoch = epoch
        self.exclusive_producer = producer
        self._attached(producer)
        return epoch

    def epoch_stored(self) -> concurrent.futures.Future | None:
        """None once the topic's epoch is on disk; else its write (pending, or failed)."""
        future = self.epoch_write
        if future is not None and future.done() and future.exception() is None:
            self.epoch_write = future = None
        return future

    def remove_producer(self, producer: ProducerLink) -> None:
        """The producer left (closed, or its connection went): a waiting producer may take over."""
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
        if self.exclusive_producer is producer:
            self.exclusive_producer = None
        self.waiting_producers = [w for w in self.waiting_producers if w.producer is not producer]
        while self.waiting_producers and self.exclusive_producer is None and not self.producers:
            waiting, epoch, granted, refused = self.waiting_producers.pop(0)
            try:
                granted(self._take_exclusive(waiting, epoch))
            except (ProducerFencedError, StorageError) as exc:  # the epoch could not be kept: refused
                refused(exc)

    def evict_all(self) -> int:
        """Close every producer and consumer attached here (unload); returns how many."""
        closed = 0
        waiting = [w.producer for w in self.waiting_producers]
        self.waiting_producers.clear()
        for producer in list(self.producers.values()) + waiting:
            producer.evict()
            closed += 1
        self.producers.clear()
        self.exclusive_producer = None
        for subscription in list(self.subscriptions.values()):
            for consumer in list(subscription.consumers):
                consumer.evict()
                closed += 1
        return closed

    def in_use(self) -> bool:
        """Whether anything holds the topic open: a producer, a consumer or reader, delayed
        entries it must remember, or appends not yet committed."""
        return bool(self.producers or self.waiting_producers or self.exclusive_producer is not None
                    or self.deliver_at or self.log.batch.count
                    or any(s.consumers or not s.durable for s in self.subscriptions.values()))

    def close(self) -> list[concurrent.futures.Future]:
        """Save what changed and close the log; returns the writes still under way (the metadata
        writer finishes them)."""
        try:
            self.save()
        except StorageError as exc:
            log.error("topic %s: state not saved on close: %s", self.name, exc)
        self.log.close()  # and every reader it made
        return [f for f in self._writes.values() if not f.done()]


def _partition_index(name: str) -> int:
    marker = "-partition-"
    if marker in name:
        tail = name.rsplit(marker, 1)[1]
        if tail.isdigit():
            return int(tail)
    return -1
