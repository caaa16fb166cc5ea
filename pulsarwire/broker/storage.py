"""Durable storage for the embedded broker: one segmented log per topic-partition.

A segment is `<first entry id>.log` plus `<first entry id>.idx`. Log records:

    [u32 body_size][u32 CRC32C(body)][u64 publish_time][u32 num_messages][body]

where body is the entry exactly as the producer framed it: `[u32 metadata
size][MessageMetadata][payload]`, the span the wire checksum covers, so the
stored CRC doubles as the checksum of every Message frame that re-sends it. The
.idx file holds one u64 file position per entry.

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

Every file goes through a `FilePool`: an LRU of open descriptors bounded by
`max_open_files` (idle segments are closed and reopened on demand), and a
`FileOps` whose calls tests replace to inject faults (ENOSPC, EIO, EMFILE).
Recently appended entries stay in memory in one `EntryCache` that every log of a
broker shares, bounded by `max_cache_bytes` in all: the least recently used log
gives back its oldest entries first, and a read of an evicted entry goes to disk.
"""
from __future__ import annotations

import array
import bisect
import collections
import concurrent.futures
import contextlib
import ctypes
import errno
import logging
import mmap
import os
import struct
import sys
import time
import urllib.parse
import weakref

from crc32c import crc32c

from . import staging

log = logging.getLogger("pulsarwire.broker.storage")

_HEADER = struct.Struct(">IIQI")
_U32 = struct.Struct(">I")
HEADER_SIZE = _HEADER.size
SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER = "always", "interval", "never"
_BIG_ENDIAN = sys.byteorder == "big"
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
DEFAULT_MAX_CACHE_BYTES = 64 * 1024 * 1024  # cached entry bodies, all logs of a broker together
DEFAULT_PAGE_CACHE_BYTES = 16 * 1024 * 1024  # page cache a log's appends keep behind its end
READ_AHEAD_BYTES = 2 * 1024 * 1024  # what one read of a log being read in order takes from the disk
DEFAULT_READ_RUNS = 8  # readers reading ahead at once (two READ_AHEAD_BYTES buffers each), all logs together
READ_RUN_IDLE = 1.0  # seconds after which a reader's buffers may go to another reader
PREALLOCATE_BYTES = 16 * 1024 * 1024  # disk blocks a segment being written keeps allocated ahead of its end
PREALLOCATE_FROM = 1024 * 1024  # ... once it holds this much (then as much as it holds, up to the above)


class StorageError(Exception):
    """The storage could not do what was asked (the file system refused, or the data is unusable)."""


class DataDirInUseError(StorageError):
    """Another broker holds the data dir: two brokers appending to the same logs lose what each acknowledged."""


class DataDirLock:
    """An exclusive lock on a data dir (`broker.lock`, holding the owner's pid), held from open to
    close. The OS releases it when the process dies, so a kill -9 leaves no stale lock."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, "broker.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        try:
            import fcntl
        except ImportError:  # Windows: no flock; nothing guards the dir there
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUseError(f"{os.path.dirname(self.path)} is in use by another broker "
                                    f"(process {owner} holds {self.path})") from None
        except OSError as exc:  # a file system without locks: run, but say that nothing guards the dir
            log.warning("cannot lock %s (%s): nothing stops a second broker on this data dir", self.path, exc)
        try:  # who holds it, for the error a second broker reports; a full disk must not stop a start
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            pass
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


class CorruptEntryError(StorageError):
    """One stored entry is unreadable (bad checksum, damaged or missing record); the others are not."""

    def __init__(self, message: str, entry_id: int) -> None:
        super().__init__(message)
        self.entry_id = entry_id


class Entry:
    """One stored entry; `body` is the producer's metadata+payload span (bytes or a view of them).
    `plain_value_start`: a reader's memo kept with the cached entry (V1 CONSUME: where a value it
    shows as it is starts in `body`, -1 when it is not such an entry; None until looked at)."""

    __slots__ = ("entry_id", "body", "checksum", "publish_time", "num_messages", "plain_value_start")

    def __init__(self, entry_id: int, body, checksum: int, publish_time: int, num_messages: int) -> None:
        self.entry_id = entry_id
        self.body = body
        self.checksum = checksum
        self.publish_time = publish_time
        self.num_messages = num_messages
        self.plain_value_start: int | None = None


class FileOps:
    """The file system calls the storage makes. Tests substitute a subclass to inject
    faults (a disk that fills after N bytes, an I/O error, no descriptors left)."""

    def open(self, path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def open_direct(self, path: str) -> int:
        """A read-only descriptor that bypasses the page cache (O_DIRECT: reads of whole blocks
        into aligned memory); OSError where the platform or file system has none."""
        if _O_DIRECT is None:
            raise OSError(errno.EINVAL, "O_DIRECT is not available here")
        return os.open(path, os.O_RDONLY | _O_DIRECT)

    def open_existing(self, path: str) -> int:
        """A descriptor of an existing file, for an fsync (FileNotFoundError if it is gone)."""
        return os.open(path, os.O_RDONLY)

    def close(self, fd: int) -> None:
        os.close(fd)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def pread_into(self, fd: int, buffer, offset: int) -> int:
        """Read into `buffer` (a writable view) from `offset`; the bytes read, which may be fewer.
        A subclass that replaces only `pread` gets its `pread` here too."""
        if type(self).pread is not FileOps.pread or not hasattr(os, "preadv"):
            data = self.pread(fd, len(buffer), offset)
            buffer[:len(data)] = data
            return len(data)
        return os.preadv(fd, [buffer], offset)

    def pwrite(self, fd: int, data, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: list, offset: int) -> int:
        """Write `buffers` in order from `offset` in one call, without joining them (at most
        `IOV_MAX` of them); returns the bytes written, which may be fewer. A subclass that
        replaces only `pwrite` gets its `pwrite` here too, so the faults it injects still apply."""
        if type(self).pwrite is not FileOps.pwrite:
            return self.pwrite(fd, b"".join(buffers), offset)
        return os.pwritev(fd, buffers, offset)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def start_writeback(self, fd: int, offset: int, size: int) -> None:
        """Have the OS start writing these bytes to the disk, without waiting for it (Linux's
        sync_file_range; nothing elsewhere). Not an fsync: it promises nothing."""
        if _sync_file_range is not None and size > 0:
            _sync_file_range(fd, offset, size, _SYNC_FILE_RANGE_WRITE)

    def preallocate(self, fd: int, offset: int, size: int) -> None:
        """Allocate the disk blocks of these bytes ahead of the writes, leaving the file's size
        as it is (Linux's fallocate with FALLOC_FL_KEEP_SIZE; nothing elsewhere). OSError where
        the file system refuses."""
        if _fallocate is not None and size > 0 and _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, size) != 0:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number))

    def drop_cached(self, fd: int, offset: int, size: int) -> None:
        """Ask the OS to give back the page cache these bytes use where it holds them clean (pages
        not yet written back stay); the file is unchanged."""
        if _FADV_DONTNEED is not None and size > 0:
            os.posix_fadvise(fd, offset, size, _FADV_DONTNEED)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def replace_file(self, path: str, data: bytes) -> None:
        """Write `data` to `path` atomically (a temporary file, fsync, rename)."""
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def replace_file_unsynced(self, path: str, data: bytes) -> None:
        """replace_file without the fsync: for a spare copy, whose loss in a power cut costs nothing."""
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def keep_copy(self, path: str, copy: str) -> None:
        """Make `copy` hold what `path` holds now (a hard link, put in place by a rename), so a
        later replace_file of `path` leaves the copy as it was."""
        tmp = copy + ".tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        try:
            os.link(path, tmp)
        except OSError:  # a file system without hard links: a copy of the bytes
            with open(path, "rb") as src, open(tmp, "wb") as dst:
                dst.write(src.read())
        os.replace(tmp, copy)

    def sync_directory(self, path: str) -> None:
        """fsync a directory, so the renames in it survive a power loss."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:  # e.g. Windows: directories cannot be opened
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _libc_function(name: str, *argtypes):
    """libc's `name` through ctypes, returning an int, or None off Linux or where libc lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


# The os module has no sync_file_range, and its posix_fallocate cannot keep the file's size.
# A failed sync_file_range (-1) is ignored: it only starts a writeback early.
_sync_file_range = _libc_function("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_fallocate = _libc_function("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_FALLOC_FL_KEEP_SIZE = 1
_O_DIRECT = getattr(os, "O_DIRECT", None)
_DIRECT = "\0direct"  # appended to a path: the FilePool key of its O_DIRECT descriptor
DIRECT_ALIGN = 4096  # offsets, sizes and memory of O_DIRECT reads are multiples of it
_SYNC_FILE_RANGE_WRITE = 2
_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)
DEFAULT_OPS = FileOps()


def descriptor_limit() -> int:
    """The process's soft limit on open file descriptors (4096 when unlimited or unknown)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or soft <= 0:
            soft = 4096
    except (ImportError, OSError, ValueError):
        soft = 4096
    return soft


def default_max_open_files() -> int:
    """A quarter of the process's descriptor limit (the rest is for connections), 16 to 1024."""
    return max(16, min(1024, descriptor_limit() // 4))


class StorageStats:
    """Counters of storage faults, for the broker's stats and the fault suite."""

    def __init__(self) -> None:
        self.corrupt_entries = 0   # reads of an entry that failed its checks
        self.failed_commits = 0    # group commits the file system refused (their sends got errors)
        self.failed_syncs = 0      # fsyncs that failed (interval/never policy: logged, retried)
        self.dropped_bytes = 0     # bytes recovery truncated or could not read
        self.file_reopens = 0      # descriptors opened again after the LRU closed them
        self.descriptor_refusals = 0  # opens the OS refused (EMFILE/ENFILE) even after closing idle files
        self.skipped_entries = 0   # corrupt entries a subscription skipped (each logged at ERROR)

    def as_dict(self) -> dict:
        return dict(vars(self))


class FilePool:
    """Open file descriptors of every segment, at most `max_open_files` at once: the least
    recently used one is closed when another is needed, and reopened on demand."""

    def __init__(self, max_open_files: int | None = None, ops: FileOps | None = None,
                 page_cache_bytes: int = DEFAULT_PAGE_CACHE_BYTES, read_runs: int = DEFAULT_READ_RUNS,
                 direct_reads: bool = False) -> None:
        if page_cache_bytes < 0:
            raise ValueError("page_cache_bytes must not be negative")
        if read_runs < 1:
            raise ValueError("read_runs must be at least 1")
        self.max_open_files = max(2, max_open_files or default_max_open_files())
        self.ops = ops or DEFAULT_OPS
        # what each log's appends keep of the page cache behind its end (see _Segment.commit); 0: all
        self.page_cache_bytes = page_cache_bytes
        # backlogs read around the page cache (O_DIRECT), where asked and the file system can;
        # else through it, each reader giving back what it has read (LogReader.done_before)
        self.direct_reads = direct_reads and page_cache_bytes > 0 and _O_DIRECT is not None
        self.stats = StorageStats()
        self._open: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._ever_opened: set[str] = set()
        self._syncer: concurrent.futures.ThreadPoolExecutor | None = None  # see sync_later
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None  # see read_later
        # the readers holding read-ahead buffers (LogReader.buffers), least recently used first
        self.read_runs = read_runs
        self._run_holders: collections.OrderedDict[LogReader, None] = collections.OrderedDict()

    def fd(self, path: str) -> int:
        fd = self._open.get(path)
        if fd is not None:
            self._open.move_to_end(path)
            return fd
        while len(self._open) >= self.max_open_files:
            self._close_oldest()
        while True:
            try:
                fd = self.ops.open_direct(path[:-len(_DIRECT)]) if path.endswith(_DIRECT) else self.ops.open(path)
                break
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS and self._open:
                    self._close_oldest()  # the process as a whole is out: give back ours first
                    continue
                if exc.errno in _OUT_OF_FDS:
                    self.stats.descriptor_refusals += 1
                if not path.endswith(_DIRECT):  # a file system without O_DIRECT: see direct_fd
                    log.error("cannot open %s: %s", path, exc)
                raise StorageError(f"cannot open {path}: {exc}") from exc
        if path in self._ever_opened:
            self.stats.file_reopens += 1
        self._ever_opened.add(path)
        self._open[path] = fd
        return fd

    def _close_oldest(self) -> None:
        _, fd = self._open.popitem(last=False)
        try:
            self.ops.close(fd)
        except OSError as exc:
            log.warning("closing a segment file: %s", exc)

    def direct_fd(self, path: str) -> int | None:
        """An O_DIRECT descriptor of `path` (bounded with the others), or None where the file
        system has none (then never asked again)."""
        if not self.direct_reads:
            return None
        try:
            return self.fd(path + _DIRECT)
        except StorageError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                self.direct_reads = False
                log.info("reads of backlogs go through the page cache: %s", cause)
                return None
            raise

    def release(self, path: str) -> None:
        self._release(path + _DIRECT)
        self._release(path)

    def _release(self, path: str) -> None:
        fd = self._open.pop(path, None)
        if fd is not None:
            try:
                self.ops.close(fd)
            except OSError as exc:
                log.warning("closing %s: %s", path, exc)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def run_buffers(self, reader: LogReader) -> list[mmap.mmap] | None:
        """The two read-ahead buffers of `reader` (page-aligned, as O_DIRECT reads need): its
        own; else new ones while fewer than `read_runs` readers hold some; else those of the
        reader that used its own the longest ago, when that is READ_RUN_IDLE seconds or more.
        None otherwise: the reader then reads one record at a time. A reader that is still
        reading keeps its buffers: taking them would make it read its run again."""
        now = time.monotonic()
        if reader.buffers:
            self._run_holders.move_to_end(reader)
            reader.used_at = now
            return reader.buffers
        if len(self._run_holders) < self.read_runs:
            buffers = [mmap.mmap(-1, READ_AHEAD_BYTES), mmap.mmap(-1, READ_AHEAD_BYTES)]
        else:
            oldest = next(iter(self._run_holders))
            if now - oldest.used_at < READ_RUN_IDLE:
                return None
            buffers = oldest.give_up_buffers()
        reader.buffers = buffers
        reader.used_at = now
        self._run_holders[reader] = None
        return buffers

    def drop_run_buffers(self, reader: LogReader) -> None:
        """`reader` holds no buffers any more."""
        self._run_holders.pop(reader, None)

    def run_holders(self) -> list[LogReader]:
        return list(self._run_holders)

    def read_later(self, fd: int, buffer, offset: int) -> concurrent.futures.Future:
        """Read into `buffer` from `offset` on a worker thread, then close `fd` (a duplicate the
        caller made for it); the future's result is the bytes read."""
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulsarwire-read")
        return self._reader.submit(self._read_into, fd, buffer, offset)

    def _read_into(self, fd: int, buffer, offset: int) -> int:
        try:
            return self.ops.pread_into(fd, buffer, offset)
        finally:
            os.close(fd)

    def sync_later(self, paths: list[str], drop: bool = False) -> concurrent.futures.Future:
        """fsync `paths` on a worker thread, off the event loop; each through a descriptor of its
        own, so this pool may close its descriptors meanwhile. With `drop` (a full segment, when
        the page cache is bounded) their pages are then given back. The future's exception says
        what failed."""
        if self._syncer is None:
            self._syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulsarwire-fsync")
        return self._syncer.submit(self._sync_paths, list(paths), drop and self.page_cache_bytes > 0)

    def stop_syncs(self) -> None:
        """Wait for the fsyncs handed to the worker thread, and end it."""
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
            self._syncer = None
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None

    def _sync_paths(self, paths: list[str], drop: bool) -> None:
        for path in paths:
            fd = self.ops.open_existing(path)
            try:
                self.ops.fsync(fd)
                if drop:
                    self.ops.drop_cached(fd, 0, self.ops.size(fd))
            finally:
                self.ops.close(fd)


class EntryCache:
    """Recently appended entries of every log that shares it, at most `max_bytes` in all. Each
    log keeps its own dict of entries (oldest first); this keeps the logs in the order they were
    last used (an append or a cache hit) and, over the budget, takes the oldest entries of the
    least recently used log first.

    It counts the memory the cached bodies keep alive: a body that is bytes counts its size; one
    that is a view of a bytes object (a frame in a receive buffer, kept without a copy) counts
    that whole object, once however many cached bodies view it, until the last of them goes.

    Over the budget it evicts down to `max_bytes - max_bytes // EVICT_STEP`, not just under it:
    a full cache then pays for one eviction pass per few hundred appends, not one per append."""

    EVICT_STEP = 32

    def __init__(self, max_bytes: int = DEFAULT_MAX_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_cache_bytes must not be negative")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted_entries = 0
        self._logs: collections.OrderedDict[object, collections.OrderedDict] = collections.OrderedDict()
        # id of a bytes object that cached views share -> [that object, how many cached bodies view it]
        self._viewed: dict[int, list] = {}

    def put(self, owner, entries: collections.OrderedDict, entry: Entry) -> None:
        """Add `entry` to `entries`, the cache dict of log `owner`, then evict down to the budget.
        Its body is bytes or a view of bytes (TopicLog.append copies anything else)."""
        self.put_many(owner, entries, (entry,))

    def put_many(self, owner, entries: collections.OrderedDict, new) -> None:
        """put() for each entry of `new`, in order, with one eviction at the end."""
        viewed_of = self._viewed
        added = 0
        for entry in new:
            entries[entry.entry_id] = entry
            body = entry.body
            if type(body) is memoryview:
                held: bytes = body.obj  # type: ignore[assignment]  # TopicLog.append keeps only views of bytes
                viewed = viewed_of.get(id(held))
                if viewed is None:
                    viewed_of[id(held)] = [held, 1]
                    added += len(held)
                else:
                    viewed[1] += 1
            else:
                added += len(body)
        self.bytes += added
        logs = self._logs
        try:
            logs.move_to_end(owner)
        except KeyError:
            logs[owner] = entries
        if self.bytes > self.max_bytes:
            self._evict()

    def _release(self, body) -> None:
        """A cached body leaves: what it counted is given back."""
        if type(body) is memoryview:
            key = id(body.obj)
            viewed = self._viewed[key]
            viewed[1] -= 1
            if not viewed[1]:
                del self._viewed[key]
                self.bytes -= len(viewed[0])
        else:
            self.bytes -= len(body)

    def touch(self, owner) -> None:
        """`owner` was just read from its cache: it is the most recently used log."""
        try:
            self._logs.move_to_end(owner)
        except KeyError:
            pass

    def _evict(self) -> None:
        logs = self._logs
        target = self.max_bytes - self.max_bytes // self.EVICT_STEP
        viewed_of = self._viewed
        held_bytes = self.bytes
        evicted = 0
        while held_bytes > target and logs:
            owner, entries = next(iter(logs.items()))
            popitem = entries.popitem
            while entries and held_bytes > target:
                body = popitem(last=False)[1].body
                evicted += 1
                # _release, inline: this loop runs once per entry appended to a full cache
                if type(body) is memoryview:
                    key = id(body.obj)
                    viewed = viewed_of[key]
                    viewed[1] -= 1
                    if not viewed[1]:
                        del viewed_of[key]
                        held_bytes -= len(viewed[0])
                else:
                    held_bytes -= len(body)
            if not entries:
                del logs[owner]
        self.bytes = held_bytes
        self.evicted_entries += evicted

    def discard(self, entries: collections.OrderedDict, entry_id: int) -> None:
        old = entries.pop(entry_id, None)
        if old is not None:
            self._release(old.body)

    def drop(self, owner, entries: collections.OrderedDict) -> None:
        """Forget every entry of log `owner` (it is closing)."""
        for entry in entries.values():
            self._release(entry.body)
        entries.clear()
        self._logs.pop(owner, None)

    @property
    def log_count(self) -> int:
        return len(self._logs)


class CommitBatch:
    """The appends of one group commit; `error` is set when the file system refused them."""

    __slots__ = ("error", "count")

    def __init__(self) -> None:
        self.error: StorageError | None = None
        self.count = 0


def _positions_from(raw: bytes) -> array.array:
    positions = array.array("Q")
    positions.frombytes(raw[:len(raw) - len(raw) % 8])
    if not _BIG_ENDIAN:
        positions.byteswap()  # stored big-endian
    return positions


def _index_bytes(positions) -> bytes:
    out = array.array("Q", positions)
    if not _BIG_ENDIAN:
        out.byteswap()
    return out.tobytes()


def _record_at(buf, offset: int, end: int) -> int | None:
    """The body size of a whole, checksummed record at `offset` in `buf` (not past `end`), else None."""
    if offset + HEADER_SIZE > end:
        return None
    body_size, checksum, _, _ = _HEADER.unpack_from(buf, offset)
    body_end = offset + HEADER_SIZE + body_size
    if body_end > end or body_size == 0:  # an entry is never empty; zeros are no record
        return None
    if crc32c(buf[offset + HEADER_SIZE:body_end]) != checksum:
        return None
    return body_size


class _Segment:
    def __init__(self, pool: FilePool, directory: str, base: int) -> None:
        self.pool = pool
        self.ops = pool.ops
        self.base = base
        self.log_path = os.path.join(directory, f"{base:020d}.log")
        self.idx_path = os.path.join(directory, f"{base:020d}.idx")
        self.positions = array.array("Q")
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
        self._pending: list = []  # header, body, ... of the records appended since the last commit

    # recovery

    def recover(self, last: bool) -> None:
        """Load the index, trust it as far as it is consistent, verify the rest of the log and
        rebuild the index from it. Logs every byte it drops and every record it cannot read."""
        ops = self.ops
        size = self.size
        try:
            idx_fd = self.pool.fd(self.idx_path)
            indexed = _positions_from(ops.pread(idx_fd, ops.size(idx_fd), 0))
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
        # the last trusted record is verified again, with everything after it
        keep = max(trusted - 1, 0)
        start = indexed[keep] if trusted else 0
        positions = indexed[:keep]
        fd = self.pool.fd(self.log_path)
        buf = ops.pread(fd, size - start, start) if size > start else b""
        end = len(buf)
        offset = 0
        while offset < end:
            body_size = _record_at(buf, offset, end)
            if body_size is not None:
                positions.append(start + offset)
                offset += HEADER_SIZE + body_size
                continue
            # a bad record: find the next good one
            found = next((o for o in range(offset + 1, end - HEADER_SIZE + 1)
                          if _record_at(buf, o, end) is not None), None)
            if found is None and offset + HEADER_SIZE <= end and \
                    offset + HEADER_SIZE + _U32.unpack_from(buf, offset)[0] == end:
                # a whole record that fails its checksum, last in the file: keep its entry id
                self.pool.stats.dropped_bytes += end - offset
                log.error("%s: the last record (entry %d, byte %d) fails its checksum; it reads as corrupt",
                          self.log_path, self.base + len(positions), start + offset)
                positions.append(start + offset)
                break
            if found is None:
                dropped = end - offset
                self.pool.stats.dropped_bytes += dropped
                if last:
                    log.warning("%s: a torn record at byte %d (entry %d): %d bytes truncated",
                                self.log_path, start + offset, self.base + len(positions), dropped)
                    ops.truncate(fd, start + offset)
                    size = start + offset
                else:
                    log.error("%s: bytes %d to %d hold no readable record (entry %d onwards is lost)",
                              self.log_path, start + offset, start + end, self.base + len(positions))
                end = offset
                break
            # damaged records with good ones after them keep their entry ids: follow their headers
            # while they land exactly on the next good record, else count the gap as one entry
            hops, at = [], offset
            while at < found and at + HEADER_SIZE <= found:
                hops.append(at)
                at += HEADER_SIZE + _U32.unpack_from(buf, at)[0]
            if at != found:
                hops = [offset]
            self.pool.stats.dropped_bytes += found - offset
            log.error("%s: bytes %d to %d are damaged: entr%s %s unreadable, the %d bytes after are kept",
                      self.log_path, start + offset, start + found, "y" if len(hops) == 1 else "ies",
                      ", ".join(str(self.base + len(positions) + i) for i in range(len(hops))), end - found)
            positions.extend(start + h for h in hops)
            offset = found
        self.size = self.committed_size = start + end
        self.positions = positions
        if positions != indexed:
            self._rewrite_index()
        self.committed_count = len(self.positions)
        self.index_bytes_on_disk = 8 * len(self.positions)

    def _rewrite_index(self) -> None:
        try:
            fd = self.pool.fd(self.idx_path)
            self.ops.truncate(fd, 0)
            data = _index_bytes(self.positions)
            if data:
                self.ops.pwrite(fd, data, 0)
        except (OSError, StorageError) as exc:
            # the log is the truth; the next open rebuilds the index again
            log.error("%s: cannot rewrite the index: %s", self.idx_path, exc)

    # appends

    def append(self, header: bytes, body, body_size: int) -> None:
        """Queue one record as its header and body (written together, at commit)."""
        pos = self.size
        self._pending += (header, body)
        self.positions.append(pos)
        self.size = pos + HEADER_SIZE + body_size

    def append_staged(self, records: list, positions: list[int], size: int) -> None:
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
        index_bytes = _index_bytes(self.positions[self.committed_count:])  # the pending records' positions
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

    def read(self, index: int) -> tuple[int, int, int, bytes]:
        entry_id = self.base + index
        if index >= len(self.positions):
            raise CorruptEntryError(f"{self.log_path}: entry {entry_id} is missing (its record is lost)",
                                    entry_id)
        if index >= self.committed_count:
            k = 2 * (index - self.committed_count)
            body_size, checksum, publish_time, num_messages = _HEADER.unpack(self._pending[k])
            return checksum, publish_time, num_messages, self._pending[k + 1]
        pos = self.positions[index]
        raw = self._pread(pos, self.record_end(index) - pos, entry_id)
        return self._record(raw, 0, len(raw), entry_id)

    def record_end(self, index: int) -> int:
        return self.positions[index + 1] if index + 1 < self.committed_count else self.committed_size

    def _pread(self, pos: int, size: int, entry_id: int) -> bytes:
        try:
            return self.ops.pread(self.pool.fd(self.log_path), size, pos)
        except OSError as exc:
            log.error("%s: reading entry %d: %s", self.log_path, entry_id, exc)
            raise StorageError(f"{self.log_path}: reading entry {entry_id}: {exc}") from exc

    def _record(self, raw, start: int, stop: int, entry_id: int) -> tuple[int, int, int, bytes]:
        """The record raw[start:stop] (stop may be past what a short read got), checked; its body
        as bytes of its own (raw may be a buffer read into again)."""
        if stop - start < HEADER_SIZE or stop > len(raw):
            raise CorruptEntryError(f"{self.log_path}: entry {entry_id} is cut short", entry_id)
        body_size, checksum, publish_time, num_messages = _HEADER.unpack_from(raw, start)
        body = bytes(raw[start + HEADER_SIZE:stop])
        if body_size != len(body) or crc32c(body) != checksum:
            raise CorruptEntryError(f"{self.log_path}: entry {entry_id} fails its checksum", entry_id)
        return checksum, publish_time, num_messages, body

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

    def read_run(self, index: int, buffer: mmap.mmap) -> tuple:
        """The committed records from `index` on, as many as fit in `buffer` (one at least: when
        it does not fit, in bytes of its own), with one read: (segment, first index, end index,
        file position, what holds them) for record_in(). The buffer is the reader's own,
        used again for each run (a new one per read would be new memory each time)."""
        limit = len(buffer) - 2 * DIRECT_ALIGN  # room to round both ends out to whole blocks
        end_index, pos, end = self._plan_run(index, limit)
        if end - pos > limit:  # one record bigger than the buffer
            return self, index, end_index, pos, self._pread(pos, end - pos, self.base + index)
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
        return self, index, end_index, start, memoryview(buffer)[:got]

    def prefetch_run(self, index: int, buffer: mmap.mmap) -> tuple | None:
        """Start read_run(index) into `buffer` on the pool's reader thread, through a duplicate of
        the descriptor (the pool may close its own meanwhile): (index, end index, file position,
        future of the bytes read), or None where it cannot (read_run then reads it when asked)."""
        limit = len(buffer) - 2 * DIRECT_ALIGN
        end_index, pos, end = self._plan_run(index, limit)
        if end - pos > limit:
            return None
        try:
            fd, start, stop, _ = self._run_source(pos, end)
            duplicate = os.dup(fd)
        except (OSError, StorageError):
            return None
        return index, end_index, start, self.pool.read_later(duplicate, memoryview(buffer)[:stop - start], start)

    def record_in(self, run: tuple, index: int) -> tuple[int, int, int, bytes]:
        """Entry `index` out of a read_run() that holds it, checked as read() checks it."""
        base = run[3]
        return self._record(run[4], self.positions[index] - base, self.record_end(index) - base, self.base + index)

    def close(self) -> None:
        self.pool.release(self.log_path)
        self.pool.release(self.idx_path)


_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 16


def _write_all(ops: FileOps, fd: int, buffers: list, offset: int, total: int) -> None:
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
        self._segments: list[_Segment] = []
        try:
            self._segments = [_Segment(self.pool, directory, base) for base in bases] or \
                [_Segment(self.pool, directory, 0)]
            for i, segment in enumerate(self._segments):
                is_last = i == len(self._segments) - 1
                segment.recover(is_last)
                if not is_last:
                    self._check_count(segment, self._segments[i + 1].base)
        except OSError as exc:
            for segment in self._segments:
                segment.close()
            log.error("cannot open the log in %s: %s", directory, exc)
            raise StorageError(f"cannot open the log in {directory}: {exc}") from exc
        except StorageError:
            for segment in self._segments:
                segment.close()
            raise
        last = self._segments[-1]
        last.limit = segment_bytes
        self._bases = [s.base for s in self._segments]
        self.next_entry_id = last.base + len(last.positions)
        self.committed_entry_id = self.next_entry_id  # entries before it are on the OS's side
        self.batch = CommitBatch()
        self._dirty = False
        self._background_syncs: list[tuple[_Segment, concurrent.futures.Future]] = []  # full segments
        self._cache: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # oldest first
        # every reader of this log, closed with it; reads past the cache by callers that name no
        # reader of their own go through _reader
        self._readers: weakref.WeakSet[LogReader] = weakref.WeakSet()
        self._reader = self.reader()
        self._shared_cache = cache if cache is not None else EntryCache(cache_bytes)

    @staticmethod
    def _check_count(segment: _Segment, next_base: int) -> None:
        expected = next_base - segment.base
        found = len(segment.positions)
        if found < expected:
            log.error("%s holds %d of its %d entries: entries %d to %d are unreadable", segment.log_path,
                      found, expected, segment.base + found, next_base - 1)
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

    def append(self, body, checksum: int | None, publish_time: int, num_messages: int) -> int:
        """Queue an entry; it reaches the OS at the next commit() (the broker commits before any
        receipt). It belongs to `self.batch` as it is at this call's return."""
        if checksum is None:
            checksum = crc32c(body)
        segment = self._segments[-1]
        if segment.size >= self.segment_bytes and segment.positions:
            segment = self._roll_over()
        kind = type(body)
        if kind is not bytes and not (kind is memoryview and type(body.obj) is bytes and body.c_contiguous):
            # queued until commit and cached: it must not change meanwhile (a view of bytes is
            # kept as it is; the cache counts the whole bytes object it views)
            body = bytes(body)
        size = len(body)
        segment.append(_HEADER.pack(size, checksum, publish_time, num_messages), body, size)
        entry_id = self.next_entry_id
        self.next_entry_id = entry_id + 1
        self.batch.count += 1
        self._dirty = True
        self._shared_cache.put(self, self._cache, Entry(entry_id, body, checksum, publish_time, num_messages))
        return entry_id

    def append_many(self, bodies: list, checksums: list[int], publish_times: list[int],
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
                                                                  size, limit, _HEADER, Entry)
        if entries:
            segment.append_staged(records, positions, size)
            self.next_entry_id = entry_id + len(entries)
            self.batch.count += len(entries)
            self._dirty = True
            self._shared_cache.put_many(self, self._cache, entries)
        return len(entries)

    def _roll_over(self) -> _Segment:
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
        segment = _Segment(self.pool, self.directory, self.next_entry_id)
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

    def reader(self) -> LogReader:
        """A reader of this log of its own (a subscription's): its reads in order past the entry
        cache read ahead for it alone, wherever the log's other readers are."""
        reader = LogReader(self)
        self._readers.add(reader)
        return reader

    def cached_entries(self, start: int, end: int):
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
            if run is not None and run[0] is segment and run[1] <= index < run[2]:
                reader.used_at = time.monotonic()  # still reading: its buffers stay its own
                checksum, publish_time, num_messages, body = segment.record_in(run, index)
            elif in_order and index < segment.committed_count:
                # read in order past the entry cache (a backlog): the records after it come with
                # it, and the run after that is read meanwhile; past the pool's budget of readers
                # with buffers, one record at a time
                buffers = self.pool.run_buffers(reader)
                if buffers is None:
                    checksum, publish_time, num_messages, body = segment.read(index)
                    reader.done_before(segment, segment.positions[index], segment.record_end(index))
                else:
                    run = reader.prefetched(segment, index)
                    if run is None:
                        reader.run = None  # its buffer is read into again
                        run = segment.read_run(index, buffers[0])
                    reader.run = run
                    reader.done_before(segment, run[3], run[3] + len(run[4]))
                    reader.prefetch_after(segment, run)
                    checksum, publish_time, num_messages, body = segment.record_in(run, index)
            else:
                checksum, publish_time, num_messages, body = segment.read(index)
        except CorruptEntryError as exc:
            self.stats.corrupt_entries += 1
            log.error("%s: %s", self.directory, exc)
            raise
        return Entry(entry_id, body, checksum, publish_time, num_messages)

    def find_by_publish_time(self, publish_time: int) -> int:
        """The first entry published at or after `publish_time` (next_entry_id if none)."""
        lo, hi = self.first_entry_id, self.next_entry_id
        while lo < hi:
            mid = (lo + hi) // 2
            probe = mid
            while probe < hi:  # an unreadable entry: compare with the next readable one
                try:
                    stamp = self.read(probe).publish_time
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


class LogReader:
    """One reader's place in a log (TopicLog.reader()): the entry it asks for next, the run of
    records read ahead for it (_Segment.read_run, at most READ_AHEAD_BYTES) and the run after
    that, read meanwhile on the pool's reader thread. Its two buffers come from the log's pool
    (FilePool.run_buffers), which bounds how many readers hold some; close() gives them back."""

    __slots__ = ("log", "next_read", "run", "prefetch", "buffers", "used_at", "spent", "given_back", "__weakref__")

    def __init__(self, topic_log: TopicLog) -> None:
        self.log = topic_log
        self.next_read = -1
        self.run: tuple | None = None
        self.prefetch: tuple | None = None  # (segment, prefetch_run(), its buffer)
        self.buffers: list[mmap.mmap] = []
        self.used_at = 0.0
        self.spent: tuple[_Segment, int] | None = None  # the segment it read last, and where it stopped
        self.given_back = 0  # what it gave back of that segment: all before this position

    def done_before(self, segment: _Segment, start: int, end: int) -> None:
        """It has read [start, end) of `segment` in order (a run, or one record when it has no
        buffers): give back the pages of what it read before (read through the page cache, they
        would stay there). All of the segment up to `start`, not the last read alone: the page
        cache holds files in folios of up to several MiB, and a folio is given back only when the
        range covers it whole. Within a segment, once half a run's worth more was read since it
        last did (a call per record would be a system call per record)."""
        spent, self.spent = self.spent, (segment, end)
        if spent is None:
            self.given_back = 0
        elif spent[0] is not segment:
            spent[0].drop_range(0, spent[1])
            self.given_back = 0
        elif start - self.given_back >= READ_AHEAD_BYTES // 2:
            segment.drop_range(0, start)
            self.given_back = start

    def prefetched(self, segment: _Segment | None, index: int) -> tuple | None:
        """The run read ahead, when it is the one starting at `index` of `segment` (waiting for
        the reader thread if need be); None otherwise, or when it failed (read again, in place).
        With no segment it only waits for a read in flight and drops it."""
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is None:
            return None
        owner, (first, end_index, start, future), buffer = prefetch
        try:
            got = future.result()  # also when it is not wanted: the thread writes into the buffer
        except Exception:  # noqa: BLE001 - read_run reads it again and reports what fails
            return None
        if owner is not segment or first != index:
            return None
        return segment, index, end_index, start, memoryview(buffer)[:got]

    def prefetch_after(self, segment: _Segment, run: tuple) -> None:
        """Start reading the run after `run`, in the same segment, into the other buffer."""
        if run[2] >= segment.committed_count or not isinstance(run[4], memoryview) or not self.buffers:
            return
        buffer = self.buffers[1] if run[4].obj is self.buffers[0] else self.buffers[0]
        started = segment.prefetch_run(run[2], buffer)
        if started is not None:
            self.prefetch = (segment, started, buffer)

    def give_up_buffers(self) -> list[mmap.mmap]:
        """Its buffers, for another reader: the read in flight is waited for and its runs are
        dropped (the bodies read from them were copied out), and the pages it read given back."""
        self.prefetched(None, -1)
        self.run = None
        spent, self.spent = self.spent, None
        if spent is not None:
            spent[0].drop_range(0, spent[1])
        buffers, self.buffers = self.buffers, []
        self.log.pool.drop_run_buffers(self)
        return buffers

    def close(self) -> None:
        """Give its buffers back (it may read again: it then asks for new ones)."""
        for buffer in self.give_up_buffers():
            with contextlib.suppress(BufferError):  # a view of it still held: freed with it
                buffer.close()


class Cursor:
    """A durable subscription's position: everything <= mark_delete is acknowledged,
    plus individually acknowledged entries and partially acknowledged batches."""

    def __init__(self, mark_delete: int = -1, acked=(), partial=None) -> None:
        self.mark_delete = mark_delete
        self.acked: set[int] = set(acked)
        self.partial: dict[int, int] = dict(partial or {})  # entry -> bitmask of unacked indexes

    def is_acked(self, entry_id: int) -> bool:
        return entry_id <= self.mark_delete or entry_id in self.acked

    def ack(self, entry_id: int) -> None:
        if entry_id > self.mark_delete:
            self.acked.add(entry_id)
            self.partial.pop(entry_id, None)
            self._advance()

    def ack_partial(self, entry_id: int, remaining: int) -> None:
        """Batch-index ack: `remaining` has a bit set for each index still unacknowledged."""
        if self.is_acked(entry_id):
            return
        current = self.partial.get(entry_id)
        remaining = remaining if current is None else current & remaining
        if remaining == 0:
            self.ack(entry_id)
        else:
            self.partial[entry_id] = remaining

    def ack_cumulative(self, entry_id: int) -> None:
        if entry_id > self.mark_delete:
            self.mark_delete = entry_id
            self.acked = {e for e in self.acked if e > entry_id}
            self.partial = {e: b for e, b in self.partial.items() if e > entry_id}
            self._advance()

    def reset(self, next_entry_id: int) -> None:
        self.mark_delete = next_entry_id - 1
        self.acked.clear()
        self.partial.clear()

    def _advance(self) -> None:
        while self.mark_delete + 1 in self.acked:
            self.mark_delete += 1
            self.acked.discard(self.mark_delete)

    def to_json(self) -> dict:
        return {"mark_delete": self.mark_delete, "acked": sorted(self.acked),
                "partial": {str(k): v for k, v in self.partial.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "Cursor":
        return cls(data["mark_delete"], data.get("acked", ()),
                   {int(k): v for k, v in data.get("partial", {}).items()})


def topic_directory(root: str, topic: str) -> str:
    return os.path.join(root, "topics", urllib.parse.quote(topic, safe=""))
