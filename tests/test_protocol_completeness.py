"""Protocol pieces the official client relies on, on the embedded broker (issue 11 item 10),
and the pulsarwire client features built on them (issue 14): seek for readers and consumers,
producer access modes, GetTopicsOfNamespace and pattern subscriptions, broker-unique ledger
ids, and Key_Shared sticky hash ranges."""
from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time

import pytest

from pulsarwire import client as pw
from pulsarwire import errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.routing import murmur3_32

from .conftest import unique
from .peers import BrokerThread

pulsar = pytest.importorskip("pulsar")


@pytest.fixture
def broker(tmp_path):
    peer = BrokerThread(tmp_path / "data", v1_port=None).start()
    yield peer
    peer.stop()


@pytest.fixture
def official(broker):
    client = pulsar.Client(broker.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield client
    client.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def drain(receive, timeout_ms=500):
    """Everything a reader or consumer yields until it stays silent for `timeout_ms`."""
    got = []
    while True:
        try:
            got.append(receive(timeout_ms).data())
        except pulsar.Timeout:
            return got


# -- seek (item 10: the non-durable subscription survived the seek's re-subscribe) -----------

def _publish_spread(official, topic, count=10):
    """`count` messages with publish times at least 5 ms apart; their ids and publish times."""
    producer = official.create_producer(topic)
    ids, times = [], []
    for i in range(count):
        ids.append(producer.send(b"m%d" % i))
        time.sleep(0.005)
    producer.close()
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    for _ in range(count):
        times.append(reader.read_next(5000).publish_timestamp())
    reader.close()
    return ids, times


def test_official_reader_seek_by_message_id_and_publish_time(official):
    topic = unique("seek-reader")
    ids, times = _publish_spread(official, topic)
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    assert drain(reader.read_next)[-1] == b"m9"
    reader.seek(ids[3])  # the official reader's seek is exclusive by default
    assert drain(reader.read_next) == [b"m%d" % i for i in range(4, 10)]
    reader.seek(times[6])
    assert drain(reader.read_next) == [b"m%d" % i for i in range(6, 10)]
    reader.seek(pulsar.MessageId.earliest)
    assert len(drain(reader.read_next)) == 10
    reader.close()


def test_official_consumer_seek_by_message_id_and_publish_time(official):
    topic = unique("seek-consumer")
    ids, times = _publish_spread(official, topic)
    consumer = official.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert len(drain(consumer.receive)) == 10
    consumer.seek(ids[2])
    assert drain(consumer.receive)[0] in (b"m2", b"m3")  # inclusiveness is the client's choice
    consumer.seek(times[7])
    assert drain(consumer.receive) == [b"m7", b"m8", b"m9"]
    consumer.close()


def test_reader_subscription_left_after_seek_is_dropped_once_unused(broker, official, monkeypatch):
    from pulsarwire.broker import topics
    monkeypatch.setattr(topics, "SEEK_RETAIN_SECONDS", 0.2)
    topic = unique("seek-drop")
    _publish_spread(official, topic, 3)
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    drain(reader.read_next, 200)
    reader.seek(pulsar.MessageId.earliest)
    reader.close()
    time.sleep(0.5)
    assert broker.call(lambda: dict(broker.broker.topics[f"persistent://public/default/{topic}"].subscriptions)) == {}


# -- producer access modes ---------------------------------------------------------------------

def test_official_exclusive_producer_refuses_a_second_one(official):
    topic = unique("access-exclusive")
    first = official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        official.create_producer(topic)  # Shared is refused while an exclusive producer holds it
    first.close()
    second = official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    second.send(b"x")
    second.close()


def test_official_exclusive_refused_while_shared_producers_exist(official):
    topic = unique("access-shared")
    shared = [official.create_producer(topic), official.create_producer(topic)]
    with pytest.raises(pulsar.ProducerBusy):
        official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    for p in shared:
        p.close()


def test_official_wait_for_exclusive_waits_until_the_holder_leaves(official):
    topic = unique("access-wait")
    first = official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    created = {}

    def create_waiting():
        created["producer"] = official.create_producer(
            topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
        created["at"] = time.monotonic()

    waiter = threading.Thread(target=create_waiting)
    waiter.start()
    time.sleep(0.5)
    assert "producer" not in created  # still waiting
    first.send(b"from-first")
    released = time.monotonic()
    first.close()
    waiter.join(10)
    assert created["at"] >= released
    created["producer"].send(b"from-second")
    created["producer"].close()
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    assert drain(reader.read_next) == [b"from-first", b"from-second"]


def test_official_exclusive_with_fencing_takes_over(official):
    topic = unique("access-fence")
    first = official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    first.send(b"a")
    second = official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
    second.send(b"b")
    with pytest.raises(Exception):  # the fenced producer cannot come back
        first.send(b"c", )
    second.close()


def test_pulsarwire_producer_access_modes(broker):
    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            topic = unique("pw-access")
            first = await client.create_producer(topic, access_mode=pw.ProducerAccessMode.Exclusive)
            with pytest.raises(errors.ProducerBusyError):
                await client.create_producer(topic, access_mode=pw.ProducerAccessMode.Exclusive)
            with pytest.raises(errors.ProducerBusyError):
                await client.create_producer(topic)
            waiting = asyncio.ensure_future(
                client.create_producer(topic, access_mode=pw.ProducerAccessMode.WaitForExclusive))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await first.send(b"one")
            await first.close()
            second = await asyncio.wait_for(waiting, 10)
            await second.send(b"two")
            await second.close()
    run(main())


# -- ledger ids ----------------------------------------------------------------------------------

def test_message_ids_are_unique_across_topics_partitions_and_restarts(broker, official):
    partitioned = unique("ledger-part")
    broker.call(broker.broker.create_partitioned_topic, f"persistent://public/default/{partitioned}", 3)
    seen = {}
    for topic in [unique("ledger-a"), unique("ledger-b")]:
        producer = official.create_producer(topic)
        seen[topic] = producer.send(b"x")
        producer.close()
    producer = official.create_producer(partitioned, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    part_ids = [producer.send(b"p") for _ in range(3)]
    producer.close()
    ledgers = [m.ledger_id() for m in seen.values()] + [m.ledger_id() for m in part_ids]
    assert len(set(ledgers)) == 5, ledgers
    broker.restart()
    client = pulsar.Client(broker.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(unique("ledger-c"))
        after = producer.send(b"y")
        assert after.ledger_id() not in ledgers
        for topic, mid in seen.items():  # a topic keeps its ledger across restarts
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            message = reader.read_next(5000)
            assert (message.message_id().ledger_id(), message.message_id().entry_id()) == \
                (mid.ledger_id(), mid.entry_id())
            reader.close()
    finally:
        client.close()


def test_data_stored_with_ledger_zero_stays_readable(broker, official):
    topic = unique("ledger-legacy")
    producer = official.create_producer(topic)
    for i in range(3):
        producer.send(b"old-%d" % i)
    producer.close()
    consumer = official.subscribe(topic, "durable", initial_position=pulsar.InitialPosition.Earliest)
    consumer.acknowledge(consumer.receive(5000))
    consumer.close()
    broker.stop()
    # what a data dir written before ledger ids looks like: no allocation, no ranges
    data = broker.data_dir
    os.remove(os.path.join(data, "ledger-ids.json"))
    for name in os.listdir(os.path.join(data, "topics")):
        os.remove(os.path.join(data, "topics", name, "ledgers.json"))
    broker.start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic)
        new_id = producer.send(b"new")
        assert new_id.ledger_id() > 0 and new_id.entry_id() == 3
        consumer = client.subscribe(topic, "durable")
        got = [consumer.receive(5000) for _ in range(3)]
        assert [m.data() for m in got] == [b"old-1", b"old-2", b"new"]
        assert [m.message_id().ledger_id() for m in got][:2] == [0, 0]
        for m in got:
            consumer.acknowledge(m)
        consumer.close()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert drain(reader.read_next) == [b"old-0", b"old-1", b"old-2", b"new"]
        reader.seek(pulsar.MessageId(-1, 0, 1, -1))  # an old id: ledger 0 (partition -1), entry 1
        assert drain(reader.read_next) == [b"old-2", b"new"]
    finally:
        client.close()
    with open(os.path.join(broker.data_dir, "ledger-ids.json")) as fh:
        assert json.load(fh)["next"] > new_id.ledger_id()
