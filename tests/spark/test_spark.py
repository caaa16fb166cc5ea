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

from ..conftest import unique  # noqa: E402


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
    df = reader(spark, embedded.url, topic, minPartitions="3")  # one task a partition
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
             .queryName(unique("copy").replace("-", "_"))  # Spark's own options reach the sink
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    copied = reader(spark, embedded.url, sink).collect()
    assert sorted(r.value for r in copied) == sorted(b"v%d" % i for i in range(15))


def test_bad_options_are_reported(spark, embedded):
    with pytest.raises(Exception, match="topic"):
        spark.read.format("pulsarwire").option("service.url", embedded.url).load().collect()
    with pytest.raises(Exception, match="startingOffsets"):
        reader(spark, embedded.url, unique("bad"), startingOffsets="yesterday").collect()


def test_boundaries_and_admission():
    from pulsarwire.messages import MessageId
    from pulsarwire.spark.offsets import _WHOLE_ENTRY, Boundary, _admit, _entries_between, _share

    assert _share({"a": 10, "b": 10, "c": 10}, 3, 0) == {"a": 1, "b": 1, "c": 1}
    assert _share({"a": 100, "b": 1, "c": 0}, 10, 0) == {"a": 9, "b": 1, "c": 0}
    assert sum(_share({"a": 5, "b": 5, "c": 5}, 2, 1).values()) == 2

    after3 = Boundary(0, 3, _WHOLE_ENTRY, True)
    assert after3.precedes(MessageId(0, 4)) and not after3.precedes(MessageId(0, 3, batch_index=5))
    before3 = Boundary.from_json({"ledgerId": 0, "entryId": 3})
    assert before3.precedes(MessageId(0, 3)) and not before3.precedes(MessageId(0, 2))
    start, latest = Boundary(0, 0, -1, False), Boundary(0, 9, _WHOLE_ENTRY, True)
    assert _entries_between(start, latest) == 10
    assert _admit(start, latest, 4) == Boundary(0, 3, _WHOLE_ENTRY, True)
    assert _entries_between(Boundary(0, 3, _WHOLE_ENTRY, True), latest) == 6
    # from the earliest or across ledgers the count is the broker's to say
    assert _entries_between(Boundary.before_everything(), latest) is None
    assert _entries_between(Boundary(0, 3, _WHOLE_ENTRY, True), Boundary(1, 2, _WHOLE_ENTRY, True)) is None
    assert _share({"a": None, "b": 2}, 10, 0) == {"a": 8, "b": 2}
    assert Boundary.from_json(after3.to_json()) == after3


# --- speed-shaped reading: entries to Arrow, capped in rows and bytes ------------

def test_batches_are_capped_in_rows_and_bytes(embedded):
    from pulsarwire.spark import RangePartition, source_options
    from pulsarwire.spark.reader import _read_range

    topic = "persistent://public/default/" + unique("spark-cap")
    client = blocking.Client(embedded.url)
    try:
        producer = client.create_producer(topic, batching_max_messages=10)
        for i in range(60):
            producer.send_async(bytes([i]) * 20_000, None)
        producer.flush()
    finally:
        client.close()
    opts = source_options({"service.url": embedded.url, "topic": topic, "maxbytesperbatch": "100000",
                           "maxrowsperbatch": "25"}, streaming=False)
    batches = list(_read_range(opts, RangePartition(topic, -1, [-1, -1, -1, 1], _last(embedded, topic))))
    assert sum(b.num_rows for b in batches) == 60
    assert all(b.num_rows <= 25 for b in batches)
    # a batch stops growing once it reaches the byte cap: at most one entry (10 x 20 kB) beyond it
    assert all(b.column("value").nbytes <= 100_000 + 200_000 for b in batches) and len(batches) >= 3
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values == [bytes([i]) * 20_000 for i in range(60)]


def _last(embedded, topic):
    from pulsarwire.spark import source_options
    from pulsarwire.spark.connect import _run, _with_client
    from pulsarwire.spark.positions import _latest_of
    opts = source_options({"service.url": embedded.url, "topic": topic}, streaming=False)
    return _run(_with_client(opts.client, lambda c: _latest_of(c, topic))).to_json()


def test_arrow_batches_never_overflow_2_gib():
    """2.2 GB of payloads through the builder: each batch stays under the byte cap, far below
    Arrow's 2 GiB per binary column (8 192 x 262 kB in one partition used to overflow)."""
    import pyarrow as pa

    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    from pulsarwire.spark.arrow import _BatchBuilder
    from pulsarwire.spark.options import _DEFAULT_BYTES_PER_BATCH

    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    columns = codec.split_columns(md, b"x" * (1 << 20))
    builder = _BatchBuilder("persistent://public/default/big", 0)
    total = 0
    for entry in range(2200):
        builder.add(columns, 0, 1, 0, entry, 1)
        if builder.bytes >= _DEFAULT_BYTES_PER_BATCH:
            batch = builder.take()
            assert batch.column("value").type == pa.binary() and batch.column("value").nbytes < 2**31 // 16
            total += batch.num_rows
    if builder.rows:
        total += builder.take().num_rows
    assert total == 2200


# --- silent loss and wrong results (issue 12) -----------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A broker with an 8 KiB message limit: 20 kB messages go in 3 chunks."""
    from ..peers import BrokerThread
    broker = BrokerThread(tmp_path_factory.mktemp("small-broker"), max_message_size=8192).start()
    yield broker
    broker.stop()


def _stream_to_parquet(spark, url, topic, out, checkpoint, **options):
    stream = spark.readStream.format("pulsarwire").option("service.url", url).option("startingOffsets", "earliest")
    if topic is not None:
        stream = stream.option("topic", topic)
    for key, value in options.items():
        stream = stream.option(key, value)
    query = (stream.load().select("value", "__entryId", "__partition").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except Exception:  # noqa: BLE001 - the test looks at query.exception()
        pass
    return query


def test_micro_batch_boundaries_never_cut_a_chunked_message(spark, small, tmp_path):
    topic = "persistent://public/default/" + unique("spark-chunks")
    client = blocking.Client(small.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        for i in range(12):
            producer.send(bytes([65 + i]) * 20_000)
    finally:
        client.close()
    out = str(tmp_path / "out")
    query = _stream_to_parquet(spark, small.url, topic, out, str(tmp_path / "cp"), maxEntriesPerTrigger="5")
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) > 2
    values = sorted(r.value for r in spark.read.parquet(out).collect())
    assert values == [bytes([65 + i]) * 20_000 for i in range(12)]
    batch = reader(spark, small.url, topic).collect()
    assert sorted(r.value for r in batch) == values


def test_message_ids_are_unique_across_topics_and_partitions(spark, embedded):
    from pulsarwire import MessageId
    from pulsarwire.spark import message_id_topic

    first = "persistent://public/default/" + unique("spark-ids-a")
    second = "persistent://public/default/" + unique("spark-ids-b")
    embedded.call(embedded.broker.create_partitioned_topic, first, 2)
    produce(embedded.url, first, 0, 40, batch=5)
    produce(embedded.url, second, 0, 40, batch=5)
    rows = spark.read.format("pulsarwire").option("service.url", embedded.url) \
        .option("topics", f"{first},{second}").load().select("__messageId", "__topic", "__partition").collect()
    assert len(rows) == 80
    assert len({r["__messageId"] for r in rows}) == 80
    for r in rows[:5]:
        mid = MessageId.deserialize(r["__messageId"])
        assert mid.partition == r["__partition"] and message_id_topic(r["__messageId"]) == r["__topic"]


def test_topic_recreated_under_a_checkpoint_fails_unless_told(spark, tmp_path):
    from ..peers import BrokerThread

    topic = "persistent://public/default/" + unique("spark-recreated")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    before = BrokerThread(tmp_path / "before").start()
    try:
        produce(before.url, topic, 0, 30)
        assert _stream_to_parquet(spark, before.url, topic, out, checkpoint).exception() is None
    finally:
        before.stop()
    after = BrokerThread(tmp_path / "after").start()  # the topic anew: 3 entries, fewer than before
    try:
        produce(after.url, topic, 100, 3, batch=1)
        query = _stream_to_parquet(spark, after.url, topic, out, checkpoint)
        assert query.exception() is not None and "failOnDataLoss" in str(query.exception())
        query = _stream_to_parquet(spark, after.url, topic, out, checkpoint, failOnDataLoss="false")
        assert query.exception() is None
        values = sorted(r.value for r in spark.read.parquet(out).collect())
        assert values == sorted([b"v%d" % i for i in range(30)] + [b"v%d" % i for i in range(100, 103)])
    finally:
        after.stop()


def test_max_entries_per_trigger_is_spread_over_partitions(spark, embedded, tmp_path):
    topic = "persistent://public/default/" + unique("spark-spread")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 3)
    produce(embedded.url, topic, 0, 60, batch=1)  # 20 entries a partition
    seen: list = []

    def collect(df, batch_id):
        seen.append(sorted({r["__partition"] for r in df.select("__partition").collect()}))
    stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url).option("topic", topic)
              .option("startingOffsets", "earliest").option("maxEntriesPerTrigger", "30").load())
    query = stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    assert seen[0] == [0, 1, 2] and len([s for s in seen if s]) == 2


def test_every_option_is_checked_at_load(spark, embedded):
    topic = "persistent://public/default/" + unique("spark-opts")
    produce(embedded.url, topic, 0, 10, batch=1)
    short = topic.rsplit("/", 1)[1]

    def load(**options):
        r = spark.read.format("pulsarwire").option("service.url", embedded.url)
        for key, value in options.items():
            r = r.option(key, value)
        return r.load()

    for options, message in [
        ({"topic": topic, "topics": topic}, "exactly one of"),
        ({"topics": f"{topic},{short}"}, "twice"),
        ({"topic": topic, "startingOffsets": "{"}, "startingOffsets"),
        ({"topic": topic, "maxRowsPerBatch": "0"}, "maxRowsPerBatch"),
        ({"topic": topic, "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"topic": topic, "startingTime": "yesterday"}, "startingTime"),
        ({"topic": topic, "pulsar.client.nope": "1"}, "pulsar.client"),
        ({"topic": topic, "startingOfsets": "earliest"}, "unknown option"),
    ]:
        with pytest.raises(Exception, match=message):
            load(**options)
    with pytest.raises(Exception, match="endingOffsets"):
        spark.readStream.format("pulsarwire").option("service.url", embedded.url).option("topic", topic) \
            .option("endingOffsets", "latest").load().writeStream.format("noop").start().awaitTermination(30)
    with pytest.raises(Exception, match="does not exist"):
        load(topic=topic + "-missing").collect()
    # JSON offsets keyed by a short name mean that topic (not a silent fallback to the default)
    ledger = load(topic=topic).select("__ledgerId").first()[0]  # each topic has its own ledger id
    starting = json.dumps({short: {"ledgerId": ledger, "entryId": 7}})
    assert load(topic=topic, startingOffsets=starting).count() == 3
    with pytest.raises(Exception, match="not one of the topics"):
        load(topic=topic, startingOffsets=json.dumps({"other": "earliest"})).collect()


def test_sink_takes_the_sources_columns_and_checks_types(spark, embedded):
    import datetime

    source = "persistent://public/default/" + unique("spark-roundtrip")
    copy = "persistent://public/default/" + unique("spark-copy")
    produce(embedded.url, source, 0, 30)

    def write(df, topic=copy, mode="append"):
        w = df.write.format("pulsarwire").option("service.url", embedded.url).mode(mode)
        if topic:
            w = w.option("topic", topic)
        w.save()
    write(reader(spark, embedded.url, source))  # every source column, written back as is
    back = {r.value: r for r in reader(spark, embedded.url, copy).collect()}
    assert len(back) == 30 and back[b"v4"]["__key"] == "k1" and back[b"v4"]["__messageProperties"] == {"i": "4"}
    assert back[b"v4"]["__eventTime"].replace(tzinfo=datetime.timezone.utc).timestamp() * 1000 == 1_700_000_000_004

    with pytest.raises(Exception, match="'value' must be binary or string"):
        write(spark.createDataFrame([(1,)], "value int"))
    with pytest.raises(Exception, match="overwrite"):
        write(spark.createDataFrame([(b"x",)], "value binary"), mode="overwrite")
    with pytest.raises(Exception, match="does not take column 'keys'"):
        write(spark.createDataFrame([(b"x", "k")], "value binary, keys string"))
    # Pulsar's event time 0 means "none" (its Java client refuses it): an error, not a silent drop
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    with pytest.raises(Exception, match="eventTime 0 ms"):
        write(spark.createDataFrame([(b"x", epoch)], "value binary, eventTime timestamp"))
    targets = ["persistent://public/default/" + unique("spark-row-a"), unique("spark-row-b")]
    rows = [(b"r%d" % i, b"bk%d" % i, targets[i % 2]) for i in range(6)]
    write(spark.createDataFrame(rows, "value binary, key binary, __topic string"), topic=None)
    got = reader(spark, embedded.url, targets[1]).collect()
    assert sorted((r.value, r["__key"]) for r in got) == [(b"r1", "bk1"), (b"r3", "bk3"), (b"r5", "bk5")]


def test_broker_down_at_task_start_is_retried_and_a_disconnect_is_reported(tmp_path):
    import threading

    from pulsarwire.spark import RangePartition, source_options
    from pulsarwire.spark.reader import _read_range

    from ..peers import BrokerThread

    topic = "persistent://public/default/" + unique("spark-down")
    broker = BrokerThread(tmp_path / "b").start()
    produce(broker.url, topic, 0, 20, batch=1)
    url = broker.url
    end = _last(broker, topic)
    broker.stop()
    opts = source_options({"service.url": url, "topic": topic, "connect.timeout.seconds": "20",
                           "read.timeout.seconds": "2", "maxrowsperbatch": "5"}, streaming=False)
    threading.Timer(1.0, broker.start).start()  # the broker comes back a second later
    rows = sum(b.num_rows for b in _read_range(opts, RangePartition(topic, -1, [-1, -1, -1, 1], end)))
    assert rows == 20
    # a range that runs past what is there while the broker goes away: reported as a disconnect
    far = [end[0], end[1] + 50, end[2], 1]
    batches = _read_range(opts, RangePartition(topic, -1, [-1, -1, -1, 1], far))
    next(batches)
    broker.stop()
    with pytest.raises(ConnectionError, match="disconnected"):
        list(batches)
    quick = source_options({"service.url": url, "topic": topic, "connect.timeout.seconds": "1"}, streaming=False)
    with pytest.raises(ConnectionError, match="cannot reach"):
        list(_read_range(quick, RangePartition(topic, -1, [-1, -1, -1, 1], end)))


# --- options users expect ------------------------------------------------------

def test_topics_pattern_and_time_bounds(spark, embedded):
    import time

    tag = unique("pat")
    first, second = f"persistent://public/default/{tag}-a", f"persistent://public/default/{tag}-b"
    embedded.call(embedded.broker.create_partitioned_topic, second, 2)
    produce(embedded.url, first, 0, 5, batch=1)
    produce(embedded.url, second, 5, 5, batch=1)
    produce(embedded.url, f"persistent://public/default/{unique('other')}", 0, 3)
    rows = spark.read.format("pulsarwire").option("service.url", embedded.url) \
        .option("topicsPattern", f"{tag}-.*").load().collect()
    assert sorted(r.value for r in rows) == sorted(b"v%d" % i for i in range(10))
    assert {r["__topic"] for r in rows} == {first, f"{second}-partition-0", f"{second}-partition-1"}

    timed = "persistent://public/default/" + unique("spark-time")
    produce(embedded.url, timed, 0, 4, batch=1)
    time.sleep(0.05)
    begin = int(time.time() * 1000)
    time.sleep(0.05)
    produce(embedded.url, timed, 4, 3, batch=1)
    time.sleep(0.05)
    end = int(time.time() * 1000)
    time.sleep(0.05)
    produce(embedded.url, timed, 7, 2, batch=1)
    between = reader(spark, embedded.url, timed, startingTime=str(begin), endingTime=str(end)).collect()
    assert sorted(r.value for r in between) == [b"v4", b"v5", b"v6"]
    iso = datetime_iso(begin)
    assert reader(spark, embedded.url, timed, startingTime=iso).count() == 5


def datetime_iso(ms):
    import datetime
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat()


def test_client_options_pass_through(spark, tmp_path):
    from ..peers import BrokerThread

    broker = BrokerThread(tmp_path / "auth", auth_tokens={"s3cret"}).start()
    try:
        topic = "persistent://public/default/" + unique("spark-auth")
        client = blocking.Client(broker.url, authentication=__import__("pulsarwire").client.AuthenticationToken("s3cret"))
        try:
            client.create_producer(topic).send(b"secret")
        finally:
            client.close()
        rows = reader(spark, broker.url, topic, **{"pulsar.client.authToken": "s3cret",
                                                    "pulsar.client.operationTimeoutMs": "5000",
                                                    "pulsar.client.connectionTimeoutMs": "2000"}).collect()
        assert [r.value for r in rows] == [b"secret"]
        with pytest.raises(Exception, match="(?i)auth"):
            reader(spark, broker.url, topic, **{"pulsar.client.authToken": "wrong",
                                                "connect.timeout.seconds": "1"}).collect()
    finally:
        broker.stop()


def test_stream_reports_latest_offset_and_holds_a_durable_subscription(spark, embedded, tmp_path):
    topic = "persistent://public/default/" + unique("spark-lag")
    produce(embedded.url, topic, 0, 20, batch=1)
    stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url).option("topic", topic)
              .option("startingOffsets", "earliest").option("maxEntriesPerTrigger", "8")
              .option("subscriptionName", "spark-holder").load())
    query = stream.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    first = progress[0]["sources"][0]
    assert json.loads(first["latestOffset"])[topic][1] == 19  # lag: latest 19 while this batch ends at 7
    assert json.loads(first["endOffset"])[topic][1] == 7
    subscription = embedded.call(lambda: embedded.broker.core.topic(topic).subscriptions["spark-holder"])
    # moved up to a committed batch end (Spark commits a batch's source offsets when it plans a later
    # one, so the last batch's may wait for the next start)
    assert subscription.durable and 7 <= subscription.cursor.mark_delete <= 19  # never past what was read


def test_data_deleted_under_a_checkpoint_fails_unless_told(spark, tmp_path):
    import pathlib

    from ..peers import BrokerThread

    topic = "persistent://public/default/" + unique("spark-deleted")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    broker = BrokerThread(tmp_path / "b", segment_bytes=300).start()  # a few entries a segment
    try:
        produce(broker.url, topic, 0, 10, batch=1)
        assert _stream_to_parquet(spark, broker.url, topic, out, checkpoint).exception() is None
        produce(broker.url, topic, 10, 20, batch=1)
        broker.stop()
        segments = sorted(pathlib.Path(tmp_path / "b").rglob("*.log"), key=lambda p: int(p.stem))
        deleted = [s for s in segments if int(s.stem) <= 15]
        for segment in deleted:  # what retention would do: the oldest segments go
            segment.unlink()
            segment.with_suffix(".idx").unlink(missing_ok=True)
        broker.start()
        query = _stream_to_parquet(spark, broker.url, topic, out, checkpoint)
        assert query.exception() is not None and "failOnDataLoss" in str(query.exception())
        query = _stream_to_parquet(spark, broker.url, topic, out, checkpoint, failOnDataLoss="false")
        assert query.exception() is None
        first_kept = int(segments[len(deleted)].stem)
        values = sorted(r.value for r in spark.read.parquet(out).collect())
        assert values == sorted([b"v%d" % i for i in range(10)] + [b"v%d" % i for i in range(first_kept, 30)])
    finally:
        broker.stop()


def test_a_chunked_message_its_producer_gave_up_is_skipped(small, monkeypatch):
    from pulsarwire.client import producer as producer_module
    from pulsarwire.spark import RangePartition, source_options
    from pulsarwire.spark.reader import _read_range

    topic = "persistent://public/default/" + unique("spark-abandoned")
    enqueue = producer_module.PartitionProducer._enqueue

    def lose_last_chunk(self, op):
        if op.first_chunk is not None and op.num_messages == 1 and op.sequence_id == 1:
            return  # the producer "dies" before the last chunk of message 1
        enqueue(self, op)
    client = blocking.Client(small.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
        producer.send(b"A" * 20_000)
        monkeypatch.setattr(producer_module.PartitionProducer, "_enqueue", lose_last_chunk)
        producer.send_async(b"B" * 20_000, None)  # never acknowledged: its last chunk is not sent
        monkeypatch.setattr(producer_module.PartitionProducer, "_enqueue", enqueue)
        producer.send(b"C")
    finally:
        client.close()
    opts = source_options({"service.url": small.url, "topic": topic, "read.timeout.seconds": "3"}, streaming=False)
    values = [v for b in _read_range(opts, RangePartition(topic, -1, [-1, -1, -1, 1], _last(small, topic)))
              for v in b.column("value").to_pylist()]
    assert values == [b"A" * 20_000, b"C"]


def test_message_ids_of_big_batches_and_single_messages():
    from pulsarwire import MessageId, codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    from pulsarwire.spark import message_id_topic
    from pulsarwire.spark.arrow import _BatchBuilder

    builder = codec.BatchBuilder()
    for i in range(20_000):  # batch indexes of 1, 2 and 3 varint bytes
        builder.add(b"x", None, None, 0, None, i)
    batch = codec.split_columns(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                                                   num_messages_in_batch=20_000), builder.build())
    single = codec.split_columns(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"y")
    rows = _BatchBuilder("persistent://public/default/t", 3)
    rows.add(batch, 100, 20_000, 5, 7, 1)
    rows.add(single, 0, 1, 5, 8, 1)
    rows.add(batch, 0, 3, 6, 1, 1)
    ids = rows.take().column("__messageId").to_pylist()
    assert len(set(ids)) == len(ids) == 19_904
    for row, index in [(0, 100), (27, 127), (28, 128), (16_284, 16_384), (19_899, 19_999)]:
        mid = MessageId.deserialize(ids[row])
        assert (mid.ledger_id, mid.entry_id, mid.partition, mid.batch_index, mid.batch_size) == (5, 7, 3, index, 20_000)
    assert (MessageId.deserialize(ids[19_900]).entry_id, MessageId.deserialize(ids[19_900]).batch_index) == (8, -1)
    assert message_id_topic(ids[19_902]) == "persistent://public/default/t"


# --- issue 28: no silent loss, no false loss, clear errors ------------------------

def _roll_ledger(broker, topic):
    """Stop `broker` and give `topic` a new ledger from its next entry on, as a Pulsar broker
    does at a rollover (the embedded broker keeps one ledger a topic); then start it again."""
    from pulsarwire.broker import metafile
    from pulsarwire.broker.storage import topic_directory

    data_dir = broker.broker.core.data_dir
    broker.stop()
    ids_path = os.path.join(data_dir, "ledger-ids.json")
    new_id = metafile.load(ids_path).data["next"]
    metafile.write(ids_path, {"next": new_id + 1})
    ledgers_path = os.path.join(topic_directory(data_dir, topic), "ledgers.json")
    ranges = metafile.load(ledgers_path).data
    broker.start()
    next_entry = broker.call(lambda: broker.broker.core.topic(topic).log.next_entry_id)
    broker.stop()
    metafile.write(ledgers_path, ranges + [[next_entry, new_id]])
    broker.start()


def test_entry_budget_holds_across_ledger_rollovers(spark, tmp_path):
    """Issue 28 B: a partition of three ledgers, read 100 entries a batch: no batch over budget,
    no false data-loss error at a ledger change, every message once."""
    from ..peers import BrokerThread

    topic = "persistent://public/default/" + unique("spark-rollover")
    broker = BrokerThread(tmp_path / "b").start()
    try:
        produce(broker.url, topic, 0, 150, batch=1)
        _roll_ledger(broker, topic)
        produce(broker.url, topic, 150, 120, batch=1)
        _roll_ledger(broker, topic)
        produce(broker.url, topic, 270, 130, batch=1)
        out = str(tmp_path / "out")
        query = _stream_to_parquet(spark, broker.url, topic, out, str(tmp_path / "cp"), maxEntriesPerTrigger="100")
        assert query.exception() is None
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert max(sizes) <= 100 and len(sizes) >= 4
        values = [r.value for r in spark.read.parquet(out).collect()]
        assert sorted(values) == sorted(b"v%d" % i for i in range(400))
        assert len({r["__ledgerId"] for r in reader(spark, broker.url, topic).collect()}) == 3
    finally:
        broker.stop()


def test_a_recreated_topic_is_a_data_loss_error_or_read_whole(spark, tmp_path):
    """Issue 28 A and C: a topic's data deleted and the topic re-created under a checkpoint.
    Strict: a data-loss error naming what is gone (not a read timeout). Lenient: the new data,
    all of it (before, a run timed out and the next skipped what the new topic held)."""
    import shutil

    from pulsarwire.broker.storage import topic_directory

    from ..peers import BrokerThread

    topic = "persistent://public/default/" + unique("spark-recreate")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    broker = BrokerThread(tmp_path / "b").start()
    try:
        produce(broker.url, topic, 0, 30, batch=1)
        assert _stream_to_parquet(spark, broker.url, topic, out, checkpoint).exception() is None
        data_dir = broker.broker.core.data_dir
        broker.stop()
        shutil.rmtree(topic_directory(data_dir, topic))
        broker.start()
        produce(broker.url, topic, 100, 5, batch=1)  # the topic anew, shorter than before
        query = _stream_to_parquet(spark, broker.url, topic, out, checkpoint, **{"read.timeout.seconds": "5"})
        error = str(query.exception())
        assert "PulsarDataLossError" in error and "is gone" in error and "failOnDataLoss" in error
        lenient = {"failOnDataLoss": "false", "read.timeout.seconds": "5"}
        assert _stream_to_parquet(spark, broker.url, topic, out, checkpoint, **lenient).exception() is None
        produce(broker.url, topic, 105, 40, batch=1)
        assert _stream_to_parquet(spark, broker.url, topic, out, checkpoint, **lenient).exception() is None
        values = [r.value for r in spark.read.parquet(out).collect()]
        assert sorted(values) == sorted([b"v%d" % i for i in range(30)] + [b"v%d" % i for i in range(100, 145)])
    finally:
        broker.stop()


def test_a_topic_named_with_its_partition_is_read_once(spark, embedded):
    """Issue 28 E."""
    topic = "persistent://public/default/" + unique("spark-multi")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 2)
    produce(embedded.url, topic, 0, 30, batch=1)
    rows = spark.read.format("pulsarwire").option("service.url", embedded.url) \
        .option("topics", f"{topic},{topic}-partition-0").load().select("value").collect()
    assert sorted(r.value for r in rows) == sorted(b"v%d" % i for i in range(30))


def test_connect_timeout_and_impossible_positions(spark, embedded):
    """Issue 28 F: a port that accepts and never answers fails after connect.timeout.seconds with
    a clear error; an endingOffsets position the topic does not have is an error, not 0 rows."""
    import socket

    from pulsarwire.spark import PulsarBatchReader, source_options

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        opts = source_options({"service.url": f"pulsar://127.0.0.1:{silent.getsockname()[1]}", "topic": "t",
                               "connect.timeout.seconds": "2"}, streaming=False)
        with pytest.raises(ConnectionError, match="within 2s"):
            PulsarBatchReader(opts).partitions()
    finally:
        silent.close()
    topic = "persistent://public/default/" + unique("spark-ending")
    produce(embedded.url, topic, 0, 10, batch=1)
    ledger = reader(spark, embedded.url, topic).select("__ledgerId").first()[0]
    for position, message in [({"ledgerId": ledger + 1000, "entryId": 5}, "past the topic's last entry"),
                              ({"ledgerId": ledger - 1, "entryId": 5}, "has no entry"),
                              ({"ledgerId": ledger, "entryId": 50}, "past the topic's last entry")]:
        with pytest.raises(Exception, match=message):
            reader(spark, embedded.url, topic, endingOffsets=json.dumps({topic: position})).collect()
    ending = json.dumps({topic: {"ledgerId": ledger, "entryId": 5}})
    assert reader(spark, embedded.url, topic, endingOffsets=ending).count() == 5
    with pytest.raises(Exception, match="before startingOffsets"):
        reader(spark, embedded.url, topic, endingOffsets=ending,
               startingOffsets=json.dumps({topic: {"ledgerId": ledger, "entryId": 7}})).collect()


def test_kafka_source_option_names(spark, embedded, tmp_path):
    """Issue 28 items 2 and 4: the Kafka source's names where they mean the same; minPartitions
    cuts one partition's range into several tasks; maxOffsetsPerTrigger counts messages."""
    first = "persistent://public/default/" + unique("spark-kafka-a")
    second = "persistent://public/default/" + unique("spark-kafka-b")
    embedded.call(embedded.broker.create_partitioned_topic, second, 2)
    produce(embedded.url, first, 0, 100, batch=10)  # 10 entries of 10 messages
    produce(embedded.url, second, 100, 20, batch=1)

    def load(**options):
        r = spark.read.format("pulsarwire").option("service.url", embedded.url)
        for key, value in options.items():
            r = r.option(key, value)
        return r.load()

    assert load(subscribe=f"{first},{second}").count() == 120
    assert load(subscribePattern=first.rsplit("/", 1)[1]).count() == 100
    assigned = load(assign=json.dumps({second: [1]})).select("__partition").collect()
    assert assigned and {r["__partition"] for r in assigned} == {1}
    row = load(subscribe=first, includeHeaders="true").where("value = 'v3'").first()
    assert [(h.key, h.value) for h in row.headers] == [("i", b"3")]
    with pytest.raises(Exception, match="not both"):
        load(subscribe=first, topics=first)
    packed = load(topics=f"{first},{second}", maxPartitions="2")  # 3 ranges, 2 tasks
    assert packed.rdd.getNumPartitions() == 2 and packed.count() == 120
    split = load(topic=first, minPartitions="4")
    assert split.rdd.getNumPartitions() == 4
    assert sorted(r.value for r in split.collect()) == sorted(b"v%d" % i for i in range(100))

    seen: list = []
    stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url).option("subscribe", first)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "30").load())
    query = stream.writeStream.foreachBatch(lambda df, _: seen.append(df.count())) \
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    assert sum(seen) == 100 and max(seen) == 30


def test_a_topic_deleted_mid_stream_is_left_out_then_read_again(spark, tmp_path):
    """Issue 28 item 3: under failOnDataLoss=false a deleted topic is logged and left out (the
    query goes on with the others) and read from its start once re-created."""
    import shutil

    from pulsarwire.broker.storage import topic_directory

    from ..peers import BrokerThread

    gone = "persistent://public/default/" + unique("spark-gone")
    kept = "persistent://public/default/" + unique("spark-kept")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    broker = BrokerThread(tmp_path / "b").start()

    def run(**options):
        return _stream_to_parquet(spark, broker.url, None, out, checkpoint, topics=f"{gone},{kept}", **options)
    try:
        produce(broker.url, gone, 0, 10, batch=1)
        produce(broker.url, kept, 100, 10, batch=1)
        assert run().exception() is None
        data_dir = broker.broker.core.data_dir
        broker.stop()
        shutil.rmtree(topic_directory(data_dir, gone))
        broker.start()
        produce(broker.url, kept, 110, 5, batch=1)
        try:  # strict: an error, when the query is defined (the topics' schema is looked up) or run
            error = str(run().exception())
        except Exception as exc:  # noqa: BLE001
            error = str(exc)
        assert "does not exist" in error
        assert run(failOnDataLoss="false").exception() is None
        produce(broker.url, gone, 200, 3, batch=1)
        assert run(failOnDataLoss="false").exception() is None
        values = [r.value for r in spark.read.parquet(out).collect()]
        expected = [b"v%d" % i for i in [*range(10), *range(100, 115), *range(200, 203)]]
        assert sorted(values) == sorted(expected)
    finally:
        broker.stop()


def _send_with_schema(url, topic, schema, payloads, keys=None):
    client = blocking.Client(url)
    try:
        producer = client.create_producer(topic, schema=schema, batching_max_messages=4)
        for i, payload in enumerate(payloads):
            producer.send_async(payload, None, **({"partition_key": keys[i]} if keys else {}))
        producer.flush()
    finally:
        client.close()


def test_typed_columns_from_the_topics_schema(spark, embedded):
    """Issue 28 item 1: JSON, Avro, String, primitive and KeyValue topics read as typed columns;
    rawValue keeps bytes; a payload that does not decode fails the query naming it, or with
    mode=PERMISSIVE is a null value and the payload in _corrupt_record; the sink encodes a typed
    value with the topic's schema and refuses bytes that do not fit it."""
    import struct

    from pulsarwire.schema import SchemaInfo, SchemaType, _pack_pair
    from pulsarwire.spark.sink import _topic_schema

    record = {"type": "record", "name": "Reading", "fields": [
        {"name": "sensor", "type": "string"}, {"name": "value", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None}]}
    json_info = SchemaInfo(SchemaType.JSON, "Reading", json.dumps(record))
    json_topic = "persistent://public/default/" + unique("spark-json")
    _send_with_schema(embedded.url, json_topic, _topic_schema(json_info),
                      [json.dumps({"sensor": f"s{i}", "value": i}).encode() for i in range(10)] + [b"not json"])
    load = lambda topic, **options: reader(spark, embedded.url, topic, **options)  # noqa: E731
    df = load(json_topic, mode="PERMISSIVE")
    assert df.schema["value"].dataType.simpleString() == "struct<sensor:string,value:bigint,note:string>"
    rows = df.orderBy("__entryId", "__batchIndex").collect()
    assert [(r.value.sensor, r.value.value) for r in rows[:10]] == [(f"s{i}", i) for i in range(10)]
    assert rows[10].value is None and rows[10]._corrupt_record == b"not json"
    assert all(r._corrupt_record is None for r in rows[:10])
    with pytest.raises(Exception, match=r"message \d+:\d+:\d+ does not decode with the topic's JSON schema"):
        load(json_topic).collect()
    assert load(json_topic, rawValue="true").where("value = 'not json'").count() == 1
    assert load(json_topic, mode="PERMISSIVE").selectExpr("value.sensor").where("sensor = 's3'").count() == 1

    avro_topic = "persistent://public/default/" + unique("spark-avro")
    from pulsarwire.schema import AvroSchema
    _send_with_schema(embedded.url, avro_topic, AvroSchema(schema_definition=record),
                      [{"sensor": f"a{i}", "value": -i, "note": "n" if i % 2 else None} for i in range(6)])
    got = sorted((r.value.sensor, r.value.value, r.value.note) for r in load(avro_topic).collect())
    assert got == sorted((f"a{i}", -i, "n" if i % 2 else None) for i in range(6))

    string_topic = "persistent://public/default/" + unique("spark-string")
    _send_with_schema(embedded.url, string_topic, _topic_schema(SchemaInfo(SchemaType.STRING, "String", b"")),
                      [("é%d" % i).encode() for i in range(3)])
    assert sorted(r.value for r in load(string_topic).collect()) == ["é0", "é1", "é2"]

    long_topic = "persistent://public/default/" + unique("spark-int64")
    _send_with_schema(embedded.url, long_topic, _topic_schema(SchemaInfo(9, "INT64", b"")),
                      [struct.pack(">q", n) for n in (-5, 0, 1 << 40)])
    assert sorted(r.value for r in load(long_topic).collect()) == [-5, 0, 1 << 40]

    kv_topic = "persistent://public/default/" + unique("spark-kv")
    kv_info = SchemaInfo(SchemaType.KEY_VALUE, "KeyValue", _pack_pair(None, json.dumps(record).encode()), {
        "kv.encoding.type": "INLINE", "key.schema.type": "STRING", "key.schema.name": "String",
        "key.schema.properties": "{}", "value.schema.type": "JSON", "value.schema.name": "Reading",
        "value.schema.properties": "{}"})
    _send_with_schema(embedded.url, kv_topic, _topic_schema(kv_info), [
        _pack_pair(b"k%d" % i, json.dumps({"sensor": "kv", "value": i}).encode()) for i in range(3)])
    kv = sorted((r.value.key, r.value.value.value) for r in load(kv_topic).collect())
    assert kv == [("k0", 0), ("k1", 1), ("k2", 2)]

    # the sink: a typed value encoded with the topic's schema; bytes that do not fit refused
    out_topic = "persistent://public/default/" + unique("spark-json-out")
    _send_with_schema(embedded.url, out_topic, _topic_schema(json_info), [b'{"sensor": "first", "value": 0}'])
    typed = load(json_topic, mode="PERMISSIVE").where("_corrupt_record IS NULL").select("value")
    typed.write.format("pulsarwire").option("service.url", embedded.url).option("topic", out_topic) \
        .mode("append").save()
    assert load(out_topic).count() == 11
    with pytest.raises(Exception, match="does not fit the topic's JSON schema"):
        spark.createDataFrame([(b"not json at all",)], "value binary").write.format("pulsarwire") \
            .option("service.url", embedded.url).option("topic", out_topic).mode("append").save()
    assert load(out_topic).count() == 11


def test_exactly_once_sink_drops_what_a_replayed_batch_sends_again(spark, embedded, tmp_path):
    """Issue 28: with exactlyOnce=true a micro-batch replayed after a crash (its commit lost)
    writes under the same producer name and sequence ids, so the broker's deduplication drops
    it; without the option the replay duplicates it (at-least-once, as Spark's Kafka sink)."""
    source = "persistent://public/default/" + unique("spark-eo-src")
    produce(embedded.url, source, 0, 40)
    counts = {}
    for exactly_once in ("true", "false"):
        sink = "persistent://public/default/" + unique("spark-eo-sink")
        embedded.call(embedded.broker.create_partitioned_topic, sink, 2)
        embedded.set_policy("deduplicationEnabled", True, topic=sink)  # off by default, as in Pulsar
        checkpoint = tmp_path / f"cp-{exactly_once}"

        def run():
            stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url)
                      .option("topic", source).option("startingOffsets", "earliest").load()
                      .selectExpr("value").repartition(3))
            query = (stream.writeStream.format("pulsarwire").option("service.url", embedded.url)
                     .option("topic", sink).option("exactlyOnce", exactly_once)
                     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
            query.awaitTermination(120)
            assert query.exception() is None
        run()
        for commit in (checkpoint / "commits").iterdir():  # as if the driver died before committing
            commit.unlink()
        run()  # Spark runs the batch again
        values = [r.value for r in reader(spark, embedded.url, sink).collect()]
        assert sorted(set(values)) == sorted(b"v%d" % i for i in range(40))
        counts[exactly_once] = len(values)
    assert counts == {"true": 40, "false": 80}


def test_a_schema_given_to_the_read_builds_only_its_columns(spark, embedded, tmp_path):
    """A Python source gets no column pruning from Spark, so `.schema(...)` names the columns a
    read wants (any subset, in any order): the others are never built nor handed to Spark."""
    topic = "persistent://public/default/" + unique("spark-columns")
    produce(embedded.url, topic, 0, 40)
    from pyspark.sql.types import StructType

    def fresh():  # a new DataFrameReader each time: its option() and schema() change it in place
        return spark.read.format("pulsarwire").option("service.url", embedded.url).option("topic", topic)
    load = fresh()
    full = {(r["__entryId"], r["__batchIndex"]): r for r in load.load().collect()}
    picked = load.schema("__entryId bigint, value binary, __batchIndex int").load()
    assert picked.columns == ["__entryId", "value", "__batchIndex"]
    rows = picked.collect()
    assert len(rows) == 40 and all(full[(r[0], r[2])].value == r[1] for r in rows)
    assert sorted(r.value for r in fresh().schema("value binary").load().collect()) == \
        sorted(b"v%d" % i for i in range(40))
    headers = fresh().schema("headers array<struct<key:string,value:binary>>, __key string").load() \
        .where("__key = 'k1'").collect()  # headers named in the schema need no includeHeaders
    assert len(headers) == 13 and all(h.headers[0].key == "i" for h in headers)
    assert fresh().option("includeHeaders", "true").schema("value binary").load().count() == 40
    spelled = fresh().schema("VALUE binary, __EntryId bigint").load()  # matched as Spark matches columns
    assert spelled.columns == ["VALUE", "__EntryId"] and spelled.where("VALUE = 'v7'").count() == 1
    with pytest.raises(Exception, match="unknown option.*bogus"):  # when it runs: Spark asks the source nothing at load()
        fresh().option("bogus", "1").schema("value binary").load().collect()
    for schema, error in [("value binary, offset bigint", r"names 'offset', which this source does not give; "
                                                           r"its columns: value, __key"),
                          ("__entryId int", r"gives '__entryId' as int; it is bigint"),
                          ("value binary NOT NULL", "NOT NULL"),
                          ("value string", r"gives 'value' as string; it is binary \(no schema, or rawValue=true; "
                                           r"read value as binary"),
                          (StructType([]), "names no column"),
                          ("_corrupt_record binary", "comes with mode=PERMISSIVE")]:
        with pytest.raises(Exception, match=error):
            fresh().schema(schema).load().collect()

    stream = (spark.readStream.format("pulsarwire").option("service.url", embedded.url).option("topic", topic)
              .option("startingOffsets", "earliest").schema("value binary, __publishTime timestamp").load())
    seen: list = []
    query = stream.writeStream.foreachBatch(lambda df, _: seen.extend(df.collect())) \
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(r.value for r in seen) == sorted(b"v%d" % i for i in range(40))
    assert all(r["__publishTime"] is not None for r in seen) and len(seen[0]) == 2


def test_a_schema_given_to_a_typed_read(spark, embedded):
    """On a topic with a schema: `value` as binary reads the payloads' bytes; typed, with the
    corrupt-record column or without it (PERMISSIVE), and with the key it may need left out."""
    from pulsarwire.schema import SchemaInfo, SchemaType
    from pulsarwire.spark.sink import _topic_schema

    record = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}
    topic = "persistent://public/default/" + unique("spark-typed-columns")
    _send_with_schema(embedded.url, topic, _topic_schema(SchemaInfo(SchemaType.JSON, "R", json.dumps(record))),
                      [json.dumps({"n": i}).encode() for i in range(5)] + [b"not json"])
    def load():  # a new DataFrameReader each time: its option() and schema() change it in place
        return spark.read.format("pulsarwire").option("service.url", embedded.url).option("topic", topic)
    assert sorted(r.value for r in load().schema("value binary").load().collect()) == sorted(
        [json.dumps({"n": i}).encode() for i in range(5)] + [b"not json"])
    rows = load().option("mode", "PERMISSIVE").schema("_corrupt_record binary, value struct<n:bigint>").load().collect()
    assert sorted((r.value.n if r.value else None, r._corrupt_record) for r in rows if r.value) == [
        (i, None) for i in range(5)]
    assert [r._corrupt_record for r in rows if r.value is None] == [b"not json"]
    assert sorted(r.value.n for r in load().option("mode", "PERMISSIVE").schema("value struct<n:bigint>").load().collect() if r.value) == \
        list(range(5))
    with pytest.raises(Exception, match=r"message \d+:\d+:\d+ does not decode"):
        load().schema("value struct<n:bigint>").load().collect()
    with pytest.raises(Exception, match=r"gives 'value' as struct<n:int>; it is struct<n:bigint> \(the topics' schema"):
        load().schema("value struct<n:int>").load().collect()
    assert load().option("mode", "PERMISSIVE").schema("value struct<n:bigint not null>").load() \
        .where("value IS NOT NULL").count() == 5  # n is never null there: NOT NULL within is the source's own

    from pyspark.sql.types import MapType, StringType, StructField, StructType

    from pulsarwire.spark.options import source_options
    from pulsarwire.spark.source import select_columns
    opts = source_options({"service.url": embedded.url, "topic": topic}, streaming=False)
    with pytest.raises(Exception, match=r"NOT NULL within it where the source may give null"):
        select_columns(opts, StructType([StructField("__messageProperties", MapType(StringType(), StringType(), False))]))
    assert load().schema("__entryId bigint").load().count() == 6  # no value asked for: none decoded


def test_the_builder_builds_the_columns_asked_for_in_their_order():
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    from pulsarwire.spark.arrow import _BatchBuilder

    builder = codec.BatchBuilder()
    for i in range(50):
        builder.add(b"v%d" % i, {"a": "b"} if i % 3 else None, "k" if i % 2 else None, i)
    columns = codec.split_columns(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                                                     num_messages_in_batch=50), builder.build())
    single = codec.split_columns(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=2), b"one")

    def filled():
        rows = _BatchBuilder("persistent://public/default/t", 2)
        rows.add(columns, 3, 40, 1, 2, 5)
        rows.add(single, 0, 1, 1, 3, 6)
        rows.add(columns, 0, 50, 1, 4, 7)
        return rows
    whole = filled().take()
    assert whole.num_rows == 88
    for names in (["value"], ["__entryId", "value"], whole.schema.names[::-1]):
        assert filled().take(names).equals(whole.select(names)), names


def test_the_sink_takes_a_large_batch_in_slices_of_about_4_mib():
    """Spark's Arrow batches (10 000 rows: 100 MB of 10 KiB values) become Python bytes a slice
    at a time, in memory used again slice after slice; every row once, in order."""
    import pyarrow as pa

    from pulsarwire.spark.sink import _pieces
    big = pa.RecordBatch.from_arrays([pa.array([b"%05d" % i + b"x" * 102_400 for i in range(100)])], ["value"])
    small = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"])], ["value"])
    empty = small.slice(0, 0)
    pieces = list(_pieces([big, empty, small]))
    assert pieces[-1] is small and all(p.nbytes <= (4 << 20) + 200_000 for p in pieces[:-1])
    assert len(pieces) > 3
    assert [v for p in pieces for v in p.column(0).to_pylist()] == big.column(0).to_pylist() + [b"a", b"b"]


def _entry_compressions(url, topic, count):
    """The compression of the first `count` entries of `topic`, as stored."""
    import asyncio

    from pulsarwire import MessageId
    from pulsarwire.client import Client

    async def main():
        async with Client(url) as client:
            reader = await client.create_entry_reader(topic, MessageId.earliest)
            entries = []
            while len(entries) < count:
                assert await reader.wait(10)
                entries += reader.take(count)
            await reader.close()
            return [e.metadata.compression for e in entries]
    return asyncio.run(main())


def test_the_sink_compresses_where_it_pays_unless_told_otherwise(spark, embedded):
    """compression=AUTO, the default: ZSTD for the batches it shrinks, the rest uncompressed;
    NONE or a codec's name as asked. Every row reads back as written."""
    from pyspark.sql import functions as F

    from pulsarwire import compression
    text = spark.range(3000).select(F.concat(F.lit("row "), F.col("id").cast("string"), F.lit(" " + "x" * 200))
                                    .cast("binary").alias("value")).coalesce(1)
    noise = spark.range(3000).select(F.expr("unhex(sha2(cast(id as string), 512))").alias("value")).coalesce(1)
    cases = [(text, {}, compression.ZSTD), (noise, {}, compression.NONE),
             (text, {"compression": "none"}, compression.NONE), (text, {"compression": "LZ4"}, compression.LZ4)]
    for df, options, expected in cases:
        topic = "persistent://public/default/" + unique("spark-compress")
        writer = df.write.format("pulsarwire").option("service.url", embedded.url).option("topic", topic)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.mode("append").save()
        assert set(_entry_compressions(embedded.url, topic, 3)) == {expected}, options
        back = reader(spark, embedded.url, topic).orderBy("__entryId", "__batchIndex").select("value").collect()
        assert [r.value for r in back] == [r.value for r in df.collect()]
    with pytest.raises(Exception, match="AUTO, NONE, LZ4"):
        text.write.format("pulsarwire").option("service.url", embedded.url).option("topic", "t") \
            .option("compression", "brotli").mode("append").save()


@pytest.mark.interop
def test_the_sink_and_the_source_work_against_pulsar_lite(spark, pulsar_lite):
    """pulsar-lite answers neither GetSchema nor GetTopicsOfNamespace: every write and read
    waited 30 s for them and failed. Its topics are read as bytes and taken as there when named
    (an empty one, or one not there, reads no rows); a pattern is refused at once, with the reason."""
    from pyspark.sql import functions as F

    topic = "persistent://public/default/" + unique("spark-lite")
    df = spark.range(3000).select(F.concat(F.lit('{"id": '), F.col("id").cast("string"), F.lit("}"))
                                  .cast("binary").alias("value")).coalesce(1)
    df.write.format("pulsarwire").option("service.url", pulsar_lite.url).option("topic", topic) \
        .option("connect.timeout.seconds", "10").option("operation.timeout.seconds", "10").mode("append").save()
    back = reader(spark, pulsar_lite.url, topic, **{"operation.timeout.seconds": "10"})
    assert sorted(r.value for r in back.select("value").collect()) == sorted(r.value for r in df.collect())
    with pytest.raises(Exception, match="GetTopicsOfNamespace"):
        spark.read.format("pulsarwire").option("service.url", pulsar_lite.url) \
            .option("topicsPattern", "persistent://public/default/spark-lite-.*").load().collect()
    # a topic with nothing in it, or not there (it cannot tell): no rows ("Topic has no messages")
    assert reader(spark, pulsar_lite.url, topic + "-none", **{"operation.timeout.seconds": "10"}).count() == 0


def test_small_ranges_are_packed_by_default_as_spark_packs_small_files(spark, embedded, monkeypatch):
    """Issue 28: with neither minPartitions nor maxPartitions, ranges that outnumber the cores are
    packed into tasks of up to TASK_BYTES, at least one a core (Spark's cost per Python task is
    more than a small partition's read); large ranges keep more tasks; each row is read once."""
    from pulsarwire.spark import PulsarBatchReader, source_options
    from pulsarwire.spark import source as planning
    from pulsarwire.spark.reader import RangeGroup

    topic = "persistent://public/default/" + unique("spark-packed")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 6)
    for j in range(6):  # (by key, produce() would fill three partitions)
        produce(embedded.url, f"{topic}-partition-{j}", 100 * j, 100, batch=10)
    expected = min(6, planning._cores())
    df = reader(spark, embedded.url, topic)
    assert df.rdd.getNumPartitions() == expected
    assert sorted(r.value for r in df.collect()) == sorted(b"v%d" % i for i in range(600))
    assert reader(spark, embedded.url, topic, minPartitions="6").rdd.getNumPartitions() == 6

    opts = source_options({"service.url": embedded.url, "topic": topic}, streaming=False)
    monkeypatch.setattr(planning, "_cores", lambda: 2)
    tasks = PulsarBatchReader(opts).partitions()
    assert len(tasks) == 2 and all(isinstance(t, RangeGroup) for t in tasks)
    assert sorted(r.partition for t in tasks for r in t.ranges) == list(range(6))
    ranges = [r for t in tasks for r in t.ranges]

    async def sizes(client):
        import asyncio
        return await asyncio.gather(*(planning._range_bytes(client, r, 5) for r in ranges))
    found = planning._run(planning._with_client(opts.client, sizes))
    assert sum(found) > 600 * 2  # the values' bytes and more (each message's metadata in its batch)
    monkeypatch.setattr(planning, "TASK_BYTES", 2 * max(found))  # two ranges a task
    tasks = PulsarBatchReader(opts).partitions()
    assert len(tasks) == 3
    assert sorted(r.partition for t in tasks for r in getattr(t, "ranges", [t])) == list(range(6))
    monkeypatch.setattr(planning, "TASK_BYTES", 1)
    assert len(PulsarBatchReader(opts).partitions()) == 6


@pytest.mark.parametrize("sizes_mib, cores, tasks", [
    ([50] * 7, 2, 4),   # no task over 128 MiB where a range is not itself larger
    ([100] * 3, 2, 3),
    ([10] * 20, 2, 2),  # a task a core at least
    ([0] * 16, 4, 4),
    ([200, 0, 0, 0, 0, 0], 2, 2),  # a range larger than a task stays one task
    ([1] * 8, 8, 8),    # no more ranges than cores: a task each
])
def test_default_packing_keeps_tasks_under_task_bytes_and_a_task_a_core(monkeypatch, sizes_mib, cores, tasks):
    import asyncio

    from pulsarwire.spark import source as planning
    from pulsarwire.spark.reader import RangeGroup, RangePartition

    ranges = [RangePartition(f"t-partition-{i}", i, [-1, -1, -1, 1], [0, 9, 2**31 - 1, 1])
              for i in range(len(sizes_mib))]
    sizes = {r.partition: mib << 20 for r, mib in zip(ranges, sizes_mib)}

    async def size_of(client, part, timeout):
        return sizes[part.partition]
    monkeypatch.setattr(planning, "_range_bytes", size_of)
    monkeypatch.setattr(planning, "_cores", lambda: cores)
    planned = asyncio.run(planning._default_pack(None, ranges, 1.0))
    assert len(planned) == tasks
    groups = [p.ranges if isinstance(p, RangeGroup) else [p] for p in planned]
    assert sorted(r.partition for g in groups for r in g) == list(range(len(ranges)))
    for group in groups:
        assert len(group) == 1 or sum(sizes[r.partition] for r in group) <= planning.TASK_BYTES
