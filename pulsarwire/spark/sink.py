"""The sink: Arrow batches from Spark sent to topics, each acknowledged before its task ends."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Iterator

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructType, TimestampType

from .connect import _connected, _run
from .errors import PulsarSparkError
from .options import SinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from ..client.client import Client
    from ..client.producer import Producer
    from ..messages import Message
    from ..schema import Schema, SchemaInfo
    from .types import ValueType

try:  # PySpark 4.1+: the streaming sink takes Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - older PySpark: rows
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]


@dataclass
class SentMessage(WriterCommitMessage):
    count: int


# the sink's producer batches, in messages and bytes: 1 MiB rather than the Java client's 128 KiB,
# so large rows make fewer entries (fewer frames to send, store and split again when read)
_SINK_BATCH_MESSAGES = 1000
_SINK_BATCH_BYTES = 1 << 20


def _compression(name: str) -> dict[str, Any]:
    """The producer's options for the sink's `compression`. AUTO, the default: ZSTD for the
    batches it shrinks by an eighth or more, the rest uncompressed. Parquet compresses by
    default; rows that compress (text, JSON, padding) then move a fraction of their bytes through
    the broker and its disk, and are read back faster too, while rows that do not (random,
    already compressed) cost a try in 16 batches at first, in 256 once tries keep failing."""
    if name == "AUTO":
        return {"compression_type": "ZSTD", "compress_where_it_pays": True}
    return {"compression_type": name}


# accepted column -> (the send field it fills, a description of the types accepted)
_SINK_COLUMNS = {
    "value": "value", "key": "key", "__key": "key", "properties": "properties",
    "__messageProperties": "properties", "eventTime": "eventTime", "__eventTime": "eventTime",
    "topic": "topic", "__topic": "topic",
}
# the source's columns that say where a message was: meaningless to a sink, so skipped
_SOURCE_ONLY = {"__messageId", "__publishTime", "__ledgerId", "__entryId", "__batchIndex", "__partition"}


def _check_sink_schema(schema: StructType, has_default_topic: bool, typed_topic: bool = False) -> dict[str, str]:
    """field -> column, with every column checked (clear errors for the wrong name or type).
    `typed_topic`: the topic has a schema, so `value` may be of any type (checked against it
    row by row)."""
    chosen: dict[str, str] = {}
    for column in schema.fields:
        name = column.name
        if name in _SOURCE_ONLY:
            continue
        target = _SINK_COLUMNS.get(name)
        if target is None:
            raise PulsarSparkError(f"the pulsarwire sink does not take column {name!r}: it takes "
                                   f"{', '.join(sorted(_SINK_COLUMNS))} (and skips the source's "
                                   f"{', '.join(sorted(_SOURCE_ONLY))})")
        if target in chosen:
            raise PulsarSparkError(f"columns {chosen[target]!r} and {name!r} both give the message's {target}; "
                                   "keep one")
        kind = column.dataType
        ok = {
            "value": typed_topic or isinstance(kind, (BinaryType, StringType)),
            "key": isinstance(kind, (BinaryType, StringType)),
            "properties": isinstance(kind, MapType) and isinstance(kind.keyType, StringType)
            and isinstance(kind.valueType, StringType),
            "eventTime": isinstance(kind, (TimestampType, LongType, IntegerType))
            or type(kind).__name__ == "TimestampNTZType",
            "topic": isinstance(kind, StringType),
        }[target]
        if not ok:
            wanted = {"value": "binary or string", "key": "string or binary",
                      "properties": "map<string,string>", "eventTime": "timestamp or long (milliseconds)",
                      "topic": "string"}[target]
            raise PulsarSparkError(f"column {name!r} must be {wanted}, not {kind.simpleString()}")
        chosen[target] = name
    if "value" not in chosen:
        raise PulsarSparkError("the pulsarwire sink needs a 'value' column (binary or string)")
    if "topic" not in chosen and not has_default_topic:
        raise PulsarSparkError("give option 'topic' or a '__topic' column naming each row's topic")
    return chosen


@dataclass(frozen=True)
class WriteIdentity:
    """Who writes a streaming sink task's rows: the same on every replay of its micro-batch,
    so that the broker's deduplication drops what a replay sends again."""

    query: str
    partition: int
    batch: int

    @property
    def producer_name(self) -> str:
        return f"pulsarwire-spark-{self.query}-{self.partition}"

    @property
    def last_sequence_id(self) -> int:
        """The sequence id just before this batch's first: batch b's rows take (b + 1) << 32
        onwards, above every id of an earlier batch (a task writes fewer than 2**32 rows)."""
        return ((self.batch + 1) << 32) - 1

    @classmethod
    def of_task(cls) -> "WriteIdentity":
        from pyspark import TaskContext
        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if context is None or query is None or batch is None:
            raise PulsarSparkError("exactlyOnce: this task has no streaming query id and batch id "
                                   "(exactlyOnce is for streaming writes in micro-batches)")
        return cls(query, context.partitionId(), int(batch))


def _event_ms(column: pa.Array) -> list[int | None]:
    """An eventTime column as milliseconds (None where null); 0 and negatives kept as given."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_timestamp(column.type):
        column = pc.divide(column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64()), 1000)
    return column.cast(pa.int64()).to_pylist()


async def _send_batches(opts: SinkOptions, fields: dict[str, str], batches: Iterable[pa.RecordBatch],
                        identity: WriteIdentity | None = None) -> int:
    """Send every row of `batches`; return once the broker acknowledged every one (else raise).
    With an `identity`, under its producer name and sequence ids (exactlyOnce)."""
    client = await _connected(opts.client)  # retried; sending itself is not (no row sent twice)
    try:
        return await _send_all(client, opts, fields, batches, identity)
    finally:
        await client.close()


async def _send_all(client: Client, opts: SinkOptions, fields: dict[str, str], batches: Iterable[pa.RecordBatch],
                    identity: WriteIdentity | None = None) -> int:
    producers = _Producers(client, opts, identity)
    futures: list[Awaitable[Any]] = []
    count = 0
    for batch in _pieces(batches):
        rows = _SinkRows.of(batch, fields, opts, count)
        for target, picked in rows.by_topic(opts.topic, fields, count).items():
            producer = await producers.get(target)
            payloads = rows.payloads(producers.types[target], picked, target, fields["value"])
            futures.append(await producer.send_columns(
                payloads, partition_keys=_pick(rows.keys, picked), properties=_pick(rows.properties, picked),
                event_timestamps=_pick(rows.events, picked)))
        count += batch.num_rows
    await producers.finish(futures)
    return count


class _Producers:
    """One producer a topic, each declaring its topic's schema (if it has one) as its own."""

    def __init__(self, client: Client, opts: SinkOptions, identity: WriteIdentity | None) -> None:
        self.client, self.opts, self.identity = client, opts, identity
        self.producers: dict[str, Producer] = {}
        self.types: dict[str, ValueType | None] = {}  # topic -> its schema as a ValueType (None: no schema)

    async def get(self, topic: str) -> Producer:
        from .types import UnsupportedSchemaError, value_type
        producer = self.producers.get(topic)
        if producer is None:
            info = await self.client.get_schema_info(topic)
            try:
                self.types[topic] = value_type(info)
            except UnsupportedSchemaError as exc:
                raise PulsarSparkError(f"{topic}: {exc}") from None
            identity, opts = self.identity, self.opts
            named = {} if identity is None else {
                # a replay must send each row to the partition, and under the sequence id, it had
                "producer_name": identity.producer_name, "initial_sequence_id": identity.last_sequence_id,
                "message_router": _replayable_router(identity.partition)}
            producer = self.producers[topic] = await self.client.create_producer(
                topic, batching_max_publish_delay_ms=5, **_compression(opts.compression),
                max_pending_messages=opts.max_pending, batching_max_messages=_SINK_BATCH_MESSAGES,
                batching_max_allowed_size_in_bytes=_SINK_BATCH_BYTES,
                schema=None if info is None or self.types[topic] is None else _topic_schema(info), **named)
        return producer

    async def finish(self, futures: list[Awaitable[Any]]) -> None:
        """Return once the broker acknowledged every send (else raise), then close the producers."""
        for producer in self.producers.values():
            await producer.flush()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise RuntimeError(f"{len(failed)} send(s) of this task were not acknowledged by the broker: "
                               f"{failed[0]}") from failed[0]
        for producer in self.producers.values():
            await producer.close()


_PIECE_BYTES = 4 << 20


def _pieces(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The rows of `batches` in slices of about 4 MiB: each slice's values become Python bytes
    at once, and memory that small is used again slice after slice, where a whole batch of Spark's
    (10 000 rows: 100 MB of 10 KiB values) is made in fresh pages each time (2.3 us a 10 KiB row)."""
    for batch in batches:
        rows = batch.num_rows
        if rows == 0:
            continue
        step = max(1, rows * _PIECE_BYTES // max(1, batch.nbytes))
        if step >= rows:
            yield batch
            continue
        for start in range(0, rows, step):
            yield batch.slice(start, step)


def _pick(column: list[Any] | None, rows: list[int] | None) -> list[Any] | None:
    return column if column is None or rows is None else [column[i] for i in rows]


@dataclass(slots=True)
class _SinkRows:
    """One Arrow batch's rows as the fields of the messages they become (None: a field not given)."""

    column: Any  # the value column as given
    values: list[bytes] | None  # the values as bytes, where the column is binary or string
    keys: list[str | None] | None
    properties: list[dict[str, str] | None] | None
    events: list[int | None] | None  # event times in milliseconds
    topics: list[str | None] | None  # each row's topic, where a column gives it and option 'topic' does not

    @classmethod
    def of(cls, batch: pa.RecordBatch, fields: dict[str, str], opts: SinkOptions, count: int) -> "_SinkRows":
        """The batch's rows, checked (`count`: rows before this batch, for the messages)."""
        import pyarrow as pa
        column = batch.column(fields["value"])
        values = None
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type):
            if column.null_count:
                raise PulsarSparkError(f"column {fields['value']!r} has a null: every row needs a value")
            values = column.cast(pa.binary()).to_pylist()
        keys = _keys(batch.column(fields["key"]), fields["key"]) if "key" in fields else None
        properties = batch.column(fields["properties"]).to_pylist() if "properties" in fields else None
        events = _event_ms(batch.column(fields["eventTime"])) if "eventTime" in fields else None
        # as in Spark's Kafka sink, option 'topic' (when given) overrides a topic column
        topics = batch.column(fields["topic"]).to_pylist() if "topic" in fields and not opts.topic else None
        if events is not None:
            for i, event in enumerate(events):
                if event is not None and event <= 0:
                    raise PulsarSparkError(f"row {count + i + 1}: eventTime {event} ms is not after 1970-01-01: "
                                           "Pulsar cannot carry it (0 means no event time); null it")
        if properties is not None:
            properties = [dict(p) if p else None for p in properties]
        return cls(column, values, keys, properties, events, topics)

    def by_topic(self, default: str | None, fields: dict[str, str], count: int) -> dict[str, list[int] | None]:
        """The rows by target topic, each group sent at once (None: every row)."""
        from ..client import topic_name
        if self.topics is None:
            return {default or '': None}
        groups: dict[str, list[int]] = {}
        for i, target in enumerate(self.topics):
            if target is None:
                raise PulsarSparkError(f"row {count + i + 1} has a null {fields['topic']!r} (and there is "
                                       "no option 'topic')")
            groups.setdefault(topic_name(target), []).append(i)
        return dict(groups)

    def payloads(self, kind: ValueType | None, rows: list[int] | None, target: str, name: str) -> list[bytes]:
        """The payloads of `rows` for a topic whose schema is `kind`: a typed value encoded, bytes
        checked; bytes as they are where the topic has no schema."""
        if kind is not None:
            from .types import SchemaMismatchError, encode_values
            try:
                return encode_values(kind, self.column if rows is None else self.column.take(rows), name)
            except SchemaMismatchError as exc:
                raise PulsarSparkError(f"{target}: {exc}") from None
        if self.values is None:
            raise PulsarSparkError(f"{target} has no schema: column {name!r} must be "
                                   f"binary or string, not {self.column.type}")
        return self.values if rows is None else [self.values[i] for i in rows]


def _topic_schema(info: SchemaInfo) -> Schema:
    """The topic's own schema, declared by the sink's producer; payloads are encoded (or
    checked) before they reach it (types.encode_values)."""
    from ..schema import Schema

    class TopicSchema(Schema):
        schema_type = info.schema_type()
        schema_name = info.name()

        def _definition(self) -> bytes:
            return info.data()

        def _properties(self) -> dict[str, str]:
            return info.properties()

        def encode(self, value: bytes) -> bytes:
            return value

        def decode(self, data: bytes) -> bytes:
            return bytes(data)
    return TopicSchema()


def _keys(column: pa.Array, name: str) -> list[str | None]:
    import pyarrow as pa
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        out = []
        for raw in column.to_pylist():
            try:
                out.append(None if raw is None else raw.decode())
            except UnicodeDecodeError:
                raise PulsarSparkError(f"column {name!r}: a binary key that is not UTF-8 ({raw[:16]!r}...): "
                                       "Pulsar keys are text") from None
        return out
    return column.to_pylist()


def _replayable_router(task_partition: int) -> Callable[[Message, int], int]:
    """Keyed rows by their key's hash (as the default router), keyless rows all to the task's own
    partition: the same choice on every replay (the default starts round robin at random)."""
    from ..routing import Router
    by_key = Router()

    def route(message: Message, partitions: int) -> int:
        key = message.partition_key()
        return by_key.partition(key, partitions) if key else task_partition % partitions
    return route


class PulsarBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, fields: dict[str, str]) -> None:
        self.opts, self.fields = opts, fields

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessage:
        return SentMessage(_run(_send_batches(self.opts, self.fields, iterator)))


class PulsarStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, fields: dict[str, str]) -> None:
        self.opts, self.fields = opts, fields

    def write(self, iterator: Iterable[pa.RecordBatch]) -> SentMessage:
        if DataSourceStreamArrowWriter is DataSourceStreamWriter:  # pragma: no cover - rows
            import pyarrow as pa
            rows = [r.asDict() for r in iterator]
            iterator = [pa.RecordBatch.from_pylist(rows)] if rows else []
        identity = WriteIdentity.of_task() if self.opts.exactly_once else None
        return SentMessage(_run(_send_batches(self.opts, self.fields, iterator, identity)))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every message was acknowledged before its task finished

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # what was acknowledged stays: a replay sends it again (deduplicated with exactlyOnce)


