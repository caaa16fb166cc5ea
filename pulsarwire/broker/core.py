"""The broker core: the topic registry, topic naming, partitioned-topic metadata,
producer names, deduplication and the group commit. Front ends (Pulsar binary,
V1 text) call it; it knows no wire protocol and no listener (close_transport is the one
transport step both front ends share).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import urllib.parse

from .storage import (DEFAULT_MAX_CACHE_BYTES, DEFAULT_PAGE_CACHE_BYTES, SYNC_INTERVAL, DataDirLock, EntryCache, FileOps, FilePool,
                      StorageError, read_json, topic_directory)
from .topics import DUPLICATE, LEDGERS_FILE, Topic

log = logging.getLogger("pulsarwire.broker")

PARTITION_MARKER = "-partition-"
MAX_FILE_NAME = 255  # bytes in one file name on common file systems
CLOSE_GRACE = 5.0  # seconds a closing connection may take to send its last bytes before it is aborted


class InvalidTopicName(ValueError):
    """A topic name the broker refuses: it could not be stored safely under the data dir."""


class UnknownTenant(LookupError):
    """A topic of a tenant this broker does not have: Pulsar answers TopicNotFound (tenants are
    made by an administrator; a topic never makes one)."""


# the tenants a Pulsar standalone starts with
DEFAULT_TENANTS = ("public", "pulsar")


def tenant_of(name: str) -> str:
    return (name.split("://", 1)[1] if "://" in name else name).split("/", 1)[0]


def check_topic_name(data_dir: str, name: str, partitions: int = 0) -> None:
    """Refuse a name that is empty, has a `.`/`..`/empty path segment (`a/../b`, `a//b`),
    control characters, or a directory name over MAX_FILE_NAME bytes (for a partitioned
    topic, that of its last partition)."""
    if not name:
        raise InvalidTopicName("the topic name is empty")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise InvalidTopicName(f"topic name {name[:64]!r} has control characters")
    path = name.split("://", 1)[1] if "://" in name else name
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidTopicName(f"topic name {name[:64]!r} has an empty, '.' or '..' path segment")
    longest = f"{name}{PARTITION_MARKER}{partitions - 1}" if partitions > 0 else name
    size = len(os.path.basename(topic_directory(data_dir, longest)).encode())
    if size > MAX_FILE_NAME:
        raise InvalidTopicName(f"topic name {name[:64]!r}... is too long: its file name would be "
                               f"{size} bytes (at most {MAX_FILE_NAME})")


def highest_sequence(sequence_id: int, highest_sequence_id: int | None) -> int:
    """The last sequence id a send covers (a batch may carry a higher one than its first)."""
    if highest_sequence_id is not None and highest_sequence_id > sequence_id:
        return highest_sequence_id
    return sequence_id


# As Pulsar's maxUnackedMessagesPerConsumer: past it a consumer gets nothing more until it
# acknowledges half (each unacknowledged entry costs the broker about 200 bytes to track)
DEFAULT_MAX_UNACKED_MESSAGES_PER_CONSUMER = 50_000


class BrokerCore:
    def __init__(self, data_dir: str, *, sync_policy: str = SYNC_INTERVAL,
                 segment_bytes: int = 64 * 1024 * 1024, default_partitions: int = 0,
                 max_open_files: int | None = None, file_ops: FileOps | None = None,
                 max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES,
                 max_unacked_messages_per_consumer: int = DEFAULT_MAX_UNACKED_MESSAGES_PER_CONSUMER,
                 page_cache_bytes: int = DEFAULT_PAGE_CACHE_BYTES, tenants: tuple[str, ...] = ()) -> None:
        if max_unacked_messages_per_consumer < 0:
            raise ValueError("max_unacked_messages_per_consumer must not be negative")
        self.data_dir = os.path.abspath(data_dir)
        self.max_unacked_messages_per_consumer = max_unacked_messages_per_consumer
        self.sync_policy = sync_policy
        self.segment_bytes = segment_bytes
        self.default_partitions = default_partitions
        self.topics: dict[str, Topic] = {}
        self.uncommitted: set[Topic] = set()  # topics with appends not yet handed to the OS
        # every segment's descriptors, bounded; and the page cache each log's appends keep
        self.files = FilePool(max_open_files, file_ops, page_cache_bytes)
        self.cache = EntryCache(max_cache_bytes)  # recent entries of every topic, bounded in all
        self.producer_name_prefix = "pulsarwire"
        self.generation = 0  # counts broker starts on this data dir, so names never repeat across restarts
        self._names = itertools.count()
        self._partitioned: dict[str, int] = {}
        self._next_ledger_id = 1  # ledger 0 is what entries stored before ledger ids carry
        self._lock = DataDirLock(self.data_dir)  # one broker per data dir
        # tenants topics may be made in: Pulsar's defaults, those configured, and (from open())
        # those of every topic the data dir holds, so that no stored topic becomes unreachable
        self.tenants: set[str] = set(DEFAULT_TENANTS) | set(tenants)

    def open(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock.acquire()  # DataDirInUseError when another broker has this data dir
        try:
            self._partitioned = read_json(self._metadata_path(), {})
            state_path = os.path.join(self.data_dir, "broker.json")
            state = read_json(state_path, {})
            self.generation = int(state.get("generation", 0)) + 1
            self.files.write_json(state_path, dict(state, generation=self.generation))
            allocation = read_json(self._ledgers_path(), None)
            self._next_ledger_id = allocation["next"] if allocation else self._highest_ledger_on_disk() + 1
            root = os.path.join(self.data_dir, "topics")
            self.tenants.update(tenant_of(urllib.parse.unquote(entry))
                                for entry in (os.listdir(root) if os.path.isdir(root) else ()))
            self.tenants.update(tenant_of(name) for name in self._partitioned)
        except BaseException:
            self._lock.release()
            raise

    # ledger ids: unique per broker across topics and restarts, as in Pulsar

    def _ledgers_path(self) -> str:
        return os.path.join(self.data_dir, "ledger-ids.json")

    def _highest_ledger_on_disk(self) -> int:
        """Without the allocation file (a new or older data dir): the highest id any topic holds."""
        highest = 0
        root = os.path.join(self.data_dir, "topics")
        for name in os.listdir(root) if os.path.isdir(root) else ():
            ranges = read_json(os.path.join(root, name, LEDGERS_FILE), [])
            highest = max([highest] + [int(ledger) for _, ledger in ranges])
        return highest

    def new_ledger_id(self) -> int:
        """A ledger id no topic of this broker has had; the allocation is on disk before it is used."""
        ledger_id = self._next_ledger_id
        self.files.write_json(self._ledgers_path(), {"next": ledger_id + 1})
        self._next_ledger_id = ledger_id + 1
        return ledger_id

    def close(self) -> None:
        self.commit()
        for topic in self.topics.values():
            topic.close()
        self.topics.clear()
        self.files.stop_syncs()
        self._lock.release()

    # topics

    def _metadata_path(self) -> str:
        return os.path.join(self.data_dir, "topics.json")

    def partitioned_count(self, name: str) -> int | None:
        """How many partitions the partitioned topic `name` has; None if it is not one."""
        return self._partitioned.get(name)

    def check_topic_name(self, name: str, partitions: int = 0) -> None:
        """Raise InvalidTopicName for a name that cannot be a topic here."""
        check_topic_name(self.data_dir, name, partitions)

    def check_tenant(self, name: str) -> None:
        """Raise UnknownTenant when topic `name` is in a tenant this broker does not have."""
        if tenant_of(name) not in self.tenants:
            raise UnknownTenant(f"tenant {tenant_of(name)[:64]!r} does not exist (topic {name[:128]})")

    def non_partitioned_exists(self, name: str) -> bool:
        """Whether `name` is a non-partitioned topic, open or only on disk (topics open lazily)."""
        if name in self.topics:
            return True
        self.check_topic_name(name)
        return name not in self._partitioned and os.path.isdir(topic_directory(self.data_dir, name))

    def partitions_of(self, name: str) -> int:
        """Partitions for a partitioned-metadata lookup (0: not partitioned), creating the
        topic as partitioned first when the broker has default partitions."""
        self.check_topic_name(name)
        if PARTITION_MARKER in name:
            return 0
        if name not in self._partitioned and self.default_partitions and not self.non_partitioned_exists(name):
            self.create_partitioned_topic(name, self.default_partitions)
        return self._partitioned.get(name, 0)


    def create_partitioned_topic(self, name: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("a partitioned topic needs at least one partition")
        self.check_topic_name(name, partitions)
        if self.non_partitioned_exists(name):
            raise ValueError(f"{name} already exists as a non-partitioned topic")
        existing = self._partitioned.get(name, 0)
        if partitions < existing:  # the dropped partitions' messages would become unreachable
            raise ValueError(f"{name} has {existing} partitions; partitions can be added, never removed")
        self._partitioned[name] = partitions
        self.files.write_json(self._metadata_path(), self._partitioned)
        self.tenants.add(tenant_of(name))  # made by an operator (CLI, admin): its tenant exists

    def topics_of_namespace(self, namespace: str, persistent: bool = True, non_persistent: bool = False) -> list[str]:
        """The topic-partitions of `tenant/namespace` (open, on disk, or partitions of a
        partitioned topic), sorted, as Pulsar lists them: partitions by their own names."""
        names = set(self.topics)
        root = os.path.join(self.data_dir, "topics")
        if os.path.isdir(root):
            names.update(urllib.parse.unquote(entry) for entry in os.listdir(root))
        for parent, partitions in self._partitioned.items():
            names.update(f"{parent}{PARTITION_MARKER}{i}" for i in range(partitions))
            names.discard(parent)
        prefixes = tuple(f"{scheme}://{namespace}/" for scheme, wanted in
                         (("persistent", persistent), ("non-persistent", non_persistent)) if wanted)
        return sorted(n for n in names
                      if n.startswith(prefixes) and "/" not in n.split("://", 1)[1][len(namespace) + 1:])

    def topic(self, name: str) -> Topic | None:
        """The topic-partition `name`, created on first use; None for a partitioned parent."""
        topic = self.topics.get(name)
        if topic is None:
            if name in self._partitioned:
                return None
            self.check_topic_name(name)
            # StorageError (logged) when the file system refuses, e.g. no descriptors left
            topic = Topic(name, topic_directory(self.data_dir, name), segment_bytes=self.segment_bytes,
                          sync_policy=self.sync_policy, on_append=self.uncommitted.add, pool=self.files,
                          cache=self.cache, new_ledger_id=self.new_ledger_id,
                          max_unacked_messages=self.max_unacked_messages_per_consumer)
            self.topics[name] = topic
            self.tenants.add(tenant_of(name))  # a V1 client may make topics in any tenant
        return topic

    def terminate_topic(self, name: str) -> int:
        topic = self.topic(name)
        if topic is None:
            raise ValueError(f"{name} is partitioned; terminate its partitions")
        return topic.terminate()

    def unload_topic(self, name: str) -> int:
        """Close every producer and consumer on topic-partition `name`, as a broker does when a
        topic moves: clients look it up again and re-attach. Returns how many were closed."""
        topic = self.topics.get(name)
        return 0 if topic is None else topic.evict_all()

    # producers

    def new_producer_name(self, topic: Topic | None = None) -> str:
        """A name no producer had: `<prefix>-<generation>-<n>`, the generation counting broker starts
        (dedup state is keyed by name; a reused name would inherit another producer's sequence ids)."""
        while True:
            name = f"{self.producer_name_prefix}-{self.generation}-{next(self._names)}"
            if topic is None or (name not in topic.last_sequence and name not in topic.producers):
                return name

    def publish(self, topic: Topic, producer_name: str, sequence_id: int, highest_sequence_id: int | None,
                continuation_chunk: bool, body, checksum: int | None, publish_time: int,
                deliver_at_time: int | None, batch_count: int | None, compression: int | None = None) -> int:
        """Append one entry unless the producer sent it before; returns its entry id or DUPLICATE.
        `batch`: (num_messages_in_batch or None, compression) when the front end read them.

        A later chunk of a chunked message shares its sequence id with the first, so it is
        never a duplicate by sequence id."""
        highest = highest_sequence(sequence_id, highest_sequence_id)
        if not continuation_chunk and highest <= topic.last_sequence.get(producer_name, -1):
            return DUPLICATE
        return topic.append(body, checksum, publish_time, deliver_at_time, batch_count, producer_name, highest,
                            compression)

    # persistence

    def commit(self) -> None:
        """Group commit: write every pending append. Runs before any receipt leaves the broker;
        a topic whose write fails marks its `log.batch` failed (logged), and the front ends
        answer an error instead of a receipt for every send in it."""
        while self.uncommitted:
            self.uncommitted.pop().commit()

    def save(self) -> bool:
        """Persist cursors and dedup state that changed; a topic that cannot is logged and
        tried again on the next call. Returns whether every topic was saved."""
        self.commit()
        saved = True
        for topic in list(self.topics.values()):
            try:
                topic.save()
            except StorageError:
                saved = False  # logged where it failed; still marked changed
        return saved

    def sync(self, background: bool = False) -> bool:
        """fsync every log (the interval sync policy calls this on its cadence); failures are
        logged and tried again next time. Returns whether every log was synced. With `background`
        the fsyncs run on the storage's worker thread, so the event loop goes on meanwhile (a
        failure is then logged and retried by the next sync)."""
        self.commit()
        synced = True
        for topic in list(self.topics.values()):
            try:
                topic.log.sync(background)
            except StorageError as exc:
                log.error("topic %s: fsync failed: %s", topic.name, exc)
                synced = False
        return synced

    def storage_stats(self) -> dict:
        """Storage fault counters (corrupt entries skipped, failed commits, ...), open files and the
        entry cache (bytes held, its budget, entries evicted)."""
        return dict(self.files.stats.as_dict(), open_files=self.files.open_count,
                    max_open_files=self.files.max_open_files, cache_bytes=self.cache.bytes,
                    max_cache_bytes=self.cache.max_bytes, cache_evicted_entries=self.cache.evicted_entries)


def close_transport(transport, abort: bool, last_words=None) -> None:
    """Close a front end's connection: at once with `abort`; else after `last_words()` queued
    its last output, and a peer that does not read that within CLOSE_GRACE is aborted, so what
    it holds is freed. Nothing to do for a transport already closing."""
    if transport is None or transport.is_closing():
        return
    if abort:
        transport.abort()
        return
    if last_words is not None:
        last_words()
    transport.close()
    if transport.get_write_buffer_size():
        asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)
