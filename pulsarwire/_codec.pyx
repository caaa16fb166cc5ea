# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython twin of pulsarwire._codec_py: same API, same behaviour, same errors.

Frame layout (all integers big-endian):

    [u32 total_size]                  bytes after this field
    [u32 command_size][BaseCommand]
    -- payload frames (SEND, MESSAGE) only --
    [u16 0x0e02][u32 size][BrokerEntryMetadata]     optional
    [u16 0x0e01][u32 CRC32C]                        optional; CRC covers the rest
    [u32 metadata_size][MessageMetadata][payload]

Batch payload (after decompression), num_messages_in_batch entries of:

    [u32 smm_size][SingleMessageMetadata][payload_size bytes]

BaseCommand and MessageMetadata are parsed by protobuf's C parser (upb). The
per-message work (splitting, SingleMessageMetadata, columns, batch encoding) is
here, in C, with no Python object per message until one is asked for.
"""
cimport cython
from cpython cimport array
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport (
    PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE, PyByteArray_Resize,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

import array
from collections import deque

from crc32c import crc32c
from google.protobuf.message import DecodeError

from . import compression
from ._codec_py import (  # framing of outgoing commands is protobuf-bound: one implementation
    DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_MESSAGE_SIZE, FRAME_PADDING, MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C, decompress_payload, encode_command, encode_metadata_and_payload,
    encode_payload_command, encode_payload_frame, encode_payload_frame_head, encode_single_message_metadata,
    metadata_and_payload_size,
)
from ._codec_py import (  # Columns' field list, its Python-level helpers, and a non-batch payload's row
    _COLUMN_FIELDS, _column_fields, _columns_row, _columns_to_arrow, _empty_columns, _stable_view,
    _unbatched_row,
)
# encode_send_receipt is defined below, in C
from ._proto import PulsarApi_pb2 as pb
from .errors import (
    BadBatchError, BadCommandError, BadMagicError, BadMetadataError, ChecksumMismatchError,
    FrameTooLargeError, TruncatedFrameError,
)

IMPLEMENTATION = "cython"

cdef object _BaseCommand = pb.BaseCommand
cdef object _MessageMetadata = pb.MessageMetadata
cdef object _BrokerEntryMetadata = pb.BrokerEntryMetadata
cdef object _DEFAULT_MAX_UNCOMPRESSED = compression.DEFAULT_MAX_UNCOMPRESSED_SIZE


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint32_t _u16(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 8) | <uint32_t>p[1]


cdef object _parse(object message_type, const uint8_t* p, Py_ssize_t size, object error_type,
                   str what, object command):
    try:
        message = message_type.FromString(PyBytes_FromStringAndSize(<const char*>p, size))
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise error_type(f"{what} does not parse: {exc}", command=command) from None
    if not message.IsInitialized():  # upb does not enforce proto2 `required` itself
        missing = ", ".join(message.FindInitializationErrors())
        raise error_type(f"{what} lacks required fields: {missing}", command=command)
    return message


@cython.final
cdef class Frame:
    """One decoded frame. Payload fields are None for simple commands.

    `payload` is the payload as carried (still compressed); `metadata_and_payload`
    is the span the checksum covers, which a broker stores and re-sends as is.
    Both are memoryviews into the bytes that were fed (zero-copy).
    """

    cdef readonly object command
    cdef readonly object metadata
    cdef readonly object payload
    cdef readonly object metadata_and_payload
    cdef readonly object broker_entry_metadata
    cdef readonly object checksum
    cdef readonly Py_ssize_t size

    @property
    def type(self):
        return self.command.type

    @property
    def checksum_verified(self):
        """True when the frame carried 0x0e01 (and so its CRC32C matched)."""
        return self.checksum is not None

    def messages(self, max_uncompressed_size=_DEFAULT_MAX_UNCOMPRESSED):
        """Decompress the payload and split it into SingleMessage objects."""
        if self.metadata is None:
            return []
        return split_messages(self.metadata,
                              decompress_payload(self.metadata, self.payload, max_uncompressed_size))

    def columns(self, max_uncompressed_size=_DEFAULT_MAX_UNCOMPRESSED):
        """Decompress the payload and split it into Columns (no rows for a simple command)."""
        if self.metadata is None:
            return _empty_columns(Columns)
        return split_columns(self.metadata,
                             decompress_payload(self.metadata, self.payload, max_uncompressed_size))

    def __repr__(self):
        return (f"<Frame {self.command.type} size={self.size} "
                f"payload={'-' if self.payload is None else len(self.payload)}>")


cdef Frame _decode_frame(object owner, const uint8_t* base, Py_ssize_t start, Py_ssize_t end):
    """Decode the frame base[start:end]; `owner` is a memoryview over base."""
    cdef Py_ssize_t pos, size
    cdef uint32_t command_size, metadata_size, expected, actual
    cdef Frame frame = Frame.__new__(Frame)
    frame.size = end - start
    if end - start < 8:
        raise TruncatedFrameError(f"frame of {end - start - 4} bytes cannot hold its 4-byte command size")
    command_size = _u32(base + start + 4)
    pos = start + 8
    if command_size > end - pos:
        raise TruncatedFrameError(f"command size {command_size} exceeds the {end - pos} bytes left in the frame")
    command = _parse(_BaseCommand, base + pos, command_size, BadCommandError, "BaseCommand", None)
    frame.command = command
    pos += command_size
    if pos == end:
        return frame

    if end - pos >= 2 and _u16(base + pos) == MAGIC_BROKER_ENTRY_METADATA:
        if end - pos < 6:
            raise TruncatedFrameError("broker entry metadata header is cut off", command=command)
        size = _u32(base + pos + 2)
        if size > end - pos - 6:
            raise TruncatedFrameError(
                f"broker entry metadata size {size} exceeds the {end - pos - 6} bytes left", command=command)
        frame.broker_entry_metadata = _parse(_BrokerEntryMetadata, base + pos + 6, size,
                                             BadMetadataError, "BrokerEntryMetadata", command)
        pos += 6 + size

    if end - pos >= 2 and _u16(base + pos) == MAGIC_CRC32C:
        if end - pos < 6:
            raise TruncatedFrameError("checksum header is cut off", command=command)
        expected = _u32(base + pos + 2)
        pos += 6
        actual = crc32c(owner[pos:end])
        if actual != expected:
            raise ChecksumMismatchError(expected, actual, command=command)
        frame.checksum = expected

    if end - pos < 4:
        raise TruncatedFrameError(
            f"payload section of {end - pos} bytes cannot hold its metadata size", command=command)
    metadata_size = _u32(base + pos)
    if metadata_size > end - pos - 4:
        if frame.checksum is None:
            raise BadMagicError(
                f"payload section starts with 0x{_u16(base + pos):04x}: neither magic "
                f"0x{MAGIC_CRC32C:04x} nor a metadata size that fits", command=command)
        raise TruncatedFrameError(
            f"metadata size {metadata_size} exceeds the {end - pos - 4} bytes left", command=command)
    frame.metadata = _parse(_MessageMetadata, base + pos + 4, metadata_size,
                            BadMetadataError, "MessageMetadata", command)
    frame.metadata_and_payload = owner[pos:end]
    frame.payload = owner[pos + 4 + metadata_size:end]
    return frame


@cython.final
cdef class SendFrame:
    """A plain, valid SEND frame, read without building protobuf messages (a broker's hot path).

    FrameReader(send_fast_path=True) returns one for a Send frame whose command
    and metadata use only common fields and are well formed; any other frame,
    and any frame with a problem, takes the full path (and its typed errors).
    Its fields are declared in _codec.pxd.
    """

    @property
    def type(self):
        return 6  # BaseCommand.SEND

    @property
    def checksum_verified(self):
        return self.checksum is not None


@cython.final
cdef class ReceiptFrame:
    """A plain, valid SEND_RECEIPT read without protobuf messages (FrameReader(receipt_fast_path=True));
    what it holds and when: the pure twin's (_codec_py.ReceiptFrame)."""

    cdef readonly object producer_id
    cdef readonly object sequence_id
    cdef readonly object highest_sequence_id
    cdef readonly object ledger_id
    cdef readonly object entry_id
    cdef readonly Py_ssize_t size

    @property
    def type(self):
        return 7  # BaseCommand.SEND_RECEIPT


cdef object _fast_receipt(const uint8_t* base, Py_ssize_t start, Py_ssize_t end):
    # [u32 total][u32 command size][BaseCommand: 1 type = SEND_RECEIPT, 7 send_receipt], nothing after
    cdef Py_ssize_t pos, command_end, span, receipt_pos, receipt_end, id_pos, id_end
    cdef uint32_t command_size, field, wire_type
    cdef uint64_t value, producer = 0, sequence = 0, highest = 0, ledger = 0, entry = 0
    cdef bint has_producer = False, has_sequence = False, has_highest = False, has_id = False
    cdef bint has_ledger = False, has_entry = False
    cdef ReceiptFrame frame
    if end - start < 10 or base[start + 8] != 0x08 or base[start + 9] != 0x07:
        return None
    command_size = _u32(base + start + 4)
    pos = start + 8
    if <Py_ssize_t>command_size != end - pos:
        return None
    command_end = end
    pos += 2  # type = SEND_RECEIPT
    if pos >= command_end or _scan_next(base, &pos, command_end, &field, &wire_type, &value, &span) != 0:
        return None
    if field != 7 or wire_type != 2 or pos != command_end:
        return None
    receipt_pos = span
    receipt_end = span + <Py_ssize_t>value
    while receipt_pos < receipt_end:
        if _scan_next(base, &receipt_pos, receipt_end, &field, &wire_type, &value, &span) != 0:
            return None
        if field == 3 and wire_type == 2:  # message_id: 1 ledgerId, 2 entryId
            has_id = True
            has_ledger = has_entry = False
            id_pos = span
            id_end = span + <Py_ssize_t>value
            while id_pos < id_end:
                if _scan_next(base, &id_pos, id_end, &field, &wire_type, &value, &span) != 0 or wire_type != 0:
                    return None
                if field == 1:
                    ledger = value
                    has_ledger = True
                elif field == 2:
                    entry = value
                    has_entry = True
                else:
                    return None
            if not (has_ledger and has_entry):
                return None
        elif wire_type != 0:
            return None
        elif field == 1:
            producer = value
            has_producer = True
        elif field == 2:
            sequence = value
            has_sequence = True
        elif field == 4:
            highest = value
            has_highest = True
        else:
            return None
    if not (has_producer and has_sequence and has_id):
        return None
    frame = ReceiptFrame.__new__(ReceiptFrame)
    frame.producer_id = producer
    frame.sequence_id = sequence
    frame.highest_sequence_id = highest if has_highest else sequence
    frame.ledger_id = <int64_t>ledger
    frame.entry_id = <int64_t>entry
    frame.size = end - start
    return frame


cdef inline int64_t _int32(uint64_t value) noexcept nogil:
    return <int64_t>(<int32_t>(<uint32_t>value))


cdef int _scan_next(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, uint32_t* field, uint32_t* wire_type,
                    uint64_t* value, Py_ssize_t* span_start) noexcept nogil:
    """One field of plain protobuf: a varint value, or a length-delimited span; -1 otherwise."""
    cdef uint64_t tag, length
    if _varint(buf, pos, end, &tag) != SCAN_OK:
        return -1
    field[0] = <uint32_t>(tag >> 3)
    wire_type[0] = <uint32_t>(tag & 7)
    if wire_type[0] == 0:
        return 0 if _varint(buf, pos, end, value) == SCAN_OK else -1
    if wire_type[0] == 2:
        if _varint(buf, pos, end, &length) != SCAN_OK or length > <uint64_t>(end - pos[0]):
            return -1
        span_start[0] = pos[0]
        value[0] = length
        pos[0] += <Py_ssize_t>length
        return 0
    return -1


cdef bint _plain_key_value(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    cdef uint32_t field, wire_type
    cdef uint64_t value
    cdef Py_ssize_t span
    cdef bint has_key = False, has_value = False
    while pos < end:
        if _scan_next(buf, &pos, end, &field, &wire_type, &value, &span) != 0 or wire_type != 2:
            return False
        if field == 1:
            has_key = True
        elif field == 2:
            has_value = True
        else:
            return False
    return has_key and has_value


cdef object _fast_send(object owner, const uint8_t* base, Py_ssize_t start, Py_ssize_t end):
    cdef Py_ssize_t pos, command_end, send_pos, send_end, md_pos, md_end, span
    cdef uint32_t command_size, metadata_size, checksum, field, wire_type
    cdef uint64_t value
    cdef uint64_t send_values[9]
    cdef bint send_has[9]
    cdef uint64_t publish_time = 0, deliver_at = 0, chunk_id = 0, batch_count = 0, compression = 0
    cdef bint has_name = False, has_sequence = False, has_publish = False, has_deliver = False, has_chunk = False
    cdef bint has_batch = False
    cdef int i
    if end - start < 10 or base[start + 8] != 0x08 or base[start + 9] != 0x06:
        return None
    command_size = _u32(base + start + 4)
    pos = start + 8
    if command_size > end - pos:
        return None
    command_end = pos + command_size
    pos += 2  # type = SEND
    if pos >= command_end or _scan_next(base, &pos, command_end, &field, &wire_type, &value, &span) != 0:
        return None
    if field != 6 or wire_type != 2 or pos != command_end:
        return None
    for i in range(9):
        send_has[i] = False
        send_values[i] = 0
    send_pos = span
    send_end = span + <Py_ssize_t>value
    while send_pos < send_end:
        if _scan_next(base, &send_pos, send_end, &field, &wire_type, &value, &span) != 0:
            return None
        if wire_type != 0 or field < 1 or field > 8:
            return None
        send_values[field] = value
        send_has[field] = True
    if not (send_has[1] and send_has[2]):
        return None
    pos = command_end
    if end - pos < 6 or _u16(base + pos) != MAGIC_CRC32C:
        return None
    checksum = _u32(base + pos + 2)
    pos += 6
    if end - pos < 4 or crc32c(owner[pos:end]) != checksum:
        return None
    metadata_size = _u32(base + pos)
    if metadata_size > end - pos - 4:
        return None
    md_pos = pos + 4
    md_end = md_pos + metadata_size
    while md_pos < md_end:
        if _scan_next(base, &md_pos, md_end, &field, &wire_type, &value, &span) != 0:
            return None
        if wire_type == 0:
            if field == 2:
                has_sequence = True
            elif field == 3:
                publish_time = value
                has_publish = True
            elif field == 19:
                deliver_at = value
                has_deliver = True
            elif field == 29:
                chunk_id = value
                has_chunk = True
            elif field == 8:
                compression = value
            elif field == 11:
                batch_count = value
                has_batch = True
            elif not (field in (9, 12, 17, 24, 25, 27, 28, 30)):
                return None
        else:
            if field == 1:
                has_name = True
            elif field == 4:
                if not _plain_key_value(base, span, span + <Py_ssize_t>value):
                    return None
            elif not (field in (6, 18, 26)):
                return None
    if not (has_name and has_sequence and has_publish):
        return None
    cdef SendFrame frame = SendFrame.__new__(SendFrame)
    frame.producer_id = send_values[1]
    frame.sequence_id = send_values[2]
    frame.num_messages = _int32(send_values[3]) if send_has[3] else 1
    frame.highest_sequence_id = send_values[6] if send_has[6] else None
    frame.is_chunk = send_has[7] and send_values[7] != 0
    frame.publish_time = publish_time
    frame.deliver_at_time = <int64_t>deliver_at if has_deliver else None
    frame.chunk_id = _int32(chunk_id) if has_chunk else None
    frame.metadata_and_payload = owner[pos:end]
    frame.checksum = checksum
    frame.size = end - start
    frame.num_messages_in_batch = _int32(batch_count) if has_batch else None
    frame.compression = <int>_int32(compression)
    return frame


cdef int _check_total_size(uint64_t total_size, Py_ssize_t max_frame_size) except -1:
    if total_size > <uint64_t>max_frame_size:
        raise FrameTooLargeError(f"frame of {total_size} bytes is over the {max_frame_size}-byte limit")
    if total_size < 4:
        raise TruncatedFrameError(f"frame of {total_size} bytes cannot hold its 4-byte command size")
    return 0


cdef class FrameReader:
    """Incremental frame reader: feed byte chunks of any size, take whole frames.

    Frames that lie inside one fed chunk are views into it (zero-copy); a frame
    split across chunks is joined once. A size error leaves the stream out of
    sync, so it is sticky; any later error (magic, checksum, metadata) consumes
    just its frame and the next frame can still be read.
    """

    cdef public Py_ssize_t max_frame_size
    cdef public bint send_fast_path
    cdef public bint receipt_fast_path
    cdef object _chunks        # deque of bytes
    cdef object _head_view     # memoryview of _chunks[0]
    cdef Py_ssize_t _pos       # read offset into _chunks[0]
    cdef Py_ssize_t _buffered  # unread bytes across all chunks
    cdef object _error

    def __init__(self, Py_ssize_t max_frame_size=DEFAULT_MAX_FRAME_SIZE, bint send_fast_path=False,
                 bint receipt_fast_path=False):
        if max_frame_size < 8:
            raise ValueError("max_frame_size must be at least 8")
        self.max_frame_size = max_frame_size
        self.send_fast_path = send_fast_path
        self.receipt_fast_path = receipt_fast_path
        self._chunks = deque()
        self._head_view = None
        self._pos = 0
        self._buffered = 0
        self._error = None

    @property
    def buffered(self):
        """Bytes fed but not yet returned as frames."""
        return self._buffered

    def feed(self, data):
        if self._error is not None:
            raise self._error
        if type(data) is not bytes:
            data = bytes(data)  # views must not see the caller reuse its buffer
        if PyBytes_GET_SIZE(data):
            self._chunks.append(data)
            self._buffered += PyBytes_GET_SIZE(data)

    cpdef object next_frame(self):
        """The next complete frame, or None until more bytes are fed."""
        cdef bytes head
        cdef const uint8_t* p
        cdef uint32_t total_size
        cdef Py_ssize_t need, pos, head_len
        if self._error is not None:
            raise self._error
        if self._buffered < 4:
            return None
        head = <bytes>self._chunks[0]
        head_len = PyBytes_GET_SIZE(head)
        pos = self._pos
        p = <const uint8_t*>PyBytes_AS_STRING(head)
        if head_len - pos >= 4:
            total_size = _u32(p + pos)
        else:
            total_size = _u32(<const uint8_t*>PyBytes_AS_STRING(self._peek(4)))
        try:
            _check_total_size(total_size, self.max_frame_size)
        except Exception as exc:
            self._error = exc
            raise
        need = 4 + <Py_ssize_t>total_size
        if self._buffered < need:
            return None
        self._buffered -= need
        if head_len - pos >= need:
            if self._head_view is None:
                self._head_view = memoryview(head)
            owner = self._head_view
            self._pos += need
            if self._pos == head_len:
                self._chunks.popleft()
                self._head_view = None
                self._pos = 0
            if self.send_fast_path:
                fast = _fast_send(owner, p, pos, pos + need)
                if fast is not None:
                    return fast
            if self.receipt_fast_path:
                fast = _fast_receipt(p, pos, pos + need)
                if fast is not None:
                    return fast
            return _decode_frame(owner, p, pos, pos + need)
        joined = self._take(need)
        owner = memoryview(joined)
        p = <const uint8_t*>PyBytes_AS_STRING(joined)
        if self.send_fast_path:
            fast = _fast_send(owner, p, 0, need)
            if fast is not None:
                return fast
        if self.receipt_fast_path:
            fast = _fast_receipt(p, 0, need)
            if fast is not None:
                return fast
        return _decode_frame(owner, p, 0, need)

    def __iter__(self):
        return self

    def __next__(self):
        frame = self.next_frame()
        if frame is None:
            raise StopIteration
        return frame

    def close(self):
        """Declare end of stream; bytes of an unfinished frame are an error."""
        if self._buffered:
            raise TruncatedFrameError(f"stream ended inside a frame ({self._buffered} bytes left over)")

    cdef bytes _peek(self, Py_ssize_t count):
        out = bytearray()
        pos = self._pos
        for chunk in self._chunks:
            out += chunk[pos:pos + count - len(out)]
            pos = 0
            if len(out) == count:
                break
        return bytes(out)

    cdef bytes _take(self, Py_ssize_t count):
        # one copy of each piece into the frame's own bytes (slices joined into a growing
        # bytearray, then copied out, moved a 1 MiB frame read in 256 KiB chunks about five times)
        cdef bytes out = PyBytes_FromStringAndSize(NULL, count)
        cdef char* dst = PyBytes_AS_STRING(out)
        cdef bytes head
        cdef Py_ssize_t done = 0, n, head_len
        while done < count:
            head = <bytes>self._chunks[0]  # feed() keeps bytes only
            head_len = PyBytes_GET_SIZE(head)
            n = min(head_len - self._pos, count - done)
            memcpy(dst + done, PyBytes_AS_STRING(head) + self._pos, n)
            done += n
            self._pos += n
            if self._pos == head_len:
                self._chunks.popleft()
                self._head_view = None
                self._pos = 0
        return out


def decode_frame(data):
    """Decode exactly one complete frame held in `data` (bytes-like)."""
    cdef bytes raw = data if type(data) is bytes else bytes(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(raw)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    if size < 4:
        raise TruncatedFrameError(f"{size} bytes cannot hold a frame size")
    total_size = _u32(p)
    _check_total_size(total_size, max(DEFAULT_MAX_FRAME_SIZE, size))
    if 4 + <Py_ssize_t>total_size != size:
        raise TruncatedFrameError(f"frame declares {total_size} bytes but {size - 4} follow its size")
    return _decode_frame(memoryview(raw), p, 0, size)


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
# fields: split_messages, SingleMessage and split_columns all use it. Every read
# is bounded by the end passed in.

# Status codes of the nogil scanners; _raise_scan turns them into BadBatchError.
cdef enum:
    SCAN_OK = 0
    SCAN_VARINT_PAST_END = -1
    SCAN_VARINT_TOO_LONG = -2
    SCAN_FIELD_PAST_END = -3
    SCAN_BAD_WIRE_TYPE = -4
    SCAN_KV_PAST_END = -5
    SCAN_KV_INCOMPLETE = -6
    SCAN_NO_PAYLOAD_SIZE = -7
    SCAN_BAD_UTF8 = -8


cdef int _raise_scan(int status) except -1:
    messages = {
        SCAN_VARINT_PAST_END: "varint runs past the end of SingleMessageMetadata",
        SCAN_VARINT_TOO_LONG: "varint longer than 10 bytes in SingleMessageMetadata",
        SCAN_FIELD_PAST_END: "field runs past the end of SingleMessageMetadata",
        SCAN_BAD_WIRE_TYPE: "unsupported wire type in SingleMessageMetadata",
        SCAN_KV_PAST_END: "property runs past the end of SingleMessageMetadata",
        SCAN_KV_INCOMPLETE: "property KeyValue lacks its required key or value",
        SCAN_NO_PAYLOAD_SIZE: "SingleMessageMetadata lacks its required payload_size",
        SCAN_BAD_UTF8: "string in SingleMessageMetadata is not UTF-8",
    }
    raise BadBatchError(messages[status])


cdef int _varint_long(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, uint64_t* out) noexcept nogil:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t byte
    cdef Py_ssize_t p = pos[0]
    while True:
        if p >= end:
            return SCAN_VARINT_PAST_END
        byte = buf[p]
        p += 1
        if shift < 64:
            result |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            pos[0] = p
            out[0] = result
            return SCAN_OK
        shift += 7
        if shift >= 70:
            return SCAN_VARINT_TOO_LONG


cdef inline int _varint(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, uint64_t* out) noexcept nogil:
    cdef Py_ssize_t p = pos[0]
    if p < end and buf[p] < 0x80:  # tags and small values: one byte
        out[0] = buf[p]
        pos[0] = p + 1
        return SCAN_OK
    return _varint_long(buf, pos, end, out)


cdef inline uint64_t _be64(uint64_t value) noexcept nogil:
    """A big-endian 64-bit word as loaded on this machine, in host order."""
    cdef uint64_t out = 0
    cdef const uint8_t* b = <const uint8_t*>&value
    cdef int i
    for i in range(8):
        out = (out << 8) | b[i]
    return out


cdef inline int _varint2(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, uint64_t* out) noexcept nogil:
    """_varint with the two-byte case inline too (payload sizes under 16 KiB, small sequence ids)."""
    cdef Py_ssize_t p = pos[0]
    if end - p >= 2 and buf[p] >= 0x80 and buf[p + 1] < 0x80:
        out[0] = (buf[p] & 0x7F) | (<uint64_t>buf[p + 1] << 7)
        pos[0] = p + 2
        return SCAN_OK
    return _varint(buf, pos, end, out)


cdef inline int _skip(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, uint32_t wire_type) noexcept nogil:
    cdef uint64_t value
    cdef int status
    if wire_type == 0:
        return _varint(buf, pos, end, &value)
    if wire_type == 1:
        if end - pos[0] < 8:
            return SCAN_FIELD_PAST_END
        pos[0] += 8
    elif wire_type == 5:
        if end - pos[0] < 4:
            return SCAN_FIELD_PAST_END
        pos[0] += 4
    elif wire_type == 2:
        status = _varint(buf, pos, end, &value)
        if status != SCAN_OK:
            return status
        if value > <uint64_t>(end - pos[0]):
            return SCAN_FIELD_PAST_END
        pos[0] += <Py_ssize_t>value
    else:
        return SCAN_BAD_WIRE_TYPE
    return SCAN_OK


cdef bint _utf8_ok(const uint8_t* p, Py_ssize_t size) noexcept nogil:
    """Well-formed UTF-8 (Unicode table 3-7), exactly what Python's strict decoder accepts."""
    cdef Py_ssize_t i = 0
    cdef uint8_t lead, second
    while i < size:
        lead = p[i]
        if lead < 0x80:
            i += 1
        elif lead < 0xC2:
            return False
        elif lead < 0xE0:
            if size - i < 2 or (p[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif lead < 0xF0:
            if size - i < 3:
                return False
            second = p[i + 1]
            if ((second & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80
                    or (lead == 0xE0 and second < 0xA0) or (lead == 0xED and second >= 0xA0)):
                return False
            i += 3
        elif lead < 0xF5:
            if size - i < 4:
                return False
            second = p[i + 1]
            if ((second & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80 or (p[i + 3] & 0xC0) != 0x80
                    or (lead == 0xF0 and second < 0x90) or (lead == 0xF4 and second >= 0x90)):
                return False
            i += 4
        else:
            return False
    return True


cdef int _parse_key_value(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, bint check_utf8,
                          Py_ssize_t* spans) noexcept nogil:
    """One KeyValue in buf[pos:end]: spans = key start, key size, value start, value size (last of each)."""
    cdef uint64_t tag, length
    cdef int status
    cdef bint has_key = False, has_value = False
    while pos < end:
        status = _varint(buf, &pos, end, &tag)
        if status != SCAN_OK:
            return status
        if tag == 0x0A or tag == 0x12:
            status = _varint(buf, &pos, end, &length)
            if status != SCAN_OK:
                return status
            if length > <uint64_t>(end - pos):
                return SCAN_KV_PAST_END
            if check_utf8 and not _utf8_ok(buf + pos, <Py_ssize_t>length):
                return SCAN_BAD_UTF8
            if tag == 0x0A:
                spans[0] = pos
                spans[1] = <Py_ssize_t>length
                has_key = True
            else:
                spans[2] = pos
                spans[3] = <Py_ssize_t>length
                has_value = True
            pos += <Py_ssize_t>length
        else:
            status = _skip(buf, &pos, end, <uint32_t>(tag & 7))
            if status != SCAN_OK:
                return status
    if not (has_key and has_value):
        return SCAN_KV_INCOMPLETE
    return SCAN_OK


# SmmFields.flags: the boolean fields, and whether sequence_id was present.
cdef enum:
    SMM_HAS_SEQUENCE_ID = 1
    SMM_COMPACTED_OUT = 2
    SMM_NULL_VALUE = 4
    SMM_NULL_PARTITION_KEY = 8
    SMM_PARTITION_KEY_B64 = 16
    SMM_KEPT_PROPERTIES = 4  # properties whose spans _parse_smm keeps; _next_property finds any others


cdef struct SmmFields:
    int64_t payload_size
    bint has_payload_size
    Py_ssize_t key_start, key_size                    # partition_key; key_size -1 when absent
    Py_ssize_t ordering_key_start, ordering_key_size  # ordering_key_size -1 when absent
    Py_ssize_t property_count
    Py_ssize_t property_spans[SMM_KEPT_PROPERTIES][4]   # key start, key size, value start, value size
    uint64_t event_time, sequence_id
    uint32_t flags


cdef inline void _set_flag(SmmFields* out, uint32_t flag, uint64_t value) noexcept nogil:
    if value != 0:
        out.flags |= flag
    else:
        out.flags &= ~flag


cdef int _parse_smm_field(const uint8_t* buf, Py_ssize_t* at, Py_ssize_t end, bint check_utf8,
                          SmmFields* out) noexcept nogil:
    """Read the SingleMessageMetadata field at buf[at[0]:end], tag included, and move at past it."""
    cdef uint64_t tag, value
    cdef Py_ssize_t pos = at[0]
    cdef Py_ssize_t spans[4]
    cdef Py_ssize_t* kept
    cdef int status = _varint(buf, &pos, end, &tag)
    if status != SCAN_OK:
        return status
    if tag == 0x18 or tag == 0x20 or tag == 0x28 or tag == 0x30 or tag == 0x40 or tag == 0x48 or tag == 0x50:
        status = _varint(buf, &pos, end, &value)
        if status != SCAN_OK:
            return status
        if tag == 0x18:
            out.payload_size = <int64_t>value
            out.has_payload_size = True
        elif tag == 0x28:
            out.event_time = value
        elif tag == 0x40:
            out.sequence_id = value
            out.flags |= SMM_HAS_SEQUENCE_ID
        elif tag == 0x20:
            _set_flag(out, SMM_COMPACTED_OUT, value)
        elif tag == 0x30:
            _set_flag(out, SMM_PARTITION_KEY_B64, value)
        elif tag == 0x48:
            _set_flag(out, SMM_NULL_VALUE, value)
        else:
            _set_flag(out, SMM_NULL_PARTITION_KEY, value)
    elif tag == 0x0A or tag == 0x12 or tag == 0x3A:
        status = _varint(buf, &pos, end, &value)
        if status != SCAN_OK:
            return status
        if value > <uint64_t>(end - pos):
            return SCAN_KV_PAST_END if tag == 0x0A else SCAN_FIELD_PAST_END
        if tag == 0x0A:
            kept = &out.property_spans[out.property_count][0] if out.property_count < SMM_KEPT_PROPERTIES else spans
            status = _parse_key_value(buf, pos, pos + <Py_ssize_t>value, check_utf8, kept)
            if status != SCAN_OK:
                return status
            out.property_count += 1
        elif tag == 0x12:
            if check_utf8 and not _utf8_ok(buf + pos, <Py_ssize_t>value):
                return SCAN_BAD_UTF8
            out.key_start = pos
            out.key_size = <Py_ssize_t>value
        else:
            out.ordering_key_start = pos
            out.ordering_key_size = <Py_ssize_t>value
        pos += <Py_ssize_t>value
    else:
        status = _skip(buf, &pos, end, <uint32_t>(tag & 7))
        if status != SCAN_OK:
            return status
    at[0] = pos
    return SCAN_OK


cdef inline int _parse_smm(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, bint check_utf8,
                           SmmFields* out) noexcept nogil:
    """Check one SingleMessageMetadata in buf[pos:end] and read its fields into out.

    check_utf8 also checks every string it meets (split_messages leaves that
    to the first read of a field, where SingleMessage raises). The fields every
    batch entry carries are read here, inline in the callers' loops; the rest
    by _parse_smm_field.
    """
    cdef uint64_t value
    cdef uint8_t tag
    cdef int status
    out.has_payload_size = False
    out.key_size = -1
    out.ordering_key_size = -1
    out.property_count = 0
    out.event_time = 0
    out.sequence_id = 0
    out.flags = 0
    while pos < end:
        tag = buf[pos]
        if tag == 0x18 or tag == 0x40 or tag == 0x28:  # one-byte tags of payload_size, sequence_id, event_time
            pos += 1
            status = _varint(buf, &pos, end, &value)
            if status != SCAN_OK:
                return status
            if tag == 0x18:
                out.payload_size = <int64_t>value
                out.has_payload_size = True
            elif tag == 0x40:
                out.sequence_id = value
                out.flags |= SMM_HAS_SEQUENCE_ID
            else:
                out.event_time = value
        else:
            status = _parse_smm_field(buf, &pos, end, check_utf8, out)
            if status != SCAN_OK:
                return status
    if not out.has_payload_size:
        return SCAN_NO_PAYLOAD_SIZE
    return SCAN_OK


cdef bint _next_property(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, Py_ssize_t* spans) noexcept nogil:
    """Advance to the next property of a SingleMessageMetadata _parse_smm has checked; False after the last."""
    cdef uint64_t tag = 0, length = 0
    while pos[0] < end:
        if _varint(buf, pos, end, &tag) != SCAN_OK:
            return False
        if tag == 0x0A:
            if (_varint(buf, pos, end, &length) != SCAN_OK or length > <uint64_t>(end - pos[0])
                    or _parse_key_value(buf, pos[0], pos[0] + <Py_ssize_t>length, False, spans) != SCAN_OK):
                return False  # cannot happen after _parse_smm; stops short rather than read past the end
            pos[0] += <Py_ssize_t>length
            return True
        if _skip(buf, pos, end, <uint32_t>(tag & 7)) != SCAN_OK:
            return False
    return False


cdef str _utf8(const uint8_t* p, Py_ssize_t size):
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, size, "strict")
    except UnicodeDecodeError as exc:
        raise BadBatchError(f"string in SingleMessageMetadata is not UTF-8: {exc}") from None


@cython.final
cdef class _HeldBuffer:
    """Pins the bytes a split payload lives in, for as long as its messages live.

    It keeps a reference to an immutable bytes object rather than a buffer
    export, so no memoryview is left with exports the garbage collector
    cannot clear. A payload backed by anything mutable is copied once.
    """
    cdef object owner      # the bytes object the pointer points into
    cdef object memview    # memoryview over the payload, for slicing out message views
    cdef const uint8_t* ptr
    cdef Py_ssize_t size

    def __cinit__(self, obj):
        cdef Py_buffer view
        if type(obj) is not bytes:
            memview = memoryview(obj)
            if type(memview.obj) is bytes and memview.c_contiguous and memview.itemsize == 1:
                PyObject_GetBuffer(memview, &view, PyBUF_SIMPLE)
                self.ptr = <const uint8_t*>view.buf
                self.size = view.len
                PyBuffer_Release(&view)
                self.owner = memview.obj
                self.memview = memview
                return
            obj = bytes(memview)
        self.owner = obj
        self.ptr = <const uint8_t*>PyBytes_AS_STRING(obj)
        self.size = PyBytes_GET_SIZE(obj)

    cdef object slice(self, Py_ssize_t start, Py_ssize_t end):
        if self.memview is None:
            self.memview = memoryview(self.owner)
        return self.memview[start:end]


@cython.final
@cython.freelist(1024)
@cython.no_gc  # no cycle can run through it (bytes, views, str keys and a dict of str), and a
# tracked object per received message set off a young-generation collection every few hundred
cdef class SingleMessage:
    """One message of a payload: its bytes (a memoryview) and its metadata.

    In a batch, metadata fields are read from the entry's SingleMessageMetadata
    the first time one is asked for; `batch_index` is its position (-1 when the
    payload was not a batch).
    """

    cdef _HeldBuffer _held
    cdef Py_ssize_t _smm_start, _smm_end, _payload_start, _payload_end
    cdef readonly int batch_index
    cdef readonly int batch_size
    cdef object _payload
    cdef bint _decoded
    cdef object _properties, _partition_key, _ordering_key, _sequence_id
    cdef uint64_t _event_time
    cdef bint _partition_key_b64_encoded, _null_value, _null_partition_key, _compacted_out

    @property
    def payload(self):
        if self._payload is None:
            self._payload = self._held.slice(self._payload_start, self._payload_end)
        return self._payload

    @property
    def payload_size(self):
        """len(payload), without making the view."""
        return self._payload_end - self._payload_start

    def data(self):
        if self._payload is None:
            return PyBytes_FromStringAndSize(<const char*>self._held.ptr + self._payload_start,
                                             self._payload_end - self._payload_start)
        return bytes(self._payload)

    cdef int _decode(self) except -1:
        cdef const uint8_t* buf = self._held.ptr
        cdef Py_ssize_t pos = self._smm_start
        cdef Py_ssize_t spans[4]
        cdef SmmFields fields
        cdef int status = _parse_smm(buf, self._smm_start, self._smm_end, True, &fields)
        if status != SCAN_OK:
            _raise_scan(status)  # split_messages checked the structure: only text can be bad here
        properties = {}
        if fields.property_count:
            while _next_property(buf, &pos, self._smm_end, spans):
                properties[_utf8(buf + spans[0], spans[1])] = _utf8(buf + spans[2], spans[3])
        if fields.key_size >= 0:
            self._partition_key = _utf8(buf + fields.key_start, fields.key_size)
        if fields.ordering_key_size >= 0:
            self._ordering_key = PyBytes_FromStringAndSize(<const char*>buf + fields.ordering_key_start,
                                                           fields.ordering_key_size)
        if fields.flags & SMM_HAS_SEQUENCE_ID:
            self._sequence_id = fields.sequence_id
        self._compacted_out = (fields.flags & SMM_COMPACTED_OUT) != 0
        self._event_time = fields.event_time
        self._partition_key_b64_encoded = (fields.flags & SMM_PARTITION_KEY_B64) != 0
        self._null_value = (fields.flags & SMM_NULL_VALUE) != 0
        self._null_partition_key = (fields.flags & SMM_NULL_PARTITION_KEY) != 0
        self._properties = properties
        self._decoded = True
        return 0

    @property
    def properties(self):
        if not self._decoded:
            self._decode()
        return self._properties

    @property
    def partition_key(self):
        if not self._decoded:
            self._decode()
        return self._partition_key

    @property
    def partition_key_b64_encoded(self):
        if not self._decoded:
            self._decode()
        return self._partition_key_b64_encoded

    @property
    def ordering_key(self):
        if not self._decoded:
            self._decode()
        return self._ordering_key

    @property
    def event_time(self):
        if not self._decoded:
            self._decode()
        return self._event_time

    @property
    def sequence_id(self):
        if not self._decoded:
            self._decode()
        return self._sequence_id

    @property
    def null_value(self):
        if not self._decoded:
            self._decode()
        return self._null_value

    @property
    def null_partition_key(self):
        if not self._decoded:
            self._decode()
        return self._null_partition_key

    @property
    def compacted_out(self):
        if not self._decoded:
            self._decode()
        return self._compacted_out

    def __repr__(self):
        return f"<SingleMessage batch_index={self.batch_index} {len(self.payload)} bytes>"


cdef SingleMessage _unbatched(object metadata, object payload):
    cdef SingleMessage message = SingleMessage.__new__(SingleMessage)
    cdef _HeldBuffer held = _HeldBuffer(payload)
    message._held = held  # the payload is its whole span: its view is made when asked, as a batch's
    message._payload_start = 0
    message._payload_end = held.size
    message.batch_index = -1
    message.batch_size = 0
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
    message._decoded = True
    return message


cdef int _check_batch_count(long count, Py_ssize_t end) except -1:
    if count < 0 or count > end // 5 + 1:
        raise BadBatchError(f"num_messages_in_batch {count} cannot fit in {end} bytes")
    return 0


# Status codes of _batch_entry, besides _parse_smm's; _raise_entry turns them into BadBatchError.
cdef enum:
    ENTRY_CUT = -20            # fewer than 4 bytes left for the entry's metadata size
    ENTRY_SMM_PAST_END = -21   # its metadata size points past the end
    ENTRY_PAYLOAD_PAST_END = -22


cdef inline int _batch_entry(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, bint check_utf8,
                             SmmFields* fields, Py_ssize_t* smm_end) noexcept nogil:
    """Check the batch entry at buf[pos:end], in wire order, and read its SingleMessageMetadata.

    On success smm_end is where its metadata ends and its payload (fields.payload_size
    bytes) starts.
    """
    cdef uint32_t smm_size
    cdef int status
    if end - pos < 4:
        return ENTRY_CUT
    smm_size = _u32(buf + pos)
    pos += 4
    if smm_size > end - pos:
        return ENTRY_SMM_PAST_END
    smm_end[0] = pos + smm_size
    status = _parse_smm(buf, pos, smm_end[0], check_utf8, fields)
    if status != SCAN_OK:
        return status
    if fields.payload_size < 0 or fields.payload_size > end - smm_end[0]:
        return ENTRY_PAYLOAD_PAST_END
    return SCAN_OK


cdef int _raise_entry(int status, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t index,
                      long count, SmmFields* fields) except -1:
    """Raise the error _batch_entry reported for entry `index`, which starts at buf[pos]."""
    if status == ENTRY_CUT:
        raise BadBatchError(f"batch ends after {index} of {count} entries")
    cdef uint32_t smm_size = _u32(buf + pos)
    pos += 4
    if status == ENTRY_SMM_PAST_END:
        raise BadBatchError(f"entry {index}: metadata size {smm_size} exceeds the {end - pos} bytes left")
    if status == ENTRY_PAYLOAD_PAST_END:
        raise BadBatchError(f"entry {index}: payload_size {fields.payload_size} does not fit in "
                            f"{end - pos - smm_size} bytes")
    return _raise_scan(status)


cdef int _check_batch_end(Py_ssize_t pos, Py_ssize_t end, long count) except -1:
    if pos != end:
        raise BadBatchError(f"{end - pos} bytes left over after {count} batch entries")
    return 0


cdef int _simple_buffer(obj, Py_buffer* view) except -1:
    """Fill `view` with obj's bytes, read from a copy when obj is not contiguous (the view holds
    what it reads; PyBuffer_Release when done)."""
    try:
        PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    except BufferError:
        PyObject_GetBuffer(bytes(memoryview(obj)), view, PyBUF_SIMPLE)
    return 0


cdef inline bint _plain_entry(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t* smm_end,
                              Py_ssize_t* size, bint* has_sequence_id, uint64_t* sequence_id) noexcept nogil:
    """Whether the batch entry at buf[pos] (8 bytes at least before end) is one whose
    SingleMessageMetadata is payload_size, with at most a sequence_id after it (as the official
    clients write it), all in bounds; then smm_end, size and the sequence id are set. Anything
    else (errors too) is left to _batch_entry, which reads such an entry to the same fields.

    The next entry's place depends only on smm_size and payload_size, which one 8-byte load
    holds; the rest is checked off that chain of dependent loads."""
    cdef uint64_t head
    cdef Py_ssize_t p, end_of_smm
    memcpy(&head, buf + pos, 8)
    head = _be64(head)
    end_of_smm = pos + 4 + <Py_ssize_t>(head >> 32)
    if ((head >> 24) & 0xFF) != 0x18:
        return False
    if ((head >> 16) & 0x80) == 0:
        size[0] = <Py_ssize_t>((head >> 16) & 0x7F)
        p = pos + 6
    elif ((head >> 8) & 0x80) == 0:
        size[0] = <Py_ssize_t>(((head >> 16) & 0x7F) | ((head >> 1) & 0x3F80))
        p = pos + 7
    else:
        return False
    if p > end_of_smm or end_of_smm > end or size[0] > end - end_of_smm:
        return False
    has_sequence_id[0] = p != end_of_smm
    if has_sequence_id[0]:
        if buf[p] != 0x40:
            return False
        p += 1
        if _varint2(buf, &p, end_of_smm, sequence_id) != SCAN_OK or p != end_of_smm:
            return False
    smm_end[0] = end_of_smm
    return True


cdef Py_ssize_t _count_plain_run(const uint8_t* buf, Py_ssize_t end, Py_ssize_t* at, Py_ssize_t index,
                                 Py_ssize_t count) noexcept nogil:
    """Step over entries from `index` (at buf[at[0]]) while _plain_entry takes them; the index of
    the first entry left, with at[0] where it starts."""
    cdef Py_ssize_t pos = at[0], smm_end = 0, size = 0
    cdef bint has_sequence_id = False
    cdef uint64_t sequence_id = 0
    while index < count and end - pos >= 8 and \
            _plain_entry(buf, pos, end, &smm_end, &size, &has_sequence_id, &sequence_id):
        pos = smm_end + size
        index += 1
    at[0] = pos
    return index


cdef long _count_entries(const uint8_t* buf, Py_ssize_t end, long count) except -1:
    """count_batch over buf[:end]."""
    cdef Py_ssize_t pos = 0, smm_end = 0, index = 0
    cdef int status
    cdef SmmFields fields
    _check_batch_count(count, end)
    while True:
        index = _count_plain_run(buf, end, &pos, index, count)
        if index >= count:
            break
        status = _batch_entry(buf, pos, end, False, &fields, &smm_end)
        if status != SCAN_OK:
            _raise_entry(status, buf, pos, end, index, count, &fields)
        pos = smm_end + <Py_ssize_t>fields.payload_size
        index += 1
    _check_batch_end(pos, end, count)
    return count


def count_batch(payload, long count):
    """`count` when the uncompressed batch payload holds exactly that many messages, checked as
    split_messages checks them (the same BadBatchError otherwise), without making the messages."""
    cdef Py_buffer view
    _simple_buffer(payload, &view)
    try:
        return _count_entries(<const uint8_t*>view.buf, view.len, count)
    finally:
        PyBuffer_Release(&view)


def count_entry_batch(entry, long count):
    """count_batch of the uncompressed batch payload in `entry`, laid out as a Send frame carries
    it and the broker stores it: [u32 metadata size][MessageMetadata][payload]. BadBatchError
    also when the metadata size points past the end."""
    return _count_entry_batch(entry, count)


cdef object _count_entry_batch(entry, long count):
    cdef Py_buffer view
    cdef uint32_t metadata_size
    _simple_buffer(entry, &view)
    try:
        if view.len < 4:
            raise BadBatchError(f"an entry of {view.len} bytes cannot hold a metadata size")
        metadata_size = _u32(<const uint8_t*>view.buf)
        if metadata_size > view.len - 4:
            raise BadBatchError(f"metadata size {metadata_size} exceeds the {view.len - 4} bytes after it")
        return _count_entries(<const uint8_t*>view.buf + 4 + metadata_size, view.len - 4 - metadata_size, count)
    finally:
        PyBuffer_Release(&view)


def split_messages(metadata, payload):
    """Split an uncompressed payload into its messages.

    A payload is a batch when MessageMetadata.num_messages_in_batch is present
    (presence, not value, as the reference clients decide).
    """
    cdef _HeldBuffer held
    cdef Py_ssize_t pos = 0, end, smm_end = 0, index
    cdef long count
    cdef int status
    cdef SmmFields fields
    cdef SingleMessage message
    cdef list messages
    if not metadata.HasField("num_messages_in_batch"):
        return [_unbatched(metadata, payload)]
    held = _HeldBuffer(payload)
    end = held.size
    count = metadata.num_messages_in_batch
    _check_batch_count(count, end)
    messages = [None] * count
    for index in range(count):
        status = _batch_entry(held.ptr, pos, end, False, &fields, &smm_end)
        if status != SCAN_OK:
            _raise_entry(status, held.ptr, pos, end, index, count, &fields)
        message = SingleMessage.__new__(SingleMessage)
        message._held = held
        message._smm_start = pos + 4
        message._smm_end = smm_end
        message._payload_start = smm_end
        message._payload_end = smm_end + <Py_ssize_t>fields.payload_size
        message.batch_index = <int>index
        message.batch_size = <int>count
        messages[index] = message
        pos = message._payload_end
    _check_batch_end(pos, end, count)
    return messages


# --- columns ----------------------------------------------------------------

@cython.final
cdef class Columns:
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

    cdef readonly Py_ssize_t count
    cdef readonly object payloads, payload_offsets
    # Columns that are often empty, all zeros or 0, 1, 2, ... are made when first read if the
    # split left them None: making and writing them costs as much as copying half the payloads
    # of a batch of small messages.
    cdef object _partition_key_offsets, _ordering_key_offsets, _property_offsets
    cdef object _event_times, _sequence_ids, _batch_indexes
    cdef object _partition_keys, _ordering_keys, _property_keys, _property_values
    cdef object _property_key_offsets, _property_value_offsets
    cdef object _has_partition_key, _has_ordering_key, _has_sequence_id
    cdef object _compacted_out, _null_value, _null_partition_key, _partition_key_b64_encoded

    @property
    def partition_keys(self):
        if self._partition_keys is None:
            self._partition_keys = _empty_bytes()
        return self._partition_keys

    @property
    def ordering_keys(self):
        if self._ordering_keys is None:
            self._ordering_keys = _empty_bytes()
        return self._ordering_keys

    @property
    def property_keys(self):
        if self._property_keys is None:
            self._property_keys = _empty_bytes()
        return self._property_keys

    @property
    def property_values(self):
        if self._property_values is None:
            self._property_values = _empty_bytes()
        return self._property_values

    @property
    def property_key_offsets(self):
        if self._property_key_offsets is None:
            self._property_key_offsets = array.clone(_INT64, 1, True)
        return self._property_key_offsets

    @property
    def property_value_offsets(self):
        if self._property_value_offsets is None:
            self._property_value_offsets = array.clone(_INT64, 1, True)
        return self._property_value_offsets

    @property
    def has_partition_key(self):
        if self._has_partition_key is None:
            self._has_partition_key = _bitmap(self.count)
        return self._has_partition_key

    @property
    def has_ordering_key(self):
        if self._has_ordering_key is None:
            self._has_ordering_key = _bitmap(self.count)
        return self._has_ordering_key

    @property
    def has_sequence_id(self):
        if self._has_sequence_id is None:
            self._has_sequence_id = _bitmap(self.count)
        return self._has_sequence_id

    @property
    def compacted_out(self):
        if self._compacted_out is None:
            self._compacted_out = _bitmap(self.count)
        return self._compacted_out

    @property
    def null_value(self):
        if self._null_value is None:
            self._null_value = _bitmap(self.count)
        return self._null_value

    @property
    def null_partition_key(self):
        if self._null_partition_key is None:
            self._null_partition_key = _bitmap(self.count)
        return self._null_partition_key

    @property
    def partition_key_b64_encoded(self):
        if self._partition_key_b64_encoded is None:
            self._partition_key_b64_encoded = _bitmap(self.count)
        return self._partition_key_b64_encoded

    @property
    def partition_key_offsets(self):
        if self._partition_key_offsets is None:
            self._partition_key_offsets = array.clone(_INT64, self.count + 1, True)
        return self._partition_key_offsets

    @property
    def ordering_key_offsets(self):
        if self._ordering_key_offsets is None:
            self._ordering_key_offsets = array.clone(_INT64, self.count + 1, True)
        return self._ordering_key_offsets

    @property
    def property_offsets(self):
        if self._property_offsets is None:
            self._property_offsets = array.clone(_INT64, self.count + 1, True)
        return self._property_offsets

    @property
    def event_times(self):
        if self._event_times is None:
            self._event_times = array.clone(_UINT64, self.count, True)
        return self._event_times

    @property
    def sequence_ids(self):
        if self._sequence_ids is None:
            self._sequence_ids = array.clone(_UINT64, self.count, True)
        return self._sequence_ids

    @property
    def batch_indexes(self):
        cdef array.array indexes
        cdef Py_ssize_t index
        if self._batch_indexes is None:
            indexes = array.clone(_INT64, self.count, False)
            for index in range(self.count):
                indexes.data.as_longlongs[index] = index
            self._batch_indexes = indexes
        return self._batch_indexes

    def __init__(self, *values):
        if len(values) != len(_COLUMN_FIELDS):
            raise TypeError(f"Columns takes {len(_COLUMN_FIELDS)} values, got {len(values)}")
        (self.count, self.payloads, self.payload_offsets,
         self._partition_keys, self._partition_key_offsets, self._has_partition_key,
         self._ordering_keys, self._ordering_key_offsets, self._has_ordering_key,
         self._property_offsets, self._property_keys, self._property_key_offsets,
         self._property_values, self._property_value_offsets,
         self._event_times, self._sequence_ids, self._has_sequence_id, self._batch_indexes,
         self._compacted_out, self._null_value, self._null_partition_key,
         self._partition_key_b64_encoded) = values

    def __len__(self):
        return self.count

    def row(self, index):
        """Row `index` as a dict of Python values, named like SingleMessage's attributes."""
        return _columns_row(self, index)

    def to_arrow(self):
        """A pyarrow.RecordBatch over these buffers (no copy of payloads or text; needs pyarrow)."""
        return _columns_to_arrow(self)

    def __repr__(self):
        return f"<Columns {self.count} rows, {len(self.payloads)} payload bytes>"


cdef array.array _INT64 = array.array("q")
cdef array.array _UINT64 = array.array("Q")


# Byte columns other than payloads keep this much room after what is written: short spans
# are copied as one fixed 16-byte move that may write up to 16 bytes past their end (trimmed
# when the split ends).
cdef enum:
    _SPAN_SLACK = 16
    _FAST_PROPERTIES = 4  # properties an entry may have and still take the keyed fast path


cdef inline void _copy_span(char* out, const uint8_t* src, Py_ssize_t size, const uint8_t* src_end) noexcept nogil:
    """memcpy into a column kept _SPAN_SLACK bytes roomier than what is written: a span of up to
    16 bytes is one inline 16-byte move when 16 bytes can be read at src (src_end: the end of
    the batch), rather than a call."""
    if size <= 16 and src_end - src >= 16:
        memcpy(out, src, 16)
    else:
        memcpy(out, src, size)


cdef inline void _copy_payload(char* out, const uint8_t* src, Py_ssize_t size) noexcept nogil:
    """memcpy of a payload, inline in 16-byte moves (the last one overlapping the one before)
    when it is 16 to 256 bytes: for the small payloads of a constant-stride run the call costs
    about as much as the copy."""
    cdef Py_ssize_t i = 0
    if size < 16 or size > 256:
        memcpy(out, src, size)
        return
    while i + 16 < size:
        memcpy(out + i, src + i, 16)
        i += 16
    memcpy(out + size - 16, src + size - 16, 16)


cdef inline uint64_t _le64(const uint8_t* p) noexcept nogil:
    """8 bytes at p as a little-endian word (one load on little-endian machines)."""
    cdef uint64_t value, out = 0
    cdef const uint8_t* b = <const uint8_t*>&value
    cdef int i
    memcpy(&value, p, 8)
    for i in range(8):
        out |= (<uint64_t>b[i]) << (8 * i)
    return out


cdef inline bint _ascii(const uint8_t* p, Py_ssize_t size, const uint8_t* limit) noexcept nogil:
    """No byte of p[:size] is above 0x7F; reads 8-byte words, never at or past limit."""
    cdef uint64_t seen = 0
    while size >= 8:
        seen |= _le64(p)
        p += 8
        size -= 8
    if size > 0:
        if limit - p >= 8:
            seen |= _le64(p) & (((<uint64_t>1) << (8 * size)) - 1)
        else:
            while size > 0:
                seen |= p[0]
                p += 1
                size -= 1
    return (seen & 0x8080808080808080ULL) == 0


cdef struct _Bytes:
    # A byte column filled from C: its bytearray holds capacity bytes, the first size written.
    char* ptr
    Py_ssize_t size, capacity


cdef inline bytearray _byte_column(Py_ssize_t first, Py_ssize_t rows_left, Py_ssize_t batch_size, _Bytes* out):
    """A byte column for a span of `first` bytes and room for as much again for every row left,
    and never more than the batch (every byte copied out comes from a distinct byte of it).
    Sized so, rather than at the batch size for each column, a split of small keys asks the
    allocator for a few KiB per column, not a batch-sized block it mostly trims again."""
    cdef Py_ssize_t capacity = _SPAN_SLACK + min(batch_size, 256 + 2 * first * rows_left)
    cdef bytearray column = PyByteArray_FromStringAndSize(NULL, capacity)
    out.ptr = PyByteArray_AS_STRING(column)
    out.size = 0
    out.capacity = capacity
    return column


cdef int _reserve(bytearray column, _Bytes* out, Py_ssize_t extra) except -1:
    """Room for `extra` more bytes, and _SPAN_SLACK after them."""
    cdef Py_ssize_t capacity
    if out.size + extra + _SPAN_SLACK > out.capacity:
        capacity = max(2 * out.capacity, out.size + extra + _SPAN_SLACK)
        PyByteArray_Resize(column, capacity)
        out.ptr = PyByteArray_AS_STRING(column)
        out.capacity = capacity
    return 0


cdef inline bint _fits(const _Bytes* column, Py_ssize_t extra) noexcept nogil:
    return column.size + extra + _SPAN_SLACK <= column.capacity


cdef inline void _put(_Bytes* column, const uint8_t* src, Py_ssize_t size, const uint8_t* src_end) noexcept nogil:
    """Append a span; the caller made room (_reserve, _fits)."""
    _copy_span(column.ptr + column.size, src, size, src_end)
    column.size += size


cdef inline array.array _ends_column(Py_ssize_t rows, long long** out):
    """Offsets for `rows` rows, zeroed: the rows before the first that fills it are empty at 0."""
    cdef array.array column = array.clone(_INT64, rows + 1, True)
    out[0] = column.data.as_longlongs
    return column


cdef struct _BitGather:
    # A bitmap column's bits for rows word * 64 to word * 64 + 63, ORed in when the word changes:
    # no read-modify-write of memory per row.
    uint8_t* bitmap
    uint64_t bits
    Py_ssize_t word


cdef inline bytearray _bitmap_column(Py_ssize_t rows, _BitGather* gather):
    cdef bytearray column = _bitmap(rows)
    gather.bitmap = <uint8_t*>PyByteArray_AS_STRING(column)
    gather.bits = 0
    gather.word = 0
    return column


cdef inline void _gather_bit(_BitGather* gather, Py_ssize_t rows, Py_ssize_t index) noexcept nogil:
    if (index >> 6) != gather.word:
        _or_word(gather.bitmap, rows, gather.word, gather.bits)
        gather.word = index >> 6
        gather.bits = 0
    gather.bits |= (<uint64_t>1) << (index & 63)


cdef void _gather_bits(_BitGather* gather, Py_ssize_t rows, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
    """_gather_bit for every row from start to stop, a word at a time."""
    cdef Py_ssize_t count
    while start < stop:
        if (start >> 6) != gather.word:
            _or_word(gather.bitmap, rows, gather.word, gather.bits)
            gather.word = start >> 6
            gather.bits = 0
        count = min(stop - start, 64 - (start & 63))
        gather.bits |= ((~<uint64_t>0) >> (64 - count)) << (start & 63)
        start += count


cdef inline void _flush_bits(_BitGather* gather, Py_ssize_t rows) noexcept nogil:
    if gather.bitmap != NULL:
        _or_word(gather.bitmap, rows, gather.word, gather.bits)


cdef struct _PropertyColumns:
    _Bytes keys, values
    long long* key_ends     # pairs + 1 int64 offsets each, from 0
    long long* value_ends
    Py_ssize_t pairs, capacity  # pairs written; pairs the ends arrays hold, less one


cdef inline void _write_pair(_PropertyColumns* out, const uint8_t* buf, const uint8_t* buf_end,
                             Py_ssize_t key_start, Py_ssize_t key_size,
                             Py_ssize_t value_start, Py_ssize_t value_size) noexcept nogil:
    """One property pair; the caller made room for it (_PropertyColumns.capacity, _Bytes)."""
    _put(&out.keys, buf + key_start, key_size, buf_end)
    _put(&out.values, buf + value_start, value_size, buf_end)
    out.pairs += 1
    out.key_ends[out.pairs] = out.keys.size
    out.value_ends[out.pairs] = out.values.size


cdef inline bytearray _empty_bytes():
    return PyByteArray_FromStringAndSize(NULL, 0)


cdef inline bytearray _bitmap(Py_ssize_t count):
    cdef Py_ssize_t size = (count + 7) >> 3
    cdef bytearray out = PyByteArray_FromStringAndSize(NULL, size)
    memset(PyByteArray_AS_STRING(out), 0, size)
    return out


cdef inline void _set_bit(uint8_t* bitmap, Py_ssize_t index) noexcept nogil:
    bitmap[index >> 3] |= <uint8_t>(1 << (index & 7))


cdef inline void _or_word(uint8_t* bitmap, Py_ssize_t rows, Py_ssize_t word, uint64_t bits) noexcept nogil:
    """OR bits for rows word * 64 to word * 64 + 63 into a bitmap of `rows` rows."""
    cdef Py_ssize_t byte = word * 8, stop = min(byte + 8, (rows + 7) >> 3)
    while byte < stop:
        bitmap[byte] |= <uint8_t>(bits & 0xFF)
        bits >>= 8
        byte += 1


def split_columns(metadata, payload):
    """Split an uncompressed payload into Columns: contiguous buffers and offset arrays.

    The same checks and errors as split_messages, in the same order, and also
    the UTF-8 of every string met (split_messages checks that when a field is
    first read). A payload that is not a batch gives one row, batch_index -1.
    """
    cdef Py_buffer view
    if not metadata.HasField("num_messages_in_batch"):
        return Columns(*_column_fields([_unbatched_row(metadata, _stable_view(payload))]))
    count = metadata.num_messages_in_batch
    _simple_buffer(payload, &view)
    try:
        return _split_batch_columns(<const uint8_t*>view.buf, view.len, count)
    finally:
        PyBuffer_Release(&view)


cdef struct _ColumnsOut:
    # Where _split_batch_columns writes, shared by its fast runs and its general path. A column
    # not made yet has a NULL pointer: the runs leave a row that needs one to the general path,
    # which makes it.
    Py_ssize_t pos                  # where the next entry starts
    char* payloads
    Py_ssize_t payloads_size
    long long* payload_ends
    _Bytes keys                     # partition keys
    long long* key_ends
    _Bytes ordering
    long long* ordering_ends
    _PropertyColumns properties
    long long* property_ends
    bint any_key_column             # key_ends, ordering_ends or property_ends is made
    unsigned long long* event_times
    unsigned long long* sequence_ids
    _BitGather has_key, has_sequence


cdef inline void _end_key_columns(_ColumnsOut* out, Py_ssize_t index) noexcept nogil:
    """Row `index`'s ends in the key and property columns made so far (every row writes them)."""
    if out.key_ends != NULL:
        out.key_ends[index + 1] = out.keys.size
    if out.ordering_ends != NULL:
        out.ordering_ends[index + 1] = out.ordering.size
    if out.property_ends != NULL:
        out.property_ends[index + 1] = out.properties.pairs


cdef inline bint _fast_varint(const uint8_t* buf, Py_ssize_t* pos, Py_ssize_t end, uint64_t* out) noexcept nogil:
    """A varint of at most 9 bytes in buf[pos[0]:end], read as _varint reads it; False for
    anything else (a longer one too), left to the general path."""
    cdef Py_ssize_t p = pos[0]
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t byte
    while p < end and shift < 63:
        byte = buf[p]
        p += 1
        result |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            pos[0] = p
            out[0] = result
            return True
        shift += 7
    return False


cdef Py_ssize_t _plain_run(const uint8_t* buf, Py_ssize_t end, _ColumnsOut* out, Py_ssize_t index,
                           Py_ssize_t rows) noexcept nogil:
    """Split rows from `index` on while _plain_entry takes them (and a sequence id finds its
    column made); the index of the first row left."""
    cdef _ColumnsOut o = out[0]  # a local copy: stores through char* cannot alias it
    cdef Py_ssize_t pos = o.pos, smm_end = 0, size = 0
    cdef bint has_sequence_id = False
    cdef uint64_t sequence_id = 0
    while index < rows and end - pos >= 8:
        if not _plain_entry(buf, pos, end, &smm_end, &size, &has_sequence_id, &sequence_id):
            break
        if has_sequence_id:
            if o.sequence_ids == NULL:
                break
            o.sequence_ids[index] = sequence_id
            _gather_bit(&o.has_sequence, rows, index)
        memcpy(o.payloads + o.payloads_size, buf + smm_end, size)
        o.payloads_size += size
        o.payload_ends[index + 1] = o.payloads_size
        if o.any_key_column:
            _end_key_columns(&o, index)
        index += 1
        if index < rows:
            index = _repeat_plain_run(buf, end, &o, index, rows, pos, smm_end - pos, size, has_sequence_id)
            pos = o.pos
        else:
            pos = smm_end + size
    o.pos = pos
    out[0] = o
    return index


cdef inline uint64_t _varint_word(uint64_t word) noexcept nogil:
    """The value of a varint of at most 8 bytes held little-endian in `word` (zeros above it):
    its 7-bit groups are closed up in pairs, then fours, then eights (no branch on its length)."""
    word &= 0x7F7F7F7F7F7F7F7FULL
    word = (word & 0x007F007F007F007FULL) | ((word & 0x7F007F007F007F00ULL) >> 1)
    word = (word & 0x00003FFF00003FFFULL) | ((word & 0x3FFF00003FFF0000ULL) >> 2)
    return (word & 0x000000000FFFFFFFULL) | ((word & 0x0FFFFFFF00000000ULL) >> 4)


cdef Py_ssize_t _repeat_plain_run(const uint8_t* buf, Py_ssize_t end, _ColumnsOut* out, Py_ssize_t index,
                                  Py_ssize_t rows, Py_ssize_t last, Py_ssize_t smm_len, Py_ssize_t size,
                                  bint has_sequence_id) noexcept nogil:
    """Split rows from `index` on while each repeats the layout of the row _plain_run has just
    taken at buf[last] (smm_len bytes of size and SingleMessageMetadata, `size` payload bytes):
    the same first bytes (metadata size, payload_size, the sequence_id tag) and a sequence_id
    varint of the same length. Sets out.pos to where the first row left starts; returns its index.

    Such a row's place is the last one's plus a constant, not read from the row before: the
    loads that check each row run ahead of one another rather than in a chain."""
    cdef _ColumnsOut o = out[0]  # a local copy: stores through char* cannot alias it
    cdef Py_ssize_t row_len = smm_len + size, pos = last + row_len, first = index
    cdef uint64_t head, expect, word, head_mask, tail_mask = 0, tail_expect = 0
    cdef Py_ssize_t head_len, sequence_len
    cdef int tail_shift = 0
    memcpy(&head, buf + last, 8)
    expect = _be64(head)
    # size, 0x18, payload_size's varint (its length as _plain_entry read it), then 0x40
    head_len = 6 + (((expect >> 16) & 0x80) != 0) + has_sequence_id
    head_mask = (~<uint64_t>0) << (64 - 8 * head_len) if head_len < 8 else ~<uint64_t>0
    expect &= head_mask
    sequence_len = smm_len - head_len
    if has_sequence_id:
        # the varint is the last sequence_len bytes of the 8 ending at the metadata's end: the
        # same continuation bits (set on all but its last byte) mean the same length
        if sequence_len < 1 or sequence_len > 8:
            out.pos = pos
            return index
        tail_shift = 8 * (8 - sequence_len)
        tail_mask = (0x8080808080808080ULL >> tail_shift) << tail_shift
        tail_expect = _le64(buf + last + smm_len - 8) & tail_mask
    # rows that the batch holds in full, each with the 8 bytes of its head
    cdef Py_ssize_t need = max(row_len, 8)
    cdef Py_ssize_t stop = index + min(rows - index, (end - pos - need) // row_len + 1) if end - pos >= need else index
    cdef const uint8_t* row = buf + pos
    cdef char* payload_out = o.payloads + o.payloads_size
    cdef long long filled = o.payloads_size
    cdef long long* payload_ends = o.payload_ends
    cdef unsigned long long* sequence_ids = o.sequence_ids
    # the head compared as loaded (no byte swap per row)
    head_mask = _be64(head_mask)
    expect = _be64(expect)
    while index < stop:
        memcpy(&head, row, 8)
        if (head & head_mask) != expect:
            break
        if has_sequence_id:
            word = _le64(row + smm_len - 8)
            if (word & tail_mask) != tail_expect:
                break
            sequence_ids[index] = _varint_word(word >> tail_shift)
        _copy_payload(payload_out, row + smm_len, size)
        payload_out += size
        filled += size
        payload_ends[index + 1] = filled
        if o.any_key_column:
            _end_key_columns(&o, index)
        row += row_len
        index += 1
    o.payloads_size = filled
    pos = row - buf
    if has_sequence_id:
        _gather_bits(&o.has_sequence, rows, first, index)
    o.pos = pos
    out[0] = o
    return index


cdef enum:
    _TEMPLATE_WORDS = 4  # a SingleMessageMetadata of up to 32 bytes may be matched as a template


cdef struct _RowTemplate:
    # The layout of a row _keyed_run took, which the rows after it mostly repeat (the same
    # properties, key and varint lengths): a row whose SingleMessageMetadata has its size and
    # matches `expect` under `mask` (every tag and size byte equal, every string byte ASCII,
    # every varint byte's continuation bit equal) reads to the same fields at the same offsets,
    # so it is taken with one masked compare instead of a parse. Offsets are from the start of
    # the SingleMessageMetadata.
    bint valid
    uint32_t smm_size
    uint64_t expect[_TEMPLATE_WORDS]
    uint64_t mask[_TEMPLATE_WORDS]
    Py_ssize_t pair_count
    Py_ssize_t pairs[_FAST_PROPERTIES][4]  # key start, key size, value start, value size
    Py_ssize_t key_bytes, value_bytes
    Py_ssize_t key_start, key_size         # key_size -1: no partition key
    Py_ssize_t payload_at, payload_len     # payload_size's varint
    Py_ssize_t event_at, event_len         # event_len 0: no event_time
    Py_ssize_t sequence_at, sequence_len   # sequence_len 0: no sequence_id
    uint64_t payload_mask, event_mask, sequence_mask  # a varint's bytes in the 8 loaded at its start
    Py_ssize_t payload_size                # the size in the row the template was made of
    # expect and mask with payload_size's bytes held exact: a row that matches these has the
    # template row's payload size too (_repeat_template_run)
    uint64_t same_size_expect[_TEMPLATE_WORDS]
    uint64_t same_size_mask[_TEMPLATE_WORDS]


cdef inline void _template_bytes(uint8_t* expect, uint8_t* mask, Py_ssize_t start, Py_ssize_t size,
                                 bint varint) noexcept nogil:
    """Loosen the template over a string (any ASCII byte) or a varint (its continuation bits)."""
    cdef Py_ssize_t i
    for i in range(start, start + size):
        mask[i] = 0x80
        if not varint:
            expect[i] = 0


cdef void _make_template(_RowTemplate* t, const uint8_t* buf, Py_ssize_t base, uint32_t smm_size,
                         Py_ssize_t pairs[_FAST_PROPERTIES][4], Py_ssize_t pair_count,
                         Py_ssize_t key_start, Py_ssize_t key_size, Py_ssize_t payload_at, Py_ssize_t payload_len,
                         Py_ssize_t payload_size, Py_ssize_t event_at, Py_ssize_t event_len,
                         Py_ssize_t sequence_at, Py_ssize_t sequence_len) noexcept nogil:
    """The template of a row _keyed_run has just taken, its SingleMessageMetadata at buf[base]
    (the positions given are in buf); not valid where the row is too long to match so."""
    cdef uint8_t expect[8 * _TEMPLATE_WORDS]
    cdef uint8_t mask[8 * _TEMPLATE_WORDS]
    cdef Py_ssize_t pair
    t.valid = False
    if smm_size > 8 * _TEMPLATE_WORDS or payload_len > 3 or event_len > 8 or sequence_len > 8:
        return
    memset(expect, 0, sizeof(expect))
    memset(mask, 0, sizeof(mask))
    memcpy(expect, buf + base, smm_size)
    memset(mask, 0xFF, smm_size)
    key_start = key_start - base if key_size >= 0 else 0
    payload_at -= base
    event_at = event_at - base if event_len else 0
    sequence_at = sequence_at - base if sequence_len else 0
    t.key_bytes = t.value_bytes = 0
    for pair in range(pair_count):
        t.pairs[pair][0] = pairs[pair][0] - base
        t.pairs[pair][1] = pairs[pair][1]
        t.pairs[pair][2] = pairs[pair][2] - base
        t.pairs[pair][3] = pairs[pair][3]
        t.key_bytes += pairs[pair][1]
        t.value_bytes += pairs[pair][3]
        _template_bytes(expect, mask, t.pairs[pair][0], t.pairs[pair][1], False)
        _template_bytes(expect, mask, t.pairs[pair][2], t.pairs[pair][3], False)
    if key_size >= 0:
        _template_bytes(expect, mask, key_start, key_size, False)
    _template_bytes(expect, mask, event_at, event_len, True)
    _template_bytes(expect, mask, sequence_at, sequence_len, True)
    for pair in range(_TEMPLATE_WORDS):
        memcpy(&t.same_size_expect[pair], expect + 8 * pair, 8)
        memcpy(&t.same_size_mask[pair], mask + 8 * pair, 8)
        t.same_size_expect[pair] &= t.same_size_mask[pair]
    _template_bytes(expect, mask, payload_at, payload_len, True)
    for pair in range(_TEMPLATE_WORDS):
        memcpy(&t.expect[pair], expect + 8 * pair, 8)
        memcpy(&t.mask[pair], mask + 8 * pair, 8)
        t.expect[pair] &= t.mask[pair]
    t.smm_size = smm_size
    t.pair_count = pair_count
    t.key_start = key_start
    t.key_size = key_size
    t.payload_at = payload_at
    t.payload_len = payload_len
    t.event_at = event_at
    t.event_len = event_len
    t.sequence_at = sequence_at
    t.sequence_len = sequence_len
    t.payload_size = payload_size
    t.payload_mask = _low_bytes(payload_len)
    t.event_mask = _low_bytes(event_len)
    t.sequence_mask = _low_bytes(sequence_len)
    t.valid = True


cdef inline uint64_t _low_bytes(Py_ssize_t count) noexcept nogil:
    """A mask of the low `count` bytes of a word (0 to 8)."""
    return (~<uint64_t>0) >> (64 - 8 * count) if count else 0


cdef inline Py_ssize_t _rows_of(Py_ssize_t left, Py_ssize_t per_row, Py_ssize_t rows) noexcept nogil:
    """At most `rows`, and no more rows of `per_row` each than `left` holds."""
    if per_row <= 0:
        return rows
    return min(rows, left // per_row) if left > 0 else 0


cdef inline void _template_row(_ColumnsOut* o, const uint8_t* smm, const uint8_t* buf_end, Py_ssize_t index,
                               Py_ssize_t rows, const _RowTemplate* t, Py_ssize_t payload_size) noexcept nogil:
    """Write a row that matched the template t (its SingleMessageMetadata at smm, its payload
    after it); the caller checked the row and the room for it."""
    cdef Py_ssize_t pair
    cdef const Py_ssize_t* span
    cdef uint64_t event_time
    memcpy(o.payloads + o.payloads_size, smm + t.smm_size, payload_size)
    o.payloads_size += payload_size
    o.payload_ends[index + 1] = o.payloads_size
    for pair in range(t.pair_count):
        span = &t.pairs[pair][0]
        _write_pair(&o.properties, smm, buf_end, span[0], span[1], span[2], span[3])
    if t.key_size >= 0:
        _put(&o.keys, smm + t.key_start, t.key_size, buf_end)
        _gather_bit(&o.has_key, rows, index)
    if o.any_key_column:
        _end_key_columns(o, index)
    if t.event_len:
        event_time = _varint_word(_le64(smm + t.event_at) & t.event_mask)
        if event_time:
            o.event_times[index] = event_time
    if t.sequence_len:
        o.sequence_ids[index] = _varint_word(_le64(smm + t.sequence_at) & t.sequence_mask)
        _gather_bit(&o.has_sequence, rows, index)


cdef inline bint _template_matches(const uint8_t* row, const _RowTemplate* t) noexcept nogil:
    """Whether the row at `row` (4 + 8 * _TEMPLATE_WORDS bytes readable) has the template's
    metadata size and matches it under its mask."""
    cdef uint64_t diff = 0, loaded
    cdef Py_ssize_t word
    if _u32(row) != t.smm_size:
        return False
    for word in range(_TEMPLATE_WORDS):  # all of them, past the metadata too (masked out): unrolled
        memcpy(&loaded, row + 4 + 8 * word, 8)
        diff |= (loaded & t.mask[word]) ^ t.expect[word]
    return diff == 0


cdef struct _SameRows:
    # What every row of a _repeat_template_run writes, at the same offsets from its start.
    uint32_t size_word                      # the metadata size as loaded (big-endian bytes)
    uint64_t expect[_TEMPLATE_WORDS]
    uint64_t mask[_TEMPLATE_WORDS]
    Py_ssize_t row_len, payload_at, payload_size
    Py_ssize_t key_at[_FAST_PROPERTIES]
    Py_ssize_t key_len[_FAST_PROPERTIES]
    Py_ssize_t value_at[_FAST_PROPERTIES]
    Py_ssize_t value_len[_FAST_PROPERTIES]
    Py_ssize_t partition_key_at, partition_key_size  # size -1: none
    Py_ssize_t event_at, sequence_at
    uint64_t event_mask, sequence_mask


cdef inline Py_ssize_t _same_rows(const _SameRows* same, const uint8_t* row, Py_ssize_t limit, _ColumnsOut* o,
                                  Py_ssize_t index, Py_ssize_t pair_count) noexcept nogil:
    """The loop of _repeat_template_run: up to `limit` rows from `row` on; how many it took.
    Its state is in locals (and the layout in `same`), not in `o`, so that it stays in registers."""
    cdef Py_ssize_t count = 0, pair, word, size = same.payload_size, row_len = same.row_len
    cdef Py_ssize_t key_size = same.partition_key_size
    cdef uint64_t diff, loaded
    cdef uint32_t head
    cdef char* payload_out = o.payloads + o.payloads_size
    cdef long long* payload_ends = o.payload_ends + index + 1
    cdef long long payload_fill = o.payloads_size
    cdef char* property_keys = o.properties.keys.ptr + o.properties.keys.size
    cdef char* property_values = o.properties.values.ptr + o.properties.values.size
    cdef long long* key_ends = o.properties.key_ends + o.properties.pairs + 1
    cdef long long* value_ends = o.properties.value_ends + o.properties.pairs + 1
    cdef long long key_fill = o.properties.keys.size, value_fill = o.properties.values.size
    cdef long long pairs = o.properties.pairs
    cdef long long* property_ends = o.property_ends + index + 1 if o.property_ends != NULL else NULL
    cdef char* partition_keys = o.keys.ptr + o.keys.size
    cdef long long* partition_key_ends = o.key_ends + index + 1 if o.key_ends != NULL else NULL
    cdef long long partition_key_fill = o.keys.size
    cdef long long* ordering_ends = o.ordering_ends + index + 1 if o.ordering_ends != NULL else NULL
    cdef unsigned long long* event_times = o.event_times + index if same.event_mask else NULL
    cdef unsigned long long* sequence_ids = o.sequence_ids + index if same.sequence_mask else NULL
    while count < limit:
        memcpy(&head, row, 4)
        diff = head ^ same.size_word
        for word in range(_TEMPLATE_WORDS):  # unrolled
            memcpy(&loaded, row + 4 + 8 * word, 8)
            diff |= (loaded & same.mask[word]) ^ same.expect[word]
        if diff:
            break
        _copy_payload(payload_out, row + same.payload_at, size)
        payload_out += size
        payload_fill += size
        payload_ends[count] = payload_fill
        for pair in range(pair_count):
            memcpy(property_keys, row + same.key_at[pair], 16)
            property_keys += same.key_len[pair]
            key_fill += same.key_len[pair]
            key_ends[0] = key_fill
            key_ends += 1
            memcpy(property_values, row + same.value_at[pair], 16)
            property_values += same.value_len[pair]
            value_fill += same.value_len[pair]
            value_ends[0] = value_fill
            value_ends += 1
        pairs += pair_count
        if property_ends != NULL:
            property_ends[count] = pairs
        if key_size >= 0:
            memcpy(partition_keys, row + same.partition_key_at, 16)
            partition_keys += key_size
            partition_key_fill += key_size
        if partition_key_ends != NULL:
            partition_key_ends[count] = partition_key_fill
        if ordering_ends != NULL:
            ordering_ends[count] = o.ordering.size
        if event_times != NULL:
            event_times[count] = _varint_word(_le64(row + same.event_at) & same.event_mask)
        if sequence_ids != NULL:
            sequence_ids[count] = _varint_word(_le64(row + same.sequence_at) & same.sequence_mask)
        row += row_len
        count += 1
    o.payloads_size = payload_fill
    o.properties.keys.size = key_fill
    o.properties.values.size = value_fill
    o.properties.pairs = pairs
    o.keys.size = partition_key_fill
    return count


cdef Py_ssize_t _repeat_template_run(const uint8_t* buf, Py_ssize_t end, _ColumnsOut* out, Py_ssize_t index,
                                     Py_ssize_t stop, Py_ssize_t rows, const _RowTemplate* t) noexcept nogil:
    """Split rows from `index` to at most `stop` (the columns have room for them) while each
    matches the template t with the payload size of its row; the index of the first row left
    (out.pos where it starts). Returns `index` untouched where a span is longer than 16 bytes.

    Every such row is the last one's length further on and writes the same bytes to every
    column: each string is one fixed 16-byte move (the columns keep _SPAN_SLACK bytes of room
    past what is written, and the next move overwrites the spare bytes), and the payload size
    needs no decoding, its bytes being part of the compare."""
    cdef _ColumnsOut o = out[0]  # a local copy: stores through char* cannot alias it
    cdef _SameRows same
    cdef Py_ssize_t pair, word, count, pair_count = t.pair_count
    cdef Py_ssize_t smm_size = t.smm_size
    cdef Py_ssize_t reach = 4 + 8 * _TEMPLATE_WORDS  # bytes read from a row's start
    for pair in range(pair_count):
        same.key_at[pair] = 4 + t.pairs[pair][0]
        same.key_len[pair] = t.pairs[pair][1]
        same.value_at[pair] = 4 + t.pairs[pair][2]
        same.value_len[pair] = t.pairs[pair][3]
        if same.key_len[pair] > 16 or same.value_len[pair] > 16:
            return index
        reach = max(reach, same.key_at[pair] + 16, same.value_at[pair] + 16)
    same.partition_key_at = 4 + t.key_start
    same.partition_key_size = t.key_size
    if t.key_size > 16:
        return index
    if t.key_size >= 0:
        reach = max(reach, same.partition_key_at + 16)
    same.event_at = 4 + t.event_at
    same.sequence_at = 4 + t.sequence_at
    same.event_mask = t.event_mask
    same.sequence_mask = t.sequence_mask
    if t.event_len:
        reach = max(reach, same.event_at + 8)
    if t.sequence_len:
        reach = max(reach, same.sequence_at + 8)
    same.payload_at = 4 + smm_size
    same.payload_size = t.payload_size
    same.row_len = 4 + smm_size + t.payload_size
    cdef Py_ssize_t pos = o.pos, need = max(reach, same.row_len)
    if end - pos < need:
        return index
    stop = min(stop, index + (end - pos - need) // same.row_len + 1)
    for word in range(_TEMPLATE_WORDS):
        same.expect[word] = t.same_size_expect[word]
        same.mask[word] = t.same_size_mask[word]
    cdef uint8_t size_bytes[4]
    size_bytes[0] = <uint8_t>(smm_size >> 24)
    size_bytes[1] = <uint8_t>(smm_size >> 16)
    size_bytes[2] = <uint8_t>(smm_size >> 8)
    size_bytes[3] = <uint8_t>smm_size
    memcpy(&same.size_word, size_bytes, 4)
    count = _same_rows(&same, buf + pos, stop - index, &o, index, pair_count)
    if t.key_size >= 0:
        _gather_bits(&o.has_key, rows, index, index + count)
    if t.sequence_len:
        _gather_bits(&o.has_sequence, rows, index, index + count)
    o.pos = pos + count * same.row_len
    out[0] = o
    return index + count


cdef Py_ssize_t _template_run(const uint8_t* buf, Py_ssize_t end, _ColumnsOut* out, Py_ssize_t index,
                              Py_ssize_t rows, const _RowTemplate* t) noexcept nogil:
    """Split rows from `index` on while each matches the template t; the index of the first row
    left (out.pos where it starts).

    Every row taken writes the same number of string bytes and pairs (their sizes are in the
    compare), so how many rows the columns have room for is known before the loop. While
    payloads keep the size of the template's row, each row starts a constant past the last,
    not where sizes read from the last row say: the loads that check each row then run ahead
    of one another rather than in a chain. A row of another size ends that, and the rows
    after it are placed by their sizes."""
    cdef _ColumnsOut o = out[0]  # a local copy: stores through char* cannot alias it
    cdef const uint8_t* buf_end = buf + end
    cdef const uint8_t* smm
    cdef Py_ssize_t pos = o.pos, smm_end, payload_size, stop
    # bytes read from a row's start: the compare, and 8 from the start of each varint in it
    cdef Py_ssize_t reach = 4 + 8 * _TEMPLATE_WORDS + 8
    cdef Py_ssize_t smm_len = 4 + t.smm_size, same_size = t.payload_size, row_len = smm_len + t.payload_size
    if (t.event_len and o.event_times == NULL) or (t.sequence_len and o.sequence_ids == NULL):
        return index  # the general path makes the column
    stop = rows - index
    if t.pair_count:
        stop = _rows_of(o.properties.capacity - o.properties.pairs, t.pair_count, stop)
        stop = _rows_of(o.properties.keys.capacity - _SPAN_SLACK - o.properties.keys.size, t.key_bytes, stop)
        stop = _rows_of(o.properties.values.capacity - _SPAN_SLACK - o.properties.values.size, t.value_bytes, stop)
    if t.key_size >= 0:
        stop = _rows_of(o.keys.capacity - _SPAN_SLACK - o.keys.size, t.key_size, stop)
    stop += index
    # rows of the template row's payload size
    o.pos = pos
    index = _repeat_template_run(buf, end, &o, index, stop, rows, t)
    pos = o.pos
    while index < stop and end - pos >= max(reach, row_len):
        if not _template_matches(buf + pos, t):
            break
        smm = buf + pos + 4
        if <Py_ssize_t>_varint_word(_le64(smm + t.payload_at) & t.payload_mask) != same_size:
            break
        _template_row(&o, smm, buf_end, index, rows, t, same_size)
        pos += row_len
        index += 1
    # rows of other sizes
    while index < stop and end - pos >= reach:
        if not _template_matches(buf + pos, t):
            break
        smm = buf + pos + 4
        smm_end = pos + smm_len
        payload_size = <Py_ssize_t>_varint_word(_le64(smm + t.payload_at) & t.payload_mask)
        if payload_size > end - smm_end:
            break
        _template_row(&o, smm, buf_end, index, rows, t, payload_size)
        pos = smm_end + payload_size
        index += 1
    o.pos = pos
    out[0] = o
    return index


cdef Py_ssize_t _keyed_run(const uint8_t* buf, Py_ssize_t end, _ColumnsOut* out, Py_ssize_t index,
                           Py_ssize_t rows) noexcept nogil:
    """Split rows from `index` on while each SingleMessageMetadata is, in this order, up to
    _FAST_PROPERTIES properties (each exactly {0x0a key, 0x12 value}), a partition_key,
    payload_size, event_time and sequence_id, any but payload_size left out, with one-byte
    sizes, all of it in bounds and every string UTF-8, and the columns it fills are made;
    the index of the first row left.

    Anything else (errors too) is left to the general path, which reports what is wrong as
    split_messages does: a row is checked in full before anything of it is written, and only
    a layout _parse_smm reads to the same fields is taken. The parse is written out here, in
    the loop, so that it compiles inline."""
    cdef _ColumnsOut o = out[0]  # a local copy: stores through char* cannot alias it
    cdef const uint8_t* buf_end = buf + end
    cdef Py_ssize_t pos = o.pos, q, smm_end, kv_end, at, pair, pair_count, text_start, key_bytes, value_bytes
    cdef Py_ssize_t key_start = 0, key_size, payload_size
    cdef Py_ssize_t pairs[_FAST_PROPERTIES][4]  # key start, key size, value start, value size
    cdef Py_ssize_t* span
    cdef uint64_t value, event_time, sequence_id = 0
    cdef uint32_t smm_size
    cdef bint has_sequence_id, text_ok
    cdef Py_ssize_t payload_at, payload_len, event_at, event_len, sequence_at, sequence_len
    cdef _RowTemplate template
    template.valid = False
    while index < rows:
        if template.valid:
            o.pos = pos
            index = _template_run(buf, end, &o, index, rows, &template)
            pos = o.pos
            if index >= rows:
                break
        if end - pos < 4:
            break
        smm_size = _u32(buf + pos)
        q = pos + 4
        if smm_size > end - q:
            break
        smm_end = q + smm_size
        text_start = q
        pair_count = 0
        key_bytes = value_bytes = 0
        while q < smm_end and buf[q] == 0x0A:
            # 0x0a kv_size 0x0a key_size key 0x12 value_size value: six bytes at least. A size
            # byte of 0x80 or more (a longer varint) cannot make the ends meet, but kv_size's
            # is checked.
            if pair_count == _FAST_PROPERTIES or smm_end - q < 6 or buf[q + 1] >= 0x80 or buf[q + 2] != 0x0A:
                break
            kv_end = q + 2 + buf[q + 1]
            at = q + 4 + buf[q + 3]
            if kv_end > smm_end or kv_end - at < 2 or buf[at] != 0x12 or at + 2 + buf[at + 1] != kv_end:
                break
            span = &pairs[pair_count][0]
            span[0] = q + 4
            span[1] = at - q - 4
            span[2] = at + 2
            span[3] = kv_end - at - 2
            key_bytes += span[1]
            value_bytes += span[3]
            pair_count += 1
            q = kv_end
        key_size = -1
        if q < smm_end and buf[q] == 0x12:
            if smm_end - q < 2 or buf[q + 1] > smm_end - q - 2:  # a size byte of 0x80 or more is past the end
                break
            key_start = q + 2
            key_size = buf[q + 1]
            q += 2 + key_size
        if q >= smm_end or buf[q] != 0x18:  # also where a property above was not taken
            break
        # Tags and sizes (all under 0x80) and strings so far: one ASCII check covers the strings.
        if not _ascii(buf + text_start, q - text_start, buf_end):
            text_ok = True
            for pair in range(pair_count):
                span = &pairs[pair][0]
                text_ok = text_ok and _utf8_ok(buf + span[0], span[1]) and _utf8_ok(buf + span[2], span[3])
            if not (text_ok and (key_size < 0 or _utf8_ok(buf + key_start, key_size))):
                break
        q += 1
        payload_at = q
        if _varint2(buf, &q, smm_end, &value) != SCAN_OK or value > <uint64_t>(end - smm_end):
            break
        payload_len = q - payload_at
        payload_size = <Py_ssize_t>value
        event_time = 0
        event_at = event_len = 0
        if q < smm_end and buf[q] == 0x28:
            q += 1
            event_at = q
            if not _fast_varint(buf, &q, smm_end, &event_time):
                break
            event_len = q - event_at
        has_sequence_id = False
        sequence_at = sequence_len = 0
        if q < smm_end and buf[q] == 0x40:
            q += 1
            sequence_at = q
            if not _fast_varint(buf, &q, smm_end, &sequence_id):
                break
            sequence_len = q - sequence_at
            has_sequence_id = True
        if q != smm_end:
            break
        # The columns this row fills must be made (the general path makes them).
        if pair_count and (o.property_ends == NULL or o.properties.pairs + pair_count > o.properties.capacity
                           or not _fits(&o.properties.keys, key_bytes)
                           or not _fits(&o.properties.values, value_bytes)):
            break
        if ((key_size >= 0 and (o.key_ends == NULL or not _fits(&o.keys, key_size)))
                or (event_time and o.event_times == NULL) or (has_sequence_id and o.sequence_ids == NULL)):
            break

        memcpy(o.payloads + o.payloads_size, buf + smm_end, payload_size)
        o.payloads_size += payload_size
        o.payload_ends[index + 1] = o.payloads_size
        for pair in range(pair_count):
            span = &pairs[pair][0]
            _write_pair(&o.properties, buf, buf_end, span[0], span[1], span[2], span[3])
        if key_size >= 0:
            _put(&o.keys, buf + key_start, key_size, buf_end)
            _gather_bit(&o.has_key, rows, index)
        if o.any_key_column:
            _end_key_columns(&o, index)
        if event_time:
            o.event_times[index] = event_time
        if has_sequence_id:
            o.sequence_ids[index] = sequence_id
            _gather_bit(&o.has_sequence, rows, index)
        _make_template(&template, buf, text_start, smm_size, pairs, pair_count, key_start, key_size,
                       payload_at, payload_len, payload_size, event_at, event_len, sequence_at, sequence_len)
        pos = smm_end + payload_size
        index += 1
    o.pos = pos
    out[0] = o
    return index


cdef Columns _split_batch_columns(const uint8_t* buf, Py_ssize_t end, long count):
    # Every byte copied out comes from a distinct byte of buf[:end], so payloads (allocated
    # at `end` bytes, trimmed at the end) never grows. Rows go through the fast runs while
    # they take them, else one by one the general way.
    cdef Py_ssize_t index = 0, start, smm_end = 0, size, property_pos, pair, pos
    cdef const uint8_t* buf_end = buf + end
    cdef Py_ssize_t spans[4]
    cdef Py_ssize_t* span
    cdef int status
    cdef SmmFields fields
    _check_batch_count(count, end)
    cdef Py_ssize_t rows = count
    cdef _ColumnsOut out
    memset(&out, 0, sizeof(_ColumnsOut))
    cdef bytearray payloads = PyByteArray_FromStringAndSize(NULL, end)
    out.payloads = PyByteArray_AS_STRING(payloads)
    cdef array.array payload_offsets = array.clone(_INT64, rows + 1, False)
    out.payload_ends = payload_offsets.data.as_longlongs
    out.payload_ends[0] = 0

    # Every other column is made on the first row that needs it, else left to Columns to
    # make when read. From then on each row writes its offsets (the rows before are empty,
    # at 0, as made).
    cdef bytearray partition_keys = None, ordering_keys = None
    cdef bytearray property_keys = None, property_values = None
    cdef array.array partition_key_offsets = None, ordering_key_offsets = None, property_offsets = None
    cdef array.array property_key_offsets = None, property_value_offsets = None
    cdef array.array event_times = None, sequence_ids = None
    cdef bytearray has_partition_key = None, has_ordering_key = None
    cdef bytearray has_sequence_id = None, compacted_out = None
    cdef bytearray null_value = None, null_partition_key = None
    cdef bytearray partition_key_b64_encoded = None
    cdef uint8_t* has_ordering_bits = NULL
    cdef uint8_t* compacted_bits = NULL
    cdef uint8_t* null_value_bits = NULL
    cdef uint8_t* null_key_bits = NULL
    cdef uint8_t* b64_bits = NULL

    while index < rows:
        start = index
        index = _plain_run(buf, end, &out, index, rows)
        if index < rows:
            index = _keyed_run(buf, end, &out, index, rows)
        if index != start:
            continue
        # General path: any SingleMessageMetadata, the first row to fill a column, and every error.
        pos = out.pos
        status = _batch_entry(buf, pos, end, True, &fields, &smm_end)
        if status != SCAN_OK:
            _raise_entry(status, buf, pos, end, index, count, &fields)
        size = <Py_ssize_t>fields.payload_size
        memcpy(out.payloads + out.payloads_size, buf + smm_end, size)
        out.payloads_size += size
        out.payload_ends[index + 1] = out.payloads_size
        if fields.key_size >= 0:
            if out.key_ends == NULL:
                partition_keys = _byte_column(fields.key_size, rows - index, end, &out.keys)
                partition_key_offsets = _ends_column(rows, &out.key_ends)
                has_partition_key = _bitmap_column(rows, &out.has_key)
                out.any_key_column = True
            _reserve(partition_keys, &out.keys, fields.key_size)
            _put(&out.keys, buf + fields.key_start, fields.key_size, buf_end)
            _gather_bit(&out.has_key, rows, index)
        if fields.ordering_key_size >= 0:
            if out.ordering_ends == NULL:
                ordering_keys = _byte_column(fields.ordering_key_size, rows - index, end, &out.ordering)
                ordering_key_offsets = _ends_column(rows, &out.ordering_ends)
                has_ordering_key = _bitmap(rows)
                has_ordering_bits = <uint8_t*>PyByteArray_AS_STRING(has_ordering_key)
                out.any_key_column = True
            _reserve(ordering_keys, &out.ordering, fields.ordering_key_size)
            _put(&out.ordering, buf + fields.ordering_key_start, fields.ordering_key_size, buf_end)
            _set_bit(has_ordering_bits, index)
        if fields.property_count:
            if out.property_ends == NULL:
                property_keys = _byte_column(fields.property_spans[0][1], rows - index, end, &out.properties.keys)
                property_values = _byte_column(fields.property_spans[0][3], rows - index, end,
                                               &out.properties.values)
                property_offsets = _ends_column(rows, &out.property_ends)
                out.properties.capacity = rows
                property_key_offsets = _ends_column(rows, &out.properties.key_ends)
                property_value_offsets = _ends_column(rows, &out.properties.value_ends)
                out.any_key_column = True
            if out.properties.pairs + fields.property_count > out.properties.capacity:
                _grow_pairs(&out.properties, property_key_offsets, property_value_offsets, fields.property_count)
            if fields.property_count <= SMM_KEPT_PROPERTIES:
                for pair in range(fields.property_count):
                    span = &fields.property_spans[pair][0]
                    _reserve(property_keys, &out.properties.keys, span[1])
                    _reserve(property_values, &out.properties.values, span[3])
                    _write_pair(&out.properties, buf, buf_end, span[0], span[1], span[2], span[3])
            else:
                property_pos = pos + 4
                while _next_property(buf, &property_pos, smm_end, spans):
                    _reserve(property_keys, &out.properties.keys, spans[1])
                    _reserve(property_values, &out.properties.values, spans[3])
                    _write_pair(&out.properties, buf, buf_end, spans[0], spans[1], spans[2], spans[3])
        if out.any_key_column:
            _end_key_columns(&out, index)
        if fields.event_time:
            if out.event_times == NULL:
                event_times = array.clone(_UINT64, rows, True)
                out.event_times = event_times.data.as_ulonglongs
            out.event_times[index] = fields.event_time
        if fields.flags:
            if fields.flags & SMM_HAS_SEQUENCE_ID:
                if out.sequence_ids == NULL:
                    sequence_ids = array.clone(_UINT64, rows, True)
                    out.sequence_ids = sequence_ids.data.as_ulonglongs
                    has_sequence_id = _bitmap_column(rows, &out.has_sequence)
                out.sequence_ids[index] = fields.sequence_id
                _gather_bit(&out.has_sequence, rows, index)
            if fields.flags & SMM_COMPACTED_OUT:
                if compacted_bits == NULL:
                    compacted_out = _bitmap(rows)
                    compacted_bits = <uint8_t*>PyByteArray_AS_STRING(compacted_out)
                _set_bit(compacted_bits, index)
            if fields.flags & SMM_NULL_VALUE:
                if null_value_bits == NULL:
                    null_value = _bitmap(rows)
                    null_value_bits = <uint8_t*>PyByteArray_AS_STRING(null_value)
                _set_bit(null_value_bits, index)
            if fields.flags & SMM_NULL_PARTITION_KEY:
                if null_key_bits == NULL:
                    null_partition_key = _bitmap(rows)
                    null_key_bits = <uint8_t*>PyByteArray_AS_STRING(null_partition_key)
                _set_bit(null_key_bits, index)
            if fields.flags & SMM_PARTITION_KEY_B64:
                if b64_bits == NULL:
                    partition_key_b64_encoded = _bitmap(rows)
                    b64_bits = <uint8_t*>PyByteArray_AS_STRING(partition_key_b64_encoded)
                _set_bit(b64_bits, index)
        out.pos = smm_end + size
        index += 1
    _check_batch_end(out.pos, end, count)
    _flush_bits(&out.has_key, rows)
    _flush_bits(&out.has_sequence, rows)

    PyByteArray_Resize(payloads, out.payloads_size)
    if partition_keys is not None:
        PyByteArray_Resize(partition_keys, out.keys.size)
    if ordering_keys is not None:
        PyByteArray_Resize(ordering_keys, out.ordering.size)
    if property_keys is not None:
        PyByteArray_Resize(property_keys, out.properties.keys.size)
        PyByteArray_Resize(property_values, out.properties.values.size)
        array.resize(property_key_offsets, out.properties.pairs + 1)
        array.resize(property_value_offsets, out.properties.pairs + 1)
    cdef Columns columns = Columns.__new__(Columns)
    columns.count = rows
    columns.payloads = payloads
    columns.payload_offsets = payload_offsets
    columns._partition_keys = partition_keys
    columns._partition_key_offsets = partition_key_offsets
    columns._has_partition_key = has_partition_key
    columns._ordering_keys = ordering_keys
    columns._ordering_key_offsets = ordering_key_offsets
    columns._has_ordering_key = has_ordering_key
    columns._property_offsets = property_offsets
    columns._property_keys = property_keys
    columns._property_key_offsets = property_key_offsets
    columns._property_values = property_values
    columns._property_value_offsets = property_value_offsets
    columns._event_times = event_times
    columns._sequence_ids = sequence_ids
    columns._has_sequence_id = has_sequence_id
    columns._batch_indexes = None  # 0, 1, 2, ...: made when read
    columns._compacted_out = compacted_out
    columns._null_value = null_value
    columns._null_partition_key = null_partition_key
    columns._partition_key_b64_encoded = partition_key_b64_encoded
    return columns


cdef int _grow_pairs(_PropertyColumns* out, array.array key_ends, array.array value_ends,
                     Py_ssize_t extra) except -1:
    """Room for `extra` more property pairs (the ends arrays hold capacity + 1 offsets)."""
    cdef Py_ssize_t capacity = max(2 * out.capacity, out.pairs + extra, 16)
    array.resize(key_ends, capacity + 1)
    array.resize(value_ends, capacity + 1)
    out.key_ends = key_ends.data.as_longlongs
    out.value_ends = value_ends.data.as_longlongs
    out.capacity = capacity
    return 0


# --- batch encoding ---------------------------------------------------------

cdef class BatchBuilder:
    """Accumulates messages into one batch payload (uncompressed)."""

    cdef uint8_t* _buf
    cdef Py_ssize_t _len, _cap
    cdef readonly int num_messages

    def __cinit__(self):
        self._cap = 4096
        self._buf = <uint8_t*>PyMem_Malloc(self._cap)
        if self._buf == NULL:
            raise MemoryError()
        self._len = 0
        self.num_messages = 0

    def __dealloc__(self):
        PyMem_Free(self._buf)

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t cap = self._cap
        cdef uint8_t* grown
        if self._len + extra <= cap:
            return 0
        while cap < self._len + extra:
            cap *= 2
        grown = <uint8_t*>PyMem_Realloc(self._buf, cap)
        if grown == NULL:
            raise MemoryError()
        self._buf = grown
        self._cap = cap
        return 0

    cdef inline void _byte(self, uint8_t value) noexcept:
        self._buf[self._len] = value
        self._len += 1

    cdef inline void _varint(self, uint64_t value) noexcept:
        while value >= 0x80:
            self._buf[self._len] = <uint8_t>((value & 0x7F) | 0x80)
            self._len += 1
            value >>= 7
        self._buf[self._len] = <uint8_t>value
        self._len += 1

    cdef inline void _bytes_field(self, uint8_t tag, const uint8_t* data, Py_ssize_t size) noexcept:
        self._byte(tag)
        self._varint(<uint64_t>size)
        memcpy(self._buf + self._len, data, size)
        self._len += size

    def add(self, payload, properties=None, partition_key=None, event_time=0,
            ordering_key=None, sequence_id=None, null_value=False):
        cdef Py_buffer view
        cdef Py_ssize_t header_at, smm_start, smm_size, extra
        cdef bytes key_raw, value_raw, pk_raw = None, ok_raw = None
        cdef list encoded_properties = []
        cdef uint8_t* at
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        try:
            extra = 4 + 64 + view.len
            if properties:
                for key, value in properties.items():
                    key_raw = PyUnicode_AsUTF8String(key)
                    value_raw = PyUnicode_AsUTF8String(value)
                    encoded_properties.append((key_raw, value_raw))
                    extra += 30 + len(key_raw) + len(value_raw)
            if partition_key is not None:
                pk_raw = PyUnicode_AsUTF8String(partition_key)
                extra += 10 + len(pk_raw)
            if ordering_key is not None:
                ok_raw = bytes(ordering_key)
                extra += 10 + len(ok_raw)
            self._reserve(extra)
            header_at = self._len
            self._len += 4
            smm_start = self._len
            for key_raw, value_raw in encoded_properties:
                self._byte((1 << 3) | 2)
                self._varint(<uint64_t>(len(key_raw) + len(value_raw)
                                        + _varint_size(len(key_raw)) + _varint_size(len(value_raw)) + 2))
                self._bytes_field((1 << 3) | 2, <const uint8_t*>PyBytes_AS_STRING(key_raw), len(key_raw))
                self._bytes_field((2 << 3) | 2, <const uint8_t*>PyBytes_AS_STRING(value_raw), len(value_raw))
            if pk_raw is not None:
                self._bytes_field((2 << 3) | 2, <const uint8_t*>PyBytes_AS_STRING(pk_raw), len(pk_raw))
            self._byte(3 << 3)
            self._varint(<uint64_t>view.len)
            if event_time:
                self._byte(5 << 3)
                self._varint(<uint64_t>event_time)
            if ok_raw is not None:
                self._bytes_field((7 << 3) | 2, <const uint8_t*>PyBytes_AS_STRING(ok_raw), len(ok_raw))
            if sequence_id is not None:
                self._byte(8 << 3)
                self._varint(<uint64_t>sequence_id)
            if null_value:
                self._byte(9 << 3)
                self._byte(1)
            smm_size = self._len - smm_start
            at = self._buf + header_at
            at[0] = <uint8_t>(smm_size >> 24)
            at[1] = <uint8_t>(smm_size >> 16)
            at[2] = <uint8_t>(smm_size >> 8)
            at[3] = <uint8_t>smm_size
            memcpy(self._buf + self._len, view.buf, view.len)
            self._len += view.len
            self.num_messages += 1
        finally:
            PyBuffer_Release(&view)

    def add_many(self, list items, Py_ssize_t start, first_sequence_id, Py_ssize_t max_messages,
                 Py_ssize_t max_bytes):
        """Add items[start:], plain payloads, with sequence ids first_sequence_id, +1, ...; the number added.

        Each entry is what add(payload, sequence_id=...) writes. Stops after the message that
        brings the batch to max_messages or max_bytes, and before an item that is not bytes or
        is max_bytes long or longer (the caller sends that one another way).
        """
        cdef Py_ssize_t index = start, stop = len(items), size, smm_size
        cdef uint64_t sequence_id = <uint64_t>first_sequence_id
        cdef object item
        cdef uint8_t* at
        while index < stop:
            item = items[index]
            if type(item) is not bytes:
                break
            size = PyBytes_GET_SIZE(item)
            if size >= max_bytes:
                break
            self._reserve(4 + 22 + size)
            at = self._buf + self._len
            self._len += 4
            self._byte(3 << 3)
            self._varint(<uint64_t>size)
            self._byte(8 << 3)
            self._varint(sequence_id)
            smm_size = self._len - (at - self._buf) - 4
            at[0] = 0
            at[1] = 0
            at[2] = 0
            at[3] = <uint8_t>smm_size
            memcpy(self._buf + self._len, PyBytes_AS_STRING(item), size)
            self._len += size
            self.num_messages += 1
            sequence_id += 1
            index += 1
            if self.num_messages >= max_messages or self._len >= max_bytes:
                break
        return index - start

    @property
    def size(self):
        return self._len

    def build(self):
        return PyBytes_FromStringAndSize(<const char*>self._buf, self._len)

    def clear(self):
        self._len = 0
        self.num_messages = 0


cdef inline Py_ssize_t _varint_size(Py_ssize_t value) noexcept:
    cdef Py_ssize_t size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


cdef inline Py_ssize_t _put_varint(uint8_t* out, uint64_t value) noexcept nogil:
    cdef Py_ssize_t n = 0
    while value >= 0x80:
        out[n] = <uint8_t>((value & 0x7F) | 0x80)
        value >>= 7
        n += 1
    out[n] = <uint8_t>value
    return n + 1


def encode_send_receipt(producer_id, sequence_id, highest_sequence_id, ledger_id, entry_id):
    """A SEND_RECEIPT frame, byte for byte what protobuf writes, without building messages.

    The broker answers every entry with one; this is its hot path.
    """
    return _send_receipt(producer_id, sequence_id, highest_sequence_id, ledger_id, entry_id)


cdef bytes _send_receipt(producer_id, sequence_id, highest_sequence_id, ledger_id, entry_id):
    cdef uint8_t mid[24]
    cdef uint8_t receipt[64]
    cdef uint8_t frame[96]
    cdef Py_ssize_t m = 0, r = 0, f = 8, total
    mid[m] = 0x08
    m += 1
    m += _put_varint(mid + m, <uint64_t>(ledger_id & 0xFFFFFFFFFFFFFFFF))
    mid[m] = 0x10
    m += 1
    m += _put_varint(mid + m, <uint64_t>(entry_id & 0xFFFFFFFFFFFFFFFF))
    receipt[r] = 0x08
    r += 1
    r += _put_varint(receipt + r, <uint64_t>producer_id)
    receipt[r] = 0x10
    r += 1
    r += _put_varint(receipt + r, <uint64_t>sequence_id)
    receipt[r] = 0x1A
    r += 1
    r += _put_varint(receipt + r, <uint64_t>m)
    memcpy(receipt + r, mid, m)
    r += m
    receipt[r] = 0x20
    r += 1
    r += _put_varint(receipt + r, <uint64_t>highest_sequence_id)
    frame[f] = 0x08
    frame[f + 1] = 0x07
    frame[f + 2] = 0x3A
    f += 3
    f += _put_varint(frame + f, <uint64_t>r)
    memcpy(frame + f, receipt, r)
    f += r
    total = f - 4
    frame[0] = <uint8_t>(total >> 24)
    frame[1] = <uint8_t>(total >> 16)
    frame[2] = <uint8_t>(total >> 8)
    frame[3] = <uint8_t>total
    frame[4] = <uint8_t>((total - 4) >> 24)
    frame[5] = <uint8_t>((total - 4) >> 16)
    frame[6] = <uint8_t>((total - 4) >> 8)
    frame[7] = <uint8_t>(total - 4)
    return PyBytes_FromStringAndSize(<const char*>frame, f)



def encode_send(producer_id, sequence_id, highest_sequence_id, num_messages, producer_name, publish_time,
                payload, batched, schema_version=None, compression=0, uncompressed_size=0):
    """A producer's SEND frame for a message or a batch without per-send options, byte for byte
    what the pure twin builds through protobuf (see there), written without building a message."""
    cdef uint8_t send[64]
    cdef uint8_t command[80]
    cdef Py_ssize_t s = 0, c = 0, m = 0, md_cap, total, crc_at
    cdef uint64_t first = <uint64_t>sequence_id, highest = <uint64_t>highest_sequence_id
    cdef int64_t count = <int32_t>num_messages
    cdef bytes name = PyUnicode_AsUTF8String(producer_name)
    cdef Py_ssize_t name_size = PyBytes_GET_SIZE(name)
    cdef bytes version = None if schema_version is None else bytes(schema_version)
    cdef Py_ssize_t version_size = 0 if version is None else PyBytes_GET_SIZE(version)
    cdef uint64_t kind = <uint64_t>compression
    cdef uint32_t unpacked = <uint32_t>uncompressed_size
    cdef uint8_t* md
    cdef uint8_t* out
    cdef bytes frame
    cdef Py_buffer body
    # CommandSend: 1 producer_id, 2 sequence_id, 3 num_messages (int32), 6 highest_sequence_id
    send[s] = 0x08
    s += 1
    s += _put_varint(send + s, <uint64_t>producer_id)
    send[s] = 0x10
    s += 1
    s += _put_varint(send + s, first)
    send[s] = 0x18
    s += 1
    s += _put_varint(send + s, <uint64_t>count)
    if highest != first:
        send[s] = 0x30
        s += 1
        s += _put_varint(send + s, highest)
    # BaseCommand: 1 type = SEND (6), 6 send
    command[0] = 0x08
    command[1] = 0x06
    command[2] = 0x32
    c = 3
    c += _put_varint(command + c, <uint64_t>s)
    memcpy(command + c, send, s)
    c += s
    # MessageMetadata: 1 producer_name, 2 sequence_id, 3 publish_time, 8 compression,
    # 9 uncompressed_size, 11 num_messages_in_batch, 16 schema_version, 24 highest_sequence_id
    md_cap = 1 + 10 + name_size + 1 + 10 + 1 + 10 + 1 + 10 + 1 + 10 + 1 + 10 + 2 + 10 + version_size + 2 + 10
    md = <uint8_t*>PyMem_Malloc(md_cap)
    if md == NULL:
        raise MemoryError()
    try:
        md[m] = 0x0A
        m += 1
        m += _put_varint(md + m, <uint64_t>name_size)
        memcpy(md + m, PyBytes_AS_STRING(name), name_size)
        m += name_size
        md[m] = 0x10
        m += 1
        m += _put_varint(md + m, first)
        md[m] = 0x18
        m += 1
        m += _put_varint(md + m, <uint64_t>publish_time)
        if kind:
            md[m] = 0x40
            m += 1
            m += _put_varint(md + m, kind)
            md[m] = 0x48
            m += 1
            m += _put_varint(md + m, unpacked)
        if batched:
            md[m] = 0x58
            m += 1
            m += _put_varint(md + m, <uint64_t>count)
        if version is not None:
            md[m] = 0x82
            md[m + 1] = 0x01
            m += 2
            m += _put_varint(md + m, <uint64_t>version_size)
            memcpy(md + m, PyBytes_AS_STRING(version), version_size)
            m += version_size
        if batched and highest != first:
            md[m] = 0xC0
            md[m + 1] = 0x01
            m += 2
            m += _put_varint(md + m, highest)
        # [u32 total][u32 command size][command][u16 magic][u32 CRC32C][u32 metadata size][metadata][payload]
        _simple_buffer(payload, &body)
        try:
            total = 4 + c + 2 + 4 + 4 + m + body.len
            frame = PyBytes_FromStringAndSize(NULL, 4 + total)
            out = <uint8_t*>PyBytes_AS_STRING(frame)
            _put_u32(out, <uint32_t>total)
            _put_u32(out + 4, <uint32_t>c)
            memcpy(out + 8, command, c)
            out[8 + c] = 0x0E
            out[9 + c] = 0x01
            crc_at = 10 + c
            _put_u32(out + crc_at + 4, <uint32_t>m)
            memcpy(out + crc_at + 8, md, m)
            memcpy(out + crc_at + 8 + m, body.buf, body.len)
        finally:
            PyBuffer_Release(&body)
    finally:
        PyMem_Free(md)
    _put_u32(out + crc_at, <uint32_t>crc32c(memoryview(frame)[crc_at + 4:]))
    return frame


cdef inline void _put_u32(uint8_t* out, uint32_t value) noexcept nogil:
    out[0] = <uint8_t>(value >> 24)
    out[1] = <uint8_t>(value >> 16)
    out[2] = <uint8_t>(value >> 8)
    out[3] = <uint8_t>value
