"""The storage's files: the system calls it makes (`FileOps`, which tests replace to inject
faults: ENOSPC, EIO, EMFILE), the bounded pool of open descriptors and read-ahead buffers every
log of a broker shares (`FilePool`), the data dir's lock and where a topic's files live."""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import errno
import logging
import mmap
import os
import sys
import time
import urllib.parse
from typing import Any, Callable, Protocol

log = logging.getLogger("pulsarwire.broker.storage")

_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
DEFAULT_PAGE_CACHE_BYTES = 16 * 1024 * 1024  # page cache a log's appends keep behind its end
READ_AHEAD_BYTES = 2 * 1024 * 1024  # what one read of a log being read in order takes from the disk
DEFAULT_READ_RUNS = 8  # readers reading ahead at once (two READ_AHEAD_BYTES buffers each), all logs together
READ_RUN_IDLE = 1.0  # seconds after which a reader's buffers may go to another reader


class RunHolder(Protocol):
    """What the pool needs of a reader to lend it read-ahead buffers (a LogReader)."""

    buffers: list[mmap.mmap]
    used_at: float

    def give_up_buffers(self) -> list[mmap.mmap]: ...


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

    def pread_into(self, fd: int, buffer: memoryview, offset: int) -> int:
        """Read into `buffer` (a writable view) from `offset`; the bytes read, which may be fewer.
        A subclass that replaces only `pread` gets its `pread` here too."""
        if type(self).pread is not FileOps.pread or not hasattr(os, "preadv"):
            data = self.pread(fd, len(buffer), offset)
            buffer[:len(data)] = data
            return len(data)
        return os.preadv(fd, [buffer], offset)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: list[Any], offset: int) -> int:
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


def _libc_function(name: str, *argtypes: Any) -> Callable[..., int] | None:
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

    def as_dict(self) -> dict[str, int]:
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
        # what each log's appends keep of the page cache behind its end (see Segment.commit); 0: all
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
        self._run_holders: collections.OrderedDict[RunHolder, None] = collections.OrderedDict()

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

    def run_buffers(self, reader: RunHolder) -> list[mmap.mmap] | None:
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

    def drop_run_buffers(self, reader: RunHolder) -> None:
        """`reader` holds no buffers any more."""
        self._run_holders.pop(reader, None)

    def run_holders(self) -> list[RunHolder]:
        return list(self._run_holders)

    def read_later(self, fd: int, buffer: memoryview, offset: int) -> concurrent.futures.Future[int]:
        """Read into `buffer` from `offset` on a worker thread, then close `fd` (a duplicate the
        caller made for it); the future's result is the bytes read."""
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulsarwire-read")
        return self._reader.submit(self._read_into, fd, buffer, offset)

    def _read_into(self, fd: int, buffer: memoryview, offset: int) -> int:
        try:
            return self.ops.pread_into(fd, buffer, offset)
        finally:
            os.close(fd)

    def sync_later(self, paths: list[str], drop: bool = False) -> concurrent.futures.Future[None]:
        """fsync `paths` on a worker thread, off the event loop; each through a descriptor of its
        own, so this pool may close its descriptors meanwhile. With `drop` (a full segment, when
        the page cache is bounded) their pages are then given back. The future's exception says
        what failed."""
        if self._syncer is None:
            self._syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulsarwire-fsync")
        return self._syncer.submit(self._sync_paths, list(paths), drop and self.page_cache_bytes > 0)

    def write_later(self, path: str, data: bytes, offset: int) -> concurrent.futures.Future[None]:
        """Write `data` at `offset` of the existing file `path` and fsync it, on the fsync worker
        thread (a repair, off the event loop); the future's exception says what failed."""
        if self._syncer is None:
            self._syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulsarwire-fsync")
        return self._syncer.submit(self._write_at, path, data, offset)

    def _write_at(self, path: str, data: bytes, offset: int) -> None:
        if not os.path.exists(path):  # gone meanwhile: nothing to repair
            return
        fd = self.ops.open(path)
        try:
            self.ops.pwrite(fd, data, offset)
            self.ops.fsync(fd)
        finally:
            self.ops.close(fd)

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


def topic_directory(root: str, topic: str) -> str:
    return os.path.join(root, "topics", urllib.parse.quote(topic, safe=""))
