"""A log record, as stored and as read back:

    [u32 body_size][u32 CRC32C(body)][u64 publish_time][u32 num_messages][body]

where body is the entry exactly as the producer framed it: `[u32 metadata size][MessageMetadata]
[payload]`, the span the wire checksum covers, so the stored CRC doubles as the checksum of every
Message frame that re-sends it. A segment's .idx file holds one big-endian u64 file position per
entry."""
from __future__ import annotations

import array
import bisect
import struct
import sys
from typing import Iterable, MutableSequence, Sequence, Union

from crc32c import crc32c

from .files import StorageError

RECORD_HEADER = struct.Struct(">IIQI")
BODY_SIZE = struct.Struct(">I")  # a record's first field alone
HEADER_SIZE = RECORD_HEADER.size
_BIG_ENDIAN = sys.byteorder == "big"
# an entry's body: bytes, or a view of the bytes it was received in (kept without a copy)
Body = Union[bytes, memoryview]


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

    def __init__(self, entry_id: int, body: Body, checksum: int, publish_time: int, num_messages: int) -> None:
        self.entry_id = entry_id
        self.body = body
        self.checksum = checksum
        self.publish_time = publish_time
        self.num_messages = num_messages
        self.plain_value_start: int | None = None


def decode_index(raw: bytes) -> array.array[int]:
    """An index file's bytes as entry positions (a torn last one left out)."""
    positions = array.array("Q")
    positions.frombytes(raw[:len(raw) - len(raw) % 8])
    if not _BIG_ENDIAN:
        positions.byteswap()  # stored big-endian
    return positions


def encode_index(positions: Iterable[int]) -> bytes:
    """Entry positions as an index file stores them."""
    out = array.array("Q", positions)
    if not _BIG_ENDIAN:
        out.byteswap()
    return out.tobytes()


def record_at(buf: bytes | memoryview, offset: int, end: int) -> int | None:
    """The body size of a whole, checksummed record at `offset` in `buf` (not past `end`), else None."""
    if offset + HEADER_SIZE > end:
        return None
    body_size, checksum, _, _ = RECORD_HEADER.unpack_from(buf, offset)
    body_end = offset + HEADER_SIZE + body_size
    if body_end > end or body_size == 0:  # an entry is never empty; zeros are no record
        return None
    if crc32c(buf[offset + HEADER_SIZE:body_end]) != checksum:
        return None
    return body_size


def damaged_records(buf: bytes, offset: int, found: int, listed: Sequence[int] = ()) -> tuple[list[int], bool]:
    """Where the damaged records between `offset` and the next good record at `found` start: they
    keep their entry ids. Their headers are followed while they land exactly on `found`; else the
    index's positions (`listed`, in `buf`'s coordinates) are taken where it lists both ends and
    increases between them (a run of zeros over several records leaves no header to follow);
    else the gap counts as one entry, and the second value is False: how many it holds is not
    known (see `count_gap`)."""
    hops, at = [], offset
    while at < found and at + HEADER_SIZE <= found:
        body_size = BODY_SIZE.unpack_from(buf, at)[0]
        if body_size == 0:  # zeros: no header to follow
            break
        hops.append(at)
        at += HEADER_SIZE + body_size
    if at == found:
        return hops, True
    first = bisect.bisect_left(listed, offset)
    last = bisect.bisect_left(listed, found, first)
    if first < len(listed) and listed[first] == offset and last < len(listed) and listed[last] == found:
        between = listed[first:last]
        if all(b - a >= HEADER_SIZE for a, b in zip(between, list(between[1:]) + [found])):
            return list(between), True
    return [offset], False


def count_gap(positions: MutableSequence[int], uncounted: list[int], expected: int, end: int) -> int:
    """A segment whose entry count is known (`expected`: the next segment's first id less its
    own) and one damaged range whose entries could not be counted (`uncounted`: the index of its
    one position in `positions`, the record starts found in order; `end`: where the data ends):
    that range holds the entries missing from the count, each given a position in it (its own
    reads fail their checksum) so that the ids after it stay theirs. How many were added (0 when
    it cannot tell: more than one such range, none missing, or a range too short to hold them)."""
    missing = expected - len(positions)
    if len(uncounted) != 1 or missing <= 0:
        return 0
    at = uncounted[0]
    stop = positions[at + 1] if at + 1 < len(positions) else end
    if positions[at] + HEADER_SIZE * (missing + 1) > stop:  # a record takes more than a header
        return 0
    added = [positions[at] + HEADER_SIZE * k for k in range(1, missing + 1)]
    positions[at + 1:at + 1] = array.array("Q", added) if isinstance(positions, array.array) else added
    return missing
