"""Arrow record batches of the source's columns, built from row slices of the codec's Columns.

The codec has its own Columns -> Arrow builder (`Columns.to_arrow`): one Columns wrapped without a
copy, with 64-bit offsets and the codec's names. This one joins row slices of many entries into one
batch in Spark's layout (32-bit offsets, the message id, topic and position columns); building it
from `to_arrow` of each entry measured 2x slower for batched entries and 4x for entries of one
message, so the two stay apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._codec_py import varint_bytes
from .columns import _arrow_schema

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from .._proto import PulsarApi_pb2 as pb

# the codec's Columns: typed Any, as its fields are set from a tuple of names mypy cannot follow
_Columns = Any

_varint = varint_bytes


_TOPIC_FIELD = 100  # an extra field of MessageIdData: parsers that do not know it skip it


def message_id_topic(raw: bytes) -> str | None:
    """The topic carried in a `__messageId` (None when absent)."""
    from .._proto import PulsarApi_pb2 as pb
    data = pb.MessageIdData.FromString(raw)
    for number, _, value in _unknown_fields(data):
        if number == _TOPIC_FIELD:
            return bytes(value).decode()
    return None


def _unknown_fields(data: pb.MessageIdData) -> list[tuple[int, int, Any]]:
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
        return [(f.field_number, f.wire_type, f.data) for f in UnknownFieldSet(data)]
    except ImportError:  # pragma: no cover - older protobuf
        return [(f.field_number, f.wire_type, f.data) for f in data.UnknownFields()]


@dataclass(slots=True)
class _Slice:
    """Rows [lo, hi) of one entry's Columns, with what every row of them shares."""

    columns: _Columns
    lo: int
    hi: int
    ledger: int
    entry: int
    publish_ms: int
    batched: bool  # rows of a batch (a __messageId with a batch index), not a single message


class _BatchBuilder:
    """Rows of whole entries (the codec's Columns, row slices of them) gathered into one Arrow
    record batch, built with a few array operations per entry and none per row."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self._topic_field = _varint((_TOPIC_FIELD << 3) | 2) + _varint(len(topic.encode())) + topic.encode()
        self._row_overhead = 64 + 24 + len(self._topic_field)  # the other columns of a row, about
        self._clear()

    def _clear(self) -> None:
        self.slices: list[_Slice] = []
        self.rows = 0
        self.bytes = 0

    def add(self, columns: _Columns, lo: int, hi: int, ledger: int, entry: int, publish_ms: int) -> None:
        import numpy as np
        if hi <= lo:
            return
        count = hi - lo
        payload_offsets = np.frombuffer(columns.payload_offsets, np.int64)[lo:hi + 1]
        key_offsets = np.frombuffer(columns.partition_key_offsets, np.int64)[lo:hi + 1]
        pair_offsets = np.frombuffer(columns.property_offsets, np.int64)[lo:hi + 1]
        size = int(payload_offsets[-1] - payload_offsets[0]) + int(key_offsets[-1] - key_offsets[0])
        pairs = int(pair_offsets[-1] - pair_offsets[0])
        if pairs:
            pk = np.frombuffer(columns.property_key_offsets, np.int64)
            pv = np.frombuffer(columns.property_value_offsets, np.int64)
            size += int(pk[pair_offsets[-1]] - pk[pair_offsets[0]] + pv[pair_offsets[-1]] - pv[pair_offsets[0]])
        batched = bool(np.frombuffer(columns.batch_indexes, np.int64)[lo] >= 0)
        self.slices.append(_Slice(columns, lo, hi, ledger, entry, publish_ms, batched))
        self.rows += count
        self.bytes += size + count * self._row_overhead

    def take(self, names: Sequence[str] | None = None) -> pa.RecordBatch:
        """The gathered rows as one pyarrow.RecordBatch (and the builder emptied): the columns
        `names`, in that order (None: all of SCHEMA's); a column not asked for is not built."""
        import numpy as np
        import pyarrow as pa

        slices, rows = self.slices, self.rows
        self._clear()
        wrap = pa.py_buffer
        counts = np.array([s.hi - s.lo for s in slices], np.int64)
        ts = pa.timestamp("us", tz="UTC")

        def per_entry(value_of: Callable[[_Slice], int], kind: type) -> np.ndarray:
            return np.repeat(np.array([value_of(s) for s in slices], kind), counts)

        def per_row(column_of: Callable[[_Columns], Any], kind: type) -> np.ndarray:
            return np.concatenate([np.frombuffer(column_of(s.columns), kind)[s.lo:s.hi] for s in slices])

        def event() -> pa.Array:
            event_ms = per_row(lambda c: c.event_times, np.uint64).astype(np.int64)
            return pa.Array.from_buffers(ts, rows, [wrap(np.packbits(event_ms != 0, bitorder="little")),
                                                    wrap(event_ms * 1000)])

        def topic() -> pa.Array:
            name = self.topic.encode()
            return pa.Array.from_buffers(pa.string(), rows, [
                None, wrap(np.arange(0, (rows + 1) * len(name), len(name), dtype=np.int32)), wrap(name * rows)])

        build: dict[str, Callable[[], pa.Array]] = {
            "value": lambda: _values(slices, rows),
            "__key": lambda: _keys(slices, rows),
            "__topic": topic,
            "__messageId": lambda: _message_ids(slices, rows, self.partition, self._topic_field),
            "__publishTime": lambda: pa.Array.from_buffers(
                ts, rows, [None, wrap(per_entry(lambda s: s.publish_ms, np.int64) * 1000)]),
            "__eventTime": event,
            "__messageProperties": lambda: _properties(slices, rows),
            "__ledgerId": lambda: pa.array(per_entry(lambda s: s.ledger, np.int64)),
            "__entryId": lambda: pa.array(per_entry(lambda s: s.entry, np.int64)),
            "__batchIndex": lambda: pa.array(per_row(lambda c: c.batch_indexes, np.int64).astype(np.int32)),
            "__partition": lambda: pa.array(np.full(rows, self.partition, np.int32)),
        }
        schema = _arrow_schema()
        if names is None:
            return pa.RecordBatch.from_arrays([build[name]() for name in schema.names], schema=schema)
        return pa.RecordBatch.from_arrays([build[name]() for name in names],
                                          schema=pa.schema([schema.field(name) for name in names]))


def _spans(slices: list[_Slice], bounds: list[tuple[int, int]], data_of: Callable[[_Columns], Any],
           offsets_of: Callable[[_Columns], Any]) -> tuple[bytes, np.ndarray]:
    """Concatenated spans (data, int32 offsets) of rows [lo, hi) of each slice's Columns, one
    (lo, hi) a slice in `bounds`."""
    import numpy as np
    offsets = np.empty(sum(hi - lo for lo, hi in bounds) + 1, np.int64)
    offsets[0] = 0
    chunks, at, base = [], 1, 0
    for piece, (lo, hi) in zip(slices, bounds):
        source = np.frombuffer(offsets_of(piece.columns), np.int64)
        first, last = int(source[lo]), int(source[hi])
        offsets[at:at + hi - lo] = source[lo + 1:hi + 1] - first + base
        at += hi - lo
        base += last - first
        chunks.append(memoryview(data_of(piece.columns))[first:last])
    return b"".join(chunks), offsets.astype(np.int32)


def _bits(slices: list[_Slice], bitmap_of: Callable[[_Columns], Any]) -> np.ndarray:
    """A bitmap column of the slices' rows, as bools."""
    import numpy as np
    return np.concatenate([np.unpackbits(np.frombuffer(bitmap_of(s.columns), np.uint8), bitorder="little")[s.lo:s.hi]
                           for s in slices]).astype(bool)


def _values(slices: list[_Slice], rows: int) -> pa.Array:
    """The value column: the payloads, a null value null."""
    import numpy as np
    import pyarrow as pa
    bounds = [(s.lo, s.hi) for s in slices]
    payloads, offsets = _spans(slices, bounds, lambda c: c.payloads, lambda c: c.payload_offsets)
    null_value = _bits(slices, lambda c: c.null_value)
    return pa.Array.from_buffers(pa.binary(), rows, [
        None if not null_value.any() else pa.py_buffer(np.packbits(~null_value, bitorder="little")),
        pa.py_buffer(offsets), pa.py_buffer(payloads)])


def _keys(slices: list[_Slice], rows: int) -> pa.Array:
    """The __key column: the partition keys, null where a message has none."""
    import numpy as np
    import pyarrow as pa
    bounds = [(s.lo, s.hi) for s in slices]
    keys, offsets = _spans(slices, bounds, lambda c: c.partition_keys, lambda c: c.partition_key_offsets)
    has_key = _bits(slices, lambda c: c.has_partition_key)
    return pa.Array.from_buffers(pa.string(), rows, [pa.py_buffer(np.packbits(has_key, bitorder="little")),
                                                     pa.py_buffer(offsets), pa.py_buffer(keys)])


def _properties(slices: list[_Slice], rows: int) -> pa.Array:
    """The __messageProperties column: the pairs of the rows, as an Arrow map."""
    import numpy as np
    import pyarrow as pa
    wrap = pa.py_buffer
    pair_bounds = []
    map_offsets = np.empty(rows + 1, np.int64)
    map_offsets[0] = 0
    at, base = 1, 0
    for s in slices:
        source = np.frombuffer(s.columns.property_offsets, np.int64)
        first, last = int(source[s.lo]), int(source[s.hi])
        pair_bounds.append((first, last))
        map_offsets[at:at + s.hi - s.lo] = source[s.lo + 1:s.hi + 1] - first + base
        at += s.hi - s.lo
        base += last - first
    pairs = base
    if pairs:
        pk, pk_offsets = _spans(slices, pair_bounds, lambda c: c.property_keys, lambda c: c.property_key_offsets)
        pv, pv_offsets = _spans(slices, pair_bounds, lambda c: c.property_values, lambda c: c.property_value_offsets)
    else:
        pk = pv = b""
        pk_offsets = pv_offsets = np.zeros(1, np.int32)
    return pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), rows + 1, [None, wrap(map_offsets.astype(np.int32))]),
        pa.Array.from_buffers(pa.string(), pairs, [None, wrap(pk_offsets), wrap(pk)]),
        pa.Array.from_buffers(pa.string(), pairs, [None, wrap(pv_offsets), wrap(pv)]),
        type=_arrow_schema().field("__messageProperties").type)


def _message_ids(slices: list[_Slice], rows: int, partition: int, topic_field: bytes) -> pa.Array:
    """The __messageId column: per row its entry's prefix, its batch index field, the entry's
    tail; built as fixed-width blocks (one per varint width) rather than one bytes per row."""
    import numpy as np
    import pyarrow as pa

    pieces, lengths = [], []
    for s in slices:
        lo, hi = s.lo, s.hi
        prefix = _message_id_prefix(s.ledger, s.entry, partition)
        if not s.batched:  # a single message: no batch index
            head = prefix + topic_field
            pieces.append(np.frombuffer(head, np.uint8))
            lengths.append(np.full(1, len(head), np.int32))
            continue
        tail = _varint(0x30) + _varint(s.columns.count) + topic_field  # batch_size, topic
        before, after = np.frombuffer(prefix, np.uint8), np.frombuffer(tail, np.uint8)
        for first, last, width in ((lo, min(hi, 1 << 7), 1), (max(lo, 1 << 7), min(hi, 1 << 14), 2),
                                   (max(lo, 1 << 14), hi, 3)):
            if first >= last:
                continue
            count, at = last - first, len(before)
            block = np.empty((count, at + 1 + width + len(after)), np.uint8)
            block[:, :at] = before
            block[:, at] = 0x20  # field 4 (batch_index), varint
            index = np.arange(first, last)
            for byte in range(width):
                part = (index >> (7 * byte)) & 0x7F
                block[:, at + 1 + byte] = part | 0x80 if byte < width - 1 else part
            block[:, at + 1 + width:] = after
            pieces.append(block.ravel())
            lengths.append(np.full(count, block.shape[1], np.int32))
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(np.concatenate(lengths), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets),
                                                     pa.py_buffer(np.concatenate(pieces))])


def _message_id_prefix(ledger: int, entry: int, partition: int) -> bytes:
    """MessageIdData(ledgerId, entryId[, partition]) encoded: the start of every row's __messageId."""
    out = b"\x08" + _varint(ledger) + b"\x10" + _varint(entry)
    if partition >= 0:
        out += b"\x18" + _varint(partition)
    return out


