"""The source's planning, on the driver: which ranges each batch or micro-batch reads.

A batch or micro-batch reads every message strictly between its start and end boundaries, so
consecutive micro-batches neither overlap nor leave gaps.
"""
from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Sequence

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StructField, StructType

from .columns import HEADERS, SCHEMA
from .connect import _run, _with_client
from .errors import PulsarDataLossError, PulsarSparkError
from .offsets import (
    _WHOLE_ENTRY, Boundary, TopicPartition, _entries_between, _first_unread_entry, _first_unread_id, _partition_index,
    _share, canonical,
)
from .options import SourceOptions
from .positions import (
    _advance, _entry_at_or_after, _first_at_or_after, _hold, _latest_all, _messages_per_entry, _resolve,
    _topic_partitions,
)
from .reader import RangeGroup, RangePartition, _read_partition

if TYPE_CHECKING:
    import pyarrow as pa

    from ..client.client import Client
    from .types import ValueType

log = logging.getLogger("pulsarwire.spark")

def _pack(ranges: list[RangePartition], most: int | None) -> Sequence[RangePartition | RangeGroup]:
    """At most `most` Spark partitions: ranges packed greedily, the largest (by entries, where
    counted) first into the least loaded group. Fewer tasks cost Spark less per row when
    partitions outnumber cores."""
    if not most or len(ranges) <= most:
        return ranges

    def entries(part: RangePartition) -> int:
        counted = _entries_between(Boundary.from_json(part.start), Boundary.from_json(part.end))
        return 1 if counted is None else max(1, counted)
    return [RangeGroup([ranges[i] for i in group]) for group, _ in _groups([entries(part) for part in ranges], most)]


def _groups(weights: list[int], most: int) -> list[tuple[list[int], int]]:
    """The indices of `weights` in at most `most` groups, the largest first into the least loaded
    group, with each group's load; none empty."""
    groups: list[list[int]] = [[] for _ in range(most)]
    loads = [(0, g) for g in range(most)]  # a heap: the least loaded group first (the lowest index of equals)
    for i in sorted(range(len(weights)), key=weights.__getitem__, reverse=True):
        load, g = heapq.heappop(loads)
        groups[g].append(i)
        heapq.heappush(loads, (load + weights[i], g))
    total = {g: load for load, g in loads}
    return [(group, total[g]) for g, group in enumerate(groups) if group]


# A read with neither minPartitions nor maxPartitions packs small ranges as Spark's file sources
# pack small files (spark.sql.files.maxPartitionBytes): tasks of up to this many bytes of values,
# as many tasks as the cores at least. Spark spends 25-30 ms on each Python task, more than a
# 100 B-row partition of a 1 M-row topic takes to read.
TASK_BYTES = 128 << 20


def _cores() -> int:
    """The cores the planning process may run on. Spark's Python planner is told neither the
    cluster's cores nor the session's settings; in local mode these are the machine's (or the
    container's), on a cluster the driver's, which only sets how far small reads are packed."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


async def _range_bytes(client: Client, part: RangePartition, timeout: float) -> int | None:
    """About how many bytes of values `part` holds: its entries times its first entry's size
    (uncompressed), or None where its entries cannot be counted (they span ledgers) or none came."""
    s, e = Boundary.from_json(part.start), Boundary.from_json(part.end)
    start = _first_unread_id(s)
    try:
        entry = await _first_at_or_after(client, part.topic, start, timeout)
    except RuntimeError:  # no entry came: the read itself will say what is wrong
        return None
    if entry is None:
        return 0
    if entry.ledger_id != e.ledger:
        return None
    md = entry.metadata
    each = md.uncompressed_size if md.HasField("uncompressed_size") else len(entry.payload)
    return max(1, e.entry - entry.entry_id + 1) * max(1, each)


async def _default_pack(client: Client, ranges: list[RangePartition],
                        timeout: float) -> Sequence[RangePartition | RangeGroup]:
    """`ranges` packed into fewer tasks where they outnumber the cores (see TASK_BYTES); a range
    whose size is not known keeps a task of its own."""
    cores = _cores()
    if len(ranges) <= cores:
        return ranges
    sizes = await asyncio.gather(*(_range_bytes(client, part, timeout) for part in ranges))
    known = [(part, size) for part, size in zip(ranges, sizes) if size is not None]
    alone = [part for part, size in zip(ranges, sizes) if size is None]
    total = sum(size for _, size in known)
    weights = [max(1, size) for _, size in known]
    most = max(1, cores - len(alone), -(-total // TASK_BYTES))
    if most >= len(known):
        return ranges

    def fits(groups: list[tuple[list[int], int]]) -> bool:
        return all(load <= TASK_BYTES or len(group) == 1 for group, load in groups)
    found = _groups(weights, most)
    if not fits(found):  # a group over TASK_BYTES: the fewest groups that fit, by bisection
        low, high = most, len(known)  # high: a range a group, which fits
        while high - low > 1:
            middle = (low + high) // 2
            if fits(_groups(weights, middle)):
                high = middle
            else:
                low = middle
        if high >= len(known):
            return ranges
        found = _groups(weights, high)
    return [*(RangeGroup([known[i][0] for i in group]) for group, _ in found), *alone]


def _tasks_ask_broker(ranges: list[RangePartition], opts: SourceOptions) -> bool:
    """Whether `_tasks` needs to look at entries (else it is `_pack` with maxPartitions)."""
    if opts.min_partitions or opts.max_partitions:
        return bool(opts.min_partitions and len(ranges) < opts.min_partitions)
    return len(ranges) > _cores()


async def _tasks(client: Client, ranges: list[RangePartition],
                 opts: SourceOptions) -> Sequence[RangePartition | RangeGroup]:
    """The Spark partitions that read `ranges`: cut (minPartitions), packed (maxPartitions), or,
    with neither option, small ranges packed where they outnumber the cores."""
    if opts.min_partitions or opts.max_partitions:
        ranges = await _split(client, ranges, opts.min_partitions, opts.read_timeout)
        return _pack(ranges, opts.max_partitions)
    return await _default_pack(client, ranges, opts.read_timeout)


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


def select_columns(opts: SourceOptions, schema: StructType) -> SourceOptions:
    """`opts` reading the columns of `schema`: the one `source_schema` gave at load(), or a
    subset a query names with `.schema(...)` (in any order), so that the columns it does not
    want are never built nor handed to Spark (a Python source gets no column pruning). `value`
    given as binary reads a typed topic's payloads as bytes; `headers` needs no option."""
    if [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in source_schema(opts).fields]:
        return opts
    given = schema.fieldNames()
    if not given:
        raise PulsarSparkError("the read's schema names no column; name at least one (its columns: "
                               f"{', '.join(f.name for f in source_schema(opts).fields)})")
    lower = [name.lower() for name in given]  # as Spark resolves columns (spark.sql.caseSensitive=false)
    twice = sorted({name for name, low in zip(given, lower) if lower.count(low) > 1})
    if twice:
        raise PulsarSparkError(f"the read's schema names {', '.join(twice)} more than once")
    fields = dict(zip(lower, schema.fields))
    if opts.value_type is not None and (
            ("value" in fields and isinstance(fields["value"].dataType, BinaryType))  # bytes asked for
            or ("value" not in fields and opts.corrupt_column.lower() not in fields)):  # nothing to decode
        opts.raw_value, opts.value_type = True, None
    if "headers" in fields:
        opts.include_headers = True
    offered = {f.name.lower(): f for f in source_schema(opts).fields}
    names: list[str] = []
    retyped: dict[str, DataType] = {}
    for field in schema.fields:
        have = offered.get(field.name.lower())
        if have is None:
            hint = ""
            if field.name.lower() == opts.corrupt_column.lower():
                hint = (" (that column comes with mode=PERMISSIVE on a topic with a schema, its value read "
                        "typed, not as binary)")
            raise PulsarSparkError(f"the read's schema names {field.name!r}, which this source does not give{hint}; "
                                   f"its columns: {', '.join(f.name for f in offered.values())}")
        names.append(have.name)
        if field.dataType != have.dataType:
            if _nullable(field.dataType) != _nullable(have.dataType):
                why = ""
                if have.name == "value":
                    why = (" (the topics' schema" if opts.value_type is not None else " (no schema, or rawValue=true") \
                        + "; read value as binary for the payloads' bytes; a struct has the schema's fields, all " \
                        "of them, in its order and spelling; if the topics' schema changed since the query was " \
                        "defined, define it again)"
                raise PulsarSparkError(f"the read's schema gives {field.name!r} as {field.dataType.simpleString()}; "
                                       f"it is {have.dataType.simpleString()}{why}")
            if not _may_be_null_where(field.dataType, have.dataType):
                raise PulsarSparkError(f"the read's schema gives {field.name!r} ({field.dataType.simpleString()}) "
                                       "NOT NULL within it where the source may give null; declare it nullable there")
            retyped[have.name] = field.dataType  # the same but for what may be null within it: cast
        if not field.nullable:
            raise PulsarSparkError(f"the read's schema gives {field.name!r} as NOT NULL; declare it nullable "
                                   "(the source's columns are)")
    opts.columns, opts.retyped = tuple(names), retyped or None
    opts.column_names = tuple(given) if given != names else None
    opts.include_headers = "headers" in names  # includeHeaders=true with a schema without them: not built
    return opts


def _may_be_null_where(given: DataType, have: DataType) -> bool:
    """Whether `given` allows a null everywhere within it that `have` does (types alike but for
    nullability): a cast to it never meets a null it refuses."""
    if isinstance(given, StructType) and isinstance(have, StructType):
        return all((g.nullable or not h.nullable) and _may_be_null_where(g.dataType, h.dataType)
                   for g, h in zip(given.fields, have.fields))
    if isinstance(given, ArrayType) and isinstance(have, ArrayType):
        return (given.containsNull or not have.containsNull) and _may_be_null_where(given.elementType, have.elementType)
    if isinstance(given, MapType) and isinstance(have, MapType):
        return (given.valueContainsNull or not have.valueContainsNull) and \
            _may_be_null_where(given.keyType, have.keyType) and _may_be_null_where(given.valueType, have.valueType)
    return True


def _nullable(kind: DataType) -> DataType:
    """`kind` with everything within it nullable: types that differ only there hold the same values."""
    if isinstance(kind, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType)) for f in kind.fields])
    if isinstance(kind, ArrayType):
        return ArrayType(_nullable(kind.elementType))
    if isinstance(kind, MapType):
        return MapType(_nullable(kind.keyType), _nullable(kind.valueType))
    return kind


async def _value_type(client: Client, opts: SourceOptions) -> ValueType | None:
    """The ValueType of the topics read (one schema for all of them), or None for bytes."""
    from .types import UnsupportedSchemaError, value_type
    if opts.raw_value:
        return None
    parts = await _topic_partitions(client, opts, missing_ok=not opts.fail_on_data_loss)
    parents = sorted({re.sub(r"-partition-\d+$", "", t) if i >= 0 else t for t, i in parts})
    infos = await asyncio.gather(*(client.get_schema_info(t) for t in parents))
    found: dict[str, ValueType | None] = {}
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


def _ranges(parts: list[TopicPartition], start: dict[str, Boundary], end: dict[str, Boundary]) -> list[RangePartition]:
    out: list[RangePartition] = []
    for topic, index in parts:
        s, e = start.get(topic, Boundary.before_everything()), end[topic]
        if s.key() < e.key():
            out.append(RangePartition(topic, index, s.to_json(), e.to_json()))
    return out


class _Span(NamedTuple):
    """The entries of a range that can be cut: first to last, all in one ledger."""

    ledger: int
    first: int
    last: int

    @property
    def entries(self) -> int:
        return self.last - self.first + 1


async def _split(client: Client, ranges: list[RangePartition], want: int | None,
                 timeout: float) -> list[RangePartition]:
    """At least `want` ranges where entries allow (minPartitions): each range cut at entries,
    in pieces in proportion to its entries, so that one partition can keep several cores busy.
    A range is cut within the ledger of its end (entry ids are consecutive within a ledger)."""
    if not want or len(ranges) >= want:
        return ranges
    spans: list[_Span | None] = []  # per range: None when it cannot be cut
    for part in ranges:
        s, e = Boundary.from_json(part.start), Boundary.from_json(part.end)
        first = None
        if s.ledger >= 0 and s.ledger == e.ledger:
            first = _first_unread_entry(s)
        else:
            start = _first_unread_id(s)
            found = await _entry_at_or_after(client, part.topic, start, timeout)
            if found is not None and found.ledger == e.ledger:
                first = found.entry
        spans.append(None if first is None or e.entry <= first else _Span(e.ledger, first, e.entry))
    total = sum(span.entries for span in spans if span)
    out: list[RangePartition] = []
    for part, span in zip(ranges, spans):
        if span is None:
            out.append(part)
            continue
        ledger, first = span.ledger, span.first
        entries = span.entries
        pieces = min(entries, max(1, round(want * entries / total)))
        cuts = [first - 1 + (j * entries) // pieces for j in range(1, pieces)]
        bounds = [part.start] + [Boundary(ledger, x, _WHOLE_ENTRY, True).to_json() for x in cuts] + [part.end]
        out += [RangePartition(part.topic, part.partition, a, b) for a, b in zip(bounds, bounds[1:])]
    return out


class PulsarBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[RangePartition | RangeGroup]:
        opts = self.opts

        async def plan(client: Client) -> Sequence[RangePartition | RangeGroup]:
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
            return await _tasks(client, _ranges(parts, start, end), opts)
        return _run(_with_client(opts.client, plan))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.opts, partition)


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._frozen: dict[str, list[int]] | None = None  # the target offset of an availableNow query
        self._latest: dict[str, list[int]] | None = None  # for reportLatestOffset
        self._turn = 0

    def _latest_now(self) -> dict[str, Boundary]:
        async def look(client: Client) -> dict[str, Boundary]:
            parts = await _topic_partitions(client, self.opts, missing_ok=not self.opts.fail_on_data_loss)
            return await _latest_all(client, parts)
        return _run(_with_client(self.opts.client, look))

    def initialOffset(self) -> dict[str, list[int]]:
        opts = self.opts

        async def plan(client: Client) -> dict[str, Boundary]:
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
        self._frozen = canonical(self._latest_now())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, list[int]]:
        opts = self.opts
        frozen = None if self._frozen is None else {t: Boundary.from_json(v) for t, v in self._frozen.items()}
        begin = {t: Boundary.from_json(v) for t, v in (start or {}).items()}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None

        async def plan(client: Client) -> tuple[dict[str, Boundary], dict[str, Boundary]]:
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

    def reportLatestOffset(self) -> dict[str, list[int]] | None:
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[RangePartition | RangeGroup]:
        parts = [TopicPartition(t, _partition_index(t)) for t in sorted(end)]
        begin = {t: Boundary.from_json(v) for t, v in (start or {}).items()}
        finish = {t: Boundary.from_json(v) for t, v in end.items()}
        for topic, s in list(begin.items()):
            e = finish.get(topic)
            if e is not None and e.key() < s.key():  # re-created (failOnDataLoss=false): read it anew
                begin[topic] = Boundary.before_everything()
        ranges = _ranges(parts, begin, finish)
        if _tasks_ask_broker(ranges, self.opts):
            return _run(_with_client(self.opts.client, lambda client: _tasks(client, ranges, self.opts)))
        return _pack(ranges, self.opts.max_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        subscription = self.opts.subscription
        if subscription:  # move the held subscription up to what is now read
            done = {t: Boundary.from_json(v) for t, v in end.items()}
            _run(_with_client(self.opts.client, lambda client: _hold(client, subscription, done)))


