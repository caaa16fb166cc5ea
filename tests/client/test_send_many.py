"""Producer.send_many: order, receipts in bulk, partitions, errors, dedup across reconnect;
and BatchBuilder.add_many, the codec call under it, in both twins."""
from __future__ import annotations

import asyncio

import pytest

from pulsarwire import Client, InitialPosition, MessageId, MessageIds, blocking, errors

from ..conftest import unique
from ..peers import BrokerProcess, BrokerThread
from ..helpers import client_for, drain, run

EARLIEST = InitialPosition.Earliest


def test_add_many_writes_what_add_writes(twin):
    items = [b"x" * size for size in (0, 1, 127, 128, 300)] * 3 + [(b"tuple",), b"after"]
    built = twin.BatchBuilder()
    assert built.add_many(items, 2, 2**40, 1000, 1 << 20) == 13  # stops before the tuple
    expected = twin.BatchBuilder()
    for offset, payload in enumerate(items[2:15]):
        expected.add(payload, sequence_id=2**40 + offset)
    assert built.build() == expected.build() and built.num_messages == 13 and built.size == expected.size
    limited = twin.BatchBuilder()
    assert limited.add_many(items, 0, 0, 4, 1 << 20) == 4  # max_messages reached
    assert limited.add_many([b"a" * 50, b"b"], 0, 0, 100, 50) == 0  # too large for a batch: left to the caller
    assert limited.add_many([b"a" * 40, b"b"], 0, 0, 100, 50) == 1  # the batch reached max_bytes
    columns = twin.split_columns(__import__("tests.helpers", fromlist=["metadata"]).metadata(count=13),
                                 built.build())
    assert columns.sequence_ids.tolist() == [2**40 + i for i in range(13)]


def test_send_many_order_receipts_and_content(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_max_messages=7)
            plain = [b"m%d" % i for i in range(40)]
            mixed = [((b"k%d" % i, f"key{i % 3}", {"i": str(i)}) + ((1000 + i,) if i % 2 else ()))
                     if i % 4 else bytearray(b"b%d" % i) for i in range(20)]
            first = await producer.send_many(plain)
            second = await producer.send_many(mixed)
            single = await producer.send_async(b"single")
            ids = await first
            more = await second
            assert isinstance(ids, MessageIds) and len(ids) == 40 and len(more) == 20
            every = list(ids) + list(more) + [await single]
            assert every == sorted(every) and len(set(every)) == 61
            assert ids[0].batch_index == 0 and ids[7].batch_index == 0 and ids[8].batch_index == 1
            assert ids[-1] == every[39] and ids[3:5] == every[3:5]
            with pytest.raises(IndexError):
                ids[40]
            messages = await drain(consumer, 61)
            assert [m.data() for m in messages] == plain + [bytes(item[0] if isinstance(item, tuple) else item)
                                                             for item in mixed] + [b"single"]
            for message, item in zip(messages[40:60], mixed):
                if isinstance(item, tuple):
                    assert message.partition_key() == item[1] and message.properties() == item[2]
                    assert message.event_timestamp() == (item[3] if len(item) == 4 else 0)
            assert [m.message_id() for m in messages] == every
            assert [m.sequence_id() for m in messages] == list(range(61))
            assert len(await (await producer.send_many([]))) == 0
    run(main())


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
def test_send_many_partitioned_and_large(embedded, batching):
    topic = "persistent://public/default/" + unique("parted")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 3)

    async def main():
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_enabled=batching,
                                                    batching_max_allowed_size_in_bytes=1000)
            items = [(b"p%d" % i, f"key{i % 5}", None) if i % 2 else b"r%d" % i for i in range(30)]
            items.append(b"L" * 5000)  # over the batch size limit: a batch of one, as the official client
            ids = await (await producer.send_many(items))
            assert len(ids) == 31 and ids[30].batch_index == (0 if batching else -1)
            by_payload = {m.data(): m for m in await drain(consumer, 31)}
            for index, item in enumerate(items):
                payload = item[0] if isinstance(item, tuple) else item
                message = by_payload[payload]
                assert message.message_id() == ids[index]
                assert ids[index].topic == f"{topic}-partition-{ids[index].partition}"
            keyed = {}
            for index in range(1, 30, 2):
                keyed.setdefault(f"key{index % 5}", set()).add(ids[index].partition)
            assert all(len(partitions) == 1 for partitions in keyed.values())
    run(main())


def test_send_many_keyless_payloads_go_round_robin_by_slices(embedded):
    """Plain payloads on a partitioned topic: each call's payloads are cut into one contiguous
    slice per partition (each batched in one codec call), the first partition turning round
    from call to call; receipts stay in input order and nothing is lost or repeated."""
    topic = "persistent://public/default/" + unique("slices")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 4)

    async def main():
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic)
            first = await (await producer.send_many([b"a%03d" % i for i in range(10)]))
            second = await (await producer.send_many([b"b%03d" % i for i in range(10)]))
            single = await (await producer.send_many([b"c"]))
            parts = [m.partition for m in first]
            assert parts == [parts[0]] * 3 + [(parts[0] + 1) % 4] * 3 + [(parts[0] + 2) % 4] * 3 + \
                [(parts[0] + 3) % 4]
            assert second[0].partition == (parts[0] + 1) % 4
            assert single[0].partition == (parts[0] + 2) % 4
            got = {m.data(): m.message_id() for m in await drain(consumer, 21)}
            assert sorted(got) == sorted([b"a%03d" % i for i in range(10)] + [b"b%03d" % i for i in range(10)]
                                         + [b"c"])
            assert [got[b"a%03d" % i] for i in range(10)] == list(first)
    run(main())


def test_send_many_and_send_columns_follow_the_custom_router_and_start_lazy_partitions(embedded):
    topic = "persistent://public/default/" + unique("routed")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 3)

    def last_digit(message, num_partitions):
        return int(message.data()[-1:]) % num_partitions

    async def main():
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic, message_router=last_digit,
                                                    lazy_start_partitioned_producers=True)
            ids = await (await producer.send_many([b"m%d" % i for i in range(6)] + [(b"k4", "key", None)]))
            assert [m.partition for m in ids] == [i % 3 for i in range(6)] + [1]
            assert [m.partition for m in await (await producer.send_columns([b"c2", b"c0"]))] == [2, 0]
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            got = {m.data(): m.message_id().partition for m in await drain(consumer, 9)}
            assert got[b"c2"] == 2 and got[b"c0"] == 0
    run(main())


def test_send_many_bad_items_queue_nothing(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic)
            for bad in ([b"ok", "text"], [b"ok", (b"p", 5)], [(b"p", None, ["x"])], [(b"a", None, None, 1, 2)],
                    [(b"a", None, None, -1)], [(b"a", None, None, "1")]):
                with pytest.raises(TypeError):
                    await producer.send_many(bad)
            assert producer._in_flight == 0 and producer._partitions[0]._batch.num_messages == 0
            await producer.close()
            with pytest.raises(errors.ConnectionClosedError):
                await producer.send_many([b"x"])
    run(main())


def test_send_many_pending_limit_queue_full_and_timeout(tmp_path):
    broker = BrokerThread(tmp_path, v1_port=None).start()

    async def main():
        async with client_for(broker, operation_timeout_seconds=2) as client:
            blocking = await client.create_producer("bounded", max_pending_messages=10)
            ids = await (await blocking.send_many([b"%d" % i for i in range(95)]))  # waits for space 9 times
            assert len(ids) == 95 and blocking._in_flight == 0
            producer = await client.create_producer("q", max_pending_messages=5, block_if_queue_full=False,
                                                    send_timeout_millis=400)
            broker.stop()  # nothing will be acknowledged now
            with pytest.raises(errors.ProducerQueueFullError):
                await producer.send_many([b"a"] * 6)
            assert producer._in_flight == 0
            pending = await producer.send_many([b"a"] * 3)
            producer.flush_batches()
            with pytest.raises(errors.TimeoutError):
                await pending
            assert producer._in_flight == 0
    try:
        run(main())
    finally:
        broker.stop()


def test_send_many_resent_after_broker_restart_is_stored_once(tmp_path):
    broker = BrokerProcess(tmp_path / "data", extra=["--deduplication"]).start()
    count = 3000

    async def main():
        async with Client(broker.url, operation_timeout_seconds=5, initial_backoff_seconds=0.05,
                          max_backoff_seconds=0.5, keep_alive_interval_seconds=1) as client:
            producer = await client.create_producer("crash-many", batching_max_messages=50)
            receipts = []
            for start in range(0, count, 100):
                receipts.append(await producer.send_many([b"msg-%05d" % i for i in range(start, start + 100)]))
                if start == 1000:
                    producer.flush_batches()
                    await asyncio.sleep(0.05)
                    broker.kill()
                    await asyncio.sleep(0.3)
                    broker.start()
                await asyncio.sleep(0.005)
            ids = [mid for r in receipts for mid in await r]
            assert len(ids) == count and ids == sorted(ids) and len(set(ids)) == count
            reader = await client.create_reader("crash-many", MessageId.earliest)
            stored = []
            while await reader.has_message_available():
                message = await reader.read_next(5000)
                stored.append(message.data())
            assert stored == [b"msg-%05d" % i for i in range(count)]
    try:
        run(main(), timeout=120)
    finally:
        broker.stop()


def test_blocking_facade_send_many(embedded):
    topic = unique()
    with blocking.Client(embedded.url) as client:
        consumer = client.subscribe(topic, "s", initial_position=EARLIEST)
        producer = client.create_producer(topic)
        ids = producer.send_many([b"a", (b"b", "k", {"p": "1"})])
        assert len(ids) == 2 and ids[0] < ids[1]
        done = []
        producer.send_many_async([b"c", b"d"], lambda error, message_ids: done.append((error, message_ids)))
        producer.flush()
        assert done and done[0][0] is None and len(done[0][1]) == 2
        got = [consumer.receive(5000) for _ in range(4)]
        assert [m.data() for m in got] == [b"a", b"b", b"c", b"d"] and got[1].partition_key() == "k"
        producer.close()
