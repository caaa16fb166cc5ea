"""The broker core: the topic registry, topic naming, partitioned-topic metadata,
producer names, deduplication and the group commit. Front ends (Pulsar binary,
V1 text) call it; it knows no wire protocol and no listener (close_transport is the one
transport step both front ends share).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import shutil
import time
import urllib.parse
from typing import Any, Callable

from . import metafile
from .metafile import CURRENT, LOST, MISSING, PREVIOUS_COPY, MetadataError, MetadataWriter, report_damage
from .policies import Policies
from .settings import BrokerSettings
from .storage import DataDirLock, EntryCache, FilePool, StorageError, topic_directory
from .topic import DUPLICATE, Topic
from .topic_files import LEDGERS_FILE, read_ledger_ranges, read_topic_files

log = logging.getLogger("pulsarwire.broker")

PARTITION_MARKER = "-partition-"
MAX_FILE_NAME = 255  # bytes in one file name on common file systems
CLOSE_GRACE = 5.0  # seconds a closing connection may take to send its last bytes before it is aborted
BROKER_FILE = "broker.json"
LEDGER_IDS_FILE = "ledger-ids.json"
PARTITIONED_FILE = "topics.json"
# Ledger ids are reserved on disk this many at a time, so creating a topic writes no broker-wide
# file; the next block is reserved (by the metadata writer) when half of one is left.
LEDGER_ID_BLOCK = 1024
# topics whose files are being made or read off the event loop at once, broker-wide (open_topic);
# more wait their turn
MAX_OPENS_IN_FLIGHT = 64
OPENER_THREADS = 2


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
    if not isinstance(name, str):  # protobuf hands over a string field that is not UTF-8 as bytes
        raise InvalidTopicName(f"topic name {name[:64]!r} is not UTF-8 text")
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


class BrokerCore:
    """The domain behind the front ends. `BrokerCore(data_dir, settings=...)`, or keywords naming
    fields of `BrokerSettings` (those of storage and the domain: sync_policy, max_cache_bytes...)."""

    def __init__(self, data_dir: str, *, settings: BrokerSettings | None = None, **keywords: Any) -> None:
        settings = BrokerSettings.of(settings, keywords)
        max_unacked_messages_per_consumer = settings.max_unacked_messages_per_consumer
        if max_unacked_messages_per_consumer < 0:
            raise ValueError("max_unacked_messages_per_consumer must not be negative")
        self.data_dir = os.path.abspath(data_dir)
        self.max_unacked_messages_per_consumer = max_unacked_messages_per_consumer
        self.sync_policy = settings.sync_policy
        self.segment_bytes = settings.segment_bytes
        self.default_partitions = settings.default_partitions
        self.topics: dict[str, Topic] = {}
        self.uncommitted: set[Topic] = set()  # topics with appends not yet handed to the OS
        # every segment's descriptors, bounded; and the page cache each log's appends keep
        self.files = FilePool(settings.max_open_files, settings.file_ops, settings.page_cache_bytes)
        self.cache = EntryCache(settings.max_cache_bytes)  # recent entries of every topic, bounded in all
        self.producer_name_prefix = "pulsarwire"
        self.generation = 0  # counts broker starts on this data dir, so names never repeat across restarts
        self._names = itertools.count()
        self._partitioned: dict[str, int] = {}
        # partitioned topics (and new counts) being written: in force once on disk
        self._creating: dict[str, tuple[int, concurrent.futures.Future]] = {}
        self._next_ledger_id = 1  # ledger 0 is what entries stored before ledger ids carry
        self._lock = DataDirLock(self.data_dir)  # one broker per data dir
        # namespace and topic policies; `deduplication` is the broker's default, off as in Pulsar
        self.metadata = MetadataWriter(self.files.ops)  # every metadata file is written through it
        self.policies = Policies(self.data_dir, self.metadata, deduplication=settings.deduplication)
        self.policies.changed = self.apply_policies
        self._ledger_ids_reserved = 1  # ids below it may have been given out (they are on disk)
        self._reserving: tuple[int, concurrent.futures.Future] | None = None
        self._generation_write: concurrent.futures.Future | None = None
        # why the broker cannot write (a full disk at start); None when it can
        self.read_only: str | None = None
        self._idle_since: dict[str, float] = {}  # open topics nobody uses, since when
        self._closing: dict[str, list[concurrent.futures.Future]] = {}  # unloaded topics' last writes
        self.unloaded_topics = 0
        # tenants topics may be made in: Pulsar's defaults, those configured, and (from open())
        # those of every topic the data dir holds, so that no stored topic becomes unreachable
        self.tenants: set[str] = set(DEFAULT_TENANTS) | set(settings.tenants)
        self._last_idle_scan = float("-inf")
        # open_topic: one opening per name, shared by every request for it; what it read, for topic()
        self._opening: dict[str, asyncio.Future] = {}
        self._preloaded: dict[str, dict] = {}
        self._open_slots: asyncio.Semaphore | None = None
        self._opener: concurrent.futures.ThreadPoolExecutor | None = None

    def open(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock.acquire()  # DataDirInUseError when another broker has this data dir
        try:
            self._partitioned, rebuilt = self._load_partitioned()
            self.policies.load()
            shutil.rmtree(self._deleted_path(), ignore_errors=True)  # topics deleted before a crash
            self.generation = self._load_generation()
            self._next_ledger_id = self._load_next_ledger_id()
            try:  # the starts counted, and a first block of ledger ids, on disk before anything is served
                metafile.write(self._broker_path(), {"generation": self.generation}, self.files.ops)
                self._reserve_ledger_ids(wait=True)
                if rebuilt:
                    metafile.write(self._metadata_path(), self._partitioned, self.files.ops)
            except StorageError as exc:
                self._enter_read_only(exc)
            root = os.path.join(self.data_dir, "topics")
            self.tenants.update(tenant_of(urllib.parse.unquote(entry))
                                for entry in (os.listdir(root) if os.path.isdir(root) else ()))
            self.tenants.update(tenant_of(name) for name in self._partitioned)
        except BaseException:
            self._lock.release()
            raise

    def _broker_path(self) -> str:
        return os.path.join(self.data_dir, BROKER_FILE)

    def _has_topics(self) -> bool:
        root = os.path.join(self.data_dir, "topics")
        return os.path.isdir(root) and bool(os.listdir(root))

    def _load_generation(self) -> int:
        """This start's generation. Producer names carry it, so it must never repeat: a damaged
        file gives way to its previous copy plus two (the damaged one may have counted one more
        start), or without one to the clock in seconds, above any count of starts."""
        loaded = metafile.load(self._broker_path(), _broker_state)
        if loaded.source == CURRENT:
            return loaded.data + 1
        if loaded.source == PREVIOUS_COPY:
            generation = loaded.data + 2
            report_damage(loaded, "the count of broker starts",
                          f"restored from the previous copy: this start is generation {generation}")
            return generation
        if loaded.source == MISSING and not self._has_topics():
            return 1  # a new data dir
        generation = int(time.time())
        report_damage(loaded if loaded.problem else metafile.Loaded(loaded.path, None, LOST, "missing", "nothing"),
                      "the count of broker starts",
                      f"rebuilt from the clock: this start is generation {generation}, above any earlier one")
        return generation

    def _enter_read_only(self, exc: Exception) -> None:
        self.read_only = f"the broker cannot write its metadata ({exc}); it serves reads only until it can"
        log.error("%s: starting read-only", self.read_only)

    def retry_writes(self) -> None:
        """While read-only: try writing again (the maintenance loop calls this); once a write
        succeeds, the broker takes writes again."""
        if self.read_only is None:
            return
        pending = self._generation_write
        if pending is None:
            self._generation_write = self.metadata.write(self._broker_path(), {"generation": self.generation})
            return
        if not pending.done():
            return
        self._generation_write = None
        if pending.exception() is None:
            self.read_only = None
            self._reserve_ledger_ids(wait=False)
            log.warning("the broker can write its metadata again: taking writes")

    # ledger ids: unique per broker across topics and restarts, as in Pulsar

    def _ledgers_path(self) -> str:
        return os.path.join(self.data_dir, LEDGER_IDS_FILE)

    def _load_next_ledger_id(self) -> int:
        """Ids below the one returned may have been given out. A damaged file is rebuilt from
        the topics' ledgers (what its previous copy says too, when higher)."""
        loaded = metafile.load(self._ledgers_path(), _ledger_allocation)
        if loaded.source == CURRENT:
            return loaded.data
        on_disk = self._highest_ledger_on_disk() + 1
        if loaded.source == MISSING:
            return on_disk  # a new data dir, or one written before ledger ids
        rebuilt = max(on_disk, loaded.data or 0)
        source = "and its previous copy" if loaded.source == PREVIOUS_COPY else "(no good previous copy)"
        report_damage(loaded, "the next ledger id to give out",
                      f"rebuilt from the ledgers of the topics on disk {source}: next id {rebuilt}")
        return rebuilt

    def _highest_ledger_on_disk(self) -> int:
        """Without the allocation file (a new or older data dir): the highest id any topic holds."""
        highest = 0
        root = os.path.join(self.data_dir, "topics")
        for name in os.listdir(root) if os.path.isdir(root) else ():
            ranges = read_ledger_ranges(os.path.join(root, name, LEDGERS_FILE)).data or []
            highest = max([highest] + [int(ledger) for _, ledger in ranges])
        return highest

    def _reserve_ledger_ids(self, wait: bool) -> None:
        """Put the next block of ledger ids on disk (at once with `wait`, else by the writer)."""
        reserved = max(self._ledger_ids_reserved, self._next_ledger_id) + LEDGER_ID_BLOCK
        # urgent: ahead of the topics' own files, as every new topic soon waits for it
        future = self.metadata.write(self._ledgers_path(), {"next": reserved}, urgent=True)
        self._reserving = (reserved, future)
        if wait:
            self._settle_reservation(wait=True)

    def _settle_reservation(self, wait: bool) -> None:
        if self._reserving is None:
            return
        reserved, future = self._reserving
        if not wait and not future.done():
            return
        self._reserving = None
        future.result()  # StorageError when it could not be written
        self._ledger_ids_reserved = max(self._ledger_ids_reserved, reserved)

    def new_ledger_id(self) -> int:
        """A ledger id no topic of this broker has had; the allocation is on disk before it is used."""
        if self.read_only is not None:
            raise MetadataError(self.read_only)
        try:
            self._settle_reservation(wait=False)
            if self._next_ledger_id >= self._ledger_ids_reserved:  # the block ran out before the next was written
                if self._reserving is None:
                    self._reserve_ledger_ids(wait=True)
                else:
                    self._settle_reservation(wait=True)
        except StorageError:
            self._reserving = None
            raise
        ledger_id = self._next_ledger_id
        self._next_ledger_id = ledger_id + 1
        if self._reserving is None and self._ledger_ids_reserved - self._next_ledger_id < LEDGER_ID_BLOCK // 2:
            self._reserve_ledger_ids(wait=False)
        return ledger_id

    def close(self) -> None:
        if self._opener is not None:
            self._opener.shutdown(wait=True)
        self.commit()
        for topic in self.topics.values():
            topic.close()
        self.topics.clear()
        self.metadata.close()  # what is queued is written before the data dir is let go
        self.files.stop_syncs()
        self._lock.release()

    # topics

    def _metadata_path(self) -> str:
        return os.path.join(self.data_dir, PARTITIONED_FILE)

    def _partition_directories(self) -> dict[str, int]:
        """Partitioned topics as their partitions' directories show them: at least one more
        partition than the highest index found."""
        found: dict[str, int] = {}
        root = os.path.join(self.data_dir, "topics")
        for entry in os.listdir(root) if os.path.isdir(root) else ():
            parent, marker, index = urllib.parse.unquote(entry).rpartition(PARTITION_MARKER)
            if marker and parent and index.isdigit():
                found[parent] = max(found.get(parent, 0), int(index) + 1)
        return found

    def _load_partitioned(self) -> tuple[dict[str, int], bool]:
        """Partitioned topics and their partition counts, and whether they were rebuilt: a
        damaged file is, from its previous copy and the partitions' directories (the higher
        count of the two)."""
        loaded = metafile.load(self._metadata_path(), _partitioned_topics)
        if loaded.source in (CURRENT, MISSING):
            return loaded.data or {}, False
        rebuilt = dict(loaded.data or {})
        for parent, count in self._partition_directories().items():
            rebuilt[parent] = max(rebuilt.get(parent, 0), count)
        source = "its previous copy and " if loaded.source == PREVIOUS_COPY else ""
        report_damage(loaded, "the partitioned topics and their partition counts",
                      f"rebuilt from {source}the partitions' directories: {len(rebuilt)} partitioned topics "
                      "(partitions never written to may be missing from a count)")
        return rebuilt, True

    def partitioned_count(self, name: str) -> int | None:
        """How many partitions the partitioned topic `name` has; None if it is not one."""
        return self._partitioned.get(name)

    def check_topic_name(self, name: str, partitions: int = 0) -> None:
        """Raise InvalidTopicName for a name that cannot be a topic here."""
        check_topic_name(self.data_dir, name, partitions)

    def check_tenant(self, name: str) -> None:
        """Raise UnknownTenant when topic `name` is in a tenant this broker does not have
        (InvalidTopicName first when `name` cannot be a topic at all)."""
        self.check_topic_name(name)
        if tenant_of(name) not in self.tenants and tenant_of(name) not in self.policies.tenants:
            raise UnknownTenant(f"tenant {tenant_of(name)[:64]!r} does not exist (topic {name[:128]})")

    def non_partitioned_exists(self, name: str) -> bool:
        """Whether `name` is a non-partitioned topic, open or only on disk (topics open lazily)."""
        if name in self.topics:
            return True
        self.check_topic_name(name)
        return name not in self._partitioned and name not in self._creating and \
            os.path.isdir(topic_directory(self.data_dir, name))

    def partitions_of(self, name: str) -> int:
        """Partitions for a partitioned-metadata lookup (0: not partitioned). Call
        `partitions_written` first: it creates the topic as partitioned when the broker has
        default partitions, and a topic being created has its count once that is on disk."""
        self.check_topic_name(name)
        if PARTITION_MARKER in name:
            return 0
        return self._partitioned.get(name, 0)

    def partitions_written(self, name: str) -> concurrent.futures.Future | None:
        """The write a partitioned-metadata lookup of `name` waits for (None: none): a creation
        under way, or one it starts when the broker has default partitions."""
        self.check_topic_name(name)
        if PARTITION_MARKER in name:
            return None
        creating = self._creating.get(name)
        if creating is not None:
            return creating[1]
        if name not in self._partitioned and self.default_partitions and not self.non_partitioned_exists(name):
            return self.create_partitioned_topic(name, self.default_partitions)
        return None


    def create_partitioned_topic(self, name: str, partitions: int) -> concurrent.futures.Future:
        """Make `name` a partitioned topic of `partitions` (or grow it to that many). The topic
        (or its new count) is in force once on disk, so nobody is answered a topic a crash could
        take back: the future is done then, or holds the StorageError. Off the event loop's
        thread of work: the write is the metadata writer's."""
        if partitions < 1:
            raise ValueError("a partitioned topic needs at least one partition")
        self.check_topic_name(name, partitions)
        creating = self._creating.get(name)
        if creating is not None:
            if creating[0] == partitions:
                return creating[1]
            raise ValueError(f"{name} is being given {creating[0]} partitions; try again once it has them")
        if self.non_partitioned_exists(name):
            raise ValueError(f"{name} already exists as a non-partitioned topic")
        existing = self._partitioned.get(name, 0)
        if partitions < existing:  # the dropped partitions' messages would become unreachable
            raise ValueError(f"{name} has {existing} partitions; partitions can be added, never removed")
        if self.read_only is not None:
            raise MetadataError(self.read_only)
        if partitions == existing:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(None)
            return done
        future = self._write_partitioned({name: partitions})
        self._creating[name] = (partitions, future)

        def written(error: BaseException | None) -> None:
            if self._creating.get(name, (0, None))[1] is future:
                del self._creating[name]
                if error is None:
                    self._partitioned[name] = partitions
                    self.tenants.add(tenant_of(name))  # made by an operator (CLI, admin): its tenant exists
        metafile.when_written(future, written)
        return future

    def _write_partitioned(self, changes: dict[str, int | None]) -> concurrent.futures.Future:
        """Write topics.json: the counts in force, those being written, and `changes` (None: gone).
        Writes are coalesced, so each holds every change under way."""
        counts = dict(self._partitioned)
        counts.update((name, count) for name, (count, _) in self._creating.items())
        for name, count in changes.items():
            if count is None:
                counts.pop(name, None)
            else:
                counts[name] = count
        return self.metadata.write(self._metadata_path(), counts, urgent=True)

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

    def needs_opening(self, name: str) -> bool:
        """Whether `name` is a topic-partition not open yet (a valid name, not a partitioned parent):
        a front end opens it with open_topic rather than topic(), off the event loop."""
        if name in self.topics or name in self._partitioned or name in self._creating or not isinstance(name, str):
            return False
        try:
            self.check_topic_name(name)
        except InvalidTopicName:
            return False  # topic() answers why
        return True

    async def open_topic(self, name: str) -> Topic | None:
        """topic(name), with the file-system part of opening it (its folder and first segment made,
        its metadata files read) done on a thread, so the event loop serves others meanwhile.
        Concurrent requests for one name share one opening; at most MAX_OPENS_IN_FLIGHT run at once."""
        if self.needs_opening(name):
            opening = self._opening.get(name)
            if opening is None:
                opening = self._opening[name] = asyncio.ensure_future(self._read_topic_files(name))
                opening.add_done_callback(lambda _: self._opening.pop(name, None))
            await asyncio.shield(opening)
        reserving = self._reserving
        if name not in self.topics and reserving is not None and self._next_ledger_id >= self._ledger_ids_reserved:
            # a new topic needs a ledger id and the block is spent: wait for the next one here,
            # not in new_ledger_id on the loop (its failure is topic()'s to report)
            await asyncio.wait([asyncio.wrap_future(reserving[1])])
        return self.topic(name)

    async def _read_topic_files(self, name: str) -> None:
        if self._open_slots is None:
            self._open_slots = asyncio.Semaphore(MAX_OPENS_IN_FLIGHT)
        if self._opener is None:
            self._opener = concurrent.futures.ThreadPoolExecutor(OPENER_THREADS, thread_name_prefix="topic-opener")
        async with self._open_slots:
            if name in self.topics:
                return
            closing = list(self._closing.get(name, ()))  # its last writes, if it was unloaded: before it is read
            directory = topic_directory(self.data_dir, name)
            create = self.read_only is None
            ops = self.files.ops

            def read() -> dict:
                concurrent.futures.wait(closing)
                return read_topic_files(directory, create, ops)
            preloaded = await asyncio.get_running_loop().run_in_executor(self._opener, read)
            if name not in self.topics:  # else opened meanwhile (V1): what was read may be stale once it closes
                self._preloaded[name] = preloaded

    def topic(self, name: str) -> Topic | None:
        """The topic-partition `name`, opened (or created) on first use; None for a partitioned
        parent. StorageError when it cannot be opened (MetadataError when its metadata is the
        cause); nothing else escapes, so a front end can always answer."""
        topic = self.topics.get(name)
        if topic is None:
            if name in self._partitioned or name in self._creating:
                return None
            self.check_topic_name(name)
            directory = topic_directory(self.data_dir, name)
            if self.read_only is not None and not os.path.isdir(directory):
                raise MetadataError(f"{name} cannot be created: {self.read_only}")
            concurrent.futures.wait(self._closing.pop(name, ()))  # its last writes, if it was unloaded
            preloaded = self._preloaded.pop(name, None)
            try:
                # StorageError (logged) when the file system refuses, e.g. no descriptors left
                topic = Topic(name, directory, segment_bytes=self.segment_bytes,
                              sync_policy=self.sync_policy, on_append=self.uncommitted.add, pool=self.files,
                              cache=self.cache, new_ledger_id=self.new_ledger_id,
                              max_unacked_messages=self.max_unacked_messages_per_consumer, metadata=self.metadata,
                              deduplication=self.policies.deduplication(name), preloaded=preloaded)
            except StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever its files hold, the front end answers an error
                log.exception("topic %s cannot be opened", name)
                raise MetadataError(f"topic {name} cannot be opened: {exc}") from exc
            self.topics[name] = topic
            self.tenants.add(tenant_of(name))  # a V1 client may make topics in any tenant
        self._idle_since.pop(name, None)
        return topic

    def _deleted_path(self) -> str:
        return os.path.join(self.data_dir, "deleted")

    def delete_topic(self, name: str) -> str | None:
        """Delete topic-partition `name`: its producers and consumers are closed and its folder is
        moved out of the topics (one rename). Returns that folder, for the caller to remove off
        the event loop (a restart removes what is left); None when the topic had no files."""
        self.check_topic_name(name)
        self._preloaded.pop(name, None)
        topic = self.topics.pop(name, None)
        if topic is not None:
            topic.evict_all()
            topic.commit()
            self.uncommitted.discard(topic)
            topic.close()
        directory = topic_directory(self.data_dir, name)
        if not os.path.isdir(directory):
            return None
        os.makedirs(self._deleted_path(), exist_ok=True)
        target = os.path.join(self._deleted_path(), f"{self.generation}-{next(self._names)}")
        os.rename(directory, target)
        return target

    def delete_partitioned_topic(self, name: str) -> tuple[concurrent.futures.Future, list[str]]:
        """Delete a partitioned topic and its partitions: the write that makes it final on disk,
        and the folders to remove once it is."""
        partitions = self._partitioned.get(name)
        if partitions is None:
            raise ValueError(f"{name} is not a partitioned topic")
        if name in self._creating:
            raise ValueError(f"{name} is being given more partitions; try again once it has them")
        del self._partitioned[name]
        written = self._write_partitioned({})  # a crash before it is on disk brings it back, empty
        folders = [self.delete_topic(f"{name}{PARTITION_MARKER}{i}") for i in range(partitions)]
        return written, [folder for folder in folders if folder]

    def apply_policies(self) -> None:
        """Give open topics the policies now in force (after an admin change)."""
        for name, topic in self.topics.items():
            topic.deduplication = self.policies.deduplication(name)

    def unload_idle_topics(self, idle_timeout: float, now: float | None = None) -> int:
        """Close the topics nobody has used for `idle_timeout` seconds (no producer, consumer or
        reader, nothing pending): their files are closed and their memory given back; they open
        again on their next use. Returns how many were closed."""
        now = time.monotonic() if now is None else now
        if now - self._last_idle_scan < min(1.0, idle_timeout):  # a scan at most every second
            return 0
        self._last_idle_scan = now
        closed = 0
        for name, topic in list(self.topics.items()):
            if topic.in_use() or topic in self.uncommitted:
                self._idle_since.pop(name, None)
                continue
            since = self._idle_since.setdefault(name, now)
            if now - since < idle_timeout:
                continue
            del self._idle_since[name]
            del self.topics[name]
            self._preloaded.pop(name, None)
            self._closing[name] = topic.close()
            closed += 1
        if closed:
            self.unloaded_topics += closed
            for name in [n for n, futures in self._closing.items() if all(f.done() for f in futures)]:
                del self._closing[name]
            log.info("%d idle topics closed (%d open)", closed, len(self.topics))
        return closed

    def terminate_topic(self, name: str) -> tuple[int, concurrent.futures.Future | None]:
        """Terminate topic-partition `name`: its last entry id, and the write to wait for before answering."""
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
                continuation_chunk: bool, body: bytes | memoryview, checksum: int | None, publish_time: int,
                deliver_at_time: int | None, batch_count: int | None, compression: int | None = None) -> int:
        """Append one entry unless the topic deduplicates and the producer sent it before; returns
        its entry id or DUPLICATE. `batch`: (num_messages_in_batch or None, compression) when the
        front end read them.

        A later chunk of a chunked message shares its sequence id with the first, so it is
        never a duplicate by sequence id."""
        highest = highest_sequence(sequence_id, highest_sequence_id)
        if topic.deduplication and not continuation_chunk and highest <= topic.last_sequence.get(producer_name, -1):
            return DUPLICATE
        return topic.append(body, checksum, publish_time, deliver_at_time, batch_count, producer_name, highest,
                            compression)

    # persistence

    def commit(self) -> None:
        """Group commit: write every pending append. Runs before any receipt leaves the broker;
        a topic whose write fails marks its `log.batch` failed (logged), and the front ends
        answer an error instead of a receipt for every send in it."""
        refusal = MetadataError(self.read_only) if self.read_only is not None else None
        while self.uncommitted:
            self.uncommitted.pop().commit(refusal)

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
                    max_cache_bytes=self.cache.max_bytes, cache_evicted_entries=self.cache.evicted_entries,
                    open_topics=len(self.topics), unloaded_topics=self.unloaded_topics,
                    damaged_metadata_files=metafile.damage_count.damaged,
                    metadata_writes=self.metadata.written, metadata_write_failures=self.metadata.failed,
                    metadata_writes_coalesced=self.metadata.coalesced, read_only=self.read_only is not None)


def _broker_state(data: Any) -> int:
    generation = metafile.expect(dict)(data).get("generation", 0)
    if not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation {generation!r}")
    return generation


def _ledger_allocation(data: Any) -> int:
    next_id = metafile.expect(dict)(data)["next"]
    if not isinstance(next_id, int) or next_id < 1:
        raise ValueError(f"next ledger id {next_id!r}")
    return next_id


def _partitioned_topics(data: Any) -> dict[str, int]:
    for name, count in metafile.expect(dict)(data).items():
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"{name}: {count!r} partitions")
    return data


def close_transport(transport: asyncio.WriteTransport | None, abort: bool,
                    last_words: Callable[[], object] | None = None) -> None:
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
