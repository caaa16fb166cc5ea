"""Durable storage for the embedded broker: one segmented log per topic-partition.

Appends are group-committed: `commit()` hands everything appended since the last
commit to the OS in one positioned, vectored write (`pwritev`, no joined copy), and
the broker commits before it sends any receipt, so a killed process loses nothing
acknowledged; fsync (power loss) follows the sync policy. A commit that fails (disk
full, I/O error) truncates the files back to the last good record, forgets the batch
and marks its `CommitBatch` failed, so that the broker answers an error for every
send in it.

Recovery trusts the index only as far as it is consistent, then verifies every
record after that. A torn tail (a record cut short at the end of the last segment)
is truncated; a damaged record with good records after it keeps its entry id and
reads as a `CorruptEntryError`, so one bad byte costs that entry alone. Everything
recovery drops or cannot read is logged.

Every file goes through a `FilePool`; recently appended entries stay in memory in one
`EntryCache` that every log of a broker shares, bounded by `max_cache_bytes` in all: the
least recently used log gives back its oldest entries first, and a read of an evicted
entry goes to disk.
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import contextlib
import logging
import os
import time
import weakref
from typing import Any, Callable, Iterator, Sequence

from crc32c import crc32c

from .. import staging
from .cache import Entries, EntryCache
from .files import FilePool, StorageError, StorageStats
from .reader import LogReader
from .record import RECORD_HEADER, Body, CorruptEntryError, Entry
from .segment import Segment

log = logging.getLogger("pulsarwire.broker.storage")

SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER = "always", "interval", "never"


class CommitBatch:
    """The appends of one group commit; `error` is set when the file system refused them."""

    __slots__ = ("error", "count")

    def __init__(self) -> None:
        self.error: StorageError | None = None
        self.count = 0


class TopicLog:
    """Append-only, segmented log of one topic-partition. Its recent entries live in `cache`,
    shared with the broker's other logs; without one it gets its own of `cache_bytes`."""

    def __init__(self, directory: str, *, segment_bytes: int = 64 * 1024 * 1024,
                 sync_policy: str = SYNC_INTERVAL, cache_bytes: int = 32 * 1024 * 1024,
                 pool: FilePool | None = None, cache: EntryCache | None = None) -> None:
        if sync_policy not in (SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER):
            raise ValueError(f"unknown sync policy {sync_policy!r}")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.sync_policy = sync_policy
        self._own_pool = pool is None
        self.pool = pool or FilePool()
        try:
            os.makedirs(directory, exist_ok=True)
            names = os.listdir(directory)
        except OSError as exc:
            log.error("cannot open the log in %s: %s", directory, exc)
            raise StorageError(f"cannot open the log in {directory}: {exc}") from exc
        bases = sorted(int(name[:-4]) for name in names if name.endswith(".log") and name[:-4].isdigit())
        self._segments: list[Segment] = []
        try:
            self._segments = [Segment(self.pool, directory, base) for base in bases] or \
                [Segment(self.pool, directory, 0)]
            for i, segment in enumerate(self._segments):
                is_last = i == len(self._segments) - 1
                segment.recover(is_last, None if is_last else self._segments[i + 1].base - segment.base)
                if not is_last:
                    self._check_count(segment, self._segments[i + 1].base)
            last = self._segments[-1]
            if last.expected is not None:  # its indexed tail is lost: the log goes on after those ids
                self._segments.append(Segment(self.pool, directory, last.base + last.expected))
                self._segments[-1].recover(True)
        except OSError as exc:
            for segment in self._segments:
                segment.close()
            log.error("cannot open the log in %s: %s", directory, exc)
            raise StorageError(f"cannot open the log in {directory}: {exc}") from exc
        except StorageError:
            for segment in self._segments:
                segment.close()
            raise
        # the first entry id that recovery found lost (its record gone from the disk), if any:
        # state counted from entries up to it (deduplication) cannot be trusted
        self.first_lost: int | None = None
        if self._segments[0].base > 0:
            log.error("%s: the log starts at entry %d: the segments before it are missing, entries 0 to %d "
                      "are lost", directory, self._segments[0].base, self._segments[0].base - 1)
            self.first_lost = 0
        else:
            self.first_lost = next((s.base + len(s.positions) for s in self._segments
                                    if s.expected is not None and s.expected > len(s.positions)), None)
        last = self._segments[-1]
        last.limit = segment_bytes
        self._bases = [s.base for s in self._segments]
        self.next_entry_id = last.base + len(last.positions)
        self.committed_entry_id = self.next_entry_id  # entries before it are on the OS's side
        self.batch = CommitBatch()
        self._dirty = False
        self._background_syncs: list[tuple[Segment, concurrent.futures.Future[None]]] = []  # full segments
        self._cache: Entries = collections.OrderedDict()  # oldest first
        # every reader of this log, closed with it; reads past the cache by callers that name no
        # reader of their own go through _reader
        self._readers: weakref.WeakSet[LogReader] = weakref.WeakSet()
        self._reader = self.reader()
        self._shared_cache = cache if cache is not None else EntryCache(cache_bytes)

    @staticmethod
    def _check_count(segment: Segment, next_base: int) -> None:
        expected = next_base - segment.base
        found = len(segment.positions)
        if found < expected:
            log.error("%s holds %d of its %d entries: entries %d to %d are unreadable (its end cut, or a segment "
                      "between it and the next, %020d.log, missing)", segment.log_path, found, expected,
                      segment.base + found, next_base - 1, segment.base + found)
        elif found > expected:
            log.error("%s holds %d records but the next segment starts at entry %d: %d ignored",
                      segment.log_path, found, next_base, found - expected)
            del segment.positions[expected:]
            segment.committed_count = expected
        segment.expected = expected

    @property
    def first_entry_id(self) -> int:
        return self._segments[0].base

    @property
    def last_entry_id(self) -> int:
        return self.next_entry_id - 1

    @property
    def stats(self) -> StorageStats:
        return self.pool.stats

    @property
    def size_bytes(self) -> int:
        """Bytes in the log's segments, pending records included (admin stats, metrics)."""
        return sum(segment.size for segment in self._segments)

    def append(self, body: Body, checksum: int | None, publish_time: int, num_messages: int) -> int:
        """Queue an entry; it reaches the OS at the next commit() (the broker commits before any
        receipt). It belongs to `self.batch` as it is at this call's return."""
        if checksum is None:
            checksum = crc32c(body)
        segment = self._segments[-1]
        if segment.size >= self.segment_bytes and segment.positions:
            segment = self._roll_over()
        # queued until commit and cached: it must not change meanwhile (a view of bytes is kept
        # as it is; the cache counts the whole bytes object it views)
        if type(body) is memoryview:
            if type(body.obj) is not bytes or not body.c_contiguous:
                body = bytes(body)
        elif type(body) is not bytes:
            body = bytes(body)
        size = len(body)
        segment.append(RECORD_HEADER.pack(size, checksum, publish_time, num_messages), body, size)
        entry_id = self.next_entry_id
        self.next_entry_id = entry_id + 1
        self.batch.count += 1
        self._dirty = True
        self._shared_cache.put(self, self._cache, Entry(entry_id, body, checksum, publish_time, num_messages))
        return entry_id

    def append_many(self, bodies: Sequence[Body], checksums: Sequence[int], publish_times: Sequence[int],
                    counts: list[int]) -> int:
        """Queue entries as append() does, one after another (the hot path of a run of sends),
        up to one that must start a new segment, which is left to append(); how many were queued.
        Every checksum is known."""
        segment = self._segments[-1]
        size, limit = segment.size, self.segment_bytes
        if size >= limit and segment.positions:
            return 0
        entry_id = self.next_entry_id
        records, positions, entries, size = staging.stage_entries(bodies, checksums, publish_times, counts, entry_id,
                                                                  size, limit, RECORD_HEADER, Entry)
        if entries:
            segment.append_staged(records, positions, size)
            self.next_entry_id = entry_id + len(entries)
            self.batch.count += len(entries)
            self._dirty = True
            self._shared_cache.put_many(self, self._cache, entries)
        return len(entries)

    def _roll_over(self) -> Segment:
        """Commit and fsync the full segment, then start the next one (StorageError if it cannot).
        Under the `always` policy its commits were fsynced already; under the others the fsync of
        the full segment (tens of MB to the disk) runs on a worker thread, so that the event loop
        goes on meanwhile: the next sync() checks it and tries a failed one again."""
        batch = self.batch
        if not self.commit():
            # the entries before this one failed: this one must not be stored after the gap
            raise StorageError(f"not stored after a failed commit: {batch.error}")
        old = self._segments[-1]
        if self.sync_policy == SYNC_ALWAYS:
            try:
                old.commit(sync=True)
                old.drop_range(0, old.committed_size)
            except StorageError as exc:
                self.stats.failed_syncs += 1
                log.error("%s: fsync before starting a new segment failed: %s", old.log_path, exc)
        else:
            if self._background_syncs:  # also where the never policy, which has no sync(), sees them
                self._check_background_syncs(wait=False)
            self._background_syncs.append((old, self.pool.sync_later([old.log_path, old.idx_path], drop=True)))
        old.release_preallocation()
        segment = Segment(self.pool, self.directory, self.next_entry_id)
        segment.limit = self.segment_bytes
        self._segments.append(segment)
        self._bases.append(segment.base)
        return segment

    def commit(self, refusal: StorageError | None = None) -> bool:
        """Write what was appended (with the `always` policy, fsync it too). Returns False when
        the file system refused, or `refusal` says the broker cannot write (a read-only start):
        the batch is rolled back and `batch.error` says why."""
        batch = self.batch
        if not batch.count:
            return True
        self.batch = CommitBatch()
        segment = self._segments[-1]
        try:
            if refusal is not None:
                segment._roll_back()
                raise refusal
            segment.commit(sync=self.sync_policy == SYNC_ALWAYS)
        except StorageError as exc:
            batch.error = exc
            self.stats.failed_commits += 1
            lost_from = segment.base + len(segment.positions)
            log.error("%s: a group commit of %d entries failed, rolled back to entry %d: %s",
                      self.directory, batch.count, lost_from - 1, exc)
            for entry_id in range(lost_from, self.next_entry_id):
                self._shared_cache.discard(self._cache, entry_id)
            self.next_entry_id = lost_from
            self.committed_entry_id = lost_from
            return False
        if self.sync_policy == SYNC_ALWAYS:
            self._dirty = False
        self.committed_entry_id = self.next_entry_id
        return True

    def skip_to(self, entry_id: int) -> None:
        """Go on from `entry_id`: the ids before it, past the last entry held, are lost entries
        (read as lost, never given to new messages). On open, before any append."""
        if entry_id <= self.next_entry_id:
            return
        lost = self.next_entry_id
        old = self._segments[-1]
        old.expected = entry_id - old.base
        old.release_preallocation()
        segment = Segment(self.pool, self.directory, entry_id)
        segment.recover(True)
        segment.limit = self.segment_bytes
        self._segments.append(segment)
        self._bases.append(entry_id)
        self.next_entry_id = self.committed_entry_id = entry_id
        self.first_lost = lost if self.first_lost is None else min(self.first_lost, lost)

    def reader(self) -> LogReader:
        """A reader of this log of its own (a subscription's): its reads in order past the entry
        cache read ahead for it alone, wherever the log's other readers are."""
        reader = LogReader(self, self.pool)
        self._readers.add(reader)
        return reader

    def cached_entries(self, start: int, end: int) -> Iterator[Any]:  # Entry; v1's CONSUME reuses its variable for None
        """Yield entries start..end-1 held by the entry cache, in order, up to the first that is
        not (read() reads it); the cache is touched once (a reader of many entries)."""
        cache = self._cache
        entry = cache.get(start)
        if entry is None:
            return
        self._shared_cache.touch(self)
        yield entry
        for entry_id in range(start + 1, end):
            entry = cache.get(entry_id)
            if entry is None:
                return
            yield entry

    def read(self, entry_id: int, reader: LogReader | None = None) -> Entry:
        """The entry; KeyError outside the log, CorruptEntryError (logged) when it is unreadable,
        StorageError when the file system refuses. `reader`: whose reads these are (see
        reader()); the log's own when None."""
        cached = self._cache.get(entry_id)
        if cached is not None:
            self._shared_cache.touch(self)
            return cached
        if not self.first_entry_id <= entry_id < self.next_entry_id:
            raise KeyError(entry_id)
        if reader is None:
            reader = self._reader
        elif reader.log is not self:
            raise ValueError("a reader of another log")
        i = bisect.bisect_right(self._bases, entry_id) - 1
        segment = self._segments[i]
        index = entry_id - segment.base
        in_order, reader.next_read = entry_id == reader.next_read, entry_id + 1
        try:
            run = reader.run
            if run is not None and run.segment is segment and run.first <= index < run.end:
                reader.used_at = time.monotonic()  # still reading: its buffers stay its own
                entry = segment.record_in(run, index)
            elif (run := reader.landed(segment, index)) is not None:  # read alone, off the loop
                entry = segment.record_in(run, index)
                if in_order:
                    reader.done_before(segment, run.start, run.start + len(run.data))
            elif in_order and index < segment.committed_count:
                # read in order past the entry cache (a backlog): the records after it come with
                # it, and the run after that is read meanwhile; past the pool's budget of readers
                # with buffers, one record at a time
                buffers = self.pool.run_buffers(reader)
                if buffers is None:
                    entry = segment.read(index)
                    reader.done_before(segment, segment.positions[index], segment.record_end(index))
                else:
                    run = reader.prefetched(segment, index)
                    if run is None:
                        reader.run = None  # its buffer is read into again
                        run = segment.read_run(index, buffers[0])
                    reader.run = run
                    reader.done_before(segment, run.start, run.start + len(run.data))
                    reader.prefetch_after(segment, run)
                    entry = segment.record_in(run, index)
            else:
                entry = segment.read(index)
        except CorruptEntryError as exc:
            self.stats.corrupt_entries += 1
            log.error("%s: %s", self.directory, exc)
            raise
        return entry

    def read_pending(self, entry_id: int, reader: LogReader | None = None) -> concurrent.futures.Future[int] | None:
        """None when read(entry_id, reader) needs no disk read now (the entry is cached, read
        ahead, not yet handed to the OS, or outside the log); else the future of that read,
        started on the pool's reader thread (LogReader.wait_for): once it is done, read() takes
        what it read. A caller on the event loop asks this first, so that the loop never waits
        on the disk."""
        if reader is None:
            reader = self._reader
        run = reader.run
        if run is not None and run.first <= entry_id - run.segment.base < run.end:
            return None  # the hot path of a backlog: in the run read ahead (read() checks the log)
        if entry_id in self._cache or not self.first_entry_id <= entry_id < self.next_entry_id:
            return None
        if reader.log is not self:
            return None  # read() refuses it
        i = bisect.bisect_right(self._bases, entry_id) - 1
        segment = self._segments[i]
        index = entry_id - segment.base
        if index >= segment.committed_count:
            return None
        return reader.wait_for(segment, index, entry_id == reader.next_read)

    async def read_off_loop(self, entry_id: int, reader: LogReader | None = None) -> Entry:
        """read(), its disk read made on the reader thread while the event loop goes on."""
        await self.landed(entry_id, reader)
        return self.read(entry_id, reader)

    async def landed(self, entry_id: int, reader: LogReader | None = None) -> None:
        """Return once read(entry_id, reader) needs no disk read (read_pending), waiting off the
        event loop for the reads it starts."""
        for _ in range(3):  # a read ahead of another place in flight, then this one's
            pending = self.read_pending(entry_id, reader)
            if pending is None:
                return
            with contextlib.suppress(Exception):  # read() reads it again and reports what fails
                await asyncio.wrap_future(pending)

    async def find_by_publish_time(self, publish_time: int, stamp_of: Callable[[Entry], int] | None = None) -> int:
        """The first entry published at or after `publish_time` (next_entry_id if none); its
        reads are made off the event loop. `stamp_of(entry)`: its publish time (default: the
        record header's, which its checksum does not cover; a caller that can read the time
        from the checked body passes that)."""
        lo, hi = self.first_entry_id, self.next_entry_id
        while lo < hi:
            mid = (lo + hi) // 2
            probe = mid
            while probe < hi:  # an unreadable entry: compare with the next readable one
                try:
                    entry = await self.read_off_loop(probe)
                    stamp = entry.publish_time if stamp_of is None else stamp_of(entry)
                    break
                except StorageError:
                    probe += 1
            else:
                hi = mid
                continue
            if stamp < publish_time:
                lo = probe + 1
            else:
                hi = mid
        return lo

    def _check_background_syncs(self, wait: bool) -> None:
        """Count and log each failed fsync of a full segment, and start it again; with `wait`,
        wait for them and retry a failed one here."""
        running = []
        for segment, future in self._background_syncs:
            if not wait and not future.done():
                running.append((segment, future))
                continue
            exc = future.exception()
            if exc is None:
                continue
            self.stats.failed_syncs += 1
            log.error("%s: fsync of the full segment failed: %s; trying again", segment.log_path, exc)
            if wait:
                try:
                    segment.fsync()
                except StorageError as again:
                    self.stats.failed_syncs += 1
                    log.error("%s: %s", segment.log_path, again)
            else:
                running.append((segment, self.pool.sync_later([segment.log_path, segment.idx_path],
                                                              drop=segment is not self._segments[-1])))
        self._background_syncs = running

    def sync(self, background: bool = False) -> None:
        """Commit, then fsync what is not yet (StorageError if the fsync fails; retried next time).
        With `background` the fsync runs on the worker thread, and a failure is counted, logged
        and tried again by a later sync()."""
        if self._background_syncs:
            self._check_background_syncs(wait=False)
        self.commit()
        if self._dirty and background:
            segment = self._segments[-1]
            if not any(s is segment for s, _ in self._background_syncs):  # else: next time
                self._dirty = False
                self._background_syncs.append((segment, self.pool.sync_later([segment.log_path, segment.idx_path])))
            return
        if self._dirty:
            try:
                self._segments[-1].commit(sync=True)
            except StorageError:
                self.stats.failed_syncs += 1
                raise
            self._dirty = False

    def close(self) -> None:
        try:
            if self.sync_policy != SYNC_NEVER:
                self.sync()
            else:
                self.commit()
        except StorageError as exc:
            log.error("%s: closing: %s", self.directory, exc)
        self._check_background_syncs(wait=True)
        self._segments[-1].release_preallocation()
        for reader in list(self._readers):
            reader.close()
        self._shared_cache.drop(self, self._cache)
        for segment in self._segments:
            segment.close()
        if self._own_pool:
            self.pool.stop_syncs()
