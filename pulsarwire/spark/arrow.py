"""Arrow record batches of the source's columns, built from row slices of the codec's Columns.

The codec has its own Columns -> Arrow builder (`Columns.to_arrow`): one Columns wrapped without a
copy, with 64-bit offsets and the codec's names. This one joins row slices of many entries into one
batch in Spark's layout (32-bit offsets, the message id, topic and position columns); building it
from `to_arrow` of each entry measured 2x slower for batched entries and 4x for entries of one
message, so the two stay apart.
"""
from __future__ import annotations

from .._codec_py import varint_bytes
from .columns import _arrow_schema

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


def _unknown_fields(data):
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
        return [(f.field_number, f.wire_type, f.data) for f in UnknownFieldSet(data)]
    except ImportError:  # pragma: no cover - older protobuf
        return [(f.field_number, f.wire_type, f.data) for f in data.UnknownFields()]


class _BatchBuilder:
    """Rows of whole entries (the codec's Columns, row slices of them) gathered into one Arrow
    record batch, built with a few array operations per entry and none per row."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self._topic_field = _varint((_TOPIC_FIELD << 3) | 2) + _varint(len(topic.encode())) + topic.encode()
        self._clear()

    def _clear(self) -> None:
        self.parts: list = []
        self.ids: list = []  # per part: (the row ids' bytes before the batch index, after it)
        self.rows = 0
        self.bytes = 0

    def add(self, columns, lo: int, hi: int, ledger: int, entry: int, publish_ms: int) -> None:
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
        self.parts.append((columns, lo, hi, ledger, entry, publish_ms))
        batch_indexes = np.frombuffer(columns.batch_indexes, np.int64)
        prefix = _message_id_prefix(ledger, entry, self.partition)
        suffix = self._topic_field
        if batch_indexes[lo] < 0:
            self.ids.append((prefix + suffix, None))
        else:
            self.ids.append((prefix, _varint(0x30) + _varint(columns.count) + suffix))  # batch_size, topic
        self.rows += count
        self.bytes += size + count * (64 + len(prefix) + len(suffix))

    def take(self):
        """The gathered rows as one pyarrow.RecordBatch (and the builder emptied)."""
        import numpy as np
        import pyarrow as pa

        parts, ids, rows = self.parts, self.ids, self.rows
        self._clear()
        wrap = pa.py_buffer

        def spans(data_of, offsets_of, los, his):
            """Concatenated spans (data, int32 offsets) of row ranges of several Columns."""
            offsets = np.empty(sum(h - l for l, h in zip(los, his)) + 1, np.int64)
            offsets[0] = 0
            chunks, at, base = [], 1, 0
            for part, lo, hi in zip(parts_of, los, his):
                source = np.frombuffer(offsets_of(part), np.int64)
                first, last = int(source[lo]), int(source[hi])
                offsets[at:at + hi - lo] = source[lo + 1:hi + 1] - first + base
                at += hi - lo
                base += last - first
                chunks.append(memoryview(data_of(part))[first:last])
            return b"".join(chunks), offsets.astype(np.int32)

        def bits(bitmap_of, los, his):
            out = []
            for part, lo, hi in zip(parts_of, los, his):
                out.append(np.unpackbits(np.frombuffer(bitmap_of(part), np.uint8), bitorder="little")[lo:hi])
            return np.concatenate(out).astype(bool)

        parts_of = [p[0] for p in parts]
        los = [p[1] for p in parts]
        his = [p[2] for p in parts]
        counts = np.array([h - l for l, h in zip(los, his)], np.int64)
        # value (a null value is null), key
        payloads, payload_offsets = spans(lambda c: c.payloads, lambda c: c.payload_offsets, los, his)
        null_value = bits(lambda c: c.null_value, los, his)
        value = pa.Array.from_buffers(pa.binary(), rows, [
            None if not null_value.any() else wrap(np.packbits(~null_value, bitorder="little")),
            wrap(payload_offsets), wrap(payloads)])
        keys, key_offsets = spans(lambda c: c.partition_keys, lambda c: c.partition_key_offsets, los, his)
        has_key = bits(lambda c: c.has_partition_key, los, his)
        key = pa.Array.from_buffers(pa.string(), rows, [wrap(np.packbits(has_key, bitorder="little")),
                                                        wrap(key_offsets), wrap(keys)])
        # properties: the pairs of the rows, as an Arrow map
        pair_los = [int(np.frombuffer(c.property_offsets, np.int64)[lo]) for c, lo in zip(parts_of, los)]
        pair_his = [int(np.frombuffer(c.property_offsets, np.int64)[hi]) for c, hi in zip(parts_of, his)]
        map_offsets = np.empty(rows + 1, np.int64)
        map_offsets[0] = 0
        at, base = 1, 0
        for c, lo, hi, plo in zip(parts_of, los, his, pair_los):
            source = np.frombuffer(c.property_offsets, np.int64)
            map_offsets[at:at + hi - lo] = source[lo + 1:hi + 1] - plo + base
            at += hi - lo
            base += int(source[hi]) - plo
        pairs = base
        if pairs:
            pk, pk_offsets = spans(lambda c: c.property_keys, lambda c: c.property_key_offsets, pair_los, pair_his)
            pv, pv_offsets = spans(lambda c: c.property_values, lambda c: c.property_value_offsets,
                                   pair_los, pair_his)
        else:
            pk = pv = b""
            pk_offsets = pv_offsets = np.zeros(1, np.int32)
        map_type = _arrow_schema().field("__messageProperties").type
        properties = pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), rows + 1, [None, wrap(map_offsets.astype(np.int32))]),
            pa.Array.from_buffers(pa.string(), pairs, [None, wrap(pk_offsets), wrap(pk)]),
            pa.Array.from_buffers(pa.string(), pairs, [None, wrap(pv_offsets), wrap(pv)]), type=map_type)
        # per-entry constants, repeated; per-row times
        publish = np.repeat(np.array([p[5] for p in parts], np.int64) * 1000, counts)
        event_ms = np.concatenate([np.frombuffer(c.event_times, np.uint64)[lo:hi]
                                   for c, lo, hi in zip(parts_of, los, his)]).astype(np.int64)
        has_event = event_ms != 0
        ts = pa.timestamp("us", tz="UTC")
        event = pa.Array.from_buffers(ts, rows, [wrap(np.packbits(has_event, bitorder="little")),
                                                 wrap(event_ms * 1000)])
        batch_index = np.concatenate([np.frombuffer(c.batch_indexes, np.int64)[lo:hi]
                                      for c, lo, hi in zip(parts_of, los, his)]).astype(np.int32)
        name = self.topic.encode()
        topic = pa.Array.from_buffers(pa.string(), rows, [
            None, wrap(np.arange(0, (rows + 1) * len(name), len(name), dtype=np.int32)), wrap(name * rows)])
        arrays = [
            value, key, topic, _message_ids(parts, ids, rows),
            pa.Array.from_buffers(ts, rows, [None, wrap(publish)]), event, properties,
            pa.array(np.repeat(np.array([p[3] for p in parts], np.int64), counts)),
            pa.array(np.repeat(np.array([p[4] for p in parts], np.int64), counts)),
            pa.array(batch_index), pa.array(np.full(rows, self.partition, np.int32)),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=_arrow_schema())


def _message_ids(parts, ids, rows: int):
    """The __messageId column: per row its entry's prefix, its batch index field, the entry's
    tail; built as fixed-width blocks (one per varint width) rather than one bytes per row."""
    import numpy as np
    import pyarrow as pa

    pieces, lengths = [], []
    for (_, lo, hi, *_rest), (head, tail) in zip(parts, ids):
        if tail is None:  # not a batch: no batch index
            pieces.append(np.frombuffer(head, np.uint8))
            lengths.append(np.full(1, len(head), np.int32))
            continue
        before, after = np.frombuffer(head, np.uint8), np.frombuffer(tail, np.uint8)
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


