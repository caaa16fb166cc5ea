"""Pure-Python twin of pulsarwire._codec (same API, same behaviour, same errors).

Used when the Cython extension is absent or PULSARWIRE_PURE_PYTHON=1 is set.
tests/ run the whole suite against both twins.

Frame layout (all integers big-endian):

    [u32 total_size]                  bytes after this field
    [u32 command_size][BaseCommand]
    -- payload frames (SEND, MESSAGE) only --
    [u16 0x0e02][u32 size][BrokerEntryMetadata]     optional
    [u16 0x0e01][u32 CRC32C]                        optional; CRC covers the rest
    [u32 metadata_size][MessageMetadata][payload]

Batch payload (after decompression), num_messages_in_batch entries of:

    [u32 smm_size][SingleMessageMetadata][payload_size bytes]
"""
from __future__ import annotations

import struct
from array import array
from collections import deque
from typing import TYPE_CHECKING, Any

from crc32c import crc32c
from google.protobuf.message import DecodeError

from . import compression
from ._proto import PulsarApi_pb2 as pb
from .errors import (
    BadBatchError, BadCommandError, BadMagicError, BadMetadataError, ChecksumMismatchError,
    FrameTooLargeError, TruncatedFrameError,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TypeVar

    from google.protobuf.message import Message

    from .errors import CodecError

    _Bytes = bytes | bytearray | memoryview
    _M = TypeVar("_M", bound=Message)
    # (start, end) of a field's bytes in the buffer it was read from
    _Span = tuple[int, int]
    # one row for _column_fields: payload, partition_key, ordering_key, properties, event_time,
    # sequence_id, batch_index, compacted_out, null_value, null_partition_key, partition_key_b64_encoded
    _Row = tuple[bytes, bytes | None, bytes | None, list[tuple[bytes, bytes]], int, int | None, int,
                 bool, bool, bool, bool]

IMPLEMENTATION = "python"

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
#: A 5 MiB message must still fit with its command and metadata around it.
FRAME_PADDING = 10 * 1024
DEFAULT_MAX_FRAME_SIZE = DEFAULT_MAX_MESSAGE_SIZE + FRAME_PADDING

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_BaseCommand = pb.BaseCommand
_MessageMetadata = pb.MessageMetadata
_BrokerEntryMetadata = pb.BrokerEntryMetadata


class Frame:
    """One decoded frame. Payload fields are None for simple commands.

    `payload` is the payload as carried (still compressed); `metadata_and_payload`
    is the span the checksum covers, which a broker stores and re-sends as is.
    Both are memoryviews into the bytes that were fed (zero-copy).
    """

    command: pb.BaseCommand
    metadata: pb.MessageMetadata | None
    payload: memoryview | None
    metadata_and_payload: memoryview | None
    broker_entry_metadata: pb.BrokerEntryMetadata | None
    checksum: int | None
    size: int

    __slots__ = ("command", "metadata", "payload", "metadata_and_payload",
                 "broker_entry_metadata", "checksum", "size")

    def __init__(self, command: pb.BaseCommand, metadata: pb.MessageMetadata | None, payload: memoryview | None,
                 metadata_and_payload: memoryview | None, broker_entry_metadata: pb.BrokerEntryMetadata | None,
                 checksum: int | None, size: int) -> None:
        self.command = command
        self.metadata = metadata
        self.payload = payload
        self.metadata_and_payload = metadata_and_payload
        self.broker_entry_metadata = broker_entry_metadata
        self.checksum = checksum
        self.size = size

    @property
    def type(self) -> int:
        return self.command.type

    @property
    def checksum_verified(self) -> bool:
        """True when the frame carried 0x0e01 (and so its CRC32C matched)."""
        return self.checksum is not None

    def messages(self, max_uncompressed_size: int = compression.DEFAULT_MAX_UNCOMPRESSED_SIZE
                 ) -> list[SingleMessage]:
        """Decompress the payload and split it into SingleMessage objects."""
        if self.metadata is None:
            return []
        # payload is None only with metadata None, so it is set here (no check added to this path)
        return split_messages(self.metadata,
                              decompress_payload(self.metadata, self.payload,  # type: ignore[arg-type]
                                                 max_uncompressed_size))

    def columns(self, max_uncompressed_size: int = compression.DEFAULT_MAX_UNCOMPRESSED_SIZE) -> Columns:
        """Decompress the payload and split it into Columns (no rows for a simple command)."""
        if self.metadata is None:
            return _empty_columns(Columns)
        # payload is None only with metadata None, as in messages()
        return split_columns(self.metadata,
                             decompress_payload(self.metadata, self.payload,  # type: ignore[arg-type]
                                                max_uncompressed_size))

    def __repr__(self) -> str:
        kind = _BaseCommand.Type.Name(self.command.type) if self.command.type in _TYPE_NAMES else self.command.type
        return f"<Frame {kind} size={self.size} payload={'-' if self.payload is None else len(self.payload)}>"


_TYPE_NAMES = set(_BaseCommand.Type.values())


def _parse(message_type: type[_M], view: memoryview, error_type: type[CodecError], what: str,
           command: pb.BaseCommand | None = None) -> _M:
    try:
        message = message_type.FromString(view)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise error_type(f"{what} does not parse: {exc}", command=command) from None
    if not message.IsInitialized():  # upb does not enforce proto2 `required` itself
        missing = ", ".join(message.FindInitializationErrors())
        raise error_type(f"{what} lacks required fields: {missing}", command=command)
    return message


def _decode_frame(view: memoryview, start: int, end: int) -> Frame:
    """Decode the frame view[start:end] whose total_size was already checked."""
    if end - start < 8:
        raise TruncatedFrameError(f"frame of {end - start - 4} bytes cannot hold its 4-byte command size")
    command_size = _U32.unpack_from(view, start + 4)[0]
    pos = start + 8
    if command_size > end - pos:
        raise TruncatedFrameError(f"command size {command_size} exceeds the {end - pos} bytes left in the frame")
    command = _parse(_BaseCommand, view[pos:pos + command_size], BadCommandError, "BaseCommand")
    pos += command_size
    if pos == end:
        return Frame(command, None, None, None, None, None, end - start)

    broker_entry_metadata: pb.BrokerEntryMetadata | None = None
    if end - pos >= 2 and _U16.unpack_from(view, pos)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if end - pos < 6:
            raise TruncatedFrameError("broker entry metadata header is cut off", command=command)
        size = _U32.unpack_from(view, pos + 2)[0]
        if size > end - pos - 6:
            raise TruncatedFrameError(
                f"broker entry metadata size {size} exceeds the {end - pos - 6} bytes left", command=command)
        broker_entry_metadata = _parse(_BrokerEntryMetadata, view[pos + 6:pos + 6 + size],
                                       BadMetadataError, "BrokerEntryMetadata", command)
        pos += 6 + size

    checksum: int | None = None
    if end - pos >= 2 and _U16.unpack_from(view, pos)[0] == MAGIC_CRC32C:
        if end - pos < 6:
            raise TruncatedFrameError("checksum header is cut off", command=command)
        checksum = _U32.unpack_from(view, pos + 2)[0]
        pos += 6
        actual = crc32c(view[pos:end])
        if actual != checksum:
            raise ChecksumMismatchError(checksum, actual, command=command)

    if end - pos < 4:
        raise TruncatedFrameError(
            f"payload section of {end - pos} bytes cannot hold its metadata size", command=command)
    metadata_size = _U32.unpack_from(view, pos)[0]
    if metadata_size > end - pos - 4:
        if checksum is None:
            raise BadMagicError(
                f"payload section starts with 0x{_U16.unpack_from(view, pos)[0]:04x}: neither magic "
                f"0x{MAGIC_CRC32C:04x} nor a metadata size that fits", command=command)
        raise TruncatedFrameError(
            f"metadata size {metadata_size} exceeds the {end - pos - 4} bytes left", command=command)
    metadata = _parse(_MessageMetadata, view[pos + 4:pos + 4 + metadata_size],
                      BadMetadataError, "MessageMetadata", command)
    return Frame(command, metadata, view[pos + 4 + metadata_size:end], view[pos:end],
                 broker_entry_metadata, checksum, end - start)


class SendFrame:
    """A plain, valid SEND frame, read without building protobuf messages (a broker's hot path).

    FrameReader(send_fast_path=True) returns one for a Send frame whose command
    and metadata use only common fields and are well formed; any other frame,
    and any frame with a problem, takes the full path (and its typed errors).
    """

    producer_id: int
    sequence_id: int
    num_messages: int
    highest_sequence_id: int | None
    is_chunk: bool
    publish_time: int
    deliver_at_time: int | None
    chunk_id: int | None
    metadata_and_payload: memoryview
    checksum: int
    size: int
    num_messages_in_batch: int | None  # from the metadata; None: not a batch
    compression: int

    __slots__ = ("producer_id", "sequence_id", "num_messages", "highest_sequence_id", "is_chunk",
                 "publish_time", "deliver_at_time", "chunk_id", "metadata_and_payload", "checksum", "size",
                 "num_messages_in_batch", "compression")

    type = 6  # BaseCommand.SEND

    @property
    def checksum_verified(self) -> bool:
        return self.checksum is not None


class ReceiptFrame:
    """A plain, valid SEND_RECEIPT, read without building protobuf messages (a client's hot path:
    one for every send() and every batch).

    FrameReader(receipt_fast_path=True) returns one for a SendReceipt whose command holds only
    producer_id, sequence_id, highest_sequence_id and a message id of ledger and entry; any other
    frame, and any frame with a problem, takes the full path (and its typed errors).
    highest_sequence_id is sequence_id's value when the broker left it out; ledger_id and
    entry_id are signed (a duplicate's are -1).
    """

    producer_id: int
    sequence_id: int
    highest_sequence_id: int
    ledger_id: int
    entry_id: int
    size: int

    __slots__ = ("producer_id", "sequence_id", "highest_sequence_id", "ledger_id", "entry_id", "size")

    type = 7  # BaseCommand.SEND_RECEIPT


def _fast_receipt(view: memoryview, start: int, end: int) -> ReceiptFrame | None:
    # [u32 total][u32 command size][BaseCommand: 1 type = SEND_RECEIPT, 7 send_receipt], nothing after
    if end - start < 10 or view[start + 8] != 0x08 or view[start + 9] != 0x07:
        return None
    command_size = _U32.unpack_from(view, start + 4)[0]
    if command_size != end - start - 8:
        return None
    command = _scan_fields(view, start + 8, end)
    if command is None or len(command) != 2 or command[1][:2] != (7, 2):
        return None
    receipt = _scan_fields(view, *command[1][2])
    if receipt is None:
        return None
    values: dict[int, int] = {}
    message_id: dict[int, int] | None = None
    for field, wire_type, value in receipt:
        if field == 3 and wire_type == 2:  # message_id: 1 ledgerId, 2 entryId
            id_fields = _scan_fields(view, *value)
            if id_fields is None or any(kind != 0 or number not in (1, 2) for number, kind, _ in id_fields):
                return None
            message_id = {number: varint for number, _, varint in id_fields}
            if len(message_id) != 2:
                return None
        elif wire_type != 0 or field not in (1, 2, 4):
            return None
        else:
            values[field] = value
    if 1 not in values or 2 not in values or message_id is None:
        return None
    frame = ReceiptFrame()
    frame.producer_id = values[1]
    frame.sequence_id = values[2]
    frame.highest_sequence_id = values.get(4, values[2])
    frame.ledger_id = _signed(message_id[1])
    frame.entry_id = _signed(message_id[2])
    frame.size = end - start
    return frame


# CommandSend fields read by the fast path (all varints); anything else falls back.
_SEND_VARINTS = frozenset((1, 2, 3, 4, 5, 6, 7, 8))
# MessageMetadata fields the fast path accepts, by wire type; anything else falls back.
_METADATA_VARINTS = frozenset((2, 3, 8, 9, 11, 12, 17, 19, 24, 25, 27, 28, 29, 30))
_METADATA_BYTES = frozenset((1, 4, 6, 18, 26))


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _int32(value: int) -> int:
    """An int32 field's value, truncated as protobuf does."""
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _scan_fields(view: memoryview, pos: int, end: int) -> list[tuple[int, int, Any]] | None:
    """(field, wire_type, value_or_span) for each field, or None when the bytes are not plain protobuf.

    value_or_span is the int of a varint (wire type 0), the (start, end) span of bytes (wire type 2).
    """
    fields: list[tuple[int, int, Any]] = []
    while pos < end:
        try:
            tag, pos = _varint(view, pos, end)
            wire_type = tag & 7
            if wire_type == 0:
                value, pos = _varint(view, pos, end)
                fields.append((tag >> 3, 0, value))
            elif wire_type == 2:
                length, pos = _varint(view, pos, end)
                if length > end - pos:
                    return None
                fields.append((tag >> 3, 2, (pos, pos + length)))
                pos += length
            else:
                return None
        except BadBatchError:
            return None
    return fields


def _fast_send(view: memoryview, start: int, end: int) -> SendFrame | None:
    if end - start < 10 or view[start + 8] != 0x08 or view[start + 9] != 0x06:
        return None  # not a BaseCommand that starts with type = SEND
    command_size = _U32.unpack_from(view, start + 4)[0]
    pos = start + 8
    if command_size > end - pos:
        return None
    command = _scan_fields(view, pos, pos + command_size)
    if command is None or len(command) != 2 or command[1][:2] != (6, 2):
        return None
    send = _scan_fields(view, *command[1][2])
    if send is None:
        return None
    values: dict[int, int] = {}
    for field, wire_type, value in send:
        if wire_type != 0 or field not in _SEND_VARINTS:
            return None
        values[field] = value
    if 1 not in values or 2 not in values:
        return None
    pos += command_size
    if end - pos < 6 or _U16.unpack_from(view, pos)[0] != MAGIC_CRC32C:
        return None  # no checksum, or broker entry metadata: the full path handles those
    checksum = _U32.unpack_from(view, pos + 2)[0]
    pos += 6
    if crc32c(view[pos:end]) != checksum or end - pos < 4:
        return None
    metadata_size = _U32.unpack_from(view, pos)[0]
    if metadata_size > end - pos - 4:
        return None
    metadata = _scan_fields(view, pos + 4, pos + 4 + metadata_size)
    if metadata is None:
        return None
    found: dict[int, Any] = {}  # a varint's int, or a bytes field's span
    for field, wire_type, value in metadata:
        if wire_type == 0 and field in _METADATA_VARINTS:
            found[field] = value
        elif wire_type == 2 and field in _METADATA_BYTES:
            if field == 4 and not _plain_key_value(view, *value):
                return None
            found[field] = value
        else:
            return None
    if 1 not in found or 2 not in found or 3 not in found:
        return None
    frame = SendFrame()
    frame.producer_id = values[1]
    frame.sequence_id = values[2]
    frame.num_messages = _int32(values[3]) if 3 in values else 1
    frame.highest_sequence_id = values.get(6)
    frame.is_chunk = bool(values.get(7, 0))
    frame.publish_time = found[3]
    frame.deliver_at_time = _signed(found[19]) if 19 in found else None
    frame.chunk_id = _int32(found[29]) if 29 in found else None
    frame.metadata_and_payload = view[pos:end]
    frame.checksum = checksum
    frame.size = end - start
    frame.num_messages_in_batch = _int32(found[11]) if 11 in found else None
    frame.compression = _int32(found.get(8, 0))
    return frame


def _plain_key_value(view: memoryview, start: int, end: int) -> bool:
    fields = _scan_fields(view, start, end)
    if fields is None or any(wire_type != 2 or field not in (1, 2) for field, wire_type, _ in fields):
        return False
    present = {field for field, _, _ in fields}
    return present == {1, 2}


def _check_total_size(total_size: int, max_frame_size: int) -> None:
    if total_size > max_frame_size:
        raise FrameTooLargeError(f"frame of {total_size} bytes is over the {max_frame_size}-byte limit")
    if total_size < 4:
        raise TruncatedFrameError(f"frame of {total_size} bytes cannot hold its 4-byte command size")


class FrameReader:
    """Incremental frame reader: feed byte chunks of any size, take whole frames.

    Frames that lie inside one fed chunk are views into it (zero-copy); a frame
    split across chunks is joined once. A size error leaves the stream out of
    sync, so it is sticky; any later error (magic, checksum, metadata) consumes
    just its frame and the next frame can still be read.
    """

    max_frame_size: int
    send_fast_path: bool
    receipt_fast_path: bool

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, send_fast_path: bool = False,
                 receipt_fast_path: bool = False) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must be at least 8")
        self.max_frame_size = max_frame_size
        self.send_fast_path = send_fast_path
        self.receipt_fast_path = receipt_fast_path
        self._chunks: deque[memoryview] = deque()
        self._pos = 0          # read offset into self._chunks[0]
        self._buffered = 0     # unread bytes across all chunks
        self._error: Exception | None = None

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet returned as frames."""
        return self._buffered

    def feed(self, data: _Bytes) -> None:
        if self._error is not None:
            raise self._error
        if not isinstance(data, bytes):
            data = bytes(data)  # views must not see the caller reuse its buffer
        if data:
            self._chunks.append(memoryview(data))
            self._buffered += len(data)

    def next_frame(self) -> Frame | SendFrame | ReceiptFrame | None:
        """The next complete frame, or None until more bytes are fed."""
        if self._error is not None:
            raise self._error
        if self._buffered < 4:
            return None
        head = self._chunks[0]
        pos = self._pos
        if len(head) - pos >= 4:
            total_size = _U32.unpack_from(head, pos)[0]
        else:
            total_size = _U32.unpack(self._peek(4))[0]
        try:
            _check_total_size(total_size, self.max_frame_size)
        except Exception as exc:
            self._error = exc
            raise
        need = 4 + total_size
        if self._buffered < need:
            return None
        if len(head) - pos >= need:
            view, start = head, pos
            self._pos += need
            if self._pos == len(head):
                self._chunks.popleft()
                self._pos = 0
        else:
            view, start = memoryview(self._take(need)), 0
        self._buffered -= need
        if self.send_fast_path:
            fast = _fast_send(view, start, start + need)
            if fast is not None:
                return fast
        if self.receipt_fast_path:
            receipt = _fast_receipt(view, start, start + need)
            if receipt is not None:
                return receipt
        return _decode_frame(view, start, start + need)

    def __iter__(self) -> FrameReader:
        return self

    def __next__(self) -> Frame | SendFrame | ReceiptFrame:
        frame = self.next_frame()
        if frame is None:
            raise StopIteration
        return frame

    def close(self) -> None:
        """Declare end of stream; bytes of an unfinished frame are an error."""
        if self._buffered:
            raise TruncatedFrameError(f"stream ended inside a frame ({self._buffered} bytes left over)")

    def _peek(self, count: int) -> bytes:
        out = bytearray()
        pos = self._pos
        for chunk in self._chunks:
            out += chunk[pos:pos + count - len(out)]
            pos = 0
            if len(out) == count:
                break
        return bytes(out)

    def _take(self, count: int) -> bytes:
        pieces = []
        left = count
        while left:
            head = self._chunks[0]
            piece = memoryview(head)[self._pos:self._pos + left]  # a view: copied once, by join
            pieces.append(piece)
            left -= len(piece)
            self._pos += len(piece)
            if self._pos == len(head):
                self._chunks.popleft()
                self._pos = 0
        return b"".join(pieces)


def decode_frame(data: _Bytes) -> Frame:
    """Decode exactly one complete frame held in `data` (bytes-like)."""
    view = memoryview(data if type(data) is bytes else bytes(data))  # frames must not change under us
    if len(view) < 4:
        raise TruncatedFrameError(f"{len(view)} bytes cannot hold a frame size")
    total_size = _U32.unpack_from(view, 0)[0]
    _check_total_size(total_size, max(DEFAULT_MAX_FRAME_SIZE, len(view)))
    if 4 + total_size != len(view):
        raise TruncatedFrameError(f"frame declares {total_size} bytes but {len(view) - 4} follow its size")
    return _decode_frame(view, 0, len(view))


def decompress_payload(metadata: pb.MessageMetadata, payload: _Bytes,
                       max_uncompressed_size: int = compression.DEFAULT_MAX_UNCOMPRESSED_SIZE) -> _Bytes:
    """The payload as the producer built it: decompressed and size-checked."""
    kind = metadata.compression
    if kind == compression.NONE:
        return payload
    return compression.decompress(kind, payload, metadata.uncompressed_size, max_uncompressed_size)


# --- SingleMessageMetadata --------------------------------------------------
#
# A batch payload is num_messages_in_batch entries of
#
#     [u32 smm_size][SingleMessageMetadata, smm_size bytes][payload, payload_size bytes]
#
# SingleMessageMetadata fields read here, by tag byte (field << 3 | wire type):
#
#     0x0a properties: KeyValue {0x0a key, 0x12 value}, repeated
#     0x12 partition_key (string)      0x18 payload_size (required)   0x20 compacted_out
#     0x28 event_time                  0x30 partition_key_b64_encoded  0x3a ordering_key (bytes)
#     0x40 sequence_id                 0x48 null_value                 0x50 null_partition_key
#
# Any other field is skipped by its wire type. A field other than properties
# keeps its last value, as protobuf does. _parse_smm is the one reader of these
# fields: split_messages, SingleMessage and split_columns all use it.

def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise BadBatchError("varint runs past the end of SingleMessageMetadata")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise BadBatchError("varint longer than 10 bytes in SingleMessageMetadata")


def _skip(buf: memoryview, pos: int, end: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint(buf, pos, end)[1]
    if wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    elif wire_type == 2:
        length, pos = _varint(buf, pos, end)
        pos += length
    else:
        raise BadBatchError(f"unsupported wire type {wire_type} in SingleMessageMetadata")
    if pos > end:
        raise BadBatchError("field runs past the end of SingleMessageMetadata")
    return pos


def _utf8(buf: memoryview, start: int, end: int) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise BadBatchError(f"string in SingleMessageMetadata is not UTF-8: {exc}") from None


def _key_value(buf: memoryview, start: int, end: int, check_utf8: bool) -> tuple[_Span, _Span]:
    """One KeyValue in buf[start:end]: ((key start, end), (value start, end)), last occurrence of each."""
    key: _Span | None
    value: _Span | None
    key = value = None
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        if tag == 0x0A or tag == 0x12:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise BadBatchError("property runs past its KeyValue")
            if check_utf8:
                _utf8(buf, pos, pos + length)
            if tag == 0x0A:
                key = (pos, pos + length)
            else:
                value = (pos, pos + length)
            pos += length
        else:
            pos = _skip(buf, pos, end, tag & 7)
    if key is None or value is None:
        raise BadBatchError("property KeyValue lacks its required key or value")
    return key, value


class _Smm:
    """The fields of one SingleMessageMetadata; strings and bytes as (start, end) spans."""

    payload_size: int
    properties: list[tuple[_Span, _Span]]  # (key span, value span) of each KeyValue
    partition_key: _Span | None
    ordering_key: _Span | None
    event_time: int
    sequence_id: int | None
    compacted_out: bool
    partition_key_b64_encoded: bool
    null_value: bool
    null_partition_key: bool

    __slots__ = ("payload_size", "properties", "partition_key", "ordering_key", "event_time", "sequence_id",
                 "compacted_out", "partition_key_b64_encoded", "null_value", "null_partition_key")


_SMM_VARINT_TAGS = frozenset((0x18, 0x20, 0x28, 0x30, 0x40, 0x48, 0x50))


def _parse_smm(buf: memoryview, start: int, end: int, check_utf8: bool) -> _Smm:
    """Check one SingleMessageMetadata in buf[start:end] and read its fields.

    check_utf8 also checks every string it meets (split_messages leaves that
    to the first read of a field, where SingleMessage raises).
    """
    smm = _Smm()
    payload_size: int | None = None  # required: set on smm once known to be present
    smm.properties = []
    smm.partition_key = smm.ordering_key = smm.sequence_id = None
    smm.event_time = 0
    smm.compacted_out = smm.partition_key_b64_encoded = smm.null_value = smm.null_partition_key = False
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        if tag in _SMM_VARINT_TAGS:
            value, pos = _varint(buf, pos, end)
            if tag == 0x18:
                payload_size = value - (1 << 64) if value >= 1 << 63 else value
            elif tag == 0x20:
                smm.compacted_out = value != 0
            elif tag == 0x28:
                smm.event_time = value
            elif tag == 0x30:
                smm.partition_key_b64_encoded = value != 0
            elif tag == 0x40:
                smm.sequence_id = value
            elif tag == 0x48:
                smm.null_value = value != 0
            else:
                smm.null_partition_key = value != 0
        elif tag == 0x0A or tag == 0x12 or tag == 0x3A:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise BadBatchError("property runs past the end of SingleMessageMetadata" if tag == 0x0A
                                    else "field runs past the end of SingleMessageMetadata")
            if tag == 0x0A:
                smm.properties.append(_key_value(buf, pos, pos + length, check_utf8))
            elif tag == 0x12:
                if check_utf8:
                    _utf8(buf, pos, pos + length)
                smm.partition_key = (pos, pos + length)
            else:
                smm.ordering_key = (pos, pos + length)
            pos += length
        else:
            pos = _skip(buf, pos, end, tag & 7)
    if payload_size is None:
        raise BadBatchError("SingleMessageMetadata lacks its required payload_size")
    smm.payload_size = payload_size
    return smm


class SingleMessage:
    """One message of a payload: its bytes (a memoryview) and its metadata.

    In a batch, metadata fields are read from the entry's SingleMessageMetadata
    the first time one is asked for; `batch_index` is its position (-1 when the
    payload was not a batch).
    """

    payload: memoryview
    batch_index: int
    batch_size: int
    _smm: tuple[memoryview, int, int] | None  # (buffer, metadata start, metadata end); None: not a batch
    _decoded: bool
    _properties: dict[str, str]
    _partition_key: str | None
    _partition_key_b64_encoded: bool
    _ordering_key: bytes | None
    _event_time: int
    _sequence_id: int | None
    _null_value: bool
    _null_partition_key: bool
    _compacted_out: bool

    __slots__ = ("payload", "batch_index", "batch_size", "_smm", "_decoded",
                 "_properties", "_partition_key", "_partition_key_b64_encoded", "_ordering_key",
                 "_event_time", "_sequence_id", "_null_value", "_null_partition_key", "_compacted_out")

    def data(self) -> bytes:
        return bytes(self.payload)

    @property
    def payload_size(self) -> int:
        """len(payload)."""
        return len(self.payload)

    def _decode(self) -> None:
        # only called while not _decoded, which split_messages sets for a message without _smm
        buf, start, end = self._smm  # type: ignore[misc]
        smm = _parse_smm(buf, start, end, check_utf8=True)  # structure was checked by split_messages
        self._properties = {_utf8(buf, *key): _utf8(buf, *value) for key, value in smm.properties}
        if smm.partition_key is not None:
            self._partition_key = _utf8(buf, *smm.partition_key)
        if smm.ordering_key is not None:
            self._ordering_key = bytes(buf[smm.ordering_key[0]:smm.ordering_key[1]])
        self._compacted_out = smm.compacted_out
        self._event_time = smm.event_time
        self._partition_key_b64_encoded = smm.partition_key_b64_encoded
        self._sequence_id = smm.sequence_id
        self._null_value = smm.null_value
        self._null_partition_key = smm.null_partition_key
        self._decoded = True

    def _field(self, name: str) -> Any:
        if not self._decoded:
            self._decode()
        return getattr(self, name)

    properties = property(lambda self: self._field("_properties"))
    partition_key = property(lambda self: self._field("_partition_key"))
    partition_key_b64_encoded = property(lambda self: self._field("_partition_key_b64_encoded"))
    ordering_key = property(lambda self: self._field("_ordering_key"))
    event_time = property(lambda self: self._field("_event_time"))
    sequence_id = property(lambda self: self._field("_sequence_id"))
    null_value = property(lambda self: self._field("_null_value"))
    null_partition_key = property(lambda self: self._field("_null_partition_key"))
    compacted_out = property(lambda self: self._field("_compacted_out"))

    def __repr__(self) -> str:
        return f"<SingleMessage batch_index={self.batch_index} {len(self.payload)} bytes>"


def _blank_message(payload: memoryview, batch_index: int, batch_size: int) -> SingleMessage:
    message = SingleMessage.__new__(SingleMessage)
    message.payload = payload
    message.batch_index = batch_index
    message.batch_size = batch_size
    message._partition_key = None
    message._partition_key_b64_encoded = False
    message._ordering_key = None
    message._event_time = 0
    message._sequence_id = None
    message._null_value = False
    message._null_partition_key = False
    message._compacted_out = False
    return message


def _stable_view(payload: _Bytes) -> memoryview:
    """A byte view that cannot change under the messages: bytes are viewed, anything mutable copied."""
    view = memoryview(payload)
    if type(payload) is not bytes and not (type(view.obj) is bytes and view.c_contiguous and view.itemsize == 1):
        view = memoryview(bytes(view))
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _check_batch_count(count: int, end: int) -> None:
    if count < 0 or count > end // 5 + 1:
        raise BadBatchError(f"num_messages_in_batch {count} cannot fit in {end} bytes")


def _batch_entry(view: memoryview, pos: int, index: int, count: int,
                 check_utf8: bool) -> tuple[_Smm, int, int, int]:
    """Check entry `index` of a batch, which starts at view[pos]; in wire order.

    Returns its parsed SingleMessageMetadata, where that starts, and where its
    payload starts and ends.
    """
    end = len(view)
    if end - pos < 4:
        raise BadBatchError(f"batch ends after {index} of {count} entries")
    smm_size = _U32.unpack_from(view, pos)[0]
    pos += 4
    if smm_size > end - pos:
        raise BadBatchError(f"entry {index}: metadata size {smm_size} exceeds the {end - pos} bytes left")
    smm_end = pos + smm_size
    smm = _parse_smm(view, pos, smm_end, check_utf8)
    if smm.payload_size < 0 or smm.payload_size > end - smm_end:
        raise BadBatchError(f"entry {index}: payload_size {smm.payload_size} does not fit in {end - smm_end} bytes")
    return smm, pos, smm_end, smm_end + smm.payload_size


def _check_batch_end(view: memoryview, pos: int, count: int) -> None:
    if pos != len(view):
        raise BadBatchError(f"{len(view) - pos} bytes left over after {count} batch entries")


def count_batch(payload: _Bytes, count: int) -> int:
    """`count` when the uncompressed batch payload holds exactly that many messages, checked as
    split_messages checks them (the same BadBatchError otherwise), without making the messages."""
    view = _stable_view(payload)
    _check_batch_count(count, len(view))
    pos = 0
    for index in range(count):
        _, _, _, pos = _batch_entry(view, pos, index, count, check_utf8=False)
    _check_batch_end(view, pos, count)
    return count


def count_entry_batch(entry: _Bytes, count: int) -> int:
    """count_batch of the uncompressed batch payload in `entry`, laid out as a Send frame carries
    it and the broker stores it: [u32 metadata size][MessageMetadata][payload]. BadBatchError
    also when the metadata size points past the end."""
    view = _stable_view(entry)
    if len(view) < 4:
        raise BadBatchError(f"an entry of {len(view)} bytes cannot hold a metadata size")
    metadata_size = int.from_bytes(view[:4], "big")
    if metadata_size > len(view) - 4:
        raise BadBatchError(f"metadata size {metadata_size} exceeds the {len(view) - 4} bytes after it")
    return count_batch(view[4 + metadata_size:], count)


def split_messages(metadata: pb.MessageMetadata, payload: _Bytes) -> list[SingleMessage]:
    """Split an uncompressed payload into its messages.

    A payload is a batch when MessageMetadata.num_messages_in_batch is present
    (presence, not value, as the reference clients decide).
    """
    view = _stable_view(payload)
    if not metadata.HasField("num_messages_in_batch"):
        message = _blank_message(view, -1, 0)
        message._properties = {kv.key: kv.value for kv in metadata.properties}
        if metadata.HasField("partition_key"):
            message._partition_key = metadata.partition_key
        message._partition_key_b64_encoded = metadata.partition_key_b64_encoded
        if metadata.HasField("ordering_key"):
            message._ordering_key = metadata.ordering_key
        message._event_time = metadata.event_time
        message._sequence_id = metadata.sequence_id
        message._null_value = metadata.null_value
        message._null_partition_key = metadata.null_partition_key
        message._smm = None
        message._decoded = True
        return [message]

    count = metadata.num_messages_in_batch
    _check_batch_count(count, len(view))
    messages: list[SingleMessage] = []
    pos = 0
    for index in range(count):
        _, smm_start, payload_start, pos = _batch_entry(view, pos, index, count, check_utf8=False)
        message = _blank_message(view[payload_start:pos], index, count)
        message._smm = (view, smm_start, payload_start)
        message._decoded = False
        messages.append(message)
    _check_batch_end(view, pos, count)
    return messages


# --- columns ----------------------------------------------------------------

#: Columns' fields, in the order Columns(...) takes them.
_COLUMN_FIELDS = (
    "count", "payloads", "payload_offsets",
    "partition_keys", "partition_key_offsets", "has_partition_key",
    "ordering_keys", "ordering_key_offsets", "has_ordering_key",
    "property_offsets", "property_keys", "property_key_offsets", "property_values", "property_value_offsets",
    "event_times", "sequence_ids", "has_sequence_id", "batch_indexes",
    "compacted_out", "null_value", "null_partition_key", "partition_key_b64_encoded",
)
_BITMAP_FIELDS = ("has_partition_key", "has_ordering_key", "has_sequence_id",
                  "compacted_out", "null_value", "null_partition_key", "partition_key_b64_encoded")


class Columns:
    """A payload split into columns: contiguous buffers and offset arrays, no object per message.

    Row i's payload is payloads[payload_offsets[i]:payload_offsets[i + 1]];
    partition keys, ordering keys and each property's key and value are laid out
    alike (Arrow's large-binary layout: int64 offsets, one more than values).
    Row i's properties are the pairs property_offsets[i] to property_offsets[i + 1]
    (Arrow's map layout), every pair as carried, in order (a dict keeps the last
    of a repeated key). has_* and the flag columns are bitmaps: row i is bit
    i % 8 of byte i // 8 (Arrow's validity layout). Text is UTF-8, checked.
    An absent partition or ordering key is an empty span with its has_* bit 0;
    an absent sequence_id is 0 with has_sequence_id 0; event_time is 0 when
    absent. batch_indexes is -1 for a payload that is not a batch.

    Int arrays are array.array ('q' int64, 'Q' uint64 for event_times and
    sequence_ids), byte buffers bytearray: both wrap zero-copy with
    pyarrow.py_buffer, which to_arrow() does.
    """

    count: int
    payloads: bytearray
    payload_offsets: array[int]
    partition_keys: bytearray
    partition_key_offsets: array[int]
    has_partition_key: bytearray
    ordering_keys: bytearray
    ordering_key_offsets: array[int]
    has_ordering_key: bytearray
    property_offsets: array[int]
    property_keys: bytearray
    property_key_offsets: array[int]
    property_values: bytearray
    property_value_offsets: array[int]
    event_times: array[int]
    sequence_ids: array[int]
    has_sequence_id: bytearray
    batch_indexes: array[int]
    compacted_out: bytearray
    null_value: bytearray
    null_partition_key: bytearray
    partition_key_b64_encoded: bytearray

    __slots__ = _COLUMN_FIELDS

    def __init__(self, *values: Any) -> None:
        if len(values) != len(_COLUMN_FIELDS):
            raise TypeError(f"Columns takes {len(_COLUMN_FIELDS)} values, got {len(values)}")
        for name, value in zip(_COLUMN_FIELDS, values):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Columns is read-only")

    def __len__(self) -> int:
        return self.count

    def row(self, index: int) -> dict[str, Any]:
        """Row `index` as a dict of Python values, named like SingleMessage's attributes."""
        return _columns_row(self, index)

    def to_arrow(self) -> Any:
        """A pyarrow.RecordBatch over these buffers (no copy of payloads or text; needs pyarrow)."""
        return _columns_to_arrow(self)

    def __repr__(self) -> str:
        return f"<Columns {self.count} rows, {len(self.payloads)} payload bytes>"


def _bit(bitmap: bytearray, index: int) -> bool:
    return bool(bitmap[index >> 3] >> (index & 7) & 1)


def _column_fields(rows: list[_Row]) -> tuple[Any, ...]:
    """Columns' values from rows of (payload, partition_key, ordering_key, [(key, value)], event_time,
    sequence_id, batch_index, compacted_out, null_value, null_partition_key, partition_key_b64_encoded),
    text as UTF-8 bytes, None where absent. The pure twin's builder; the Cython twin uses it for a
    payload that is not a batch."""
    def spans(values: Iterable[bytes]) -> tuple[bytearray, array[int]]:
        data = bytearray()
        offsets = array("q", [0])
        for value in values:
            data += value
            offsets.append(len(data))
        return data, offsets

    def bitmap(bits: Iterable[bool]) -> bytearray:
        out = bytearray((len(rows) + 7) // 8)
        for index, bit in enumerate(bits):
            if bit:
                out[index >> 3] |= 1 << (index & 7)
        return out

    payloads, payload_offsets = spans(row[0] for row in rows)
    partition_keys, partition_key_offsets = spans(row[1] or b"" for row in rows)
    ordering_keys, ordering_key_offsets = spans(row[2] or b"" for row in rows)
    property_offsets = array("q", [0])
    for row in rows:
        property_offsets.append(property_offsets[-1] + len(row[3]))
    pairs = [pair for row in rows for pair in row[3]]
    property_keys, property_key_offsets = spans(key for key, _ in pairs)
    property_values, property_value_offsets = spans(value for _, value in pairs)
    return (len(rows), payloads, payload_offsets,
            partition_keys, partition_key_offsets, bitmap(row[1] is not None for row in rows),
            ordering_keys, ordering_key_offsets, bitmap(row[2] is not None for row in rows),
            property_offsets, property_keys, property_key_offsets, property_values, property_value_offsets,
            array("Q", (row[4] for row in rows)), array("Q", (row[5] or 0 for row in rows)),
            bitmap(row[5] is not None for row in rows), array("q", (row[6] for row in rows)),
            bitmap(row[7] for row in rows), bitmap(row[8] for row in rows),
            bitmap(row[9] for row in rows), bitmap(row[10] for row in rows))


def _metadata_text(value: str | bytes, what: str) -> bytes:
    if not isinstance(value, str):  # protobuf hands back bytes for a string that is not UTF-8
        raise BadMetadataError(f"{what} in MessageMetadata is not UTF-8")
    return value.encode()


def _unbatched_row(metadata: pb.MessageMetadata, payload: memoryview) -> _Row:
    """The one row of a payload that is not a batch: its fields come from MessageMetadata."""
    return (bytes(memoryview(payload)),
            _metadata_text(metadata.partition_key, "partition_key") if metadata.HasField("partition_key") else None,
            metadata.ordering_key if metadata.HasField("ordering_key") else None,
            [(_metadata_text(kv.key, "property key"), _metadata_text(kv.value, "property value"))
             for kv in metadata.properties],
            metadata.event_time, metadata.sequence_id, -1, False, metadata.null_value,
            metadata.null_partition_key, metadata.partition_key_b64_encoded)


def split_columns(metadata: pb.MessageMetadata, payload: _Bytes) -> Columns:
    """Split an uncompressed payload into Columns: contiguous buffers and offset arrays.

    The same checks and errors as split_messages, in the same order, and also
    the UTF-8 of every string met (split_messages checks that when a field is
    first read). A payload that is not a batch gives one row, batch_index -1.
    """
    view = _stable_view(payload)
    if not metadata.HasField("num_messages_in_batch"):
        return Columns(*_column_fields([_unbatched_row(metadata, view)]))
    count = metadata.num_messages_in_batch
    _check_batch_count(count, len(view))
    def span(where: _Span | None) -> bytes | None:
        return None if where is None else bytes(view[where[0]:where[1]])

    rows: list[_Row] = []
    pos = 0
    for index in range(count):
        smm, _, payload_start, pos = _batch_entry(view, pos, index, count, check_utf8=True)
        rows.append((bytes(view[payload_start:pos]), span(smm.partition_key), span(smm.ordering_key),
                     [(bytes(view[key[0]:key[1]]), bytes(view[value[0]:value[1]]))
                      for key, value in smm.properties],
                     smm.event_time, smm.sequence_id, index, smm.compacted_out, smm.null_value,
                     smm.null_partition_key, smm.partition_key_b64_encoded))
    _check_batch_end(view, pos, count)
    return Columns(*_column_fields(rows))


def _empty_columns(columns_type: type[Columns]) -> Columns:
    return columns_type(*_column_fields([]))


def _columns_row(columns: Columns, index: int) -> dict[str, Any]:
    """Row `index` of a Columns (either twin's) as a dict of Python values."""
    if not 0 <= index < columns.count:
        raise IndexError(f"row {index} of {columns.count}")

    def span(data: bytearray, offsets: array[int], at: int) -> bytes:
        return bytes(data[offsets[at]:offsets[at + 1]])

    properties: dict[str, str] = {}
    for pair in range(columns.property_offsets[index], columns.property_offsets[index + 1]):
        properties[span(columns.property_keys, columns.property_key_offsets, pair).decode()] = \
            span(columns.property_values, columns.property_value_offsets, pair).decode()
    return {
        "payload": span(columns.payloads, columns.payload_offsets, index),
        "properties": properties,
        "partition_key": (span(columns.partition_keys, columns.partition_key_offsets, index).decode()
                          if _bit(columns.has_partition_key, index) else None),
        "partition_key_b64_encoded": _bit(columns.partition_key_b64_encoded, index),
        "ordering_key": (span(columns.ordering_keys, columns.ordering_key_offsets, index)
                         if _bit(columns.has_ordering_key, index) else None),
        "event_time": columns.event_times[index],
        "sequence_id": columns.sequence_ids[index] if _bit(columns.has_sequence_id, index) else None,
        "null_value": _bit(columns.null_value, index),
        "null_partition_key": _bit(columns.null_partition_key, index),
        "compacted_out": _bit(columns.compacted_out, index),
        "batch_index": columns.batch_indexes[index],
    }


def _columns_to_arrow(columns: Columns) -> Any:
    """A pyarrow.RecordBatch whose columns wrap a Columns' buffers (either twin's) without copying them.

    Only the map column's offsets are converted (Arrow maps take int32 offsets).
    """
    import pyarrow as pa

    count = columns.count
    wrap = pa.py_buffer

    def spans(kind: Any, data: bytearray, offsets: array[int], valid: bytearray | None = None,
              length: int = count) -> Any:
        return pa.Array.from_buffers(kind, length, [None if valid is None else wrap(valid),
                                                    wrap(offsets), wrap(data)])

    def ints(kind: Any, values: array[int], valid: bytearray | None = None) -> Any:
        return pa.Array.from_buffers(kind, count, [None if valid is None else wrap(valid), wrap(values)])

    def flags(bitmap: bytearray) -> Any:
        return pa.Array.from_buffers(pa.bool_(), count, [None, wrap(bitmap)])

    pairs = len(columns.property_key_offsets) - 1
    properties = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int64(), count + 1, [None, wrap(columns.property_offsets)]),
        spans(pa.large_string(), columns.property_keys, columns.property_key_offsets, length=pairs),
        spans(pa.large_string(), columns.property_values, columns.property_value_offsets, length=pairs))
    arrays = {
        "payload": spans(pa.large_binary(), columns.payloads, columns.payload_offsets),
        "properties": properties,
        "partition_key": spans(pa.large_string(), columns.partition_keys, columns.partition_key_offsets,
                               columns.has_partition_key),
        "partition_key_b64_encoded": flags(columns.partition_key_b64_encoded),
        "ordering_key": spans(pa.large_binary(), columns.ordering_keys, columns.ordering_key_offsets,
                              columns.has_ordering_key),
        "event_time": ints(pa.uint64(), columns.event_times),
        "sequence_id": ints(pa.uint64(), columns.sequence_ids, columns.has_sequence_id),
        "null_value": flags(columns.null_value),
        "null_partition_key": flags(columns.null_partition_key),
        "compacted_out": flags(columns.compacted_out),
        "batch_index": ints(pa.int64(), columns.batch_indexes),
    }
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


# --- encoding ---------------------------------------------------------------

def _write_varint(out: bytearray, value: int) -> None:
    value &= 0xFFFFFFFFFFFFFFFF
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def varint_bytes(value: int) -> bytes:
    """`value` as a protobuf varint (a negative one as its 64-bit two's complement)."""
    out = bytearray()
    _write_varint(out, value)
    return bytes(out)


def _write_bytes_field(out: bytearray, field: int, data: bytes | bytearray) -> None:
    out.append((field << 3) | 2)
    _write_varint(out, len(data))
    out += data


def encode_single_message_metadata(payload_size: int, properties: dict[str, str] | None = None,
                                   partition_key: str | None = None, event_time: int = 0,
                                   ordering_key: bytes | None = None, sequence_id: int | None = None,
                                   null_value: bool = False, partition_key_b64_encoded: bool = False,
                                   null_partition_key: bool = False) -> bytes:
    """SingleMessageMetadata bytes, in field order, as protobuf would write them."""
    out = bytearray()
    if properties:
        for key, value in properties.items():
            entry = bytearray()
            _write_bytes_field(entry, 1, key.encode())
            _write_bytes_field(entry, 2, value.encode())
            _write_bytes_field(out, 1, entry)
    if partition_key is not None:
        _write_bytes_field(out, 2, partition_key.encode())
    out.append(3 << 3)
    _write_varint(out, payload_size)
    if event_time:
        out.append(5 << 3)
        _write_varint(out, event_time)
    if partition_key_b64_encoded:
        out += b"\x30\x01"
    if ordering_key is not None:
        _write_bytes_field(out, 7, ordering_key)
    if sequence_id is not None:
        out.append(8 << 3)
        _write_varint(out, sequence_id)
    if null_value:
        out += b"\x48\x01"
    if null_partition_key:
        out += b"\x50\x01"
    return bytes(out)


class BatchBuilder:
    """Accumulates messages into one batch payload (uncompressed)."""

    _buffer: bytearray
    num_messages: int

    __slots__ = ("_buffer", "num_messages")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.num_messages = 0

    def add(self, payload: _Bytes, properties: dict[str, str] | None = None, partition_key: str | None = None,
            event_time: int = 0, ordering_key: bytes | None = None, sequence_id: int | None = None,
            null_value: bool = False) -> None:
        smm = encode_single_message_metadata(len(payload), properties, partition_key, event_time,
                                             ordering_key, sequence_id, null_value)
        self._buffer += _U32.pack(len(smm))
        self._buffer += smm
        self._buffer += payload
        self.num_messages += 1

    def add_many(self, items: list[Any], start: int, first_sequence_id: int, max_messages: int,
                 max_bytes: int) -> int:
        """Add items[start:], plain payloads, with sequence ids first_sequence_id, +1, ...; the number added.

        Each entry is what add(payload, sequence_id=...) writes. Stops after the message that
        brings the batch to max_messages or max_bytes, and before an item that is not bytes or
        is max_bytes long or longer (the caller sends that one another way).
        """
        if not isinstance(items, list):
            raise TypeError(f"items must be a list, not {type(items).__name__}")
        index = start
        while index < len(items):
            item = items[index]
            if type(item) is not bytes or len(item) >= max_bytes:
                break
            self.add(item, sequence_id=first_sequence_id + index - start)
            index += 1
            if self.num_messages >= max_messages or len(self._buffer) >= max_bytes:
                break
        return index - start

    @property
    def size(self) -> int:
        return len(self._buffer)

    def build(self) -> bytes:
        return bytes(self._buffer)

    def clear(self) -> None:
        self._buffer.clear()
        self.num_messages = 0


def encode_send_receipt(producer_id: int, sequence_id: int, highest_sequence_id: int, ledger_id: int,
                        entry_id: int) -> bytes:
    """A SEND_RECEIPT frame, byte for byte what protobuf writes, without building messages.

    The broker answers every entry with one; this is its hot path.
    """
    message_id = bytearray(b"\x08")
    _write_varint(message_id, ledger_id)
    message_id.append(0x10)
    _write_varint(message_id, entry_id)
    receipt = bytearray(b"\x08")
    _write_varint(receipt, producer_id)
    receipt.append(0x10)
    _write_varint(receipt, sequence_id)
    receipt.append(0x1A)
    _write_varint(receipt, len(message_id))
    receipt += message_id
    receipt.append(0x20)
    _write_varint(receipt, highest_sequence_id)
    body = bytearray(b"\x08\x07\x3a")  # type = SEND_RECEIPT, then field 7 (send_receipt)
    _write_varint(body, len(receipt))
    body += receipt
    return _U32.pack(len(body) + 4) + _U32.pack(len(body)) + bytes(body)


def encode_send(producer_id: int, sequence_id: int, highest_sequence_id: int, num_messages: int,
                producer_name: str, publish_time: int, payload: _Bytes, batched: bool,
                schema_version: bytes | None = None, compression: int = 0, uncompressed_size: int = 0) -> bytes:
    """A producer's SEND frame for a message or a batch without per-send options: CommandSend
    (num_messages; highest_sequence_id when it is not sequence_id) and MessageMetadata
    (producer_name, sequence_id, publish_time; compression and uncompressed_size when compressed;
    for a batch num_messages_in_batch and highest_sequence_id; schema_version when given), with
    magic and CRC32C. Byte for byte what protobuf and encode_payload_command write (the Cython
    twin writes it without building either message: a producer's per-batch path)."""
    command = pb.BaseCommand(type=pb.BaseCommand.SEND)
    send = command.send
    send.producer_id = producer_id
    send.sequence_id = sequence_id
    send.num_messages = num_messages
    if highest_sequence_id != sequence_id:
        send.highest_sequence_id = highest_sequence_id
    md = pb.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time)
    if compression:
        md.compression = compression  # type: ignore[assignment]
        md.uncompressed_size = uncompressed_size
    if batched:
        md.num_messages_in_batch = num_messages
        if highest_sequence_id != sequence_id:
            md.highest_sequence_id = highest_sequence_id
    if schema_version is not None:
        md.schema_version = schema_version
    return encode_payload_command(command, md, payload)


def metadata_and_payload_size(frame: bytes) -> int:
    """The size of a payload frame's metadata and payload together (what a broker's message size
    limit is on), read off its command size."""
    return len(frame) - 4 - 4 - _U32.unpack_from(frame, 4)[0] - 2 - 4 - 4


def encode_command(command: pb.BaseCommand) -> bytes:
    """A simple-command frame: [total][command size][BaseCommand]."""
    body = command.SerializeToString()
    return _U32.pack(len(body) + 4) + _U32.pack(len(body)) + body


def encode_metadata_and_payload(metadata: pb.MessageMetadata | bytes | bytearray, payload: _Bytes) -> bytes:
    """[u32 metadata size][MessageMetadata][payload]: what the checksum covers."""
    raw = metadata if isinstance(metadata, (bytes, bytearray)) else metadata.SerializeToString()
    return b"".join((_U32.pack(len(raw)), raw, payload))


def encode_payload_frame(command: pb.BaseCommand, metadata_and_payload: _Bytes | tuple[_Bytes, ...],
                         checksum: int | None = None,
                         broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
                         with_checksum: bool = True) -> bytes:
    """A payload frame around an already encoded metadata+payload span, or the spans it is made
    of (the metadata span, the payload): joined once, the checksum continued from one span over
    the next, so a payload is not first copied into a span of its own (at 10 KiB a message that
    copy was a tenth of a producer's time).

    `checksum` may pass the CRC32C already known for the span (a broker
    re-sending a stored entry); with_checksum=False omits magic and CRC.
    """
    spans = metadata_and_payload if isinstance(metadata_and_payload, tuple) else (metadata_and_payload,)
    body = command.SerializeToString()
    parts: list[_Bytes] = [b"", _U32.pack(len(body)), body]
    if broker_entry_metadata is not None:
        raw = broker_entry_metadata.SerializeToString()
        parts += (_U16.pack(MAGIC_BROKER_ENTRY_METADATA), _U32.pack(len(raw)), raw)
    if with_checksum:
        if checksum is None:
            checksum = 0
            for span in spans:
                checksum = crc32c(span, checksum)
        parts += (_U16.pack(MAGIC_CRC32C), _U32.pack(checksum))
    parts += spans
    total = sum(len(part) for part in parts)
    parts[0] = _U32.pack(total)
    return b"".join(parts)


def encode_payload_frame_head(command: pb.BaseCommand, span_size: int, checksum: int) -> bytes:
    """What encode_payload_frame(command, span, checksum) puts before the span (a span of
    `span_size` bytes whose CRC32C is `checksum`): for a writer that sends the span from where it
    lies, without joining the two."""
    body = command.SerializeToString()
    return b"".join((_U32.pack(4 + len(body) + 6 + span_size), _U32.pack(len(body)), body,
                     _U16.pack(MAGIC_CRC32C), _U32.pack(checksum)))


def encode_payload_command(command: pb.BaseCommand, metadata: pb.MessageMetadata | bytes | bytearray,
                           payload: _Bytes, broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
                           with_checksum: bool = True) -> bytes:
    """A payload frame (SEND or MESSAGE) with magic 0x0e01 and CRC32C."""
    raw = metadata if isinstance(metadata, (bytes, bytearray)) else metadata.SerializeToString()
    return encode_payload_frame(command, (_U32.pack(len(raw)) + raw, payload), None,
                                broker_entry_metadata, with_checksum)
