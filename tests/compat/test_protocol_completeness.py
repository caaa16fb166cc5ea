"""Protocol pieces the official client relies on, on the embedded broker (issue 11 item 10),
and the pulsarwire client features built on them (issue 14): seek for readers and consumers,
producer access modes, GetTopicsOfNamespace and pattern subscriptions, broker-unique ledger
ids, and Key_Shared sticky hash ranges."""
from __future__ import annotations

import asyncio
import os
import re
import threading
import time

import pytest

from pulsarwire import client as pw
from pulsarwire import errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.routing import murmur3_32
from pulsarwire.broker import metafile

from ..conftest import unique
from ..helpers import wait_until
from ..peers import BrokerThread

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
    from pulsarwire.broker import subscription
    monkeypatch.setattr(subscription, "SEEK_RETAIN_SECONDS", 0.2)
    topic = unique("seek-drop")
    _publish_spread(official, topic, 3)
    reader = official.create_reader(topic, pulsar.MessageId.earliest)
    drain(reader.read_next, 200)
    reader.seek(pulsar.MessageId.earliest)
    reader.close()

    def subscriptions() -> dict:
        return broker.call(lambda: dict(broker.broker.topics[f"persistent://public/default/{topic}"].subscriptions))
    wait_until(lambda: subscriptions() == {})
    assert subscriptions() == {}


# -- producer access modes ---------------------------------------------------------------------

def test_official_exclusive_producer_refuses_a_second_one(official):
    topic = unique("access-exclusive")
    first = official.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):  # as Pulsar answers a second Exclusive producer
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
    with pytest.raises(pulsar.ProducerFenced):
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
            with pytest.raises(errors.ProducerFencedError):
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


def test_waiting_producer_that_goes_away_gives_up_its_turn(broker):
    topic = unique("access-wait-gone")

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            holder = await client.create_producer(topic, access_mode=pw.ProducerAccessMode.Exclusive)
            other = pw.Client(broker.url, operation_timeout_seconds=10)
            waiting = asyncio.ensure_future(
                other.create_producer(topic, access_mode=pw.ProducerAccessMode.WaitForExclusive))
            await asyncio.sleep(0.3)
            await other.close()  # its connection goes while it waits
            with pytest.raises(errors.PulsarWireError):
                await waiting
            await holder.close()
            after = await client.create_producer(topic, access_mode=pw.ProducerAccessMode.Exclusive)
            await after.send(b"x")
            await after.close()
    run(main())


def test_fenced_producer_stays_fenced_across_a_restart(broker):
    topic = unique("access-epoch")

    async def holder_client():
        return pw.Client(broker.url, operation_timeout_seconds=10, initial_backoff_seconds=1.5)

    async def main():
        first_client = await holder_client()
        first = await first_client.create_producer(topic, producer_name="first", send_timeout_millis=8000,
                                                   access_mode=pw.ProducerAccessMode.Exclusive)
        await first.send(b"before")
        await asyncio.get_running_loop().run_in_executor(None, broker.restart)
        # a newer exclusive producer takes the topic before the first one comes back
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            second = await client.create_producer(topic, producer_name="second",
                                                  access_mode=pw.ProducerAccessMode.ExclusiveWithFencing)
            with pytest.raises(errors.ProducerFencedError):
                await first.send(b"after")  # comes back with the old epoch: fenced, not busy forever
            await second.send(b"second")
        await first_client.close()
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
    producer = official.create_producer(partitioned,
                                        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
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
    for prefix in ("ledger-ids.json", *(os.path.join("topics", name, "ledgers.json")
                                         for name in os.listdir(os.path.join(data, "topics")))):
        for suffix in ("", metafile.PREVIOUS):  # nor the previous copies this release keeps
            os.remove(os.path.join(data, prefix + suffix))
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
        assert metafile.decode(fh.buffer.read())["next"] > new_id.ledger_id()


# -- GetTopicsOfNamespace and pattern subscriptions -------------------------------------------

def test_official_pattern_subscription_receives_from_matching_topics(official):
    prefix = unique("orders")
    for topic in (f"{prefix}-1", f"{prefix}-2", unique("other")):
        official.create_producer(topic).close()
    consumer = official.subscribe(re.compile(f"persistent://public/default/{prefix}-.*"), "pattern-sub")
    for topic in (f"{prefix}-1", f"{prefix}-2", unique("other")):
        producer = official.create_producer(topic)
        producer.send(topic.encode())
        producer.close()
    got = sorted(drain(consumer.receive, 1000))
    assert got == [f"{prefix}-1".encode(), f"{prefix}-2".encode()]
    consumer.close()


def test_get_topics_of_namespace_modes_pattern_and_hash(broker):
    Mode = pb.CommandGetTopicsOfNamespace
    prefix = unique("gtn")
    full = f"persistent://public/default/{prefix}"
    broker.call(broker.broker.create_partitioned_topic, f"{full}-parted", 2)

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            for name in (f"{prefix}-a", f"{prefix}-b", f"non-persistent://public/default/{prefix}-np",
                         f"persistent://pulsar/ns/{prefix}-elsewhere"):
                await (await client.create_producer(name)).close()
            pool = client._pool
            persistent = (await pool.topics_of_namespace("public/default", Mode.PERSISTENT)).topics
            assert {f"{full}-a", f"{full}-b", f"{full}-parted-partition-0", f"{full}-parted-partition-1"} <= \
                set(persistent)
            assert not any(t.startswith("non-persistent://") or "elsewhere" in t for t in persistent)
            non_persistent = (await pool.topics_of_namespace("public/default", Mode.NON_PERSISTENT)).topics
            assert list(non_persistent) == [f"non-persistent://public/default/{prefix}-np"]
            every = (await pool.topics_of_namespace("public/default", Mode.ALL)).topics
            assert set(every) == set(persistent) | set(non_persistent)
            filtered = await pool.topics_of_namespace("public/default", Mode.PERSISTENT,
                                                      f"persistent://public/default/{prefix}-[ab]")
            assert filtered.filtered and list(filtered.topics) == [f"{full}-a", f"{full}-b"]
            again = await pool.topics_of_namespace("public/default", Mode.PERSISTENT,
                                                   f"persistent://public/default/{prefix}-[ab]",
                                                   filtered.topics_hash)
            assert not again.changed and list(again.topics) == []
            # a pattern Python cannot compile, or one that could backtrack for ages: the client filters
            for pattern in ("public/default/(", "public/default/(a+)+b", "public/default/a*a*a*a*a*b"):
                unfiltered = await pool.topics_of_namespace("public/default", Mode.PERSISTENT, pattern)
                assert not unfiltered.filtered and set(unfiltered.topics) == set(persistent)
            with pytest.raises(errors.InvalidTopicNameError):
                await pool.topics_of_namespace("no-namespace", Mode.PERSISTENT)
    run(main())


def test_pulsarwire_pattern_subscription_discovers_new_topics(broker):
    prefix = unique("orders")

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            for name in (f"{prefix}-1", unique("other")):
                await (await client.create_producer(name)).close()
            by_regex = await client.subscribe(re.compile(f"persistent://public/default/{prefix}-.*"), "regex",
                                              initial_position=pw.InitialPosition.Earliest,
                                              pattern_auto_discovery_period=0.2)
            by_keyword = await client.subscribe(topics_pattern=f"public/default/{prefix}-[0-9]+",
                                                subscription_name="keyword",
                                                initial_position=pw.InitialPosition.Earliest,
                                                pattern_auto_discovery_period=0.2)
            assert by_regex.topics() == [f"persistent://public/default/{prefix}-1"]
            for name in (f"{prefix}-1", f"{prefix}-2", unique("other")):
                producer = await client.create_producer(name)
                await producer.send(name.encode())
                await producer.close()
            for consumer in (by_regex, by_keyword):
                got = sorted([(await consumer.receive(5000)).data() for _ in range(2)])
                assert got == [f"{prefix}-1".encode(), f"{prefix}-2".encode()]
                with pytest.raises(errors.TimeoutError):
                    await consumer.receive(300)
            assert len(by_regex.topics()) == 2
            await by_regex.close()
            await by_keyword.close()
    run(main())


def test_pulsarwire_pattern_subscription_sees_partitioned_topics(broker):
    prefix = unique("parted")
    broker.call(broker.broker.create_partitioned_topic, f"persistent://public/default/{prefix}-x", 2)

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            consumer = await client.subscribe(re.compile(f"{prefix}-.*"), "sub",
                                              initial_position=pw.InitialPosition.Earliest)
            producer = await client.create_producer(f"{prefix}-x", batching_enabled=False)
            sent = {(await producer.send(b"%d" % i)).partition for i in range(4)}
            assert sent == {0, 1}
            got = [await consumer.receive(5000) for _ in range(4)]
            assert sorted(m.data() for m in got) == [b"0", b"1", b"2", b"3"]
            assert {m.message_id().partition for m in got} == {0, 1}
            for m in got:
                consumer.acknowledge(m)
            await consumer.close()
    run(main())


def test_topics_pattern_parsing():
    pattern = pw.options.TopicsPattern.parse("orders-.*")
    assert (pattern.namespace, pattern.text) == ("public/default", "persistent://public/default/orders-.*")
    assert pattern.matches("persistent://public/default/orders-1")
    assert not pattern.matches("persistent://public/default/xorders-1")
    assert pw.options.TopicsPattern.parse(re.compile("t/n/a.*", re.I)).matches("persistent://t/n/ABC")
    with pytest.raises(ValueError):
        pw.options.TopicsPattern.parse("persistent://only-tenant")


# -- Key_Shared sticky hash ranges --------------------------------------------------------------

def _slot(key: str) -> int:
    return murmur3_32(key.encode()) % 65536


def test_pulsarwire_key_shared_sticky_ranges(broker):
    topic = unique("sticky")
    keys = [f"key-{i}" for i in range(40)]
    low = pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(0, 32767)])
    high = pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(32768, 49999), (50000, 65535)])

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            options = dict(consumer_type=pw.ConsumerType.KeyShared, initial_position=pw.InitialPosition.Earliest)
            first = await client.subscribe(topic, "ks", key_shared_policy=low, **options)
            with pytest.raises(errors.ConsumerAssignError):
                await client.subscribe(topic, "ks", key_shared_policy=pw.KeySharedPolicy(
                    pw.KeySharedMode.Sticky, sticky_ranges=[(30000, 40000)]), **options)
            with pytest.raises(errors.ConsumerAssignError):  # auto-split cannot join a sticky subscription
                await client.subscribe(topic, "ks", **options)
            producer = await client.create_producer(topic, batching_enabled=False)
            for i, key in enumerate(keys * 3):
                await producer.send(b"%d" % i, partition_key=key)
            low_keys = [k for k in keys if _slot(k) <= 32767]
            got_first = [await first.receive(5000) for _ in range(3 * len(low_keys))]
            with pytest.raises(errors.TimeoutError):  # the other keys wait for an owner
                await first.receive(300)
            second = await client.subscribe(topic, "ks", key_shared_policy=high, **options)
            got_second = [await second.receive(5000) for _ in range(3 * (len(keys) - len(low_keys)))]
            assert {m.partition_key() for m in got_first} == set(low_keys)
            assert all(_slot(m.partition_key()) >= 32768 for m in got_second)
            per_key = {}
            for m in got_second:  # each key's messages in order
                per_key.setdefault(m.partition_key(), []).append(int(m.data()))
            assert all(v == sorted(v) for v in per_key.values())
            await producer.close()
            await first.close()
            await second.close()
    run(main())


def test_official_key_shared_sticky_ranges_on_embedded_broker(official):
    topic = unique("sticky-official")
    policy = pulsar.ConsumerKeySharedPolicy(pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 20000)])
    consumer = official.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                                  key_shared_policy=policy)
    with pytest.raises(pulsar.ConsumerAssignError):
        official.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                           key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                               pulsar.KeySharedMode.Sticky, sticky_ranges=[(20000, 30000)]))
    producer = official.create_producer(topic)
    keys = [f"k{i}" for i in range(30)]
    for key in keys:
        producer.send(key.encode(), partition_key=key)
    got = [m.decode() for m in drain(consumer.receive)]
    assert sorted(got) == sorted(k for k in keys if _slot(k) <= 20000)
    consumer.close()


def test_key_shared_policy_validation():
    with pytest.raises(ValueError):
        pw.KeySharedPolicy(pw.KeySharedMode.Sticky)
    with pytest.raises(ValueError):
        pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(0, 70000)])
    with pytest.raises(ValueError):
        pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(0, 10), (10, 20)])
    meta = pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(5, 9)]).to_proto()
    assert meta.keySharedMode == pb.STICKY and [(r.start, r.end) for r in meta.hashRanges] == [(5, 9)]


def test_key_shared_many_interleaved_sticky_ranges(broker):
    topic = unique("sticky-many")
    evens = [(2 * i, 2 * i) for i in range(20000)]
    odds = [(2 * i + 1, 2 * i + 1) for i in range(20000)]

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            options = dict(consumer_type=pw.ConsumerType.KeyShared, initial_position=pw.InitialPosition.Earliest)
            even = await client.subscribe(topic, "ks", key_shared_policy=pw.KeySharedPolicy(
                pw.KeySharedMode.Sticky, sticky_ranges=evens), **options)
            odd = await client.subscribe(topic, "ks", key_shared_policy=pw.KeySharedPolicy(
                pw.KeySharedMode.Sticky, sticky_ranges=odds + [(40000, 65535)]), **options)
            with pytest.raises(errors.ConsumerAssignError):
                await client.subscribe(topic, "ks", key_shared_policy=pw.KeySharedPolicy(
                    pw.KeySharedMode.Sticky, sticky_ranges=[(39998, 39998)]), **options)
            producer = await client.create_producer(topic, batching_enabled=False)
            keys = [f"k{i}" for i in range(60)]
            for key in keys:
                await producer.send(key.encode(), partition_key=key)
            low_even = [k for k in keys if _slot(k) < 40000 and _slot(k) % 2 == 0]
            got_even = sorted([(await even.receive(5000)).data().decode() for _ in low_even])
            got_odd = sorted([(await odd.receive(5000)).data().decode() for _ in range(len(keys) - len(low_even))])
            assert got_even == sorted(low_even)
            assert sorted(got_even + got_odd) == sorted(keys)
            for c in (even, odd):
                await c.close()
            await producer.close()
    run(main())


def test_ledger_allocation_survives_a_lost_allocation_file(tmp_path):
    from pulsarwire.broker.core import BrokerCore
    core = BrokerCore(str(tmp_path))
    core.open()
    first = core.topic("persistent://public/default/a").ledger_id
    second = core.topic("persistent://public/default/b").ledger_id
    core.close()
    os.remove(tmp_path / "ledger-ids.json")  # what is on disk still tells the highest id given out
    core = BrokerCore(str(tmp_path))
    core.open()
    assert core.topic("persistent://public/default/a").ledger_id == first
    third = core.topic("persistent://public/default/c").ledger_id
    assert len({first, second, third}) == 3 and third > max(first, second)
    core.close()


def test_key_shared_sticky_keys_of_a_leaving_consumer_wait_for_a_new_owner(broker):
    topic = unique("sticky-leave")
    low = pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(0, 32767)])
    high = pw.KeySharedPolicy(pw.KeySharedMode.Sticky, sticky_ranges=[(32768, 65535)])
    keys = [f"key-{i}" for i in range(20)]
    high_keys = [k for k in keys if _slot(k) >= 32768]

    async def main():
        async with pw.Client(broker.url, operation_timeout_seconds=10) as client:
            options = dict(consumer_type=pw.ConsumerType.KeyShared, initial_position=pw.InitialPosition.Earliest)
            first = await client.subscribe(topic, "ks", key_shared_policy=low, **options)
            leaving = await client.subscribe(topic, "ks", key_shared_policy=high, **options)
            producer = await client.create_producer(topic, batching_enabled=False)
            for i, key in enumerate(keys):
                await producer.send(b"%d" % i, partition_key=key)
            unacked = [await leaving.receive(5000) for _ in high_keys]  # received, never acknowledged
            assert {m.partition_key() for m in unacked} == set(high_keys)
            await leaving.close()
            for i, key in enumerate(keys, start=len(keys)):
                await producer.send(b"%d" % i, partition_key=key)
            low_count = 2 * (len(keys) - len(high_keys))
            got_low = [await first.receive(5000) for _ in range(low_count)]
            assert all(_slot(m.partition_key()) <= 32767 for m in got_low)
            with pytest.raises(errors.TimeoutError):
                await first.receive(300)
            successor = await client.subscribe(topic, "ks", key_shared_policy=high, **options)
            got = [await successor.receive(5000) for _ in range(2 * len(high_keys))]
            per_key = {}
            for m in got:
                per_key.setdefault(m.partition_key(), []).append(int(m.data()))
            assert set(per_key) == set(high_keys)
            assert all(len(v) == 2 and v == sorted(v) for v in per_key.values())  # nothing lost, order kept
            await producer.close()
            await first.close()
            await successor.close()
    run(main())
