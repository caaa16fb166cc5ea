"""PySpark data source `pulsarwire`: topics to DataFrames and back, batch and streaming.

    from pulsarwire.spark import PulsarDataSource
    spark.dataSource.register(PulsarDataSource)
    df = (spark.read.format("pulsarwire").option("service.url", "pulsar://127.0.0.1:6650")
          .option("topic", "events").load())

Offsets are boundaries between messages, one per topic-partition, written as
canonical JSON: `{"<partition topic>": [ledgerId, entryId, batchIndex, side]}`
where side 1 means "just after that message" and 0 "just before it". A batch
or micro-batch reads every message strictly between its start and end
boundaries, so consecutive micro-batches neither overlap nor leave gaps.

Only options cross to executors: every task opens its own pulsarwire client.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter,
    InputPartition, WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from .messages import MessageId

SCHEMA = StructType([
    StructField("value", BinaryType()),
    StructField("__key", StringType()),
    StructField("__topic", StringType()),
    StructField("__messageId", BinaryType()),
    StructField("__publishTime", TimestampType()),
    StructField("__eventTime", TimestampType()),
    StructField("__messageProperties", MapType(StringType(), StringType())),
    StructField("__ledgerId", LongType()),
    StructField("__entryId", LongType()),
    StructField("__batchIndex", IntegerType()),
    StructField("__partition", IntegerType()),
])

_WHOLE_ENTRY = 2**31 - 1  # a batch index past every message of an entry
_ROWS_PER_BATCH = 8192


class PulsarSparkError(ValueError):
    """A bad option or offset given to the data source."""


@dataclass(frozen=True)
class Boundary:
    """A point between messages: just before or just after message (ledger, entry, batch)."""

    ledger: int
    entry: int
    batch: int
    after: bool

    @classmethod
    def before_everything(cls) -> "Boundary":
        return cls(-1, -1, -1, True)

    @classmethod
    def after_message(cls, mid: MessageId) -> "Boundary":
        return cls(mid.ledger_id, mid.entry_id, mid.batch_index, True)

    def key(self) -> tuple:
        return (self.ledger, self.entry, self.batch, 1 if self.after else 0)

    def precedes(self, mid: MessageId) -> bool:
        """True when message `mid` lies after this boundary."""
        position = (mid.ledger_id, mid.entry_id, mid.batch_index)
        mine = (self.ledger, self.entry, self.batch)
        return position > mine or (position == mine and not self.after)

    def to_json(self) -> list:
        return [self.ledger, self.entry, self.batch, 1 if self.after else 0]

    @classmethod
    def from_json(cls, value) -> "Boundary":
        if value == "earliest":
            return cls.before_everything()
        if isinstance(value, dict):  # a message id given by a user: start at (before) it
            return cls(int(value["ledgerId"]), int(value["entryId"]), int(value.get("batchIndex", -1)), False)
        if isinstance(value, list) and len(value) == 4:
            return cls(int(value[0]), int(value[1]), int(value[2]), bool(value[3]))
        raise PulsarSparkError(f"not an offset: {value!r}")

    def start_id(self, partition: int) -> tuple[MessageId, bool]:
        """Where a reader starts, and whether that message itself is included."""
        if self.ledger < 0:
            return MessageId.earliest, True
        return MessageId(self.ledger, self.entry, partition, self.batch), not self.after


def canonical(offsets: dict[str, Boundary]) -> dict:
    return {topic: offsets[topic].to_json() for topic in sorted(offsets)}


def _options(options) -> dict:
    """Spark treats option names case-insensitively (and may lower-case them): so do we."""
    return {str(k).lower(): v for k, v in dict(options).items()}


def _client(options: dict):
    from .blocking import Client
    url = options.get("service.url")
    if not url:
        raise PulsarSparkError("option 'service.url' is required")
    timeout = float(options.get("operation.timeout.seconds", 30))
    token = options.get("auth.token")
    from .client import AuthenticationToken
    return Client(url, operation_timeout_seconds=timeout,
                  authentication=AuthenticationToken(token) if token else None)


def _topics(options: dict) -> list[str]:
    from .client import topic_name
    raw = options.get("topics") or options.get("topic")
    if not raw:
        raise PulsarSparkError("option 'topic' or 'topics' is required")
    return [topic_name(t.strip()) for t in raw.split(",") if t.strip()]


def _partitions(client, options: dict) -> list[tuple[str, int]]:
    out = []
    for topic in _topics(options):
        names = client.get_topic_partitions(topic)
        partitioned = len(names) > 1 or names[0] != topic
        out += [(name, index if partitioned else -1) for index, name in enumerate(names)]
    return out


def _latest(client, topic: str) -> Boundary:
    """Just after the last entry of `topic` now (before everything when it is empty).

    The whole last entry is covered whatever batch index the broker reports
    for it: an entry is written at once, so all of it is there.
    """
    reader = client.create_reader(topic, MessageId.latest)
    try:
        mid = reader.get_last_message_id()
    finally:
        reader.close()
    if mid.entry_id < 0:
        return Boundary.before_everything()
    return Boundary(mid.ledger_id, mid.entry_id, _WHOLE_ENTRY, True)


def _resolve(spec: str, client, partitions, default: str) -> dict[str, Boundary]:
    spec = (spec or default).strip()
    if spec == "earliest":
        return {t: Boundary.before_everything() for t, _ in partitions}
    if spec == "latest":
        return {t: _latest(client, t) for t, _ in partitions}
    try:
        given = json.loads(spec)
    except ValueError:
        raise PulsarSparkError(f"offsets must be 'earliest', 'latest' or JSON, got {spec!r}") from None
    if not isinstance(given, dict):
        raise PulsarSparkError("JSON offsets must map partition topics to positions")
    out = {}
    for topic, _ in partitions:
        value = given.get(topic, default)
        out[topic] = _latest(client, topic) if value == "latest" else Boundary.from_json(value)
    return out


class RangePartition(InputPartition):
    """One topic-partition's messages strictly between two boundaries."""

    def __init__(self, topic: str, partition: int, start: list, end: list) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _read_range(options: dict, part: RangePartition) -> Iterator[Any]:
    """Arrow record batches of the messages strictly between part.start and part.end."""
    import pyarrow as pa

    start, end = Boundary.from_json(part.start), Boundary.from_json(part.end)
    idle_ms = int(float(options.get("read.timeout.seconds", 10)) * 1000)
    client = _client(options)
    try:
        first, inclusive = start.start_id(part.partition)
        reader = client.create_reader(part.topic, first, start_message_id_inclusive=inclusive)
        columns: dict[str, list] = {field.name: [] for field in SCHEMA.fields}
        while True:
            try:
                message = reader.read_next(idle_ms)
            except Exception as exc:  # noqa: BLE001 - a TimeoutError: the range cannot be completed
                raise RuntimeError(f"{part.topic}: no message for {idle_ms} ms before reaching the end "
                                   f"of its range {end.to_json()}") from exc
            mid = message.message_id()
            if end.precedes(mid):
                break  # past the range
            if start.precedes(mid):
                _append(columns, message, mid, part)
            if len(columns["value"]) >= _ROWS_PER_BATCH:
                yield pa.RecordBatch.from_pydict(columns, schema=_arrow_schema())
                columns = {name: [] for name in columns}
            if _is_last_before(end, mid):
                break  # the range is complete: no need to wait for a message beyond it
        if columns["value"]:
            yield pa.RecordBatch.from_pydict(columns, schema=_arrow_schema())
        reader.close()
    finally:
        client.close()


def _is_last_before(end: Boundary, mid: MessageId) -> bool:
    """Whether `mid` is the last message before boundary `end` (so reading can stop)."""
    if not end.after:
        return False
    if (mid.ledger_id, mid.entry_id) != (end.ledger, end.entry):
        return False
    return end.batch == _WHOLE_ENTRY and (mid.batch_index < 0 or mid.batch_index == mid.batch_size - 1) \
        or mid.batch_index == end.batch


def _append(columns, message, mid: MessageId, part: RangePartition) -> None:
    import datetime
    utc = datetime.timezone.utc
    columns["value"].append(message.data())
    columns["__key"].append(message.partition_key())
    columns["__topic"].append(part.topic)
    columns["__messageId"].append(mid.serialize())
    columns["__publishTime"].append(datetime.datetime.fromtimestamp(message.publish_timestamp() / 1000, utc))
    event = message.event_timestamp()
    columns["__eventTime"].append(datetime.datetime.fromtimestamp(event / 1000, utc) if event else None)
    columns["__messageProperties"].append(list(message.properties().items()))
    columns["__ledgerId"].append(mid.ledger_id)
    columns["__entryId"].append(mid.entry_id)
    columns["__batchIndex"].append(mid.batch_index)
    columns["__partition"].append(part.partition)


def _arrow_schema():
    import pyarrow as pa
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([("value", pa.binary()), ("__key", pa.string()), ("__topic", pa.string()),
                      ("__messageId", pa.binary()), ("__publishTime", ts), ("__eventTime", ts),
                      ("__messageProperties", pa.map_(pa.string(), pa.string())),
                      ("__ledgerId", pa.int64()), ("__entryId", pa.int64()), ("__batchIndex", pa.int32()),
                      ("__partition", pa.int32())])


def _ranges(partitions, start: dict[str, Boundary], end: dict[str, Boundary]) -> list[RangePartition]:
    out = []
    for topic, index in partitions:
        s, e = start.get(topic, Boundary.before_everything()), end[topic]
        if s.key() < e.key():
            out.append(RangePartition(topic, index, s.to_json(), e.to_json()))
    return out


class PulsarBatchReader(DataSourceReader):
    def __init__(self, options: dict) -> None:
        self.options = options

    def partitions(self):
        client = _client(self.options)
        try:
            parts = _partitions(client, self.options)
            start = _resolve(self.options.get("startingoffsets", ""), client, parts, "earliest")
            end = _resolve(self.options.get("endingoffsets", ""), client, parts, "latest")
        finally:
            client.close()
        return _ranges(parts, start, end)

    def read(self, partition):
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return _read_range(self.options, partition)


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict) -> None:
        self.options = options
        self._frozen: dict | None = None  # the target offset of an availableNow query
        limit = options.get("maxentriespertrigger")
        self._max_entries = int(limit) if limit else None
        if self._max_entries is not None and self._max_entries < 1:
            raise PulsarSparkError("maxEntriesPerTrigger must be at least 1")

    def _now(self) -> tuple[list, dict[str, Boundary]]:
        client = _client(self.options)
        try:
            parts = _partitions(client, self.options)
            return parts, {t: _latest(client, t) for t, _ in parts}
        finally:
            client.close()

    def initialOffset(self) -> dict:
        client = _client(self.options)
        try:
            parts = _partitions(client, self.options)
            return canonical(_resolve(self.options.get("startingoffsets", ""), client, parts, "latest"))
        finally:
            client.close()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._max_entries) if self._max_entries else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._frozen = canonical(self._now()[1])

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._frozen is not None:
            latest = {t: Boundary.from_json(v) for t, v in self._frozen.items()}
        else:
            latest = self._now()[1]
        begin = {t: Boundary.from_json(v) for t, v in (start or {}).items()}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        out = {}
        for topic in sorted(latest):
            s = begin.get(topic, Boundary.before_everything())
            e = latest[topic]
            if e.key() <= s.key():
                out[topic] = s
                continue
            if budget is not None:
                e = _admit(s, e, budget)
                budget -= _entries_between(s, e)
            out[topic] = e
        return canonical(out)

    def partitions(self, start: dict, end: dict):
        parts = [(t, _partition_index(t)) for t in end]
        begin = {t: Boundary.from_json(v) for t, v in (start or {}).items()}
        finish = {t: Boundary.from_json(v) for t, v in end.items()}
        return _ranges(parts, begin, finish)

    def read(self, partition):
        if not isinstance(partition, RangePartition):
            return iter(())
        return _read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; the reader subscriptions are non-durable


def _first_unread_entry(s: Boundary) -> int:
    """The first entry that still has messages after boundary `s` (entries are counted from 0)."""
    if s.ledger < 0:
        return 0
    if s.after and s.batch in (_WHOLE_ENTRY, -1):
        return s.entry + 1
    return s.entry


def _entries_between(s: Boundary, e: Boundary) -> int:
    if e.ledger < 0 or e.key() <= s.key():
        return 0
    if s.ledger >= 0 and s.ledger != e.ledger:
        return 0  # another ledger: entries cannot be counted, and are not charged
    return max(0, e.entry - _first_unread_entry(s) + 1)


def _admit(s: Boundary, e: Boundary, budget: int) -> Boundary:
    """The end boundary that admits at most `budget` entries after `s` (up to `e`)."""
    available = _entries_between(s, e)
    if available <= budget or (s.ledger >= 0 and s.ledger != e.ledger):
        return e
    if budget <= 0:
        return s
    return Boundary(e.ledger, _first_unread_entry(s) + budget - 1, _WHOLE_ENTRY, True)


def _partition_index(topic: str) -> int:
    marker = "-partition-"
    if marker in topic and topic.rsplit(marker, 1)[1].isdigit():
        return int(topic.rsplit(marker, 1)[1])
    return -1


# --- writing -------------------------------------------------------------------

@dataclass
class SentMessage(WriterCommitMessage):
    count: int


def _write_rows(options: dict, rows) -> SentMessage:
    """Send every row; return once the broker acknowledged every one (else raise)."""
    import datetime
    import threading

    topic = _topics(options)[0]
    client = _client(options)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def done(error, message_id):
        if error is not None:
            with lock:
                errors.append(error)
    count = 0
    try:
        producer = client.create_producer(topic, batching_max_publish_delay_ms=5,
                                          compression_type=options.get("compression", "NONE"))
        for row in rows:
            data = row.asDict() if hasattr(row, "asDict") else dict(row)
            value = data.get("value")
            if value is None:
                raise PulsarSparkError("every row needs a non-null 'value' column")
            if isinstance(value, str):
                value = value.encode()
            event = data.get("eventTime")
            if isinstance(event, datetime.datetime):
                event = int(event.timestamp() * 1000)
            properties = data.get("properties")
            producer.send_async(bytes(value), done, partition_key=data.get("key"),
                                properties=dict(properties) if properties else None,
                                event_timestamp=int(event) if event else None)
            count += 1
        producer.flush()
        producer.close()
    finally:
        client.close()
    if errors:
        raise RuntimeError(f"{len(errors)} of {count} messages were not acknowledged: {errors[0]}")
    return SentMessage(count)


class PulsarBatchWriter(DataSourceWriter):
    def __init__(self, options: dict) -> None:
        self.options = options
        _topics(options)

    def write(self, iterator) -> SentMessage:
        return _write_rows(self.options, iterator)


class PulsarStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: dict) -> None:
        self.options = options
        _topics(options)

    def write(self, iterator) -> SentMessage:
        return _write_rows(self.options, iterator)

    def commit(self, messages, batchId) -> None:
        pass  # every message was acknowledged before its task finished

    def abort(self, messages, batchId) -> None:
        pass  # at-least-once: what was acknowledged stays


class PulsarDataSource(DataSource):
    """Format `pulsarwire` (`pulsar` is taken by other connectors)."""

    @classmethod
    def name(cls) -> str:
        return "pulsarwire"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return PulsarBatchReader(_options(self.options))

    def streamReader(self, schema):
        return PulsarStreamReader(_options(self.options))

    def writer(self, schema, overwrite):
        return PulsarBatchWriter(_options(self.options))

    def streamWriter(self, schema, overwrite):
        return PulsarStreamWriter(_options(self.options))


def register(spark) -> None:
    """spark.dataSource.register(PulsarDataSource), spelled shorter."""
    spark.dataSource.register(PulsarDataSource)


__all__ = ["PulsarDataSource", "register", "SCHEMA", "Boundary", "PulsarSparkError"]
