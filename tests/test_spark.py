"""The `pulsarwire` PySpark data source in a local[2] session against the embedded broker."""
from __future__ import annotations

import json
import os
import sys

import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if not (os.environ.get("JAVA_HOME") or __import__("shutil").which("java")):
    pytest.skip("Spark needs a Java runtime (java on PATH or JAVA_HOME)", allow_module_level=True)

from pulsarwire import blocking  # noqa: E402

from .conftest import unique  # noqa: E402


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter (and this codec)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # never bind anything but loopback
    from pyspark.sql import SparkSession

    from pulsarwire.spark import PulsarDataSource

    session = (SparkSession.builder.master("local[2]").appName("pulsarwire-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(PulsarDataSource)
    yield session
    session.stop()


def produce(url, topic, start, count, batch=7):
    client = blocking.Client(url)
    try:
        producer = client.create_producer(topic, batching_max_messages=batch)
        for i in range(start, start + count):
            producer.send_async(b"v%d" % i, None, partition_key=f"k{i % 3}", properties={"i": str(i)},
                                event_timestamp=1_700_000_000_000 + i)
        producer.flush()
    finally:
        client.close()


def reader(spark, url, topic, **options):
    r = spark.read.format("pulsarwire").option("service.url", url).option("topic", topic)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_batch_read_everything_with_metadata(spark, embedded):
    topic = "persistent://public/default/" + unique("spark-batch")
    produce(embedded.url, topic, 0, 40)
    rows = reader(spark, embedded.url, topic).orderBy("__entryId", "__batchIndex").collect()
    assert [r.value for r in rows] == [b"v%d" % i for i in range(40)]
    first = rows[0]
    assert first["__key"] == "k0" and first["__messageProperties"] == {"i": "0"}
    assert first["__topic"] == topic and first["__partition"] == -1
    assert first["__eventTime"].year == 2023 and first["__publishTime"] is not None
    from pulsarwire import MessageId
    assert MessageId.deserialize(first["__messageId"]).entry_id == first["__entryId"]


def test_batch_ranges_and_partitions(spark, embedded):
    topic = "persistent://public/default/" + unique("spark-ranges")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 3)
    produce(embedded.url, topic, 0, 30, batch=1)
    df = reader(spark, embedded.url, topic)
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted(r.value for r in rows) == sorted(b"v%d" % i for i in range(30))
    p0 = f"{topic}-partition-0"
    ledger = next(r["__ledgerId"] for r in rows if r["__partition"] == 0)  # each partition has its own
    starting = json.dumps({p0: {"ledgerId": ledger, "entryId": 2}, f"{topic}-partition-1": "latest",
                           f"{topic}-partition-2": "latest"})
    ending = json.dumps({p0: {"ledgerId": ledger, "entryId": 5}})
    part = reader(spark, embedded.url, topic, startingOffsets=starting, endingOffsets=ending).collect()
    assert sorted(r["__entryId"] for r in part) == [2, 3, 4]
    assert {r["__partition"] for r in part} == {0}
    assert reader(spark, embedded.url, topic, startingOffsets="latest").count() == 0


def test_streaming_restarts_from_checkpoint_without_loss_or_duplicates(spark, embedded, tmp_path):
    topic = "persistent://public/default/" + unique("spark-stream")
    produce(embedded.url, topic, 0, 30)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_once():
        stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url)
                  .option("topic", topic).option("startingOffsets", "earliest")
                  .option("maxEntriesPerTrigger", "2").load())
        query = (stream.select("value", "__entryId", "__batchIndex").writeStream.format("parquet")
                 .option("path", out).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    first = run_once()
    assert len([p for p in first.recentProgress if p["numInputRows"]]) > 1  # admission control split it
    assert spark.read.parquet(out).count() == 30
    produce(embedded.url, topic, 30, 20)
    run_once()
    values = [r.value for r in spark.read.parquet(out).collect()]
    assert sorted(values) == sorted(b"v%d" % i for i in range(50))
    assert len(values) == len(set(values)) == 50


def test_write_then_read_back(spark, embedded):
    import datetime

    topic = "persistent://public/default/" + unique("spark-write")
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    df = spark.createDataFrame([(f"row-{i}".encode(), f"key{i % 2}", {"n": str(i)}, when) for i in range(25)],
                               "value binary, key string, properties map<string,string>, eventTime timestamp")
    df.repartition(3).write.format("pulsarwire").option("service.url", embedded.url).option("topic", topic) \
        .mode("append").save()
    back = reader(spark, embedded.url, topic).collect()
    assert sorted(r.value for r in back) == sorted(f"row-{i}".encode() for i in range(25))
    by_value = {r.value: r for r in back}
    assert by_value[b"row-3"]["__key"] == "key1" and by_value[b"row-3"]["__messageProperties"] == {"n": "3"}
    assert by_value[b"row-3"]["__eventTime"].replace(tzinfo=datetime.timezone.utc) == when


def test_streaming_write(spark, embedded, tmp_path):
    source = "persistent://public/default/" + unique("spark-src")
    sink = "persistent://public/default/" + unique("spark-sink")
    produce(embedded.url, source, 0, 15)
    stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url).option("topic", source)
              .option("startingOffsets", "earliest").load()
              .selectExpr("value", "__key AS key"))
    query = (stream.writeStream.format("pulsarwire").option("service.url", embedded.url).option("topic", sink)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    copied = reader(spark, embedded.url, sink).collect()
    assert sorted(r.value for r in copied) == sorted(b"v%d" % i for i in range(15))


def test_bad_options_are_reported(spark, embedded):
    with pytest.raises(Exception, match="topic"):
        spark.read.format("pulsarwire").option("service.url", embedded.url).load().collect()
    with pytest.raises(Exception, match="offsets"):
        reader(spark, embedded.url, unique("bad"), startingOffsets="yesterday").collect()


def test_boundaries_and_admission():
    from pulsarwire.messages import MessageId
    from pulsarwire.spark import _WHOLE_ENTRY, Boundary, _admit, _entries_between

    after3 = Boundary(0, 3, _WHOLE_ENTRY, True)
    assert after3.precedes(MessageId(0, 4)) and not after3.precedes(MessageId(0, 3, batch_index=5))
    before3 = Boundary.from_json({"ledgerId": 0, "entryId": 3})
    assert before3.precedes(MessageId(0, 3)) and not before3.precedes(MessageId(0, 2))
    start, latest = Boundary.before_everything(), Boundary(0, 9, _WHOLE_ENTRY, True)
    assert _entries_between(start, latest) == 10
    assert _admit(start, latest, 4) == Boundary(0, 3, _WHOLE_ENTRY, True)
    assert _entries_between(Boundary(0, 3, _WHOLE_ENTRY, True), latest) == 6
    assert Boundary.from_json(after3.to_json()) == after3
