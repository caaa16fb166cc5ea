"""The broker's small metadata files (`broker.json`, `ledger-ids.json`, `topics.json`, V1's
`groups.json` and `offsets.json`, and per topic `ledgers.json`, `state.json`, `cursors.json`,
`producer-epoch.json`, `schema.json`): how they are written, read back and checked.

A file is one header line, then its JSON:

    pulsarwire-metadata 1 crc32c=1a2b3c4d size=123
    {...}

It is written whole and atomically (a temporary file, fsync, rename, fsync of the directory);
the copy it replaces is kept as `<name>.prev` (a hard link, so there is always a current file).
A read verifies the header, the size (a truncated file) and the checksum (a flipped byte); a
file without the header is one written before this format (plain JSON) and is read as such.
`load()` says what it found; each owner of a file decides how to recover (the previous copy,
or a rebuild from the log) and reports it through `report_damage()`, which logs at ERROR.

Writes go through a `MetadataWriter`: one thread that does the file-system calls, so the event
loop never waits on them, and that writes only the newest data of a file whose earlier write
had not started yet (many changes, one write). A caller that must answer only once the data is
on disk waits on the future a write returns.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import os
import threading
from typing import Any, Callable

from crc32c import crc32c

from .storage import DEFAULT_OPS, FileOps, StorageError

log = logging.getLogger("pulsarwire.broker.metadata")

MAGIC = b"pulsarwire-metadata"
FORMAT_VERSION = 1
PREVIOUS = ".prev"  # suffix of the copy a write replaced
TEMPORARY = ".tmp"

# what load() found
CURRENT = "current"      # the file, verified (or a plain-JSON file of an older release)
PREVIOUS_COPY = "previous"  # the file was damaged or missing; the previous copy is good
MISSING = "missing"      # neither exists: never written
LOST = "lost"            # the file is damaged (or gone while its previous copy is damaged too)


class MetadataError(StorageError):
    """Metadata the broker cannot read nor rebuild, so the thing it describes cannot be opened;
    front ends answer it as an error of that request (the broker and other topics go on)."""


class DamagedFile(ValueError):
    """What is wrong with a metadata file's bytes."""


def encode(data: Any) -> bytes:
    body = json.dumps(data, separators=(",", ":")).encode()
    return b"%s %d crc32c=%08x size=%d\n" % (MAGIC, FORMAT_VERSION, crc32c(body), len(body)) + body


def decode(raw: bytes) -> Any:
    """The data a file's bytes hold; DamagedFile saying what is wrong."""
    if not raw.strip():
        raise DamagedFile("empty" if not raw else "blank")
    if raw.startswith(MAGIC):
        header, newline, body = raw.partition(b"\n")
        fields = header.split(b" ")
        try:
            if len(fields) != 4 or fields[0] != MAGIC or not newline:
                raise ValueError
            version = int(fields[1])
            checksum = int(fields[2].removeprefix(b"crc32c="), 16)
            size = int(fields[3].removeprefix(b"size="))
        except ValueError:
            raise DamagedFile(f"damaged header {header[:80]!r}") from None
        if version > FORMAT_VERSION:
            raise DamagedFile(f"format version {version} is newer than this broker reads ({FORMAT_VERSION})")
        if len(body) != size:
            raise DamagedFile(f"truncated: {len(body)} of {size} bytes" if len(body) < size
                              else f"{len(body) - size} bytes after its end")
        if crc32c(body) != checksum:
            raise DamagedFile("checksum mismatch")
    else:
        body = raw  # plain JSON, as releases before this format wrote
    try:
        return json.loads(body)
    except ValueError as exc:
        raise DamagedFile(f"not JSON ({exc})") from None


def describe(raw: bytes | None, limit: int = 120) -> str:
    """What a damaged file held, for the log: its size and first bytes."""
    if raw is None:
        return "nothing (the file is gone)"
    head = raw[:limit].decode("utf-8", "backslashreplace")
    return f"{len(raw)} bytes: {head!r}{'...' if len(raw) > limit else ''}"


class Loaded:
    """What load() found: `data` (None when `source` is MISSING or LOST), where it came from,
    and, unless the current file was good, `problem` (what was wrong) and `held` (its bytes, described)."""

    __slots__ = ("path", "data", "source", "problem", "held")

    def __init__(self, path: str, data: Any, source: str, problem: str | None = None, held: str | None = None) -> None:
        self.path, self.data, self.source, self.problem, self.held = path, data, source, problem, held

    @property
    def damaged(self) -> bool:
        """The file is damaged, or gone while a previous copy shows it existed."""
        return self.problem is not None

    def __repr__(self) -> str:
        return f"Loaded({self.path!r}, source={self.source!r}, problem={self.problem!r})"


def _read(path: str, validate: Callable[[Any], Any]) -> tuple[Any, bytes | None, str | None]:
    """(data, raw bytes, problem): data valid, or problem says why not ('missing' if absent)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None, None, "missing"
    except OSError as exc:
        return None, None, f"unreadable ({exc})"
    try:
        return validate(decode(raw)), raw, None
    except DamagedFile as exc:
        return None, raw, str(exc)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return None, raw, f"not what it should hold ({type(exc).__name__}: {exc})"


def load(path: str, validate: Callable[[Any], Any] = lambda data: data) -> Loaded:
    """Read `path`, checked by `validate` (which returns the data, maybe normalised, or raises
    TypeError/ValueError/KeyError on the wrong shape); its previous copy when it is not good."""
    data, raw, problem = _read(path, validate)
    if problem is None:
        return Loaded(path, data, CURRENT)
    previous, _, previous_problem = _read(path + PREVIOUS, validate)
    if previous_problem is None:
        return Loaded(path, previous, PREVIOUS_COPY, problem, describe(raw))
    if problem == "missing" and previous_problem == "missing":
        return Loaded(path, None, MISSING)
    return Loaded(path, None, LOST, problem, describe(raw))


def expect(kind: type) -> Callable[[Any], Any]:
    """A validator: the data is a `kind` (dict, list)."""
    def check(data: Any) -> Any:
        if not isinstance(data, kind):
            raise TypeError(f"a {type(data).__name__} where a {kind.__name__} belongs")
        return data
    return check


class DamageCounter:
    """How many damaged metadata files the broker found and repaired, for its stats."""

    def __init__(self) -> None:
        self.damaged = 0

    def __call__(self) -> None:
        self.damaged += 1


damage_count = DamageCounter()  # process-wide: a broker process has one data dir


def report_damage(loaded: Loaded, what: str, action: str) -> None:
    """Log at ERROR a damaged metadata file: its path, what was wrong, what it held (`what`
    it describes and its bytes), and what was done about it (`action`)."""
    damage_count()
    log.error("metadata file %s is damaged (%s); it held %s, %s; %s",
              loaded.path, loaded.problem, what, loaded.held, action)


class MetadataWriter:
    """Writes metadata files on a thread of its own, newest data first-come: a write of a file
    whose previous write has not started yet replaces it (and shares its future). Each write is
    atomic (temporary file, fsync, rename, fsync of the directory) and keeps the previous copy."""

    def __init__(self, ops: FileOps | None = None) -> None:
        self.ops = ops or DEFAULT_OPS
        self._pending: collections.OrderedDict[str, tuple[bytes, type, concurrent.futures.Future]] = \
            collections.OrderedDict()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = 0  # writes taken off _pending and not finished
        self._stopping = False
        self.written = 0
        self.failed = 0
        self.coalesced = 0  # writes that were replaced by a newer one before they started

    def write(self, path: str, data: Any, urgent: bool = False) -> concurrent.futures.Future:
        """Queue `data` (encoded now, so later changes do not leak in) for `path`; the future is
        done once it is on disk, or holds the StorageError that stopped it. An `urgent` write
        (one the event loop will wait for) goes before those queued."""
        raw = encode(data)
        with self._lock:
            queued = self._pending.get(path)
            if queued is not None:
                future = queued[2]
                self.coalesced += 1
            else:
                future = concurrent.futures.Future()
            self._pending[path] = (raw, type(data), future)
            if urgent:
                self._pending.move_to_end(path, last=False)
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="pulsarwire-metadata", daemon=True)
                self._thread.start()
            self._lock.notify()
        return future

    def write_now(self, path: str, data: Any) -> None:
        """Write `data` and wait until it is on disk (StorageError if it cannot be)."""
        self.write(path, data, urgent=True).result()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending) + self._busy

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done (whether it succeeded or not)."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        """Write what is queued, then end the thread."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending or self._stopping)
                if not self._pending:
                    return
                path, (raw, kind, future) = self._pending.popitem(last=False)
                self._busy += 1
            try:
                write_file(path, raw, kind, self.ops)
            except StorageError as exc:
                self.failed += 1
                future.set_exception(exc)
            except BaseException as exc:  # noqa: BLE001 - reported to whoever waits; the thread goes on
                self.failed += 1
                future.set_exception(StorageError(f"cannot write {path}: {exc}"))
            else:
                self.written += 1
                future.set_result(None)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._lock.notify_all()


def when_written(future: concurrent.futures.Future, then: Callable[[BaseException | None], None]) -> None:
    """Call `then(error)` (None: on disk) once `future`, a MetadataWriter write, is done: on the
    running event loop, before anything that wraps the future later is woken (so state made
    visible by `then` is there for them); without a running loop (tools, tests, start-up), here,
    once the write is done."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        then(future.exception())
        return

    def done(finished: concurrent.futures.Future) -> None:
        try:
            loop.call_soon_threadsafe(then, finished.exception())
        except RuntimeError:  # the loop is closed: the broker stopped, nobody waits any more
            pass
    future.add_done_callback(done)


def write_file(path: str, raw: bytes, kind: type, ops: FileOps = DEFAULT_OPS) -> None:
    """Replace `path` by `raw` (already encoded data of type `kind`) atomically, keeping the
    current file as the previous copy. StorageError (logged) when the file system refuses."""
    try:
        previous = path + PREVIOUS
        if _is_good(path, kind):  # a damaged file never replaces the previous good copy
            ops.keep_copy(path, previous)
        ops.replace_file(path, raw)
        if not _is_good(previous, kind):  # a first write (or a damaged copy): a copy of this one stands in
            # bytes of its own, not a link: damage to one spares the other (a spare: no fsync of its own)
            ops.replace_file_unsynced(previous, raw)
        ops.sync_directory(os.path.dirname(path) or ".")
    except OSError as exc:
        log.error("cannot write %s: %s", path, exc)
        raise StorageError(f"cannot write {path}: {exc}") from exc


def _is_good(path: str, kind: type) -> bool:
    """Whether `path` holds a good file of data of type `kind` (not, e.g., an editor's `[]`)."""
    try:
        with open(path, "rb") as fh:
            return type(decode(fh.read())) is kind
    except (OSError, DamagedFile):
        return False


def write(path: str, data: Any, ops: FileOps = DEFAULT_OPS) -> None:
    """Write `data` to `path` now, on the caller's thread (before the event loop runs, or tools)."""
    write_file(path, encode(data), type(data), ops)


class BatchedFile:
    """A metadata file that changes on the event loop, written by a `MetadataWriter` with many
    changes in each write: while one write is under way, the changes made meanwhile wait for the
    next, which snapshots them all at once (one encoding and one fsync for many requests).
    `changed()` returns a future done once a write holding the change is on disk; its result is
    None, or the StorageError that stopped the write (a later change or `retry()` writes again)."""

    def __init__(self, writer: MetadataWriter, path: str, snapshot: Callable[[], Any]) -> None:
        self.writer = writer
        self.path = path
        self.snapshot = snapshot
        self._next: "asyncio.Future | None" = None  # waits for the write after the current one
        self._writing = False
        self.failed = False
        self.writes = 0

    def changed(self) -> "asyncio.Future":
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            if not self._writing:
                loop.call_soon(self._start)
        return self._next

    def retry(self) -> None:
        """Write again after a failure (the maintenance loop calls this)."""
        if self.failed and self._next is None and not self._writing:
            self.changed()

    def write_now(self) -> None:
        """Write the current state and wait for it (when the broker stops)."""
        self.writer.write(self.path, self.snapshot()).result()

    def _start(self) -> None:
        waiter, self._next = self._next, None
        if waiter is None:
            return
        self._writing = True
        self.writes += 1
        loop = asyncio.get_running_loop()
        try:
            written = asyncio.wrap_future(self.writer.write(self.path, self.snapshot()), loop=loop)
        except Exception as exc:  # noqa: BLE001 - e.g. the writer is closed: the waiters are told
            self._finished(waiter, StorageError(f"cannot write {self.path}: {exc}"))
            return
        written.add_done_callback(lambda done: self._finished(waiter, None if done.cancelled() else done.exception()))

    def _finished(self, waiter: "asyncio.Future", error: BaseException | None) -> None:
        self._writing = False
        self.failed = error is not None
        if not waiter.done():
            waiter.set_result(error)
        if self._next is not None:
            self._start()
