"""Reading one range of one topic-partition on a task: whole entries in, Arrow batches out.

Every task opens its own client on a private event loop, takes whole entries (`EntryReader`),
splits them with the codec's columnar split and yields Arrow record batches capped in rows and
bytes. A chunked message belongs to the range that holds its first chunk, and the task reading
that range reads on past the range's end to its last chunk.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import InputPartition

from ..messages import MessageId
from .arrow import _BatchBuilder
from .columns import SCHEMA
from .connect import _connected, _retryable
from .errors import PulsarDataLossError
from .offsets import Boundary, _position, _row_range, _where
from .options import SourceOptions
from .positions import _entry_at_or_after

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from .._proto import PulsarApi_pb2 as pb
    from ..client.client import Client
    from ..client.entries import Entry, EntryReader

log = logging.getLogger("pulsarwire.spark")


class RangePartition(InputPartition):
    """One topic-partition's messages strictly between two boundaries."""

    def __init__(self, topic: str, partition: int, start: list[int], end: list[int]) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class RangeGroup(InputPartition):
    """Several ranges read one after the other by one task (maxPartitions)."""

    def __init__(self, ranges: list[RangePartition]) -> None:
        super().__init__([r.value for r in ranges])
        self.ranges = ranges


def _read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, RangeGroup):
        for part in partition.ranges:
            yield from _read_range(opts, part)
    elif isinstance(partition, RangePartition):
        yield from _read_range(opts, partition)
    # else: Spark's stand-in partition when there is nothing to read


# what _finish reads besides the query's columns: the key for KeyValue values, the position
# columns to name a payload that does not decode
_TYPED_NEEDS = ("value", "__key", "__topic", "__ledgerId", "__entryId", "__batchIndex")


def _built_columns(opts: SourceOptions) -> list[str] | None:
    """The builder's columns: the query's own, then what _finish needs to make them (None: all)."""
    if opts.columns is None:
        return None
    names = [name for name in opts.columns if name in SCHEMA.fieldNames()]
    needs = list(_TYPED_NEEDS) if opts.value_type is not None else []
    if opts.include_headers:
        needs.append("__messageProperties")
    return names + [name for name in dict.fromkeys(needs) if name not in names]


def _finish(opts: SourceOptions, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The builder's columns made into what the read gives: the value decoded with the topic's
    schema, headers and the corrupt-record column when asked, the query's columns in its order."""
    if not opts.include_headers and opts.value_type is None and not opts.retyped and opts.column_names is None \
            and (opts.columns is None or len(opts.columns) == batch.num_columns):
        return batch
    import pyarrow as pa
    columns, names = list(batch.columns), list(batch.schema.names)
    corrupt = None
    if opts.value_type is not None:
        from .types import decode_values
        raw = batch.column("value")
        value, bad = decode_values(opts.value_type, raw, batch.column("__key"))
        if bad is not None:
            if not opts.permissive:
                _undecodable(opts, batch, bad)
            value = pa.array(value.to_pylist(), value.type, mask=bad) if value.null_count < bad.sum() else value
        if opts.permissive and (opts.columns is None or opts.corrupt_column in opts.columns):
            # the payload of each row that did not decode, null elsewhere
            corrupt = pa.nulls(len(raw), pa.binary()) if bad is None else \
                pa.array(raw.to_pylist(), pa.binary(), mask=~bad)
        columns[names.index("value")] = value
    if opts.include_headers:
        properties = batch.column("__messageProperties")
        header = pa.StructArray.from_arrays([properties.keys, properties.items.cast(pa.binary())], ["key", "value"])
        columns.append(pa.ListArray.from_arrays(properties.offsets, header))
        names.append("headers")
    if corrupt is not None:
        columns.append(corrupt)
        names.append(opts.corrupt_column)
    if opts.columns is not None:
        by_name = dict(zip(names, columns))
        if opts.retyped:
            from pyspark.sql.pandas.types import to_arrow_type
            for name, kind in opts.retyped.items():
                by_name[name] = by_name[name].cast(to_arrow_type(kind, timezone="UTC"))
        columns, names = [by_name[name] for name in opts.columns], list(opts.column_names or opts.columns)
    return pa.RecordBatch.from_arrays(columns, names=names)


def _undecodable(opts: SourceOptions, batch: pa.RecordBatch, bad: np.ndarray) -> None:
    from .types import SchemaMismatchError, _kind_name, decode_one
    row = int(bad.nonzero()[0][0])
    topic = batch.column("__topic")[row].as_py()
    where = (f"{batch.column('__ledgerId')[row].as_py()}:{batch.column('__entryId')[row].as_py()}:"
             f"{batch.column('__batchIndex')[row].as_py()}")
    try:
        decode_one(opts.value_type, batch.column("value")[row].as_py(), batch.column("__key")[row].as_py())
        why = "it does not fit the column's type"
    except Exception as exc:  # noqa: BLE001 - the reason, for the message
        why = f"{type(exc).__name__}: {exc}"
    raise SchemaMismatchError(f"{topic}: message {where} does not decode with the topic's "
                              f"{_kind_name(opts.value_type.kind)} schema ({why}); {int(bad.sum())} such row(s) in "
                              "this batch; read with mode=PERMISSIVE for null values and the payload in "
                              f"{opts.corrupt_column!r}, or rawValue=true for bytes")


class _RangeReader:
    """Reads one RangePartition on the task's private event loop: whole entries in, Arrow out."""

    def __init__(self, opts: SourceOptions, part: RangePartition) -> None:
        self.opts = opts
        self.part = part
        self.start = Boundary.from_json(part.start)
        self.end = Boundary.from_json(part.end)
        self.end_position = self.end.position
        self.builder = _BatchBuilder(part.topic, part.partition)
        self.names = _built_columns(opts)
        self.client: Client | None = None
        self.reader: EntryReader | None = None
        self.first = True
        self.seen: tuple[int, int] | None = None  # the last entry taken
        self.reached_end = False
        self.chunks: dict[str, list[Entry]] = {}  # uuid -> the entries so far of a chunked message of the range
        self.chunk_of_producer: dict[str, str] = {}  # producer name -> uuid of its chunked message in progress

    async def open(self) -> None:
        self.client = await _connected(self.opts.client)
        await self._start_reader(self.start.start_entry())
        if self.start.ledger >= 0:
            await self._check_start()

    async def _start_reader(self, start: MessageId) -> EntryReader:
        assert self.client is not None  # open() connected it
        if self.reader is not None:
            await self.reader.close()
        reader = self.reader = await self.client.create_entry_reader(
            self.part.topic, start, receiver_queue_size=max(self.opts.rows_per_batch, 10_000),
            max_queued_bytes=min(2 * self.opts.bytes_per_batch, 256 << 20))
        return reader

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    @property
    def done(self) -> bool:
        return self.reached_end and not self.chunks

    async def _check_start(self) -> None:
        """The reader starts at the start boundary's own entry, which the batch before read: see
        at once whether it is gone, rather than wait for an entry that never comes (a broker
        may wait at that entry id in a re-created topic)."""
        start = self.start.position
        assert self.client is not None and self.reader is not None  # open() started them
        last = await self.reader.get_last_message_id()
        if last.entry_id < 0 or _position(last) < start:
            await self._start_gone("the topic is now empty" if last.entry_id < 0
                                   else f"the topic now ends at {_where(_position(last))}")
        elif last.entry_id < start.entry:  # the last entry is in a later, shorter ledger
            first = await _entry_at_or_after(self.client, self.part.topic, MessageId.earliest, self.opts.read_timeout)
            if first is None or first > start:
                await self._start_gone(f"the first entry there now is {_where(first)}" if first
                                       else "the topic is now empty")

    async def _start_gone(self, why: str) -> EntryReader:
        """Data between the start boundary and what is there now is gone. Strict: a data-loss
        error naming it. Lenient: read again from the earliest entry, keeping only what lies
        past the start boundary: what is gone is skipped, nothing that is there."""
        message = (f"{self.part.topic}: entry {self.start.ledger}:{self.start.entry}, where this read starts "
                   f"(range {self.start.to_json()} to {self.end.to_json()}), is gone ({why}): data was "
                   "deleted or the topic re-created")
        if self.opts.fail_on_data_loss:
            raise PulsarDataLossError(message + "; set failOnDataLoss=false to read on from what is there")
        log.warning("%s; reading what is there past it (failOnDataLoss=false)", message)
        self.first = False
        return await self._start_reader(MessageId.earliest)

    async def next_batch(self) -> pa.RecordBatch | None:
        """The next Arrow batch (None when the range is read)."""
        builder, opts, reader = self.builder, self.opts, self.reader
        assert reader is not None  # open() started it
        while not self.done and builder.rows < opts.rows_per_batch and builder.bytes < opts.bytes_per_batch:
            entries = reader.take(1)
            if entries:
                entry = entries[0]
                if self.first:
                    self.first = False
                    if self.start.ledger >= 0 and _position(entry) != self.start.position:
                        reader = await self._start_gone(f"the first entry there now is "
                                                        f"{entry.ledger_id}:{entry.entry_id}")
                        continue
                self.seen = (entry.ledger_id, entry.entry_id)  # a plain tuple: this runs once an entry
                self._entry(entry)
            else:
                await self._wait()
        return builder.take(self.names) if builder.rows else None

    async def _wait(self) -> None:
        """Wait for entries; a range whose end is no longer there ends (lenient) or is a data-loss
        error (strict) once the broker says so, not after read.timeout.seconds."""
        reader = self.reader
        assert reader is not None  # open() started it
        waited = 0.0
        while waited < self.opts.read_timeout:
            step = min(1.0, self.opts.read_timeout - waited)
            if await reader.wait(step):
                return
            waited += step
            if self.reached_end or reader.disconnect is not None:
                continue
            try:
                last = await reader.get_last_message_id()
            except _retryable():
                continue
            end = self.end.position
            # gone when the topic now ends before the range does and every entry up to its end is here
            if last.entry_id < 0 or (_position(last) < end and self.seen is not None
                                     and self.seen >= _position(last)):
                message = (f"{self.part.topic}: the range {self.start.to_json()} to {self.end.to_json()} ends past "
                           f"the topic's last entry now ({_where(_position(last)) if last.entry_id >= 0 else 'none'}): "
                           "data was deleted or the topic re-created")
                if self.opts.fail_on_data_loss:
                    raise PulsarDataLossError(message + "; set failOnDataLoss=false to skip it")
                log.warning("%s; skipped (failOnDataLoss=false)", message)
                self.reached_end = True
                return
        self._stalled()

    def _stalled(self) -> None:
        where = f"{self.part.topic} (range {self.start.to_json()} to {self.end.to_json()})"
        assert self.reader is not None  # open() started it
        if self.reader.disconnect is not None:
            raise ConnectionError(f"{where}: disconnected from the broker at {self.opts.client.url} and not "
                                  f"reconnected within {self.opts.read_timeout:g}s (read.timeout.seconds): "
                                  f"{self.reader.disconnect}")
        if self.reached_end and self.chunks:
            for uuid in list(self.chunks):
                self._drop_chunked(uuid, f"incomplete after {self.opts.read_timeout:g}s (read.timeout.seconds)")
            return
        raise TimeoutError(f"{where}: no entry for {self.opts.read_timeout:g}s (read.timeout.seconds) before "
                           "the end of the range")

    def _entry(self, entry: Entry) -> None:
        from .. import codec
        position = (entry.ledger_id, entry.entry_id)  # a plain tuple: this runs once an entry
        if position >= self.end_position:
            self.reached_end = True
        md = entry.metadata
        if self.chunk_of_producer:
            self._abandoned(md)
        if md.HasField("num_chunks_from_msg") and md.num_chunks_from_msg > 1:
            self._chunk(entry)
            return
        lo, hi = _row_range(self.start, self.end, *position, entry.num_messages,
                            md.HasField("num_messages_in_batch"))
        if hi <= lo:
            return
        columns = codec.split_columns(md, codec.decompress_payload(md, entry.payload))
        self.builder.add(columns, lo, hi, entry.ledger_id, entry.entry_id, md.publish_time)

    def _abandoned(self, md: pb.MessageMetadata) -> None:
        """A producer sends the chunks of a message one after the other: anything else from it
        means it gave that message up (it never had a receipt for it), as a Pulsar consumer
        would find when the incomplete message expires."""
        uuid = self.chunk_of_producer.get(md.producer_name)
        if uuid is None or (md.HasField("num_chunks_from_msg") and md.uuid == uuid):
            return
        self.chunk_of_producer.pop(md.producer_name)
        if self.chunks.pop(uuid, None) is not None:
            log.warning("%s: chunked message %s was abandoned by its producer (never acknowledged to it); "
                        "skipped", self.part.topic, uuid)

    def _drop_chunked(self, uuid: str, why: str) -> None:
        message = f"{self.part.topic}: chunked message {uuid}: {why}"
        if self.opts.fail_on_data_loss:
            raise PulsarDataLossError(message + "; set failOnDataLoss=false to skip it")
        log.warning("%s; skipped (failOnDataLoss=false)", message)
        self.chunks.pop(uuid, None)

    def _chunk(self, entry: Entry) -> None:
        from .. import codec
        md = entry.metadata
        uuid = md.uuid
        parts = self.chunks.get(uuid)
        if md.chunk_id == 0:
            first = (entry.ledger_id, entry.entry_id, -1)
            if self.start.precedes(first) and not self.end.precedes(first):
                self.chunks[uuid] = [entry]
                self.chunk_of_producer[md.producer_name] = uuid
            return  # a message that starts past the range belongs to the next one
        if parts is None:
            return  # a message that started before the range: the range before read it
        if md.chunk_id < len(parts):
            return  # a chunk sent again (the producer resent after a reconnect)
        if md.chunk_id > len(parts):
            self._drop_chunked(uuid, f"chunk {md.chunk_id} follows chunk {len(parts) - 1}: chunks are missing")
            return
        parts.append(entry)
        if len(parts) < md.num_chunks_from_msg:
            return
        del self.chunks[uuid]
        self.chunk_of_producer.pop(md.producer_name, None)
        from .._proto import PulsarApi_pb2 as pb
        whole = pb.MessageMetadata()
        whole.CopyFrom(md)
        whole.ClearField("num_chunks_from_msg")
        payload = b"".join(bytes(p.payload) for p in parts)
        columns = codec.split_columns(whole, codec.decompress_payload(whole, payload))
        self.builder.add(columns, 0, columns.count, entry.ledger_id, entry.entry_id, parts[0].metadata.publish_time)


def _read_range(opts: SourceOptions, part: RangePartition) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the messages strictly between part.start and part.end."""
    loop = asyncio.new_event_loop()
    reader = _RangeReader(opts, part)
    try:
        loop.run_until_complete(reader.open())
        while True:
            batch = loop.run_until_complete(reader.next_batch())
            if batch is None:
                return
            yield _finish(opts, batch)
    finally:
        try:
            loop.run_until_complete(reader.close())
        finally:
            loop.close()


