"""Spark pipeline speed: the pulsarwire source and sink side by side with Parquet, in one run.

    flock -x /tmp/pulsarwire-cpu.lock python -m benchmarks.bench_spark [--rows 1000000]

local[2]; the embedded broker runs in its own process. Rows are 100-byte values in 4
partitions. Batch read: every row to Spark's noop sink, from a 4-partition topic and from
Parquet files of the same rows. Write: the same cached DataFrame to the topic and to
Parquet. Ratios are pulsarwire's rows/s over Parquet's (goal: at least 0.3 each).
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


def _floor_source(rows_per_partition: int, size: int):
    """A Python data source that yields ready-made Arrow batches of the pulsarwire schema (built
    once, by the same builder, from one 1 000-message entry): what Spark's Python Data Source
    path costs by itself, the ceiling of any Python source on this machine."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(4)]

        def read(self, partition):
            from pulsarwire import codec
            from pulsarwire._proto import PulsarApi_pb2 as pb
            from pulsarwire.spark import _BatchBuilder
            builder = codec.BatchBuilder()
            for i in range(1000):
                builder.add(b"x" * size, None, None, 0, None, i)
            metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                                          num_messages_in_batch=1000)
            columns = codec.split_columns(metadata, builder.build())
            batches = _BatchBuilder("persistent://public/default/floor", partition.value)
            for entry in range(32):
                batches.add(columns, 0, 1000, 0, entry, 1)
            batch = batches.take()
            left = rows_per_partition
            while left > 0:
                yield batch if left >= batch.num_rows else batch.slice(0, left)
                left -= batch.num_rows

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "pulsarwire-floor"

        def schema(self):
            from pulsarwire.spark import SCHEMA
            return SCHEMA

        def reader(self, schema):
            return FloorReader()
    return FloorSource


def _session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from pulsarwire.spark import PulsarDataSource
    spark = (SparkSession.builder.master("local[2]").appName("pulsarwire-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "2g")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PulsarDataSource)
    return spark


def _timed(action) -> float:
    start = time.perf_counter()
    action()
    took = time.perf_counter() - start
    print(f"  {getattr(action, '__name__', 'step')}: {took:.1f}s", file=sys.stderr)
    return took


def run(rows: int, size: int, workdir: str) -> dict:
    started = time.perf_counter()
    spark = _session()
    print(f"  session: {time.perf_counter() - started:.1f}s", file=sys.stderr)
    topic = "persistent://public/default/bench-spark"
    warm_topic = "persistent://public/default/bench-spark-warm"
    extra = ["--partitioned-topic", f"{topic}=4", "--partitioned-topic", f"{warm_topic}=4"]
    with BrokerUnderTest("embedded", os.path.join(workdir, "broker"), extra) as broker:
        def frame(count):
            df = spark.range(count).selectExpr(
                f"cast(lpad(cast(id as string), {size}, 'x') as binary) AS value").repartition(4).cache()
            df.count()
            return df

        def to_pulsar(df, name):
            df.write.format("pulsarwire").option("service.url", broker.url).option("topic", name) \
                .mode("append").save()

        def from_pulsar(name):
            return spark.read.format("pulsarwire").option("service.url", broker.url).option("topic", name).load()

        def to_noop(df):
            df.write.format("noop").mode("overwrite").save()

        # warm up both paths (JVM, Python workers) on a small frame
        warm = frame(20_000)
        _timed(lambda: to_pulsar(warm, warm_topic))
        warm.write.mode("overwrite").parquet(os.path.join(workdir, "warm.parquet"))
        _timed(lambda: to_noop(from_pulsar(warm_topic)))
        to_noop(spark.read.parquet(os.path.join(workdir, "warm.parquet")))
        warm.unpersist()
        spark.dataSource.register(_floor_source(rows // 4, size))
        to_noop(spark.read.format("pulsarwire-floor").load())

        df = frame(rows)
        parquet = os.path.join(workdir, "rows.parquet")
        write_parquet = _timed(lambda: df.write.mode("overwrite").parquet(parquet))
        write_pulsar = _timed(lambda: to_pulsar(df, topic))
        read_parquet = _timed(lambda: to_noop(spark.read.parquet(parquet)))
        read_pulsar = _timed(lambda: to_noop(from_pulsar(topic)))
        read_floor = _timed(lambda: to_noop(spark.read.format("pulsarwire-floor").load()))
        counted = from_pulsar(topic).count()
        print(f"  counted in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    spark.stop()
    if counted != rows:
        raise SystemExit(f"read back {counted} rows, wrote {rows}")
    result = {
        "rows": rows, "size": size,
        "read_pulsarwire_rows_s": rows / read_pulsar, "read_parquet_rows_s": rows / read_parquet,
        "write_pulsarwire_rows_s": rows / write_pulsar, "write_parquet_rows_s": rows / write_parquet,
    }
    result["read_python_floor_rows_s"] = rows / read_floor
    result["read_ratio"] = result["read_pulsarwire_rows_s"] / result["read_parquet_rows_s"]
    result["write_ratio"] = result["write_pulsarwire_rows_s"] / result["write_parquet_rows_s"]
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-spark-")
    try:
        result = run(args.rows, args.size, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.rows} rows x {args.size} B, local[2], 4 partitions")
    print(f"{'':10}{'pulsarwire rows/s':>20}{'parquet rows/s':>18}{'ratio':>8}")
    for what in ("read", "write"):
        print(f"{what:10}{result[f'{what}_pulsarwire_rows_s']:>20,.0f}{result[f'{what}_parquet_rows_s']:>18,.0f}"
              f"{result[f'{what}_ratio']:>8.2f}")
    print(f"{'read, a Python source yielding ready-made Arrow batches (the floor)':>10}: "
          f"{result['read_python_floor_rows_s']:,.0f} rows/s, "
          f"{result['read_python_floor_rows_s'] / result['read_parquet_rows_s']:.2f} of Parquet")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
