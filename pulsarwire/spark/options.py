"""Every option of the source and the sink, checked, with a clear message for each mistake."""
from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

from .columns import SCHEMA
from .errors import PulsarSparkError
from .offsets import Boundary

if TYPE_CHECKING:
    from ..client.client import Client


class _ClientOption(NamedTuple):
    target: str | None  # the Client keyword (None: checked, not passed)
    parse: Callable[[Any], Any]


# pulsar.client.<name> (names as in the Java client's configuration) -> Client keyword, parser
_CLIENT_OPTIONS: dict[str, _ClientOption] = {
    "authtoken": _ClientOption("authentication", str),
    "authparams": _ClientOption("authentication", str),
    "authpluginclassname": _ClientOption(None, str),
    "operationtimeoutms": _ClientOption("operation_timeout_seconds",
                                        lambda v: _positive(v, "operationTimeoutMs") / 1000),
    "connectiontimeoutms": _ClientOption("connection_timeout_ms",
                                         lambda v: int(_positive(v, "connectionTimeoutMs"))),
    "keepaliveintervalseconds": _ClientOption("keep_alive_interval_seconds",
                                              lambda v: _positive(v, "keepAliveIntervalSeconds")),
    "tlstrustcertsfilepath": _ClientOption("tls_trust_certs_file_path", str),
    "tlsallowinsecureconnection": _ClientOption("tls_allow_insecure_connection",
                                                lambda v: _boolean(v, "tlsAllowInsecureConnection")),
    "tlshostnameverificationenable": _ClientOption("tls_validate_hostname",
                                                   lambda v: _boolean(v, "tlsHostnameVerificationEnable")),
    "maxbackoffintervalnanos": _ClientOption("max_backoff_seconds",
                                             lambda v: _positive(v, "maxBackoffIntervalNanos") / 1e9),
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
# far below Arrow's 2 GiB per binary column, and small enough to be made in memory the allocator
# reuses: 64 MiB batches, each in fresh pages, read 10 KiB rows at 14 us a row, 4 MiB at 8 us
_DEFAULT_BYTES_PER_BATCH = 4 << 20


def _positive(value: Any, name: str, integer: bool = False) -> float:
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise PulsarSparkError(f"option {name!r} must be a {'whole ' if integer else ''}number, "
                               f"got {value!r}") from None
    if number <= 0:
        raise PulsarSparkError(f"option {name!r} must be positive, got {value!r}")
    return number


def _boolean(value: Any, name: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise PulsarSparkError(f"option {name!r} must be true or false, got {value!r}")
    return text == "true"


def _time_ms(value: Any, name: str) -> int:
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


def _options(options: Mapping[Any, Any]) -> dict[str, Any]:
    """Spark treats option names case-insensitively (and may lower-case them): so do we."""
    return {str(k).lower(): v for k, v in dict(options).items()}


@dataclass
class ClientSettings:
    """How to reach the broker: everything a task needs to open its own client."""

    url: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    connect_timeout: float = 30.0

    def client(self) -> Client:
        from ..client import Client
        return Client(self.url, **self.kwargs)


def _client_settings(options: dict[str, Any], known: set[str]) -> ClientSettings:
    from ..client import AuthenticationToken
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


class TopicPattern(NamedTuple):
    """topicsPattern: a namespace and a regex over the local names of its topics."""

    namespace: str
    regex: re.Pattern[str]


def _short_pattern(pattern: str) -> TopicPattern:
    """topicsPattern as a namespace and a regex over the topic's local name."""
    body = pattern.split("://", 1)[1] if "://" in pattern else pattern
    if pattern.startswith("non-persistent://"):
        raise PulsarSparkError("topicsPattern: only persistent topics can be read")
    parts = body.split("/", 2)
    namespace, regex = (f"{parts[0]}/{parts[1]}", parts[2]) if len(parts) == 3 else ("public/default", body)
    try:
        return TopicPattern(namespace, re.compile(regex))
    except re.error as exc:
        raise PulsarSparkError(f"topicsPattern {pattern!r} is not a regular expression: {exc}") from None


@dataclass
class SourceOptions:
    client: ClientSettings
    topics: list[str]
    pattern: TopicPattern | None
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
    value_type: Any = None  # the topics' schema as a types.ValueType (None: bytes)
    max_partitions: int | None = None  # at most this many Spark tasks (ranges packed together)
    columns: tuple[str, ...] | None = None  # a schema given to the read: these columns (None: all)
    retyped: dict[str, Any] | None = None  # of those, the Spark types that differ from ours in nullability
    column_names: tuple[str, ...] | None = None  # those columns as the schema spells them, where it differs


_KAFKA_NAMES = {"subscribe": "subscribe", "subscribepattern": "subscribePattern",
                "startingtimestamp": "startingTimestamp", "endingtimestamp": "endingTimestamp"}
_OWN_NAMES = {"topics": "topics", "topicspattern": "topicsPattern", "startingtime": "startingTime",
              "endingtime": "endingTime"}


def _kafka_aliases(options: dict[str, Any]) -> dict[str, Any]:
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


def source_options(options: dict[str, Any], streaming: bool | None) -> SourceOptions:
    """Every source option checked, with a clear message for each mistake."""
    settings = _client_settings(options, _SOURCE)
    options = _kafka_aliases(options)
    topics, pattern = _topics_read(options)
    stream_only = streaming is False  # None: at load(), batch or stream not known yet
    _check_bounds(options, streaming)
    max_entries, max_messages = _trigger_limits(options, stream_only)
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
        client=settings, topics=topics, pattern=pattern,
        starting=options.get("startingoffsets"), ending=options.get("endingoffsets"),
        starting_time=_time_ms(options["startingtime"], "startingTime") if options.get("startingtime") else None,
        ending_time=_time_ms(options["endingtime"], "endingTime") if options.get("endingtime") else None,
        fail_on_data_loss=_boolean(options.get("failondataloss", "true"), "failOnDataLoss"), max_entries=max_entries,
        rows_per_batch=int(_positive(options.get("maxrowsperbatch", _DEFAULT_ROWS_PER_BATCH), "maxRowsPerBatch",
                                     integer=True)),
        bytes_per_batch=int(_positive(options.get("maxbytesperbatch", _DEFAULT_BYTES_PER_BATCH),
                                      "maxBytesPerBatch", integer=True)),
        read_timeout=_positive(options.get("read.timeout.seconds", 30), "read.timeout.seconds"),
        subscription=str(subscription).strip() if subscription else None, max_messages=max_messages,
        min_partitions=min_partitions,
        include_headers=_boolean(options.get("includeheaders", "false"), "includeHeaders"),
        raw_value=_boolean(options.get("rawvalue", "false"), "rawValue"),
        permissive=_mode(options.get("mode", "FAILFAST")),
        corrupt_column=_corrupt_column(options.get("columnnameofcorruptrecord", "_corrupt_record")),
        value_type=None, max_partitions=max_partitions)


def _topics_read(options: dict[str, Any]) -> tuple[list[str], TopicPattern | None]:
    """The topics named by 'topic' or 'topics', or else the pattern 'topicsPattern' gives."""
    from ..client import topic_name
    given = [k for k in ("topic", "topics", "topicspattern") if options.get(k)]
    if len(given) != 1:
        raise PulsarSparkError("exactly one of the options 'topic', 'topics' or 'topicsPattern' is required"
                               + (f" (got {', '.join(given)})" if given else ""))
    if given[0] == "topicspattern":
        return [], _short_pattern(options["topicspattern"].strip())
    topics: list[str] = []
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
    return topics, None


def _check_bounds(options: dict[str, Any], streaming: bool | None) -> None:
    """Where a read starts and ends: given once each, and no end for a stream."""
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


def _trigger_limits(options: dict[str, Any], stream_only: bool) -> tuple[int | None, int | None]:
    """A micro-batch's budget: (entries, messages), at most one of them given."""
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
    return max_entries, max_messages


def _mode(value: Any) -> bool:
    """mode: FAILFAST (a payload that does not decode fails the query) or PERMISSIVE (null value,
    payload in the corrupt-record column). True for PERMISSIVE."""
    text = str(value).strip().upper()
    if text not in ("FAILFAST", "PERMISSIVE"):
        raise PulsarSparkError(f"option 'mode' must be FAILFAST or PERMISSIVE, got {value!r}")
    return text == "PERMISSIVE"


def _corrupt_column(value: Any) -> str:
    name = str(value).strip()
    if not name or name in SCHEMA.fieldNames() or name == "headers":
        raise PulsarSparkError(f"option 'columnNameOfCorruptRecord' {value!r} is empty or names another column")
    return name


def _parse_offsets_spec(spec: str, name: str, allow_earliest: bool) -> str | dict[str, Any]:
    """'earliest', 'latest', or a JSON object of partition topic -> position; checked, not resolved."""
    from ..client import topic_name
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


@dataclass
class SinkOptions:
    client: ClientSettings
    topic: str | None
    compression: str  # a compression type's name, or AUTO: ZSTD for the batches it shrinks
    max_pending: int
    exactly_once: bool = False


def sink_options(options: dict[str, Any]) -> SinkOptions:
    from .. import compression
    from ..client import topic_name
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
    kind = str(options.get("compression", "AUTO")).upper()
    try:
        if kind != "AUTO":
            compression.compression_type(kind)
    except Exception:  # noqa: BLE001 - an unknown name
        raise PulsarSparkError(f"option 'compression' must be one of AUTO, NONE, LZ4, ZLIB, ZSTD, SNAPPY; "
                               f"got {options.get('compression')!r}") from None
    pending = int(_positive(options.get("maxpendingmessages", 20_000), "maxPendingMessages", integer=True))
    return SinkOptions(settings, topic, kind, pending, _boolean(options.get("exactlyonce", "false"), "exactlyOnce"))


