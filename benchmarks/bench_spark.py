"""Spark pipeline speed: the pulsarwire source and sink side by side with Parquet, in one run.

    flock -x /tmp/pulsarwire-cpu.lock python -m benchmarks.bench_spark [--rows 1000000] [--big-rows 100000]

local[2]; the embedded broker runs in its own process. For each value size (100 B: --rows rows;
10 KiB: --big-rows rows) one cached DataFrame of 4 partitions is written to a topic of 1 and of 8
partitions and to Parquet, and each is read back to Spark's noop sink (by default the source packs
small ranges into a task a core; 8 partitions: also with minPartitions=8, one task a partition).
Every step runs --repeat times, after a warm-up of every path; the median is reported. A typed
JSON topic (a JSON schema, two fields) is read as typed columns and as bytes. Two floors show what Spark's
Python Data Source path costs by itself: a source that yields ready-made Arrow batches of the
pulsarwire schema, and a sink that drops what it is given. Goals (issue 28): write and read at
least 0.5 of Parquet; typed JSON at least 0.5 of bytes.

Values are the row id padded with 'x' (what the issue measured), which Parquet's default
compression (snappy) writes as almost nothing, as the sink's default (`compression=AUTO`: ZSTD
for the batches it shrinks) does: `--compression NONE` (or a codec's name) adds a write with the
sink's `compression` option set so (and a read of what it wrote), and `--values random` makes the
values incompressible for both.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from .common import BrokerUnderTest


def _floor_source(rows_per_partition: int, size: int, partitions: int, name: str = "pulsarwire-floor",
                  names: list[str] | None = None):
    """A Python data source that yields ready-made Arrow batches of the pulsarwire schema, or of
    its columns `names` (built once, by the same builder, from a 100-message entry, as large as the
    source's batches): what Spark's
    Python Data Source path costs by itself, the ceiling of any Python source on this machine."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition):
            from pulsarwire import codec
            from pulsarwire._proto import PulsarApi_pb2 as pb
            from pulsarwire.spark.arrow import _BatchBuilder
            builder = codec.BatchBuilder()
            for i in range(100):
                builder.add(b"x" * size, None, None, 0, None, i)
            metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                                          num_messages_in_batch=100)
            columns = codec.split_columns(metadata, builder.build())
            batches = _BatchBuilder("persistent://public/default/floor", partition.value)
            from pulsarwire.spark.options import _DEFAULT_BYTES_PER_BATCH
            for entry in range(max(1, min(320, _DEFAULT_BYTES_PER_BATCH // (100 * size)))):  # the source's batches
                batches.add(columns, 0, 100, 0, entry, 1)
            batch = batches.take(names)
            left = rows_per_partition
            while left > 0:
                yield batch if left >= batch.num_rows else batch.slice(0, left)
                left -= batch.num_rows

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return name

        def schema(self):
            from pyspark.sql.types import StructType

            from pulsarwire.spark import SCHEMA
            return SCHEMA if names is None else StructType([SCHEMA[c] for c in names])

        def reader(self, schema):
            return FloorReader()
    return FloorSource


def _floor_sink():
    """A Python data sink that takes Spark's Arrow batches and drops them: the write floor."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class DropWriter(DataSourceArrowWriter):
        def write(self, iterator):
            rows = 0
            for batch in iterator:
                rows += batch.num_rows
            return WriterCommitMessage()

    class DropSink(DataSource):
        @classmethod
        def name(cls):
            return "pulsarwire-drop"

        def writer(self, schema, overwrite):
            return DropWriter()
    return DropSink


def _session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from pulsarwire.spark import PulsarDataSource
    spark = (SparkSession.builder.master("local[2]").appName("pulsarwire-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "3g")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PulsarDataSource)
    spark.dataSource.register(_floor_sink())
    return spark


def _timed(label: str, action) -> float:
    start = time.perf_counter()
    action()
    took = time.perf_counter() - start
    print(f"  {label}: {took:.2f}s", file=sys.stderr)
    return took


def run(rows: int, big_rows: int, partition_counts: list[int], workdir: str, typed: bool = True,
        repeat: int = 3, compression: str | None = None, values: str = "padded") -> dict:
    started = time.perf_counter()
    spark = _session()
    print(f"  session: {time.perf_counter() - started:.1f}s", file=sys.stderr)
    names = {(p, size, r): f"persistent://public/default/bench-{p}-{size}-{r}"
             for p in partition_counts for size in (100, 10240) for r in range(repeat)}
    extra = []
    for (p, _, _), name in names.items():
        if p > 1:
            extra += ["--partitioned-topic", f"{name}={p}"]
            if compression:
                extra += ["--partitioned-topic", f"{name}-c={p}"]
    extra += ["--partitioned-topic", "persistent://public/default/bench-warm=4"]
    results: dict = {"rows": rows, "big_rows": big_rows, "repeat": repeat, "values": values,
                     "compression": compression, "cases": []}
    with BrokerUnderTest("embedded", os.path.join(workdir, "broker"), extra) as broker:
        def frame(count, size):
            if values == "random":  # as incompressible as random bytes: SHA-256 blocks of the row id
                value = (f"substring(unhex(concat_ws('', transform(sequence(1, {-(-size // 32)}), "
                         f"i -> sha2(concat(cast(id as string), ':', cast(i as string)), 256)))), 1, {size})")
            else:  # the row id padded with 'x': Parquet's default compression takes it to almost nothing
                value = f"cast(lpad(cast(id as string), {size}, 'x') as binary)"
            df = spark.range(count).selectExpr(f"{value} AS value").repartition(4).cache()
            df.count()
            return df

        def to_pulsar(df, name, **options):
            w = df.write.format("pulsarwire").option("service.url", broker.url).option("topic", name)
            for key, value in options.items():
                w = w.option(key, value)
            w.mode("append").save()

        def from_pulsar(name, schema=None, **options):
            r = spark.read.format("pulsarwire").option("service.url", broker.url).option("topic", name)
            if schema is not None:
                r = r.schema(schema)
            for key, value in options.items():
                r = r.option(key, value)
            return r.load()

        def to_noop(df):
            df.write.format("noop").mode("overwrite").save()

        def median(label, actions) -> float:
            """The median time of the actions (one a repetition), in seconds."""
            times = sorted(_timed(f"{label} #{i}", action) for i, action in enumerate(actions))
            return times[len(times) // 2]

        # warm up every path (JVM, Python workers) on a small frame
        warm = frame(20_000, 100)
        for _ in range(2):
            to_pulsar(warm, "persistent://public/default/bench-warm")
            warm.write.mode("overwrite").parquet(os.path.join(workdir, "warm.parquet"))
            to_noop(from_pulsar("persistent://public/default/bench-warm"))
            to_noop(spark.read.parquet(os.path.join(workdir, "warm.parquet")))
            warm.write.format("pulsarwire-drop").mode("append").save()
        warm.unpersist()

        for size, count in ((100, rows), (10240, big_rows)):
            if not count:
                continue
            df = frame(count, size)
            parquet = os.path.join(workdir, f"rows-{size}.parquet")
            for p in partition_counts:
                case = {"size": size, "rows": count, "partitions": p}
                label = f"{count} x {size} B, {p} partition(s)"
                topics = [names[(p, size, r)] for r in range(repeat)]
                case["write_parquet"] = count / median(f"{label}: write parquet", [
                    lambda: df.write.mode("overwrite").parquet(parquet)] * repeat)
                case["write_pulsarwire"] = count / median(f"{label}: write pulsarwire", [
                    (lambda t=t: to_pulsar(df, t)) for t in topics])
                if compression:
                    case["write_pulsarwire_compressed"] = count / median(f"{label}: write pulsarwire, {compression}", [
                        (lambda t=t: to_pulsar(df, t + "-c", compression=compression)) for t in topics])
                case["write_floor"] = count / median(f"{label}: write floor", [
                    lambda: df.write.format("pulsarwire-drop").mode("append").save()] * repeat)
                case["read_parquet"] = count / median(f"{label}: read parquet", [
                    lambda: to_noop(spark.read.parquet(parquet))] * repeat)
                case["read_pulsarwire"] = count / median(f"{label}: read pulsarwire", [
                    lambda: to_noop(from_pulsar(topics[0]))] * repeat)
                if compression:
                    case["read_pulsarwire_compressed"] = count / median(f"{label}: read pulsarwire, {compression}", [
                        lambda: to_noop(from_pulsar(topics[0] + "-c"))] * repeat)
                if p > 2:
                    case["read_pulsarwire_task_a_partition"] = count / median(
                        f"{label}: read pulsarwire, minPartitions={p}", [
                            lambda: to_noop(from_pulsar(topics[0], minPartitions=str(p)))] * repeat)
                tasks = from_pulsar(topics[0]).rdd.getNumPartitions()  # the floor reads in as many tasks
                case["tasks"] = tasks
                spark.dataSource.register(_floor_source(count // tasks, size, tasks))
                case["read_floor"] = count / median(f"{label}: read floor", [
                    lambda: to_noop(spark.read.format("pulsarwire-floor").load())] * repeat)
                # the value alone (.schema("value binary")), the one column Parquet holds
                case["read_pulsarwire_value"] = count / median(f"{label}: read pulsarwire, value only", [
                    lambda: to_noop(from_pulsar(topics[0], "value binary"))] * repeat)
                if p > 2:
                    case["read_pulsarwire_value_task_a_partition"] = count / median(
                        f"{label}: read pulsarwire, value only, minPartitions={p}", [
                            lambda: to_noop(from_pulsar(topics[0], "value binary", minPartitions=str(p)))] * repeat)
                spark.dataSource.register(
                    _floor_source(count // tasks, size, tasks, "pulsarwire-floor-value", ["value"]))
                case["read_floor_value"] = count / median(f"{label}: read floor, value only", [
                    lambda: to_noop(spark.read.format("pulsarwire-floor-value").load())] * repeat)
                counted = from_pulsar(topics[0]).count()
                if counted != count:
                    raise SystemExit(f"{topics[0]}: read back {counted} rows, wrote {count}")
                results["cases"].append(case)
            df.unpersist()
        if rows and typed:
            results["typed"] = _typed_json(spark, broker.url, rows, from_pulsar, to_noop, median, repeat)
    spark.stop()
    return results


def _typed_json(spark, url, rows, from_pulsar, to_noop, median, repeat) -> dict:
    """A JSON-schema topic (two fields, about 100 B a row) read as typed columns and as bytes."""
    import asyncio

    from pulsarwire.client import Client
    from pulsarwire.schema import JsonSchema, SchemaInfo, SchemaType

    topic = "persistent://public/default/bench-typed"
    definition = {"type": "record", "name": "Reading", "fields": [
        {"name": "sensor", "type": "string"}, {"name": "value", "type": "long"}]}

    async def fill():
        client = Client(url)
        try:
            producer = await client.create_producer(topic, schema=_json_schema(definition),
                                                    batching_max_messages=1000)
            for start in range(0, rows, 100_000):
                payloads = [json.dumps({"sensor": f"sensor-{i % 97:04d}-{'x' * 60}", "value": i},
                                       separators=(",", ":")).encode() for i in range(start, min(rows, start + 100_000))]
                await producer.send_many(payloads)
            await producer.flush()
        finally:
            await client.close()
    asyncio.run(fill())
    typed = rows / median("typed JSON: read typed", [lambda: to_noop(from_pulsar(topic))] * repeat)
    raw = rows / median("typed JSON: read bytes", [lambda: to_noop(from_pulsar(topic, rawValue="true"))] * repeat)
    return {"read_typed": typed, "read_bytes": raw}


def _json_schema(definition: dict):
    from pulsarwire.schema import Schema, SchemaType

    class Definition(Schema):
        """A JSON schema given as its definition (the benchmark sends ready-made payloads)."""
        schema_type = SchemaType.JSON

        def _definition(self) -> bytes:
            return json.dumps(definition).encode()

        def encode(self, value) -> bytes:
            return value

        def decode(self, data: bytes):
            return data
    return Definition()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of 100 B")
    parser.add_argument("--big-rows", type=int, default=100_000, help="rows of 10 KiB")
    parser.add_argument("--partitions", default="1,8", help="topic partition counts, comma-separated")
    parser.add_argument("--no-typed", action="store_true", help="skip the typed JSON read")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each step (the median is reported)")
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--compression", choices=["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"],
                        help="also write with the sink's compression option set to this (its default: AUTO)")
    parser.add_argument("--values", choices=["padded", "random"], default="padded",
                        help="the row id padded with 'x' (compresses to almost nothing), or random bytes")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-spark-")
    try:
        result = run(args.rows, args.big_rows, [int(p) for p in args.partitions.split(",")], workdir,
                     typed=not args.no_typed, repeat=args.repeat, compression=args.compression, values=args.values)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"local[2], the embedded broker in its own process; {args.values} values; rows/s (median of "
          f"{args.repeat}), and pulsarwire / Parquet")
    print(f"{'':44}{'pulsarwire':>12}{'Parquet':>12}{'ratio':>7}{'Python floor':>14}{'floor/Parquet':>15}")
    for case in result["cases"]:
        for what in ("write", "read"):
            label = f"{what}, {case['rows']:,} x {case['size']} B, {case['partitions']} part."
            if what == "read" and case.get("tasks", case["partitions"]) != case["partitions"]:
                label += f", {case['tasks']} tasks"
            ours, theirs, floor = case[f"{what}_pulsarwire"], case[f"{what}_parquet"], case[f"{what}_floor"]
            print(f"{label:44}{ours:>12,.0f}{theirs:>12,.0f}{ours / theirs:>7.2f}{floor:>14,.0f}"
                  f"{floor / theirs:>15.2f}")
            if f"{what}_pulsarwire_compressed" in case:
                packed = case[f"{what}_pulsarwire_compressed"]
                print(f"{'  the same, compression=' + args.compression:44}{packed:>12,.0f}{theirs:>12,.0f}"
                      f"{packed / theirs:>7.2f}")
            if what == "read" and "read_pulsarwire_task_a_partition" in case:
                alone = case["read_pulsarwire_task_a_partition"]
                label = f"  the same, minPartitions={case['partitions']}"
                print(f"{label:44}{alone:>12,.0f}{theirs:>12,.0f}{alone / theirs:>7.2f}")
            if what == "read" and "read_pulsarwire_value" in case:
                alone, floor = case["read_pulsarwire_value"], case["read_floor_value"]
                print(f"{'  value only (.schema)':44}{alone:>12,.0f}{theirs:>12,.0f}{alone / theirs:>7.2f}"
                      f"{floor:>14,.0f}{floor / theirs:>15.2f}")
                if "read_pulsarwire_value_task_a_partition" in case:
                    alone = case["read_pulsarwire_value_task_a_partition"]
                    label = f"  value only, minPartitions={case['partitions']}"
                    print(f"{label:44}{alone:>12,.0f}{theirs:>12,.0f}{alone / theirs:>7.2f}")
    if "typed" in result:
        typed = result["typed"]
        print(f"typed JSON read: {typed['read_typed']:,.0f} rows/s typed, {typed['read_bytes']:,.0f} as bytes, "
              f"ratio {typed['read_typed'] / typed['read_bytes']:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
