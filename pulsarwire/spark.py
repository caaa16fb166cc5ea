"""PySpark data source `pulsarwire`: topics to DataFrames and back, batch and streaming.

    from pulsarwire.spark import PulsarDataSource
    spark.dataSource.register(PulsarDataSource)
    df = (spark.read.format("pulsarwire").option("service.url", "pulsar://127.0.0.1:6650")
          .option("topic", "events").load())

Offsets are boundaries between messages, one per topic-partition, written as
canonical JSON: `{"<partition topic>": [ledgerId, entryId, batchIndex, side]}`
where side 1 means "just after that message" and 0 "just before it". A batch
or micro-batch reads every message strictly between its start and end
boundaries, so consecutive micro-batches neither overlap nor leave gaps. A
chunked message belongs to the range that holds its first chunk, and the task
reading that range reads on past the range's end to its last chunk: no
boundary can cut one.

Only options cross to executors: every task opens its own client on a private
event loop, takes whole entries (`EntryReader`), splits them with the codec's
columnar split and yields Arrow record batches capped in rows and bytes.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from pyspark.sql.datasource import (
    DataSource, DataSourceArrowWriter, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
    InputPartition, WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

try:  # PySpark 4.1+: the streaming sink takes Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - older PySpark: rows
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]

from ._codec_py import varint_bytes
from .messages import MessageId

log = logging.getLogger("pulsarwire.spark")

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

# includeHeaders: the message properties as the Kafka source's headers column
HEADERS = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                      StructField("value", BinaryType())])))

_WHOLE_ENTRY = 2**31 - 1  # a batch index past every message of an entry


class PulsarSparkError(ValueError):
    """A bad option or offset given to the data source."""


class PulsarDataLossError(RuntimeError):
    """Data a query was due to read is gone (deleted, or the topic re-created); see failOnDataLoss."""


# --- options -------------------------------------------------------------------

# pulsar.client.<name> (names as in the Java client's configuration) -> Client keyword, parser
_CLIENT_OPTIONS: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    "authtoken": ("authentication", str),
    "authparams": ("authentication", str),
    "authpluginclassname": (None, str),
    "operationtimeoutms": ("operation_timeout_seconds", lambda v: _positive(v, "operationTimeoutMs") / 1000),
    "connectiontimeoutms": ("connection_timeout_ms", lambda v: int(_positive(v, "connectionTimeoutMs"))),
    "keepaliveintervalseconds": ("keep_alive_interval_seconds",
                                 lambda v: _positive(v, "keepAliveIntervalSeconds")),
    "tlstrustcertsfilepath": ("tls_trust_certs_file_path", str),
    "tlsallowinsecureconnection": ("tls_allow_insecure_connection", lambda v: _boolean(v, "tlsAllowInsecureConnection")),
    "tlshostnameverificationenable": ("tls_validate_hostname",
                                      lambda v: _boolean(v, "tlsHostnameVerificationEnable")),
    "maxbackoffintervalnanos": ("max_backoff_seconds", lambda v: _positive(v, "maxBackoffIntervalNanos") / 1e9),
}
_COMMON = {"service.url", "connect.timeout.seconds", "operation.timeout.seconds", "auth.token", "path"}
_SOURCE = _COMMON | {"topic", "topics", "topicspattern", "startingoffsets", "endingoffsets", "startingtime",
                     "endingtime", "failondataloss", "maxentriespertrigger", "maxrowsperbatch",
                     "maxbytesperbatch", "read.timeout.seconds", "subscriptionname", "maxoffsetspertrigger",
                     "minpartitions", "includeheaders", "assign", "rawvalue", "mode",
                     "columnnameofcorruptrecord", "maxpartitions"}
# the Kafka source's option names, taken where they mean the same -> this source's own
_KAFKA_ALIASES = {"subscribe": "topics", "subscribepattern": "topicspattern",
                  "startingtimestamp": "startingtime", "endingtimestamp": "endingtime"}
_SOURCE |= set(_KAFKA_ALIASES)
# options Spark itself sets or passes through (DataStreamWriter.queryName, checkpointLocation, ...)
_SPARK_OWN = {"checkpointlocation", "queryname", "outputmode", "path"}
_SINK = _COMMON | _SPARK_OWN | {"topic", "compression", "maxpendingmessages", "exactlyonce"}
_DEFAULT_ROWS_PER_BATCH = 32_768
_DEFAULT_BYTES_PER_BATCH = 64 << 20  # far below Arrow's 2 GiB per binary column


def _positive(value, name: str, integer: bool = False) -> float:
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise PulsarSparkError(f"option {name!r} must be a {'whole ' if integer else ''}number, "
                               f"got {value!r}") from None
    if number <= 0:
        raise PulsarSparkError(f"option {name!r} must be positive, got {value!r}")
    return number


def _boolean(value, name: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise PulsarSparkError(f"option {name!r} must be true or false, got {value!r}")
    return text == "true"


def _time_ms(value, name: str) -> int:
    """Milliseconds since the epoch, from an integer or an ISO-8601 time (UTC unless it says)."""
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        number = int(text)
    else:
        try:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise PulsarSparkError(f"option {name!r} must be milliseconds since the epoch or an ISO-8601 "
                                   f"time, got {value!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        number = int(when.timestamp() * 1000)
    if number < 0:
        raise PulsarSparkError(f"option {name!r} must not be before 1970, got {value!r}")
    return number


def _options(options) -> dict:
    """Spark treats option names case-insensitively (and may lower-case them): so do we."""
    return {str(k).lower(): v for k, v in dict(options).items()}


@dataclass
class ClientSettings:
    """How to reach the broker: everything a task needs to open its own client."""

    url: str
    kwargs: dict = field(default_factory=dict)
    connect_timeout: float = 30.0

    def client(self):
        from .client import Client
        return Client(self.url, **self.kwargs)


def _client_settings(options: dict, known: set) -> ClientSettings:
    from .client import AuthenticationToken
    unknown = sorted(k for k in options if k not in known and not k.startswith("pulsar.client."))
    if unknown:
        raise PulsarSparkError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))} "
                               "and pulsar.client.*")
    url = options.get("service.url")
    if not url:
        raise PulsarSparkError("option 'service.url' is required (for example pulsar://127.0.0.1:6650)")
    if not re.match(r"pulsar(\+ssl)?://", url):
        raise PulsarSparkError(f"option 'service.url' must start with pulsar:// or pulsar+ssl://, got {url!r}")
    kwargs: dict[str, Any] = {}
    if "operation.timeout.seconds" in options:
        kwargs["operation_timeout_seconds"] = _positive(options["operation.timeout.seconds"],
                                                         "operation.timeout.seconds")
    token = options.get("auth.token")
    for key, value in options.items():
        if not key.startswith("pulsar.client."):
            continue
        name = key[len("pulsar.client."):]
        if name not in _CLIENT_OPTIONS:
            raise PulsarSparkError(f"unknown client option {key!r}; supported: "
                                   + ", ".join(f"pulsar.client.{n}" for n in sorted(_CLIENT_OPTIONS)))
        target, parse = _CLIENT_OPTIONS[name]
        if target == "authentication":
            value = str(value)
            if name == "authparams":
                if not value.startswith("token:"):
                    raise PulsarSparkError("pulsar.client.authParams must be 'token:<token>' (token "
                                           "authentication is the one supported)")
                value = value[len("token:"):]
            token = value
        elif target is not None:
            kwargs[target] = parse(value)
        elif "token" not in str(value).lower():
            raise PulsarSparkError(f"pulsar.client.authPluginClassName {value!r}: only token "
                                   "authentication is supported")
    if token:
        kwargs["authentication"] = AuthenticationToken(token)
    timeout = _positive(options.get("connect.timeout.seconds", 30), "connect.timeout.seconds")
    return ClientSettings(url, kwargs, timeout)


def _short_pattern(pattern: str) -> tuple[str, re.Pattern]:
    """topicsPattern as (namespace, regex over the topic's local name)."""
    body = pattern.split("://", 1)[1] if "://" in pattern else pattern
    if pattern.startswith("non-persistent://"):
        raise PulsarSparkError("topicsPattern: only persistent topics can be read")
    parts = body.split("/", 2)
    namespace, regex = (f"{parts[0]}/{parts[1]}", parts[2]) if len(parts) == 3 else ("public/default", body)
    try:
        return namespace, re.compile(regex)
    except re.error as exc:
        raise PulsarSparkError(f"topicsPattern {pattern!r} is not a regular expression: {exc}") from None


@dataclass
class SourceOptions:
    client: ClientSettings
    topics: list[str]
    pattern: tuple[str, Any] | None
    starting: str | None
    ending: str | None
    starting_time: int | None
    ending_time: int | None
    fail_on_data_loss: bool
    max_entries: int | None
    rows_per_batch: int
    bytes_per_batch: int
    read_timeout: float
    subscription: str | None
    max_messages: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    raw_value: bool = False  # value as bytes whatever the topic's schema
    permissive: bool = False  # mode=PERMISSIVE: a payload that does not decode is a null value
    corrupt_column: str = "_corrupt_record"
    value_type: Any = None  # the topics' schema as a spark_types.ValueType (None: bytes)
    max_partitions: int | None = None  # at most this many Spark tasks (ranges packed together)


_KAFKA_NAMES = {"subscribe": "subscribe", "subscribepattern": "subscribePattern",
                "startingtimestamp": "startingTimestamp", "endingtimestamp": "endingTimestamp"}
_OWN_NAMES = {"topics": "topics", "topicspattern": "topicsPattern", "startingtime": "startingTime",
              "endingtime": "endingTime"}


def _kafka_aliases(options: dict) -> dict:
    """The Kafka source's names as this source's (both given: an error, not a silent choice)."""
    options = dict(options)
    for alias, own in _KAFKA_ALIASES.items():
        if alias in options:
            if options.get(own):
                raise PulsarSparkError(f"give '{_OWN_NAMES[own]}' or its Kafka name '{_KAFKA_NAMES[alias]}', "
                                       "not both")
            options[own] = options.pop(alias)
    if "assign" in options:  # {"topic": [0, 1]}: those partitions (-1: the topic, not partitioned)
        if options.get("topics"):
            raise PulsarSparkError("give 'assign' or 'topics' ('subscribe'), not both")
        try:
            given = json.loads(options.pop("assign"))
            if not isinstance(given, dict) or not given or not all(
                    isinstance(v, list) and v and all(isinstance(i, int) and i >= -1 for i in v)
                    for v in given.values()):
                raise ValueError
        except ValueError:
            raise PulsarSparkError('option \'assign\' must be JSON like {"topic": [0, 1]} (partition '
                                   "indexes; -1 for a topic that is not partitioned)") from None
        options["topics"] = ",".join(topic if index < 0 else f"{topic}-partition-{index}"
                                     for topic, indexes in given.items() for index in indexes)
    return options


def source_options(options: dict, streaming: bool) -> SourceOptions:
    """Every source option checked, with a clear message for each mistake."""
    from .client import topic_name
    settings = _client_settings(options, _SOURCE)
    options = _kafka_aliases(options)
    given = [k for k in ("topic", "topics", "topicspattern") if options.get(k)]
    if len(given) != 1:
        raise PulsarSparkError("exactly one of the options 'topic', 'topics' or 'topicsPattern' is required"
                               + (f" (got {', '.join(given)})" if given else ""))
    topics: list[str] = []
    pattern = None
    if given[0] == "topicspattern":
        pattern = _short_pattern(options["topicspattern"].strip())
    else:
        for raw in str(options[given[0]]).split(","):
            if not raw.strip():
                continue
            try:
                name = topic_name(raw.strip())
            except ValueError as exc:
                raise PulsarSparkError(f"option {given[0]!r}: {exc}") from None
            if not name.startswith("persistent://"):
                raise PulsarSparkError(f"option {given[0]!r}: only persistent topics can be read, got {name}")
            if name in topics:
                raise PulsarSparkError(f"option {given[0]!r} names topic {name} twice")
            topics.append(name)
        if not topics:
            raise PulsarSparkError(f"option {given[0]!r} names no topic")
        if given[0] == "topic" and len(topics) > 1:
            raise PulsarSparkError("option 'topic' takes one topic; use 'topics' for a comma-separated list")
    stream_only = streaming is False  # None: at load(), batch or stream not known yet
    if streaming and options.get("endingoffsets"):
        raise PulsarSparkError("option 'endingOffsets' is for batch queries; a stream has no end")
    if streaming and options.get("endingtime"):
        raise PulsarSparkError("option 'endingTime' is for batch queries; a stream has no end")
    if options.get("startingoffsets") and options.get("startingtime"):
        raise PulsarSparkError("give 'startingOffsets' or 'startingTime', not both")
    if options.get("endingoffsets") and options.get("endingtime"):
        raise PulsarSparkError("give 'endingOffsets' or 'endingTime', not both")
    starting, ending = options.get("startingoffsets"), options.get("endingoffsets")
    for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        if spec is not None:
            _parse_offsets_spec(spec, name, allow_earliest=name == "startingOffsets")
    max_entries = options.get("maxentriespertrigger")
    if max_entries is not None:
        if stream_only:
            raise PulsarSparkError("option 'maxEntriesPerTrigger' is for streaming queries")
        max_entries = int(_positive(max_entries, "maxEntriesPerTrigger", integer=True))
    max_messages = options.get("maxoffsetspertrigger")
    if max_messages is not None:
        if stream_only:
            raise PulsarSparkError("option 'maxOffsetsPerTrigger' is for streaming queries")
        if max_entries is not None:
            raise PulsarSparkError("give 'maxOffsetsPerTrigger' (messages) or 'maxEntriesPerTrigger' (entries), "
                                   "not both")
        max_messages = int(_positive(max_messages, "maxOffsetsPerTrigger", integer=True))
    min_partitions = options.get("minpartitions")
    if min_partitions is not None:
        min_partitions = int(_positive(min_partitions, "minPartitions", integer=True))
    max_partitions = options.get("maxpartitions")
    if max_partitions is not None:
        max_partitions = int(_positive(max_partitions, "maxPartitions", integer=True))
        if min_partitions is not None and min_partitions > max_partitions:
            raise PulsarSparkError("option 'minPartitions' must not exceed 'maxPartitions'")
    subscription = options.get("subscriptionname")
    if subscription is not None:
        if stream_only:
            raise PulsarSparkError("option 'subscriptionName' is for streaming queries (it holds unread data "
                                   "between micro-batches)")
        if not str(subscription).strip():
            raise PulsarSparkError("option 'subscriptionName' is empty")
    return SourceOptions(
        settings, topics, pattern, starting, ending,
        _time_ms(options["startingtime"], "startingTime") if options.get("startingtime") else None,
        _time_ms(options["endingtime"], "endingTime") if options.get("endingtime") else None,
        _boolean(options.get("failondataloss", "true"), "failOnDataLoss"), max_entries,
        int(_positive(options.get("maxrowsperbatch", _DEFAULT_ROWS_PER_BATCH), "maxRowsPerBatch", integer=True)),
        int(_positive(options.get("maxbytesperbatch", _DEFAULT_BYTES_PER_BATCH), "maxBytesPerBatch",
                      integer=True)),
        _positive(options.get("read.timeout.seconds", 30), "read.timeout.seconds"),
        str(subscription).strip() if subscription else None, max_messages, min_partitions,
        _boolean(options.get("includeheaders", "false"), "includeHeaders"),
        _boolean(options.get("rawvalue", "false"), "rawValue"), _mode(options.get("mode", "FAILFAST")),
        _corrupt_column(options.get("columnnameofcorruptrecord", "_corrupt_record")), None, max_partitions)


def _mode(value) -> bool:
    """mode: FAILFAST (a payload that does not decode fails the query) or PERMISSIVE (null value,
    payload in the corrupt-record column). True for PERMISSIVE."""
    text = str(value).strip().upper()
    if text not in ("FAILFAST", "PERMISSIVE"):
        raise PulsarSparkError(f"option 'mode' must be FAILFAST or PERMISSIVE, got {value!r}")
    return text == "PERMISSIVE"


def _corrupt_column(value) -> str:
    name = str(value).strip()
    if not name or name in SCHEMA.fieldNames() or name == "headers":
        raise PulsarSparkError(f"option 'columnNameOfCorruptRecord' {value!r} is empty or names another column")
    return name


def _parse_offsets_spec(spec: str, name: str, allow_earliest: bool):
    """'earliest', 'latest', or a JSON object of partition topic -> position; checked, not resolved."""
    from .client import topic_name
    spec = str(spec).strip()
    if spec in ("earliest", "latest"):
        if spec == "earliest" and not allow_earliest:
            raise PulsarSparkError(f"{name}: 'earliest' cannot end a query")
        return spec
    try:
        given = json.loads(spec)
    except ValueError:
        raise PulsarSparkError(f"{name} must be 'earliest', 'latest' or a JSON object, got {spec!r}") from None
    if not isinstance(given, dict) or not given:
        raise PulsarSparkError(f"{name}: JSON offsets must be an object mapping partition topics to positions")
    out = {}
    for key, value in given.items():
        try:
            topic = topic_name(str(key))
        except ValueError as exc:
            raise PulsarSparkError(f"{name}: {exc}") from None
        if topic in out:
            raise PulsarSparkError(f"{name}: topic {topic} is given twice")
        if value == "earliest" and not allow_earliest:
            raise PulsarSparkError(f"{name}: 'earliest' cannot end a query ({topic})")
        if value not in ("earliest", "latest"):
            Boundary.from_json(value, name)
        out[topic] = value
    return out


# --- boundaries ----------------------------------------------------------------

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

    def key(self) -> tuple:
        return (self.ledger, self.entry, self.batch, 1 if self.after else 0)

    def precedes(self, mid) -> bool:
        """True when message `mid` (a MessageId or a (ledger, entry, batch) tuple) lies after this boundary."""
        position = mid if isinstance(mid, tuple) else (mid.ledger_id, mid.entry_id, mid.batch_index)
        mine = (self.ledger, self.entry, self.batch)
        return position > mine or (position == mine and not self.after)

    def to_json(self) -> list:
        return [self.ledger, self.entry, self.batch, 1 if self.after else 0]

    @classmethod
    def from_json(cls, value, what: str = "offset") -> "Boundary":
        if value == "earliest":
            return cls.before_everything()
        try:
            if isinstance(value, dict):  # a message id given by a user: start at (before) it
                unknown = set(value) - {"ledgerId", "entryId", "batchIndex"}
                if unknown or "ledgerId" not in value or "entryId" not in value:
                    raise ValueError
                return cls(int(value["ledgerId"]), int(value["entryId"]), int(value.get("batchIndex", -1)), False)
            if isinstance(value, list) and len(value) == 4 and value[3] in (0, 1):
                return cls(int(value[0]), int(value[1]), int(value[2]), bool(value[3]))
        except (TypeError, ValueError):
            pass
        raise PulsarSparkError(f"{what}: not a position: {value!r} (use 'earliest', 'latest', "
                               '{"ledgerId": L, "entryId": E[, "batchIndex": B]} or a checkpointed offset)')

    def start_entry(self) -> MessageId:
        """The entry a reader starts at (inclusive): the boundary's own entry, so that the reader
        sees that it is still there; or the earliest."""
        if self.ledger < 0:
            return MessageId.earliest
        return MessageId(self.ledger, max(self.entry, 0))


def canonical(offsets: dict[str, Boundary]) -> dict:
    return {topic: offsets[topic].to_json() for topic in sorted(offsets)}


def _partition_index(topic: str) -> int:
    marker = "-partition-"
    if marker in topic and topic.rsplit(marker, 1)[1].isdigit():
        return int(topic.rsplit(marker, 1)[1])
    return -1


# --- driver-side broker calls (each on a private event loop) -------------------

def _run(coroutine):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


_RETRYABLE: tuple = ()


def _retryable() -> tuple:
    global _RETRYABLE
    if not _RETRYABLE:
        from .errors import ConnectionClosedError, TimeoutError as PulsarTimeout
        _RETRYABLE = (ConnectionClosedError, PulsarTimeout, OSError)
    return _RETRYABLE


def _broker_backoff():
    """The client's backoff formula, from 0.1s up to 2s between tries to reach the broker."""
    from .client.options import Backoff  # imported late, as the client is
    return Backoff(0.1, 2.0)


async def _connected(settings: ClientSettings):
    """A client whose connection to the broker is up, retried until connect.timeout.seconds
    have passed (then a clear error), however the broker fails: refused, reset, or a port that
    accepts and never answers. The caller closes it."""
    deadline = time.monotonic() + settings.connect_timeout
    backoff = _broker_backoff()
    attempt = 0
    while True:
        delay = backoff.delay(attempt)
        client = settings.client()
        try:
            await asyncio.wait_for(client.connect(), max(0.05, deadline - time.monotonic()))
            return client
        except _retryable() as exc:  # asyncio's timeout is an OSError too
            await client.close()
            if time.monotonic() + delay > deadline:
                why = exc if str(exc) else "no answer to the connection handshake"
                raise ConnectionError(f"cannot reach the Pulsar broker at {settings.url} within "
                                      f"{settings.connect_timeout:g}s (connect.timeout.seconds): {why}") from exc
            log.info("broker at %s not reachable (%s); retrying", settings.url, exc)
        except BaseException:
            await client.close()
            raise
        await asyncio.sleep(delay)
        attempt += 1


async def _with_client(settings: ClientSettings, work):
    """Run `work(client)` with a fresh connected client, retrying a broker that cannot be
    reached or drops the connection until connect.timeout.seconds have passed; then a clear error."""
    deadline = time.monotonic() + settings.connect_timeout
    backoff = _broker_backoff()
    attempt = 0
    while True:
        delay = backoff.delay(attempt)
        client = await _connected(settings)
        try:
            return await work(client)
        except _retryable() as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectionError(f"cannot reach the Pulsar broker at {settings.url} within "
                                      f"{settings.connect_timeout:g}s (connect.timeout.seconds): {exc}") from exc
            log.info("broker at %s not reachable (%s); retrying", settings.url, exc)
        finally:
            await client.close()
        await asyncio.sleep(delay)
        attempt += 1


async def _topic_partitions(client, opts: SourceOptions, missing_ok: bool = False) -> list[tuple[str, int]]:
    """(partition topic, index) of every topic read, each partition once however it is named
    (a topic and one of its partitions), discovering a pattern. A topic that does not exist is
    an error, or with `missing_ok` (a stream under failOnDataLoss=false) logged and left out."""
    namespaces = {t.split("://", 1)[1].rsplit("/", 1)[0] for t in opts.topics}
    if opts.pattern:
        namespaces.add(opts.pattern[0])
    existing: set[str] = set()
    for namespace in sorted(namespaces):
        existing.update(await client.get_topics_of_namespace(namespace))
    if opts.pattern:
        namespace, regex = opts.pattern
        prefix = f"persistent://{namespace}/"
        parents = {re.sub(r"-partition-\d+$", "", t) for t in existing if t.startswith(prefix)}
        topics = sorted(t for t in parents if regex.fullmatch(t[len(prefix):]))
    else:
        topics = opts.topics
    out: dict[str, int] = {}
    for topic in topics:
        names = await client.get_topic_partitions(topic)
        partitioned = len(names) > 1 or names[0] != topic
        if not partitioned and topic not in existing:
            if missing_ok:
                log.warning("topic %s does not exist (deleted?); left out until it is there again "
                            "(failOnDataLoss=false)", topic)
                continue
            raise PulsarSparkError(f"topic {topic} does not exist (the source does not create topics)")
        for index, name in enumerate(names):
            out.setdefault(name, index if partitioned else _partition_index(name))
    return list(out.items())


async def _latest_of(client, topic: str) -> Boundary:
    """Just after the last entry of `topic` now (before everything when it is empty)."""
    reader = await client.create_entry_reader(topic, MessageId.latest, receiver_queue_size=2)
    try:
        mid = await reader.get_last_message_id()
    finally:
        await reader.close()
    if mid.entry_id < 0:
        return Boundary.before_everything()
    return Boundary(mid.ledger_id, mid.entry_id, _WHOLE_ENTRY, True)


async def _latest_all(client, parts) -> dict[str, Boundary]:
    found = await asyncio.gather(*(_latest_of(client, t) for t, _ in parts))
    return dict(zip((t for t, _ in parts), found))


def _position(mid) -> tuple[int, int]:
    return (mid.ledger_id, mid.entry_id)


def _where(position) -> str:
    return f"{position[0]}:{position[1]}"


async def _first_at_or_after(client, topic: str, start: MessageId, timeout: float):
    """The first entry at or after `start` (earliest: the first entry), or None when the broker
    would give none now.

    Pulsar places a reader at the next ledger's first entry when `start` is past the end of
    its ledger; the embedded broker numbers entries across ledgers and waits at an entry id
    past the last one instead. Where the two differ (an entry id past the last entry's, in an
    earlier ledger) this answers None rather than wait for an entry that may never come."""
    reader = await client.create_entry_reader(topic, start, receiver_queue_size=1, max_queued_bytes=1)
    try:
        last = await reader.get_last_message_id()
        if last.entry_id < 0:
            return None
        if start.ledger_id >= 0 and (_position(start) > _position(last) or start.entry_id > last.entry_id):
            return None
        if not await reader.wait(timeout):  # (not an OSError: retrying the whole plan would not help)
            raise RuntimeError(f"{topic}: no entry at or after {_where(_position(start))} within "
                               f"{timeout:g}s (read.timeout.seconds), though the topic ends at "
                               f"{_where(_position(last))}")
        return reader.take(1)[0]
    finally:
        await reader.close()


async def _entry_at_or_after(client, topic: str, start: MessageId, timeout: float) -> tuple[int, int] | None:
    """(ledger, entry) of `_first_at_or_after`."""
    entry = await _first_at_or_after(client, topic, start, timeout)
    return None if entry is None else (entry.ledger_id, entry.entry_id)


async def _messages_per_entry(client, topic: str, s: Boundary, timeout: float) -> int:
    """How many messages the first unread entry after `s` holds: a message budget becomes an
    entry budget at that rate (producers batch alike from one entry to the next)."""
    first = MessageId(s.ledger, _first_unread_entry(s)) if s.ledger >= 0 else MessageId.earliest
    entry = await _first_at_or_after(client, topic, first, timeout)
    return 1 if entry is None else max(1, entry.num_messages)


async def _advance(client, topic: str, s: Boundary, e: Boundary, budget: int, timeout: float) -> Boundary:
    """The end boundary after at most `budget` entries past `s`, never past `e`, and always on
    an entry that exists (the next batch starts there and checks that it is still there).

    Entry ids are consecutive within a ledger, so within one ledger this is arithmetic; across
    a ledger change (a rollover) the broker is asked where entries are: where the ledger of the
    next unread entry ends, the batch ends too."""
    if budget <= 0 or e.key() <= s.key():
        return s
    if s.ledger >= 0 and s.ledger == e.ledger:
        return _admit(s, e, budget)
    first = MessageId(s.ledger, _first_unread_entry(s)) if s.ledger >= 0 else MessageId.earliest
    found = await _entry_at_or_after(client, topic, first, timeout)
    if found is None or found > (e.ledger, e.entry):
        return e
    ledger, entry = found
    if ledger == e.ledger:
        return e if e.entry - entry + 1 <= budget else Boundary(ledger, entry + budget - 1, _WHOLE_ENTRY, True)
    target = (ledger, entry + budget - 1)
    found = await _entry_at_or_after(client, topic, MessageId(*target), timeout)
    if found is None or found > (e.ledger, e.entry):
        # fewer than `budget` entries up to e (or, on a Pulsar broker whose newest ledger is
        # shorter than the budget reaches, possibly more: admitted rather than guessed)
        return e
    if found == target:
        return Boundary(ledger, target[1], _WHOLE_ENTRY, True)
    return Boundary(found[0], found[1], -1, False)  # the rest of the ledger: just before the next one's first


async def _at_time(client, topic: str, when_ms: int, latest: Boundary) -> Boundary:
    """Just before the first message published at or after `when_ms` (or `latest` if none)."""
    from .client import InitialPosition
    if latest.ledger < 0:
        return latest
    consumer = await client.subscribe(topic, f"pulsarwire-spark-time-{time.time_ns()}",
                                      initial_position=InitialPosition.Earliest, receiver_queue_size=1)
    try:
        await consumer.seek(when_ms)
        try:
            message = await consumer.receive(2000)
        except Exception:  # noqa: BLE001 - nothing published since: start at the end
            return latest
        mid = message.message_id()
        if (mid.ledger_id, mid.entry_id) > (latest.ledger, latest.entry):
            return latest
        return Boundary(mid.ledger_id, mid.entry_id, -1, False)
    finally:
        await consumer.unsubscribe()


async def _resolve(client, spec, when_ms, parts, default: str, what: str,
                   latest: dict[str, Boundary], timeout: float) -> dict[str, Boundary]:
    """Per partition topic: the boundary `spec` (or `when_ms`) names; a position given as JSON
    must be one the topic has (a clear error, never a silently empty read)."""
    if when_ms is not None:
        found = await asyncio.gather(*(_at_time(client, t, when_ms, latest[t]) for t, _ in parts))
        return dict(zip((t for t, _ in parts), found))
    parsed = _parse_offsets_spec(spec, what, allow_earliest=what == "startingOffsets") if spec else default
    if isinstance(parsed, str):
        given = {t: parsed for t, _ in parts}
    else:
        known = {t for t, _ in parts}
        parents = {re.sub(r"-partition-\d+$", "", t) for t in known if _partition_index(t) >= 0}
        for topic in parsed:
            if topic in parents:
                raise PulsarSparkError(f"{what}: {topic} is partitioned; give a position per partition "
                                       f"({topic}-partition-N)")
            if topic not in known:
                raise PulsarSparkError(f"{what}: {topic} is not one of the topics read ({', '.join(sorted(known))})")
        given = {t: parsed.get(t, default) for t, _ in parts}
    out = {}
    for topic, value in given.items():
        if value == "latest":
            out[topic] = latest[topic]
        else:
            out[topic] = Boundary.from_json(value, what)
    await asyncio.gather(*(_check_position(client, t, out[t], latest[t], what, timeout)
                           for t, value in given.items() if value not in ("earliest", "latest")))
    return out


async def _check_position(client, topic: str, given: Boundary, latest: Boundary, what: str, timeout: float) -> None:
    """A position a user gave must name a message of the topic."""
    if given.ledger < 0:
        return
    position = (given.ledger, given.entry)
    if latest.ledger < 0 or position > (latest.ledger, latest.entry):
        raise PulsarSparkError(f"{what}: {topic} has no entry {_where(position)}: it is past the topic's last "
                               + (f"entry ({latest.ledger}:{latest.entry})" if latest.ledger >= 0 else "(the topic is empty)"))
    found = await _entry_at_or_after(client, topic, MessageId(*position), timeout)
    if found != position:
        raise PulsarSparkError(f"{what}: {topic} has no entry {_where(position)}"
                               + (f" (the next entry there is {_where(found)})" if found else "")
                               + ": a wrong ledger id, or data deleted")


# --- reading a range: entries -> Arrow ------------------------------------------

class RangePartition(InputPartition):
    """One topic-partition's messages strictly between two boundaries."""

    def __init__(self, topic: str, partition: int, start: list, end: list) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class RangeGroup(InputPartition):
    """Several ranges read one after the other by one task (maxPartitions)."""

    def __init__(self, ranges: list[RangePartition]) -> None:
        super().__init__([r.value for r in ranges])
        self.ranges = ranges


def _pack(ranges: list[RangePartition], most: int | None) -> list:
    """At most `most` Spark partitions: ranges packed greedily, the largest (by entries, where
    counted) first into the least loaded group. Fewer tasks cost Spark less per row when
    partitions outnumber cores."""
    if not most or len(ranges) <= most:
        return ranges

    def size(part: RangePartition) -> int:
        counted = _entries_between(Boundary.from_json(part.start), Boundary.from_json(part.end))
        return 1 if counted is None else max(1, counted)
    groups: list[list] = [[] for _ in range(most)]
    loads = [0] * most
    for part in sorted(ranges, key=size, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(part)
        loads[i] += size(part)
    return [RangeGroup(g) for g in groups if g]


def _read_partition(opts, partition) -> Iterator[Any]:
    if isinstance(partition, RangeGroup):
        for part in partition.ranges:
            yield from _read_range(opts, part)
    elif isinstance(partition, RangePartition):
        yield from _read_range(opts, partition)
    # else: Spark's stand-in partition when there is nothing to read


_arrow_schema_cache: list = []


def _arrow_schema():
    if not _arrow_schema_cache:
        from pyspark.sql.pandas.types import to_arrow_schema
        _arrow_schema_cache.append(to_arrow_schema(SCHEMA, timezone="UTC"))
    return _arrow_schema_cache[0]


def source_schema(opts: SourceOptions) -> StructType:
    """The columns a read gives: SCHEMA with `value` typed by the topics' schema, and what the
    options add."""
    fields = list(SCHEMA.fields)
    if opts.value_type is not None:
        fields[0] = StructField("value", opts.value_type.spark_type)
    if opts.include_headers:
        fields.append(HEADERS)
    if opts.value_type is not None and opts.permissive:
        fields.append(StructField(opts.corrupt_column, BinaryType()))
    return StructType(fields)


async def _value_type(client, opts: SourceOptions):
    """The ValueType of the topics read (one schema for all of them), or None for bytes."""
    from .spark_types import UnsupportedSchemaError, value_type
    if opts.raw_value:
        return None
    parts = await _topic_partitions(client, opts, missing_ok=not opts.fail_on_data_loss)
    parents = sorted({re.sub(r"-partition-\d+$", "", t) if i >= 0 else t for t, i in parts})
    infos = await asyncio.gather(*(client.get_schema_info(t) for t in parents))
    found = {}
    for topic, info in zip(parents, infos):
        try:
            found[topic] = value_type(info)
        except UnsupportedSchemaError as exc:
            raise PulsarSparkError(f"{topic}: {exc}; read it with rawValue=true") from None
    kinds = {json.dumps(None if v is None else v.info, sort_keys=True) for v in found.values()}
    if len(kinds) > 1:
        raise PulsarSparkError("the topics read have different schemas (" + ", ".join(
            f"{t}: {v.info['name'] if v else 'none'}" for t, v in found.items())
            + "); read them apart, or with rawValue=true")
    return next(iter(found.values()), None)


def with_value_type(opts: SourceOptions) -> SourceOptions:
    """`opts` with the topics' schema looked up (none looked up with rawValue=true)."""
    if opts.raw_value:
        return opts
    opts.value_type = _run(_with_client(opts.client, lambda client: _value_type(client, opts)))
    return opts


def _finish(opts: SourceOptions, batch):
    """The builder's columns made into what source_schema(opts) says: the value decoded with
    the topic's schema, headers and the corrupt-record column when asked."""
    if not opts.include_headers and opts.value_type is None:
        return batch
    import pyarrow as pa
    columns, names = list(batch.columns), list(batch.schema.names)
    corrupt = None
    if opts.value_type is not None:
        from .spark_types import decode_values
        raw = batch.column("value")
        value, bad = decode_values(opts.value_type, raw, batch.column("__key"))
        if bad is not None:
            if not opts.permissive:
                _undecodable(opts, batch, bad)
            value = pa.array(value.to_pylist(), value.type, mask=bad) if value.null_count < bad.sum() else value
        if opts.permissive:  # the payload of each row that did not decode, null elsewhere
            corrupt = pa.nulls(len(raw), pa.binary()) if bad is None else \
                pa.array(raw.to_pylist(), pa.binary(), mask=~bad)
        columns[0] = value
    if opts.include_headers:
        properties = batch.column("__messageProperties")
        header = pa.StructArray.from_arrays([properties.keys, properties.items.cast(pa.binary())], ["key", "value"])
        columns.append(pa.ListArray.from_arrays(properties.offsets, header))
        names.append("headers")
    if corrupt is not None:
        columns.append(corrupt)
        names.append(opts.corrupt_column)
    return pa.RecordBatch.from_arrays(columns, names=names)


def _undecodable(opts: SourceOptions, batch, bad) -> None:
    from .spark_types import SchemaMismatchError, _kind_name, decode_one
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


_varint = varint_bytes


_TOPIC_FIELD = 100  # an extra field of MessageIdData: parsers that do not know it skip it


def message_id_topic(raw: bytes) -> str | None:
    """The topic carried in a `__messageId` (None when absent)."""
    from ._proto import PulsarApi_pb2 as pb
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


def _row_range(start: Boundary, end: Boundary, ledger: int, entry: int, count: int, batched: bool) -> tuple:
    """Rows [lo, hi) of an entry's `count` rows that lie between the boundaries."""
    if not batched:
        position = (ledger, entry, -1)
        inside = start.precedes(position) and not end.precedes(position)
        return (0, 1) if inside else (0, 0)
    here = (ledger, entry)
    if here < (start.ledger, start.entry):
        lo = count
    elif here == (start.ledger, start.entry):
        lo = start.batch + 1 if start.after else start.batch
    else:
        lo = 0
    if here > (end.ledger, end.entry):
        hi = 0
    elif here == (end.ledger, end.entry):
        hi = end.batch + 1 if end.after else end.batch
    else:
        hi = count
    lo, hi = min(max(lo, 0), count), min(max(hi, 0), count)
    return lo, max(lo, hi)


class _RangeReader:
    """Reads one RangePartition on the task's private event loop: whole entries in, Arrow out."""

    def __init__(self, opts: SourceOptions, part: RangePartition) -> None:
        self.opts = opts
        self.part = part
        self.start = Boundary.from_json(part.start)
        self.end = Boundary.from_json(part.end)
        self.builder = _BatchBuilder(part.topic, part.partition)
        self.client: Any = None
        self.reader: Any = None
        self.first = True
        self.seen: tuple[int, int] | None = None  # the last entry taken
        self.reached_end = False
        self.chunks: dict[str, list] = {}  # uuid -> the entries so far of a chunked message of the range
        self.chunk_of_producer: dict[str, str] = {}  # producer name -> uuid of its chunked message in progress

    async def open(self) -> None:
        self.client = await _connected(self.opts.client)
        await self._start_reader(self.start.start_entry())
        if self.start.ledger >= 0:
            await self._check_start()

    async def _start_reader(self, start: MessageId) -> None:
        if self.reader is not None:
            await self.reader.close()
        self.reader = await self.client.create_entry_reader(
            self.part.topic, start, receiver_queue_size=max(self.opts.rows_per_batch, 10_000),
            max_queued_bytes=min(2 * self.opts.bytes_per_batch, 256 << 20))

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
        start = (self.start.ledger, self.start.entry)
        last = await self.reader.get_last_message_id()
        if last.entry_id < 0 or _position(last) < start:
            await self._start_gone("the topic is now empty" if last.entry_id < 0
                                   else f"the topic now ends at {_where(_position(last))}")
        elif last.entry_id < start[1]:  # the last entry is in a later, shorter ledger
            first = await _entry_at_or_after(self.client, self.part.topic, MessageId.earliest, self.opts.read_timeout)
            if first is None or first > start:
                await self._start_gone(f"the first entry there now is {_where(first)}" if first
                                       else "the topic is now empty")

    async def _start_gone(self, why: str) -> None:
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
        await self._start_reader(MessageId.earliest)

    async def next_batch(self):
        """The next Arrow batch (None when the range is read)."""
        builder, opts = self.builder, self.opts
        while not self.done and builder.rows < opts.rows_per_batch and builder.bytes < opts.bytes_per_batch:
            entries = self.reader.take(1)
            if entries:
                entry = entries[0]
                if self.first:
                    self.first = False
                    if self.start.ledger >= 0 and (entry.ledger_id, entry.entry_id) != (self.start.ledger,
                                                                                         self.start.entry):
                        await self._start_gone(f"the first entry there now is {entry.ledger_id}:{entry.entry_id}")
                        continue
                self.seen = (entry.ledger_id, entry.entry_id)
                self._entry(entry)
            else:
                await self._wait()
        return builder.take() if builder.rows else None

    async def _wait(self) -> None:
        """Wait for entries; a range whose end is no longer there ends (lenient) or is a data-loss
        error (strict) once the broker says so, not after read.timeout.seconds."""
        waited = 0.0
        while waited < self.opts.read_timeout:
            step = min(1.0, self.opts.read_timeout - waited)
            if await self.reader.wait(step):
                return
            waited += step
            if self.reached_end or self.reader.disconnect is not None:
                continue
            try:
                last = await self.reader.get_last_message_id()
            except _retryable():
                continue
            end = (self.end.ledger, self.end.entry)
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

    def _entry(self, entry) -> None:
        from . import codec
        position = (entry.ledger_id, entry.entry_id)
        if position >= (self.end.ledger, self.end.entry):
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

    def _abandoned(self, md) -> None:
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

    def _chunk(self, entry) -> None:
        from . import codec
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
        from ._proto import PulsarApi_pb2 as pb
        whole = pb.MessageMetadata()
        whole.CopyFrom(md)
        whole.ClearField("num_chunks_from_msg")
        payload = b"".join(bytes(p.payload) for p in parts)
        columns = codec.split_columns(whole, codec.decompress_payload(whole, payload))
        self.builder.add(columns, 0, columns.count, entry.ledger_id, entry.entry_id, parts[0].metadata.publish_time)


def _read_range(opts: SourceOptions, part: RangePartition) -> Iterator[Any]:
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


def _ranges(parts, start: dict[str, Boundary], end: dict[str, Boundary]) -> list[RangePartition]:
    out = []
    for topic, index in parts:
        s, e = start.get(topic, Boundary.before_everything()), end[topic]
        if s.key() < e.key():
            out.append(RangePartition(topic, index, s.to_json(), e.to_json()))
    return out


async def _split(client, ranges: list[RangePartition], want: int | None, timeout: float) -> list[RangePartition]:
    """At least `want` ranges where entries allow (minPartitions): each range cut at entries,
    in pieces in proportion to its entries, so that one partition can keep several cores busy.
    A range is cut within the ledger of its end (entry ids are consecutive within a ledger)."""
    if not want or len(ranges) >= want:
        return ranges
    spans = []  # per range: (ledger, first entry, entry of the end) or None when it cannot be cut
    for part in ranges:
        s, e = Boundary.from_json(part.start), Boundary.from_json(part.end)
        first = None
        if s.ledger >= 0 and s.ledger == e.ledger:
            first = _first_unread_entry(s)
        else:
            start = MessageId(s.ledger, _first_unread_entry(s)) if s.ledger >= 0 else MessageId.earliest
            found = await _entry_at_or_after(client, part.topic, start, timeout)
            if found is not None and found[0] == e.ledger:
                first = found[1]
        spans.append(None if first is None or e.entry <= first else (e.ledger, first, e.entry))
    total = sum(span[2] - span[1] + 1 for span in spans if span)
    out = []
    for part, span in zip(ranges, spans):
        if span is None:
            out.append(part)
            continue
        ledger, first, last = span
        entries = last - first + 1
        pieces = min(entries, max(1, round(want * entries / total)))
        cuts = [first - 1 + (j * entries) // pieces for j in range(1, pieces)]
        bounds = [part.start] + [Boundary(ledger, x, _WHOLE_ENTRY, True).to_json() for x in cuts] + [part.end]
        out += [RangePartition(part.topic, part.partition, a, b) for a, b in zip(bounds, bounds[1:])]
    return out


class PulsarBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self):
        opts = self.opts

        async def plan(client):
            parts = await _topic_partitions(client, opts)
            latest = await _latest_all(client, parts)
            start = await _resolve(client, opts.starting, opts.starting_time, parts, "earliest",
                                   "startingOffsets", latest, opts.read_timeout)
            end = await _resolve(client, opts.ending, opts.ending_time, parts, "latest", "endingOffsets", latest,
                                 opts.read_timeout)
            if opts.ending and opts.starting:
                for topic, _ in parts:
                    if end[topic].key() < start[topic].key():
                        raise PulsarSparkError(f"endingOffsets: {topic} ends at {end[topic].to_json()}, before "
                                               f"startingOffsets starts it ({start[topic].to_json()})")
            ranges = await _split(client, _ranges(parts, start, end), opts.min_partitions, opts.read_timeout)
            return _pack(ranges, opts.max_partitions)
        return _run(_with_client(opts.client, plan))

    def read(self, partition):
        return _read_partition(self.opts, partition)


# --- streaming -----------------------------------------------------------------

def _first_unread_entry(s: Boundary) -> int:
    """The first entry that still has messages after boundary `s` (entries are counted from 0)."""
    if s.ledger < 0:
        return 0
    if s.after and s.batch in (_WHOLE_ENTRY, -1):
        return s.entry + 1
    return s.entry


def _entries_between(s: Boundary, e: Boundary) -> int | None:
    """Entries after `s` up to `e`: counted within one ledger, None (not known without asking
    the broker) across ledgers or from the earliest."""
    if e.ledger < 0 or e.key() <= s.key():
        return 0
    if s.ledger < 0 or s.ledger != e.ledger:
        return None
    return max(0, e.entry - _first_unread_entry(s) + 1)


def _admit(s: Boundary, e: Boundary, budget: int) -> Boundary:
    """The end boundary that admits at most `budget` entries after `s` (up to `e`), both in one ledger."""
    available = _entries_between(s, e)
    if available is None:
        raise ValueError("_admit counts entries within one ledger")
    if available <= budget:
        return e
    if budget <= 0:
        return s
    return Boundary(e.ledger, _first_unread_entry(s) + budget - 1, _WHOLE_ENTRY, True)


def _share(available: dict[str, int | None], budget: int, turn: int) -> dict[str, int]:
    """`budget` entries spread over partitions fairly (water-filling; None: a backlog of unknown
    size, at least the budget); when there are fewer entries to give than partitions with a
    backlog, the partitions served rotate with `turn`."""
    counts = {t: budget if n is None else n for t, n in available.items()}
    grant = {t: 0 for t in counts}
    waiting = sorted(t for t, n in counts.items() if n > 0)
    while budget > 0 and waiting:
        each = budget // len(waiting)
        if each == 0:
            rotated = waiting[turn % len(waiting):] + waiting[:turn % len(waiting)]
            for topic in rotated[:budget]:
                grant[topic] += 1
            break
        for topic in list(waiting):
            take = min(each, counts[topic] - grant[topic])
            grant[topic] += take
            budget -= take
            if grant[topic] >= counts[topic]:
                waiting.remove(topic)
    return grant


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._frozen: dict | None = None  # the target offset of an availableNow query
        self._latest: dict | None = None  # for reportLatestOffset
        self._turn = 0

    def _now(self) -> tuple[list, dict[str, Boundary]]:
        async def look(client):
            parts = await _topic_partitions(client, self.opts, missing_ok=not self.opts.fail_on_data_loss)
            return parts, await _latest_all(client, parts)
        return _run(_with_client(self.opts.client, look))

    def initialOffset(self) -> dict:
        opts = self.opts

        async def plan(client):
            parts = await _topic_partitions(client, opts)
            latest = await _latest_all(client, parts)
            start = await _resolve(client, opts.starting, opts.starting_time, parts, "latest",
                                   "startingOffsets", latest, opts.read_timeout)
            if opts.subscription:
                await _hold(client, opts.subscription, start)
            return start
        return canonical(_run(_with_client(opts.client, plan)))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_entries or self.opts.max_messages
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._frozen = canonical(self._now()[1])

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self.opts
        frozen = None if self._frozen is None else {t: Boundary.from_json(v) for t, v in self._frozen.items()}
        begin = {t: Boundary.from_json(v) for t, v in (start or {}).items()}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None

        async def plan(client):
            latest = frozen
            if latest is None:
                parts = await _topic_partitions(client, opts, missing_ok=not opts.fail_on_data_loss)
                latest = await _latest_all(client, parts)
            for topic, s in begin.items():
                e = latest.get(topic)
                if e is not None and e.key() < s.key():
                    self._data_lost(f"{topic}: the topic now ends at {e.to_json()}, before the checkpointed "
                                    f"offset {s.to_json()}: data was deleted or the topic re-created")
                    begin[topic] = Boundary.before_everything()
            starts = {t: begin.get(t, Boundary.before_everything()) for t in latest}
            if budget is None:
                return latest, {t: e if e.key() > starts[t].key() else starts[t] for t, e in latest.items()}
            available = {t: _entries_between(starts[t], e) for t, e in latest.items()}
            if opts.max_messages:  # a budget in messages: each partition's entries at its own rate
                backlog = [t for t, n in available.items() if n != 0]
                rates = dict(zip(backlog, await asyncio.gather(
                    *(_messages_per_entry(client, t, starts[t], opts.read_timeout) for t in backlog))))
                shares = _share({t: None if n is None else n * rates.get(t, 1) for t, n in available.items()},
                                budget, self._turn)
                grant = {t: 0 if not n else max(1, n // rates[t]) for t, n in shares.items()}
            else:
                grant = _share(available, budget, self._turn)
            ends = await asyncio.gather(*(_advance(client, t, starts[t], e, grant[t], opts.read_timeout)
                                          for t, e in latest.items()))
            return latest, dict(zip(latest, ends))

        latest, out = _run(_with_client(opts.client, plan))
        self._turn += 1
        self._latest = canonical(latest)
        for topic, s in begin.items():  # a topic no longer read (or gone for now) keeps its offset
            out.setdefault(topic, s)
        return canonical(out)

    def _data_lost(self, message: str) -> None:
        if self.opts.fail_on_data_loss:
            raise PulsarDataLossError(message + "; set failOnDataLoss=false to go on from the earliest data")
        log.warning("%s; going on from the earliest data (failOnDataLoss=false)", message)

    def reportLatestOffset(self):
        return self._latest

    def partitions(self, start: dict, end: dict):
        parts = [(t, _partition_index(t)) for t in sorted(end)]
        begin = {t: Boundary.from_json(v) for t, v in (start or {}).items()}
        finish = {t: Boundary.from_json(v) for t, v in end.items()}
        for topic, s in list(begin.items()):
            e = finish.get(topic)
            if e is not None and e.key() < s.key():  # re-created (failOnDataLoss=false): read it anew
                begin[topic] = Boundary.before_everything()
        ranges = _ranges(parts, begin, finish)
        if self.opts.min_partitions and len(ranges) < self.opts.min_partitions:
            ranges = _run(_with_client(self.opts.client, lambda client: _split(
                client, ranges, self.opts.min_partitions, self.opts.read_timeout)))
        return _pack(ranges, self.opts.max_partitions)

    def read(self, partition):
        return _read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        if self.opts.subscription:  # move the held subscription up to what is now read
            done = {t: Boundary.from_json(v) for t, v in end.items()}
            _run(_with_client(self.opts.client, lambda client: _hold(client, self.opts.subscription, done)))


async def _hold(client, subscription: str, offsets: dict[str, Boundary]) -> None:
    """Make durable subscription `subscription` of every partition hold the data after `offsets`
    (the broker keeps what a subscription has not acknowledged, whatever retention says)."""
    from .client import InitialPosition

    async def one(topic: str, boundary: Boundary) -> None:
        consumer = await client.subscribe(topic, subscription, initial_position=InitialPosition.Earliest,
                                          receiver_queue_size=1)
        try:
            if boundary.ledger >= 0:
                # everything before the boundary's entry is read: acknowledge up to just before it
                target = boundary.entry if not (boundary.after and boundary.batch in (_WHOLE_ENTRY, -1)) \
                    else boundary.entry + 1
                await consumer.seek(MessageId(boundary.ledger, target))
        finally:
            await consumer.close()
    await asyncio.gather(*(one(t, b) for t, b in offsets.items()))


# --- writing -------------------------------------------------------------------

@dataclass
class SentMessage(WriterCommitMessage):
    count: int


# the sink's producer batches, in messages and bytes: 1 MiB rather than the Java client's 128 KiB,
# so large rows make fewer entries (fewer frames to send, store and split again when read)
_SINK_BATCH = (1000, 1 << 20)

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


@dataclass
class SinkOptions:
    client: ClientSettings
    topic: str | None
    compression: str
    max_pending: int
    exactly_once: bool = False


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


def sink_options(options: dict) -> SinkOptions:
    from . import compression
    from .client import topic_name
    settings = _client_settings(options, _SINK)
    if options.get("topics") or options.get("topicspattern"):
        raise PulsarSparkError("the sink writes to option 'topic' (or a '__topic' column), not 'topics'")
    topic = options.get("topic")
    if topic is not None:
        if "," in topic:
            raise PulsarSparkError("the sink's option 'topic' takes one topic (or use a '__topic' column)")
        try:
            topic = topic_name(topic.strip())
        except ValueError as exc:
            raise PulsarSparkError(f"option 'topic': {exc}") from None
    kind = str(options.get("compression", "NONE")).upper()
    try:
        compression.compression_type(kind)
    except Exception:  # noqa: BLE001 - an unknown name
        raise PulsarSparkError(f"option 'compression' must be one of NONE, LZ4, ZLIB, ZSTD, SNAPPY; "
                               f"got {options.get('compression')!r}") from None
    pending = int(_positive(options.get("maxpendingmessages", 20_000), "maxPendingMessages", integer=True))
    return SinkOptions(settings, topic, kind, pending, _boolean(options.get("exactlyonce", "false"), "exactlyOnce"))


def _event_ms(column) -> list:
    """An eventTime column as milliseconds (None where null); 0 and negatives kept as given."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_timestamp(column.type):
        column = pc.divide(column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64()), 1000)
    return column.cast(pa.int64()).to_pylist()


async def _send_batches(opts: SinkOptions, fields: dict[str, str], batches,
                        identity: WriteIdentity | None = None) -> int:
    """Send every row of `batches`; return once the broker acknowledged every one (else raise).
    With an `identity`, under its producer name and sequence ids (exactlyOnce)."""
    client = await _connected(opts.client)  # retried; sending itself is not (no row sent twice)
    try:
        return await _send_all(client, opts, fields, batches, identity)
    finally:
        await client.close()


async def _send_all(client, opts: SinkOptions, fields: dict[str, str], batches,
                    identity: WriteIdentity | None = None) -> int:
    import pyarrow as pa
    producers: dict[str, Any] = {}
    futures: list = []
    count = 0

    types: dict[str, Any] = {}

    async def producer_for(topic: str):
        """The topic's producer, declaring the topic's schema (if it has one) as its own."""
        from .spark_types import UnsupportedSchemaError, value_type
        producer = producers.get(topic)
        if producer is None:
            info = await client.get_schema_info(topic)
            try:
                types[topic] = value_type(info)
            except UnsupportedSchemaError as exc:
                raise PulsarSparkError(f"{topic}: {exc}") from None
            named = {} if identity is None else {
                # a replay must send each row to the partition, and under the sequence id, it had
                "producer_name": identity.producer_name, "initial_sequence_id": identity.last_sequence_id,
                "message_router": _replayable_router(identity.partition)}
            producer = producers[topic] = await client.create_producer(
                topic, batching_max_publish_delay_ms=5, compression_type=opts.compression,
                max_pending_messages=opts.max_pending, batching_max_messages=_SINK_BATCH[0],
                batching_max_allowed_size_in_bytes=_SINK_BATCH[1],
                schema=None if types[topic] is None else _topic_schema(info), **named)
        return producer

    from .client import topic_name
    for batch in batches:
        if batch.num_rows == 0:
            continue
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
        # rows by target topic, each group sent at once
        groups: dict[str, list[int] | None]
        if topics is None:
            groups = {opts.topic or '': None}
        else:
            by_topic: dict[str, list[int]] = {}
            for i, target in enumerate(topics):
                if target is None:
                    raise PulsarSparkError(f"row {count + i + 1} has a null {fields['topic']!r} (and there is "
                                           "no option 'topic')")
                by_topic.setdefault(topic_name(target), []).append(i)
            groups = dict(by_topic)
        for target, rows in groups.items():
            producer = await producer_for(target)

            def pick(column):
                return column if column is None or rows is None else [column[i] for i in rows]
            kind = types[target]
            if kind is not None:  # the topic's schema: a typed value encoded, bytes checked
                from .spark_types import SchemaMismatchError, encode_values
                try:
                    payloads = encode_values(kind, column if rows is None else column.take(rows), fields["value"])
                except SchemaMismatchError as exc:
                    raise PulsarSparkError(f"{target}: {exc}") from None
            elif values is None:
                raise PulsarSparkError(f"{target} has no schema: column {fields['value']!r} must be "
                                       f"binary or string, not {column.type}")
            else:
                payloads = pick(values)
            futures.append(await producer.send_columns(payloads, partition_keys=pick(keys),
                                                       properties=pick(properties), event_timestamps=pick(events)))
        count += batch.num_rows
    for producer in producers.values():
        await producer.flush()
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} send(s) of this task were not acknowledged by the broker: "
                           f"{failed[0]}") from failed[0]
    for producer in producers.values():
        await producer.close()
    return count


def _topic_schema(info):
    """The topic's own schema, declared by the sink's producer; payloads are encoded (or
    checked) before they reach it (spark_types.encode_values)."""
    from .schema import Schema

    class TopicSchema(Schema):
        schema_type = info.schema_type()
        schema_name = info.name()

        def _definition(self) -> bytes:
            return info.data()

        def _properties(self) -> dict[str, str]:
            return info.properties()

        def encode(self, value) -> bytes:
            return value

        def decode(self, data) -> bytes:
            return bytes(data)
    return TopicSchema()


def _keys(column, name: str) -> list:
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


def _replayable_router(task_partition: int):
    """Keyed rows by their key's hash (as the default router), keyless rows all to the task's own
    partition: the same choice on every replay (the default starts round robin at random)."""
    from .routing import Router
    by_key = Router()

    def route(message, partitions: int) -> int:
        key = message.partition_key()
        return by_key.partition(key, partitions) if key else task_partition % partitions
    return route


class PulsarBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, fields: dict[str, str]) -> None:
        self.opts, self.fields = opts, fields

    def write(self, iterator) -> SentMessage:
        return SentMessage(_run(_send_batches(self.opts, self.fields, iterator)))


class PulsarStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, fields: dict[str, str]) -> None:
        self.opts, self.fields = opts, fields

    def write(self, iterator) -> SentMessage:
        if DataSourceStreamArrowWriter is DataSourceStreamWriter:  # pragma: no cover - rows
            import pyarrow as pa
            rows = [r.asDict() for r in iterator]
            iterator = [pa.RecordBatch.from_pylist(rows)] if rows else []
        identity = WriteIdentity.of_task() if self.opts.exactly_once else None
        return SentMessage(_run(_send_batches(self.opts, self.fields, iterator, identity)))

    def commit(self, messages, batchId) -> None:
        pass  # every message was acknowledged before its task finished

    def abort(self, messages, batchId) -> None:
        pass  # what was acknowledged stays: a replay sends it again (deduplicated with exactlyOnce)


class PulsarDataSource(DataSource):
    """Format `pulsarwire` (`pulsar` is taken by other connectors)."""

    @classmethod
    def name(cls) -> str:
        return "pulsarwire"

    def schema(self):
        # called at load() for reads: check every option there (batch or stream is known later),
        # and read the topics' schema for the value's type
        return source_schema(with_value_type(source_options(_options(self.options), streaming=None)))

    def reader(self, schema):
        return PulsarBatchReader(self._source(schema, streaming=False))

    def streamReader(self, schema):
        return PulsarStreamReader(self._source(schema, streaming=True))

    def _source(self, schema, streaming: bool) -> SourceOptions:
        opts = with_value_type(source_options(_options(self.options), streaming=streaming))
        if schema is not None and schema["value"].dataType != source_schema(opts)["value"].dataType:
            raise PulsarSparkError(f"the topics' schema changed since the query was defined: value is now "
                                   f"{source_schema(opts)['value'].dataType.simpleString()}, was "
                                   f"{schema['value'].dataType.simpleString()}; define the query again")
        return opts

    def writer(self, schema, overwrite):
        opts, fields = self._sink(schema, overwrite)
        if opts.exactly_once:
            raise PulsarSparkError("option 'exactlyOnce' is for streaming writes (a batch write has no "
                                   "micro-batch to replay)")
        return PulsarBatchWriter(opts, fields)

    def streamWriter(self, schema, overwrite):
        return PulsarStreamWriter(*self._sink(schema, overwrite))

    def _sink(self, schema, overwrite):
        if overwrite:
            raise PulsarSparkError("mode 'overwrite' cannot be honoured: a Pulsar topic is append-only "
                                   "(use mode 'append')")
        opts = sink_options(_options(self.options))
        typed = False
        if opts.topic is not None and not isinstance(schema["value"].dataType, BinaryType) \
                if "value" in schema.fieldNames() else False:
            typed = _run(_with_client(opts.client, lambda client: client.get_schema_info(opts.topic))) is not None
        return opts, _check_sink_schema(schema, opts.topic is not None, typed)


def register(spark) -> None:
    """spark.dataSource.register(PulsarDataSource), spelled shorter."""
    spark.dataSource.register(PulsarDataSource)


__all__ = ["PulsarDataSource", "register", "SCHEMA", "Boundary", "PulsarSparkError", "PulsarDataLossError",
           "message_id_topic"]
