"""Durable storage for the embedded broker: one segmented log per topic-partition.

A segment is `<first entry id>.log` plus `<first entry id>.idx`. Log records:

    [u32 body_size][u32 CRC32C(body)][u64 publish_time][u32 num_messages][body]

where body is the entry exactly as the producer framed it: `[u32 metadata
size][MessageMetadata][payload]`, the span the wire checksum covers, so the
stored CRC doubles as the checksum of every Message frame that re-sends it. The
.idx file holds one u64 file position per entry. Appends are group-committed:
`commit()` hands everything appended since the last commit to the OS in one
write, and the broker commits before it sends any receipt, so a killed process
loses nothing acknowledged; fsync (power loss) follows the sync policy. Recovery
verifies the tail of the last segment and truncates a torn record.
"""
from __future__ import annotations

import array
import bisect
import collections
import json
import os
import struct
import urllib.parse

from crc32c import crc32c

_HEADER = struct.Struct(">IIQI")
_POSITION = struct.Struct(">Q")
HEADER_SIZE = _HEADER.size
SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER = "always", "interval", "never"


class StorageError(Exception):
    """The on-disk data is unusable beyond what recovery may repair."""


class Entry:
    """One stored entry; `body` is the producer's metadata+payload span (bytes or a view of them)."""

    __slots__ = ("entry_id", "body", "checksum", "publish_time", "num_messages")

    def __init__(self, entry_id: int, body, checksum: int, publish_time: int, num_messages: int) -> None:
        self.entry_id = entry_id
        self.body = body
        self.checksum = checksum
        self.publish_time = publish_time
        self.num_messages = num_messages


def _write_json(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: str, default):
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise StorageError(f"{path} is unreadable: {exc}") from exc


write_json = _write_json


class _Segment:
    def __init__(self, directory: str, base: int) -> None:
        self.base = base
        self.log_path = os.path.join(directory, f"{base:020d}.log")
        self.idx_path = os.path.join(directory, f"{base:020d}.idx")
        self.positions = array.array("Q")
        self.log_fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.idx_fd = os.open(self.idx_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.log_fd).st_size
        self.committed_size = self.size
        self._pending: list[bytes] = []
        self._pending_index = bytearray()

    def load_index(self) -> None:
        raw = os.pread(self.idx_fd, os.fstat(self.idx_fd).st_size, 0)
        usable = len(raw) - len(raw) % 8
        self.positions = array.array("Q")
        self.positions.frombytes(raw[:usable])
        if self.positions.itemsize == 8 and array.array("Q", [1]).tobytes()[0] == 1:
            self.positions.byteswap()  # stored big-endian

    def recover(self, trusted: int) -> int:
        """Trust the first `trusted` indexed records; verify the rest, truncating a torn tail."""
        positions = self.positions[:trusted]
        pos = 0
        if positions:
            header = os.pread(self.log_fd, HEADER_SIZE, positions[-1])
            pos = positions[-1] + HEADER_SIZE + _HEADER.unpack(header)[0]
        torn = False
        while pos < self.size:
            header = os.pread(self.log_fd, HEADER_SIZE, pos)
            if len(header) < HEADER_SIZE:
                torn = True
                break
            body_size, checksum, _, _ = _HEADER.unpack(header)
            body = os.pread(self.log_fd, body_size, pos + HEADER_SIZE)
            if len(body) < body_size or crc32c(body) != checksum:
                torn = True
                break
            positions.append(pos)
            pos += HEADER_SIZE + body_size
        if torn or pos != self.size:
            os.ftruncate(self.log_fd, pos)
            self.size = pos
        if positions != self.positions:
            self.positions = positions
            os.ftruncate(self.idx_fd, 0)
            os.write(self.idx_fd, self._index_bytes(positions))
        return len(positions)

    @staticmethod
    def _index_bytes(positions) -> bytes:
        return b"".join(struct.pack(">Q", p) for p in positions)

    def append(self, header: bytes, body) -> None:
        """Queue one record as its header and body (joined once, at commit)."""
        pos = self.size
        self._pending.append(header)
        self._pending.append(body)
        self._pending_index += _POSITION.pack(pos)
        self.positions.append(pos)
        self.size += HEADER_SIZE + len(body)

    def commit(self) -> None:
        """Hand every pending record (then its index entries) to the OS."""
        if not self._pending:
            return
        _write_all(self.log_fd, self._pending)
        os.write(self.idx_fd, self._pending_index)
        self.committed_size = self.size
        self._pending.clear()
        self._pending_index.clear()

    def read(self, index: int) -> tuple[int, int, int, bytes]:
        pos = self.positions[index]
        if pos >= self.committed_size:
            self.commit()
        header = os.pread(self.log_fd, HEADER_SIZE, pos)
        body_size, checksum, publish_time, num_messages = _HEADER.unpack(header)
        body = os.pread(self.log_fd, body_size, pos + HEADER_SIZE)
        if len(body) != body_size or crc32c(body) != checksum:
            raise StorageError(f"{self.log_path}: entry {self.base + index} fails its checksum")
        return checksum, publish_time, num_messages, body

    def sync(self) -> None:
        self.commit()
        os.fsync(self.log_fd)
        os.fsync(self.idx_fd)

    def close(self) -> None:
        self.commit()
        for fd in (self.log_fd, self.idx_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _write_all(fd: int, buffers: list) -> None:
    """Write the buffers in order with writev (no joined copy), going on after a short write."""
    limit = min(os.sysconf("SC_IOV_MAX"), 1024)
    at = 0
    while at < len(buffers):
        chunk = buffers[at:at + limit]
        written = os.writev(fd, chunk)
        at += len(chunk)
        if written < sum(len(b) for b in chunk):  # short write: the rest of this chunk, plainly
            view = memoryview(b"".join(chunk))[written:]
            while view:
                view = view[os.write(fd, view):]


class TopicLog:
    """Append-only, segmented log of one topic-partition."""

    def __init__(self, directory: str, *, segment_bytes: int = 64 * 1024 * 1024,
                 sync_policy: str = SYNC_INTERVAL, cache_bytes: int = 32 * 1024 * 1024) -> None:
        if sync_policy not in (SYNC_ALWAYS, SYNC_INTERVAL, SYNC_NEVER):
            raise ValueError(f"unknown sync policy {sync_policy!r}")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.sync_policy = sync_policy
        os.makedirs(directory, exist_ok=True)
        bases = sorted(int(name[:-4]) for name in os.listdir(directory) if name.endswith(".log"))
        self._segments = [_Segment(directory, base) for base in bases] or [_Segment(directory, 0)]
        for segment in self._segments:
            segment.load_index()
        for segment in self._segments:
            segment.recover(max(0, len(segment.positions) - 1))
        last = self._segments[-1]
        self._bases = [s.base for s in self._segments]
        self.next_entry_id = last.base + len(last.positions)
        self._dirty = False
        self._uncommitted = False
        self._cache: collections.OrderedDict[int, Entry] = collections.OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes

    @property
    def first_entry_id(self) -> int:
        return self._segments[0].base

    @property
    def last_entry_id(self) -> int:
        return self.next_entry_id - 1

    def append(self, body, checksum: int | None, publish_time: int, num_messages: int) -> int:
        """Queue an entry; it reaches the OS at the next commit() (the broker commits before any receipt)."""
        if checksum is None:
            checksum = crc32c(body)
        segment = self._segments[-1]
        if segment.size >= self.segment_bytes and segment.positions:
            segment.sync()
            segment = _Segment(self.directory, self.next_entry_id)
            self._segments.append(segment)
            self._bases.append(segment.base)
        if type(body) is not bytes and not (type(body) is memoryview and type(body.obj) is bytes):
            body = bytes(body)  # queued until commit and cached: it must not change meanwhile
        segment.append(_HEADER.pack(len(body), checksum, publish_time, num_messages), body)
        entry_id = self.next_entry_id
        self.next_entry_id += 1
        self._dirty = True
        self._uncommitted = True
        self._remember(Entry(entry_id, body, checksum, publish_time, num_messages))
        return entry_id

    def commit(self) -> None:
        """Write what was appended; with the `always` policy, fsync it too."""
        if self._uncommitted:
            self._uncommitted = False
            if self.sync_policy == SYNC_ALWAYS:
                self._segments[-1].sync()
                self._dirty = False
            else:
                self._segments[-1].commit()

    def _remember(self, entry: Entry) -> None:
        self._cache[entry.entry_id] = entry
        self._cache_bytes += len(entry.body)
        while self._cache_bytes > self._cache_limit and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old.body)

    def read(self, entry_id: int) -> Entry:
        cached = self._cache.get(entry_id)
        if cached is not None:
            return cached
        if not self.first_entry_id <= entry_id < self.next_entry_id:
            raise KeyError(entry_id)
        i = bisect.bisect_right(self._bases, entry_id) - 1
        segment = self._segments[i]
        checksum, publish_time, num_messages, body = segment.read(entry_id - segment.base)
        return Entry(entry_id, body, checksum, publish_time, num_messages)

    def find_by_publish_time(self, publish_time: int) -> int:
        """The first entry published at or after `publish_time` (next_entry_id if none)."""
        lo, hi = self.first_entry_id, self.next_entry_id
        while lo < hi:
            mid = (lo + hi) // 2
            if self.read(mid).publish_time < publish_time:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def sync(self) -> None:
        self.commit()
        if self._dirty:
            self._segments[-1].sync()
            self._dirty = False

    def close(self) -> None:
        if self.sync_policy != SYNC_NEVER:
            self.sync()
        for segment in self._segments:
            segment.close()


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
