"""Durable storage for the embedded broker: one segmented log per topic-partition.

One module per concern, each importing only those before it:

    files    the file system calls (FileOps), the descriptor and read-buffer pool (FilePool),
             the data dir's lock, where a topic's files live
    record   a record's layout on disk and the Entry read back
    cache    recently appended entries in memory (EntryCache), one budget per broker
    segment  one .log/.idx pair: appends, recovery, reads, its share of the page cache
    reader   a reader's place in a log and its read-ahead (LogReader)
    log      a topic-partition's log (TopicLog): group commit, roll over, sync, reads
    cursor   a subscription's acknowledged position (Cursor)

The names the broker's other layers use are offered here.
"""
from crc32c import crc32c

from .cache import DEFAULT_MAX_CACHE_BYTES, EntryCache
from .cursor import Cursor
from .files import (DEFAULT_OPS, DEFAULT_PAGE_CACHE_BYTES, DEFAULT_READ_RUNS, DIRECT_ALIGN, READ_AHEAD_BYTES,
                    READ_RUN_IDLE, DataDirInUseError, DataDirLock, FileOps, FilePool, StorageError, StorageStats,
                    default_max_open_files, descriptor_limit, topic_directory)
from .log import SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER, CommitBatch, TopicLog
from .reader import LogReader
from .record import HEADER_SIZE, RECORD_HEADER, Body, CorruptEntryError, Entry
from .segment import PREALLOCATE_BYTES, PREALLOCATE_FROM, ReadRun, Segment

__all__ = [
    "Body", "CommitBatch", "CorruptEntryError", "Cursor", "DEFAULT_MAX_CACHE_BYTES", "DEFAULT_OPS", "DEFAULT_PAGE_CACHE_BYTES",
    "DEFAULT_READ_RUNS", "DIRECT_ALIGN", "DataDirInUseError", "DataDirLock", "Entry", "EntryCache", "FileOps",
    "FilePool", "HEADER_SIZE", "LogReader", "PREALLOCATE_BYTES", "PREALLOCATE_FROM", "READ_AHEAD_BYTES",
    "READ_RUN_IDLE", "RECORD_HEADER", "ReadRun", "SYNC_ALWAYS", "SYNC_INTERVAL", "SYNC_NEVER", "Segment",
    "StorageError", "StorageStats", "TopicLog", "crc32c", "default_max_open_files", "descriptor_limit",
    "topic_directory",
]
