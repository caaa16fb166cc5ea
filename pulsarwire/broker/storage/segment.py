"""One segment of a log: `<first entry id>.log` and its index `<first entry id>.idx`. Appends are
queued and written at commit in one vectored write; recovery checks what the files hold; reads
take one record, or a run of them into a reader's buffer. The page cache its writes and reads
use is kept bounded here (write-behind, pages given back)."""
from __future__ import annotations

import array
import bisect
import concurrent.futures
import errno
import functools
import logging
import mmap
import os

from crc32c import crc32c

from .files import DIRECT_ALIGN, FileOps, FilePool, StorageError
from .record import BODY_SIZE, HEADER_SIZE, RECORD_HEADER, Body, CorruptEntryError, Entry, count_gap, damaged_records, \
    decode_index, encode_index, record_at

log = logging.getLogger("pulsarwire.broker.storage")

PREALLOCATE_BYTES = 16 * 1024 * 1024  # disk blocks a segment being written keeps allocated ahead of its end
PREALLOCATE_FROM = 1024 * 1024  # ... once it holds this much (then as much as it holds, up to the above)


class ReadRun:
    """Records of one segment read at once (Segment.read_run): entries `first` to `end` - 1, whose
    bytes from file position `start` on are in `data` (a reader's buffer, or bytes of their own)."""

    __slots__ = ("segment", "first", "end", "start", "data")

    def __init__(self, segment: Segment, first: int, end: int, start: int, data: bytes | memoryview) -> None:
        self.segment = segment
        self.first = first
        self.end = end
        self.start = start
        self.data = data

    def holds(self, segment: Segment, index: int) -> bool:
        return self.segment is segment and self.first <= index < self.end


class PendingRun:
    """A ReadRun being read into `buffer` on the pool's reader thread (Segment.prefetch_run);
    `future` gives the bytes read."""

    __slots__ = ("segment", "first", "end", "start", "future", "buffer")

    def __init__(self, segment: Segment, first: int, end: int, start: int, future: concurrent.futures.Future[int],
                 buffer: mmap.mmap | bytearray) -> None:
        self.segment = segment
        self.first = first
        self.end = end
        self.start = start
        self.future = future
        self.buffer = buffer


class Segment:
    def __init__(self, pool: FilePool, directory: str, base: int) -> None:
        self.pool = pool
        self.ops = pool.ops
        self.base = base
        self.log_path = os.path.join(directory, f"{base:020d}.log")
        self.idx_path = os.path.join(directory, f"{base:020d}.idx")
        self.positions: array.array[int] = array.array("Q")
        self.size = self.ops.size(pool.fd(self.log_path))  # bytes, pending records included
        self.committed_size = self.size  # bytes on the OS's side
        self.committed_count = 0  # entries on the OS's side
        self.index_bytes_on_disk = 0
        # the page cache this segment's appends keep: writeback was started up to _written_back,
        # and pages before _dropped were given back (see commit)
        self._written_back = self._dropped = self.committed_size
        # blocks allocated up to _allocated, at most up to `limit` (the log's segment size; 0 for
        # a segment no longer written): see _preallocate
        self.limit = 0
        self._allocated = self.committed_size
        self.expected: int | None = None  # entries a non-last segment must hold (from the next base)
        self._pending: list[Body] = []  # header, body, ... of the records appended since the last commit

    # recovery

    def recover(self, last: bool, expected: int | None = None) -> None:
        """Load the index, trust it as far as it is consistent, verify the rest of the log and
        rebuild the index from it. Logs every byte it drops and every record it cannot read.
        `expected`: how many entries the segment holds, where that is known (one that is not the
        last: the next one's first id less its own), for a damaged range that cannot be counted."""
        ops = self.ops
        size = self.size
        indexed, trusted = self._trusted_index(size)
        # the last trusted record is verified again, with everything after it
        keep = max(trusted - 1, 0)
        start = indexed[keep] if trusted else 0
        positions = indexed[:keep]
        fd = self.pool.fd(self.log_path)
        buf = ops.pread(fd, size - start, start) if size > start else b""
        end = len(buf)
        offset = 0
        uncounted: list[int] = []  # where in positions a damaged range of unknown size counts as one entry
        while offset < end:
            body_size = record_at(buf, offset, end)
            if body_size is not None:
                positions.append(start + offset)
                offset += HEADER_SIZE + body_size
                continue
            # a bad record: find the next good one
            found = next((o for o in range(offset + 1, end - HEADER_SIZE + 1)
                          if record_at(buf, o, end) is not None), None)
            if found is None and offset + HEADER_SIZE <= end and \
                    offset + HEADER_SIZE + BODY_SIZE.unpack_from(buf, offset)[0] == end:
                # a whole record that fails its checksum, last in the file: keep its entry id
                self.pool.stats.dropped_bytes += end - offset
                log.error("%s: the last record (entry %d, byte %d) fails its checksum; it reads as corrupt",
                          self.log_path, self.base + len(positions), start + offset)
                positions.append(start + offset)
                break
            if found is None:
                dropped = end - offset
                self.pool.stats.dropped_bytes += dropped
                if last and len(indexed) <= len(positions):  # not indexed yet: a write a crash cut short
                    log.warning("%s: a torn record at byte %d (entry %d): %d bytes truncated",
                                self.log_path, start + offset, self.base + len(positions), dropped)
                    ops.truncate(fd, start + offset)
                    size = start + offset
                else:  # (an indexed record damaged: kept, and its entry id with it, below)
                    log.error("%s: bytes %d to %d hold no readable record (entry %d onwards is lost)",
                              self.log_path, start + offset, start + end, self.base + len(positions))
                end = offset
                break
            hops, counted = damaged_records(buf, offset, found, [p - start for p in indexed if p >= start])
            if not counted:
                uncounted.append(len(positions))
            self.pool.stats.dropped_bytes += found - offset
            log.error("%s: bytes %d to %d are damaged: entr%s %s unreadable, the %d bytes after are kept",
                      self.log_path, start + offset, start + found, "y" if len(hops) == 1 else "ies",
                      ", ".join(str(self.base + len(positions) + i) for i in range(len(hops))), end - found)
            positions.extend(start + h for h in hops)
            offset = found
        if expected is not None and uncounted:
            gap = uncounted[0]
            added = count_gap(positions, uncounted, expected, start + end)
            if added:
                log.error("%s: the damaged bytes from %d hold %d entries by the segment's count (the next segment "
                          "starts at entry %d): entries %d to %d are unreadable, the ids after them are kept",
                          self.log_path, positions[gap], added + 1, self.base + expected, self.base + gap,
                          self.base + gap + added)
        self.size = self.committed_size = start + end
        self.positions = positions
        if last and len(indexed) > len(positions):
            # Written, indexed (so stored whole before its index entry), then lost: entries a
            # client may have been told are stored. Their ids are kept from new messages (the log
            # goes on in a new segment after them) and read as lost.
            self.expected = len(indexed)
            log.error("%s: its index lists %d entries but the log holds %d: entries %d to %d are lost "
                      "(damaged or cut from the file); their ids are not given to new messages",
                      self.log_path, len(indexed), len(positions), self.base + len(positions),
                      self.base + len(indexed) - 1)
        if positions != indexed:
            self._rewrite_index()
        self.committed_count = len(self.positions)
        self.index_bytes_on_disk = 8 * len(self.positions)

    def _trusted_index(self, size: int) -> tuple[array.array[int], int]:
        """The index file's positions, and how many of them (from the first) agree with a log of
        `size` bytes; the rest is logged."""
        try:
            idx_fd = self.pool.fd(self.idx_path)
            indexed = decode_index(self.ops.pread(idx_fd, self.ops.size(idx_fd), 0))
        except OSError as exc:
            log.error("%s is unreadable (%s); rebuilding it from the log", self.idx_path, exc)
            indexed = array.array("Q")
        trusted = 0
        previous = -HEADER_SIZE
        for position in indexed:
            if position - previous < HEADER_SIZE or position >= size or (trusted == 0 and position != 0):
                break
            previous = position
            trusted += 1
        if trusted < len(indexed):
            log.warning("%s: %d of %d index entries are inconsistent with the log from entry %d; "
                        "rebuilding the index by scanning the log", self.idx_path, len(indexed) - trusted,
                        len(indexed), self.base + trusted)
        return indexed, trusted

    def _rewrite_index(self) -> None:
        try:
            fd = self.pool.fd(self.idx_path)
            self.ops.truncate(fd, 0)
            data = encode_index(self.positions)
            if data:
                self.ops.pwrite(fd, data, 0)
        except (OSError, StorageError) as exc:
            # the log is the truth; the next open rebuilds the index again
            log.error("%s: cannot rewrite the index: %s", self.idx_path, exc)

    # appends

    def append(self, header: bytes, body: Body, body_size: int) -> None:
        """Queue one record as its header and body (written together, at commit)."""
        pos = self.size
        self._pending += (header, body)
        self.positions.append(pos)
        self.size = pos + HEADER_SIZE + body_size

    def append_staged(self, records: list[Body], positions: list[int], size: int) -> None:
        """Queue records as append() does, many at once: `records` alternates headers and bodies,
        `positions` holds where each starts and `size` where the last ends (staging.stage_entries)."""
        self.positions.extend(positions)
        self._pending += records
        self.size = size

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def commit(self, sync: bool) -> None:
        """Write every pending record and its index entries at their positions (fsync too with
        `sync`). On failure both files are cut back to the last commit, the pending records are
        forgotten, and StorageError is raised."""
        if not self._pending:
            if sync:
                self.fsync()
            return
        ops = self.ops
        index_bytes = encode_index(self.positions[self.committed_count:])  # the pending records' positions
        try:
            fd = self.pool.fd(self.log_path)
            _write_all(ops, fd, self._pending, self.committed_size, self.size - self.committed_size)
            idx_fd = self.pool.fd(self.idx_path)
            index = memoryview(index_bytes)
            offset = self.index_bytes_on_disk
            while index:
                written = ops.pwrite(idx_fd, index, offset)
                index = index[written:]
                offset += written
            if sync:  # fetched again: opening the index may have closed the log's descriptor
                ops.fsync(self.pool.fd(self.log_path))
                ops.fsync(self.pool.fd(self.idx_path))
        except (OSError, StorageError) as exc:
            pending_bytes = self.size - self.committed_size
            self._roll_back()
            raise StorageError(f"{self.log_path}: cannot write {pending_bytes} bytes: {exc}") from exc
        self.committed_size = self.size
        self.committed_count = len(self.positions)
        self.index_bytes_on_disk += len(index_bytes)
        self._pending.clear()
        window = self.pool.page_cache_bytes
        if window and self.committed_size - self._written_back >= window // 2:
            self._write_behind(window)
        ahead = min(PREALLOCATE_BYTES, self.committed_size)
        if self.limit and ahead >= PREALLOCATE_FROM and self.committed_size + ahead // 2 > self._allocated:
            self._preallocate(ahead)

    def _preallocate(self, ahead: int) -> None:
        """Keep `ahead` bytes of disk blocks allocated past the end (never past the segment's
        size): as much as the segment holds, at most PREALLOCATE_BYTES, from PREALLOCATE_FROM on,
        so that what a segment reserves and does not use is never more than what it holds, and a
        small topic reserves nothing. Writes into allocated blocks skip the file
        system's block allocation (ext4: delayed allocation work on every page written): raw
        ingest of 100 messages per entry took 0.089-0.107 rather than 0.108-0.113 s of CPU per million
        messages. The file's size does not change, so nothing that reads it sees a difference.
        A refusal (a file system without it, a full disk) only stops it for this segment."""
        start = max(self._allocated, self.committed_size)
        target = min(self.limit, self.committed_size + ahead)
        if target <= start:
            return
        try:
            self.ops.preallocate(self.pool.fd(self.log_path), start, target - start)
        except (OSError, StorageError) as exc:
            log.info("%s: no preallocation: %s", self.log_path, exc)
            self.limit = 0
            return
        self._allocated = target

    def _write_behind(self, window: int) -> None:
        """Keep what the appends hold of the page cache near `window`: start the writeback of
        what was written since the last call, and give back the pages more than `window` behind
        the end (written back by now; any still dirty or in writeback are kept by the OS, and
        asked again next time). A new page cache page can cost more than the copy into it (on
        some VMs, ten times as much once a few GB are cached), and readers of what is not in
        the entry cache read ahead in large reads (TopicLog.read). Failures are only logged:
        this changes nothing on disk."""
        try:
            fd = self.pool.fd(self.log_path)
            self.ops.start_writeback(fd, self._written_back, self.committed_size - self._written_back)
            self._written_back = self.committed_size
            upto = self.committed_size - window
            start = max(0, self._dropped - window // 2)  # again what was kept last time
            if upto > start:
                self.ops.drop_cached(fd, start, upto - start)
                self._dropped = upto
        except (OSError, StorageError) as exc:
            log.warning("%s: page cache write-behind: %s", self.log_path, exc)

    def release_preallocation(self) -> None:
        """No more writes here (a full segment, a closing log): give back the blocks allocated
        past the end. A truncate to the size the file has frees them; the data is untouched.
        Where writes are pending it is left alone (a crash leaves at most what _preallocate
        reserved, no more than the segment holds)."""
        if self._allocated > self.committed_size and self.size == self.committed_size:
            try:
                self.ops.truncate(self.pool.fd(self.log_path), self.committed_size)
            except (OSError, StorageError) as exc:
                log.warning("%s: giving back preallocated blocks: %s", self.log_path, exc)
        self._allocated = self.committed_size
        self.limit = 0

    def drop_range(self, offset: int, size: int) -> None:
        """Give back the pages of these bytes, done with (a reader's, a full segment's once
        written back), when the page cache is bounded."""
        if self.pool.page_cache_bytes:
            try:
                self.ops.drop_cached(self.pool.fd(self.log_path), offset, size)
            except (OSError, StorageError) as exc:
                log.warning("%s: page cache: %s", self.log_path, exc)

    def _roll_back(self) -> None:
        del self.positions[self.committed_count:]
        self.size = self.committed_size
        self._pending.clear()
        for path, size in ((self.log_path, self.committed_size), (self.idx_path, self.index_bytes_on_disk)):
            try:
                self.ops.truncate(self.pool.fd(path), size)
            except (OSError, StorageError) as exc:
                # later writes are positioned, so the leftover is overwritten or cut by recovery
                log.error("%s: cannot truncate back to %d bytes: %s", path, size, exc)

    def fsync(self) -> None:
        try:
            self.ops.fsync(self.pool.fd(self.log_path))
            self.ops.fsync(self.pool.fd(self.idx_path))
        except OSError as exc:
            raise StorageError(f"{self.log_path}: fsync failed: {exc}") from exc

    # reads

    def read(self, index: int) -> Entry:
        entry_id = self.base + index
        if index >= len(self.positions):
            raise CorruptEntryError(f"{self.log_path}: entry {entry_id} is missing (its record is lost)",
                                    entry_id)
        if index >= self.committed_count:
            k = 2 * (index - self.committed_count)
            body_size, checksum, publish_time, num_messages = RECORD_HEADER.unpack(self._pending[k])
            return Entry(entry_id, self._pending[k + 1], checksum, publish_time, num_messages)
        pos = self.positions[index]
        raw = self._pread(pos, self.record_end(index) - pos, entry_id)
        try:
            return self._record(raw, 0, len(raw), entry_id)
        except CorruptEntryError:
            if len(raw) < HEADER_SIZE or index + 1 >= self.committed_count:
                raise
            declared = HEADER_SIZE + RECORD_HEADER.unpack_from(raw, 0)[0]  # the index may cut it short
            if declared <= len(raw) or pos + declared > self.committed_size:
                raise
            return self._record(self._pread(pos, declared, entry_id), 0, declared, entry_id)

    def record_end(self, index: int) -> int:
        return self.positions[index + 1] if index + 1 < self.committed_count else self.committed_size

    def _pread(self, pos: int, size: int, entry_id: int) -> bytes:
        try:
            return self.ops.pread(self.pool.fd(self.log_path), size, pos)
        except OSError as exc:
            log.error("%s: reading entry %d: %s", self.log_path, entry_id, exc)
            raise StorageError(f"{self.log_path}: reading entry {entry_id}: {exc}") from exc

    def _record(self, raw: bytes | memoryview, start: int, stop: int, entry_id: int) -> Entry:
        """The record raw[start:stop] (stop may be past what a short read got), checked; its body
        as bytes of its own (raw may be a buffer read into again)."""
        if stop - start < HEADER_SIZE or stop > len(raw):
            raise CorruptEntryError(f"{self.log_path}: entry {entry_id} is cut short", entry_id)
        body_size, checksum, publish_time, num_messages = RECORD_HEADER.unpack_from(raw, start)
        body = bytes(raw[start + HEADER_SIZE:stop])
        if body_size != len(body) or crc32c(body) != checksum or body_size == 0:
            end = start + HEADER_SIZE + body_size
            # an entry is never empty: a zero header (zeroed bytes; 0 is the CRC32C of no bytes) is no record
            if body_size != len(body) and body_size and end <= len(raw) and \
                    crc32c(raw[start + HEADER_SIZE:end]) == checksum:
                return self._next_position_wrong(raw, start, end, entry_id)
            raise CorruptEntryError(f"{self.log_path}: entry {entry_id} fails its checksum", entry_id)
        return Entry(entry_id, body, checksum, publish_time, num_messages)

    def _next_position_wrong(self, raw: bytes | memoryview, start: int, end: int, entry_id: int) -> Entry:
        """The record at raw[start:] is whole and good by its own header, but the index puts the
        next record elsewhere (a damaged index entry, which opening the segment cannot tell from
        a good one without reading every record): the record is read by its header, and the
        next position corrected, in memory at once (the next entry reads too) and in the index
        file on the fsync thread."""
        body_size, checksum, publish_time, num_messages = RECORD_HEADER.unpack_from(raw, start)
        index = entry_id - self.base + 1
        right = self.positions[index - 1] + (end - start)
        if index < self.committed_count and self.positions[index] != right and \
                (index + 1 >= self.committed_count or right < self.positions[index + 1]) and \
                (record_at(raw, end, len(raw)) is not None or self._record_starts_at(right)):
            log.warning("%s: the index puts entry %d at byte %d, the log at %d; corrected", self.idx_path,
                        self.base + index, self.positions[index], right)
            self.positions[index] = right
            repair = self.pool.write_later(self.idx_path, encode_index(self.positions[index:index + 1]), 8 * index)
            repair.add_done_callback(functools.partial(_report_repair, self.idx_path, self.base + index))
        return Entry(entry_id, bytes(raw[start + HEADER_SIZE:end]), checksum, publish_time, num_messages)

    def _record_starts_at(self, pos: int) -> bool:
        """Whether a whole, checksummed, committed record starts at file position `pos`: what an
        index position must point at before it is corrected to `pos` (a record that only looks
        whole must not walk the index into damage). Read here, as read() reads: only where the
        bytes already read do not hold that record, and only for a wrong index entry."""
        try:
            head = self.ops.pread(self.pool.fd(self.log_path), HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                return False
            body_size = RECORD_HEADER.unpack_from(head, 0)[0]
            if body_size == 0 or pos + HEADER_SIZE + body_size > self.committed_size:
                return False
            raw = head + self.ops.pread(self.pool.fd(self.log_path), body_size, pos + HEADER_SIZE)
        except (OSError, StorageError):
            return False
        return record_at(raw, 0, len(raw)) == body_size

    def _plan_run(self, index: int, limit: int) -> tuple[int, int, int]:
        """The committed records from `index` on that fit in `limit` bytes (one at least):
        (end index, file position, end position)."""
        pos = self.positions[index]
        count = self.committed_count
        k = bisect.bisect_right(self.positions, pos + limit, index + 1, count)
        if k == count and self.committed_size - pos <= limit:
            end_index = count
        else:
            end_index = max(index + 1, k - 1)
        return end_index, pos, self.positions[end_index] if end_index < count else self.committed_size

    def _run_source(self, pos: int, end: int) -> tuple[int, int, int, bool]:
        """Where a run of [pos, end) is read from: (descriptor, first byte, last byte, whether
        it is O_DIRECT), whole blocks of an O_DIRECT descriptor where the file system has one."""
        fd = self.pool.direct_fd(self.log_path)
        if fd is None:
            return self.pool.fd(self.log_path), pos, end, False
        return fd, pos - pos % DIRECT_ALIGN, -(-end // DIRECT_ALIGN) * DIRECT_ALIGN, True

    def read_run(self, index: int, buffer: mmap.mmap) -> ReadRun:
        """The committed records from `index` on, as many as fit in `buffer` (one at least: when
        it does not fit, in bytes of its own), with one read, for record_in(). The buffer is the reader's own,
        used again for each run (a new one per read would be new memory each time)."""
        limit = len(buffer) - 2 * DIRECT_ALIGN  # room to round both ends out to whole blocks
        end_index, pos, end = self._plan_run(index, limit)
        if end - pos > limit:  # one record bigger than the buffer
            return ReadRun(self, index, end_index, pos, self._pread(pos, end - pos, self.base + index))
        try:
            fd, start, stop, direct = self._run_source(pos, end)
            try:
                got = self.ops.pread_into(fd, memoryview(buffer)[:stop - start], start)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not direct:
                    raise
                self.pool.direct_reads = False  # this file system refuses them after all
                log.info("reads of backlogs go through the page cache: %s", exc)
                start = pos
                got = self.ops.pread_into(self.pool.fd(self.log_path), memoryview(buffer)[:end - pos], pos)
        except OSError as exc:
            log.error("%s: reading entry %d: %s", self.log_path, self.base + index, exc)
            raise StorageError(f"{self.log_path}: reading entry {self.base + index}: {exc}") from exc
        return ReadRun(self, index, end_index, start, memoryview(buffer)[:got])

    def prefetch_run(self, index: int, buffer: mmap.mmap) -> PendingRun | None:
        """Start read_run(index) into `buffer` on the pool's reader thread, through a duplicate of
        the descriptor (the pool may close its own meanwhile), or None where it cannot (read_run
        then reads it when asked)."""
        limit = len(buffer) - 2 * DIRECT_ALIGN
        end_index, pos, end = self._plan_run(index, limit)
        if end - pos > limit:
            return None
        try:
            fd, start, stop, _ = self._run_source(pos, end)
            duplicate = os.dup(fd)
        except (OSError, StorageError):
            return None
        future = self.pool.read_later(duplicate, memoryview(buffer)[:stop - start], start)
        return PendingRun(self, index, end_index, start, future, buffer)

    def read_later(self, index: int) -> PendingRun | None:
        """Start reading committed record `index` alone, into bytes of its own, on the pool's
        reader thread, through a duplicate of the descriptor; None where it cannot (read() then
        reads it when asked, and reports what fails)."""
        if not 0 <= index < self.committed_count or index >= len(self.positions):
            return None
        pos = self.positions[index]
        end = self.record_end(index)
        try:
            duplicate = os.dup(self.pool.fd(self.log_path))
        except (OSError, StorageError):
            return None
        buffer = bytearray(end - pos)
        return PendingRun(self, index, index + 1, pos, self.pool.read_later(duplicate, memoryview(buffer), pos), buffer)

    def record_in(self, run: ReadRun, index: int) -> Entry:
        """Entry `index` out of a read_run() that holds it, checked as read() checks it."""
        base = run.start
        return self._record(run.data, self.positions[index] - base, self.record_end(index) - base, self.base + index)

    def close(self) -> None:
        self.pool.release(self.log_path)
        self.pool.release(self.idx_path)


def _report_repair(path: str, entry_id: int, done: concurrent.futures.Future[None]) -> None:
    error = done.exception()
    if error is not None:  # the index keeps the wrong position; the next open reads around it again
        log.error("%s: cannot correct the index entry of entry %d: %s", path, entry_id, error)


_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 16


def _write_all(ops: FileOps, fd: int, buffers: list[Body], offset: int, total: int) -> None:
    """Write `buffers` (`total` bytes) in order from `offset` with `ops.pwritev` (no joined
    copy), in calls of at most IOV_MAX buffers, going on after a short write from where it stopped."""
    while True:
        chunk = buffers if len(buffers) <= _IOV_MAX else buffers[:_IOV_MAX]
        written = ops.pwritev(fd, chunk, offset)
        if written == total:
            return
        if written <= 0:
            raise OSError(errno.EIO, "the file system took none of the bytes written")
        offset += written
        total -= written
        done = 0
        for buffer in chunk:  # what was written in full; a partly written one goes on from its rest
            if written < len(buffer):
                break
            written -= len(buffer)
            done += 1
        buffers = buffers[done:]
        if written:
            buffers[0] = memoryview(buffers[0])[written:]
