"""The asyncio client end to end against the embedded broker."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from pulsarwire import (
    AuthenticationToken, Client, CompressionType, ConsumerType, HashingScheme, InitialPosition,
    MessageId, RoutingMode, errors, sync,
)
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.routing import java_string_hash, murmur3_32_hash

from ..conftest import unique
from ..helpers import client_for, drain, run, self_signed_certificate

EARLIEST = InitialPosition.Earliest


@pytest.mark.parametrize("compression", list(CompressionType), ids=lambda c: c.name)
@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
def test_round_trip_preserves_everything(embedded, compression, batching):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, compression_type=compression,
                                                    batching_enabled=batching)
            futures = [await producer.send_async(b"payload-%d" % i * (i % 7 + 1), partition_key=f"k{i % 5}",
                                                 properties={"i": str(i), "src": "test"},
                                                 event_timestamp=1_700_000_000_000 + i)
                       for i in range(150)]
            ids = await asyncio.gather(*futures)
            assert len(set(ids)) == 150 and ids == sorted(ids)
            messages = await drain(consumer, 150)
            for i, message in enumerate(messages):
                assert message.data() == b"payload-%d" % i * (i % 7 + 1)
                assert message.partition_key() == f"k{i % 5}"
                assert message.properties() == {"i": str(i), "src": "test"}
                assert message.event_timestamp() == 1_700_000_000_000 + i
                assert message.message_id() == ids[i]
                assert message.publish_timestamp() > 0
            await producer.close()
            await consumer.close()
    run(main())


def test_partitioned_topic_routing(embedded):
    topic = "persistent://public/default/" + unique("parted")
    embedded.call(embedded.broker.create_partitioned_topic, topic, 4)

    async def main():
        async with client_for(embedded) as client:
            assert len(await client.get_topic_partitions(topic)) == 4
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            rr = await client.create_producer(topic, batching_enabled=False)
            ids = [await rr.send(b"rr%d" % i) for i in range(8)]
            assert sorted(mid.partition for mid in ids) == [0, 0, 1, 1, 2, 2, 3, 3]
            for scheme, fn in ((HashingScheme.JavaStringHash, java_string_hash),
                               (HashingScheme.Murmur3_32Hash, murmur3_32_hash)):
                keyed = await client.create_producer(topic, hashing_scheme=scheme,
                                                     message_routing_mode=RoutingMode.RoundRobinPartition)
                for key in ("alpha", "beta", "gamma", "δέλτα"):
                    mid = await keyed.send(key.encode(), partition_key=key)
                    assert mid.partition == fn(key) % 4
            messages = await drain(consumer, 16)
            assert {m.topic_name() for m in messages} == {f"{topic}-partition-{i}" for i in range(4)}
    run(main())


def test_hash_functions_match_java():
    # Java: "hello".hashCode() == 99162322; murmur3_32("hello", seed 0) == 0x248bfa47
    assert java_string_hash("hello") == 99162322
    assert murmur3_32_hash("hello") == 0x248BFA47 & 0x7FFFFFFF
    assert java_string_hash("") == 0


def test_exclusive_subscription_rejects_second_consumer(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            await client.subscribe(topic, "x")
            with pytest.raises(errors.ConsumerBusyError):
                await client.subscribe(topic, "x")
    run(main())


def test_shared_subscription_spreads_and_key_shared_keeps_keys(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            a = await client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared,
                                       receiver_queue_size=10)
            b = await client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared,
                                       receiver_queue_size=10)
            ka = await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared)
            kb = await client.subscribe(topic, "ks", consumer_type=ConsumerType.KeyShared)
            producer = await client.create_producer(topic, batching_enabled=False)
            for i in range(40):
                await producer.send(b"%d" % i, partition_key=f"key{i % 8}")
            got_a = await a.receive_many(100, 2000)
            got_b = await b.receive_many(100, 2000)
            while len(got_a) + len(got_b) < 40:
                got_a += await a.receive_many(100, 500)
                got_b += await b.receive_many(100, 500)
                for m in got_a + got_b:
                    (a if m in got_a else b).acknowledge(m)
            assert got_a and got_b
            seen: dict[str, str] = {}
            total = 0
            for name, consumer in (("a", ka), ("b", kb)):
                while True:
                    batch = await consumer.receive_many(100, 1000)
                    if not batch:
                        break
                    total += len(batch)
                    for m in batch:
                        assert seen.setdefault(m.partition_key(), name) == name
                        consumer.acknowledge(m)
            assert total == 40
    run(main())


def test_failover_has_one_active_consumer(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            first = await client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover, consumer_name="a")
            second = await client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover, consumer_name="b")
            producer = await client.create_producer(topic)
            for i in range(10):
                await producer.send(b"%d" % i)
            got = await first.receive_many(100, 2000)
            assert len(got) == 10
            assert await second.receive_many(100, 300) == []
            for m in got:
                first.acknowledge(m)
            await first.close()
            await producer.send(b"after")
            assert (await second.receive(5000)).data() == b"after"
    run(main())


def test_acks_cumulative_batch_index_and_redelivery(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic, batching_max_messages=10)
            futures = [await producer.send_async(b"%d" % i) for i in range(10)]
            ids = await asyncio.gather(*futures)
            assert all(mid.batch_size == 10 for mid in ids)
            consumer = await client.subscribe(topic, "bi", initial_position=EARLIEST,
                                              batch_index_ack_enabled=True, ack_group_time_ms=0)
            messages = await drain(consumer, 10, ack=False)
            for m in messages[:6]:
                consumer.acknowledge(m)
            await consumer.close()
            again = await client.subscribe(topic, "bi", batch_index_ack_enabled=True, ack_group_time_ms=0)
            redelivered = await drain(again, 4, ack=False)
            assert [m.data() for m in redelivered] == [b"6", b"7", b"8", b"9"]
            again.acknowledge_cumulative(redelivered[-1])
            await again.close()
            last = await client.subscribe(topic, "bi")
            assert await last.receive_many(10, 500) == []
            # redeliver_unacknowledged_messages brings back what was received but not acked
            await producer.send(b"x")
            first = await last.receive(5000)
            last.redeliver_unacknowledged_messages()
            assert (await last.receive(5000)).data() == first.data()
    run(main())


def test_negative_ack_and_ack_timeout_redeliver(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "n", negative_ack_redelivery_delay_ms=100,
                                              consumer_type=ConsumerType.Shared)
            producer = await client.create_producer(topic, batching_enabled=False)
            await producer.send(b"retry-me")
            message = await consumer.receive(5000)
            consumer.negative_acknowledge(message)
            again = await consumer.receive(5000)
            assert again.data() == b"retry-me" and again.redelivery_count() >= 1
            consumer.acknowledge(again)

            timed = await client.subscribe(topic, "t", unacked_messages_timeout_ms=300, initial_position=EARLIEST)
            first = await timed.receive(5000)
            second = await timed.receive(5000)
            assert second.data() == first.data() and second.redelivery_count() >= 1
    run(main())


def test_seek_by_id_and_time_and_unsubscribe(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic, batching_enabled=False)
            ids = [await producer.send(b"%d" % i) for i in range(10)]
            consumer = await client.subscribe(topic, "seek", initial_position=EARLIEST)
            await drain(consumer, 10)
            await consumer.seek(ids[3])  # exclusive, as the official client's default
            assert (await consumer.receive(5000)).data() == b"4"
            await consumer.seek(MessageId.earliest)
            assert (await consumer.receive(5000)).data() == b"0"
            await consumer.seek(int(time.time() * 1000) + 60_000)
            assert await consumer.receive_many(10, 300) == []
            await consumer.unsubscribe()
            fresh = await client.subscribe(topic, "seek", initial_position=EARLIEST)
            assert (await fresh.receive(5000)).data() == b"0"
    run(main())


def test_reader_and_last_message_id(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic, batching_max_messages=5)
            ids = await asyncio.gather(*[await producer.send_async(b"%d" % i) for i in range(12)])
            await producer.flush()
            reader = await client.create_reader(topic, MessageId.earliest)
            got = []
            while await reader.has_message_available():
                got.append((await reader.read_next(5000)).data())
            assert got == [b"%d" % i for i in range(12)]
            from_middle = await client.create_reader(topic, ids[6])
            assert (await from_middle.read_next(5000)).data() == b"7"
            inclusive = await client.create_reader(topic, ids[6], start_message_id_inclusive=True)
            assert (await inclusive.read_next(5000)).data() == b"6"
            latest = await client.create_reader(topic, MessageId.latest)
            assert not await latest.has_message_available()
            consumer = await client.subscribe(topic, "last")
            last = await consumer.get_last_message_id()
            assert (last.ledger_id, last.entry_id) == (ids[-1].ledger_id, ids[-1].entry_id)
    run(main())


def test_end_of_topic_ends_iteration(embedded):
    async def main():
        topic = "persistent://public/default/" + unique("term")
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic)
            for i in range(3):
                await producer.send(b"%d" % i)
            embedded.call(embedded.broker.terminate_topic, topic)
            consumer = await client.subscribe(topic, "end", initial_position=EARLIEST)
            seen = [m.data() async for m in consumer]
            assert seen == [b"0", b"1", b"2"]
            with pytest.raises(errors.TopicTerminatedError):
                await producer.send(b"too late")
    run(main())


def test_chunking_large_message(embedded):
    async def main():
        topic = unique()
        big = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # 6 MiB, over the 5 MiB limit
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "c", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True,
                                                    compression_type="LZ4")
            await producer.send(big, properties={"big": "yes"})
            unchunked = await client.create_producer(topic, batching_enabled=False)
            with pytest.raises(errors.PulsarWireError):
                await unchunked.send(big)
            message = await consumer.receive(10000)
            assert message.data() == big and message.properties() == {"big": "yes"}
            consumer.acknowledge(message)
    run(main())


def test_chunking_a_large_compressed_message_sent_without_options(embedded):
    """A send without options takes the producer's encoded-at-once path (codec.encode_send); one too
    big for the broker even compressed falls back to chunks, its metadata saying how it is
    compressed."""
    async def main():
        topic = unique()
        big = os.urandom(6 * 1024 * 1024) + bytes(2 * 1024 * 1024)  # LZ4 packs it, still over 5 MiB
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "c", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True,
                                                    compression_type="LZ4")
            await producer.send(big)
            await producer.send(b"small")
            message = await consumer.receive(10000)
            assert message.data() == big
            assert (await consumer.receive(10000)).data() == b"small"
    run(main())


def test_a_message_too_big_for_the_broker_fails_at_once_and_the_connection_stays(embedded):
    """A batch or chunk frame over the broker's limit made the broker close the connection, and
    the resend after each reconnect met the same fate: a reconnect every 100 ms, forever."""
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "c", initial_position=EARLIEST)
            batching = await client.create_producer(topic, batching_enabled=True)
            with pytest.raises(errors.MessageTooBigError):  # properties past the limit, in a batch
                await asyncio.wait_for(batching.send(b"x", properties={"k": "v" * 6_000_000}), 10)
            big_batch = await client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                                     batching_max_allowed_size_in_bytes=64 * 1024 * 1024)
            halves = [await big_batch.send_async(b"%d" % i * (3 * 1024 * 1024)) for i in range(2)]
            for half in halves:  # two batches: one never grows past the broker's limit
                assert (await asyncio.wait_for(half, 10)).entry_id >= 0
            chunking = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
            big = bytes(range(256)) * (12 * 1024 * 1024 // 256)
            properties = {"k": "p" * 4096}  # every chunk carries them
            await asyncio.wait_for(chunking.send(big, properties=properties), 20)
            with pytest.raises(errors.MessageTooBigError):
                await asyncio.wait_for(chunking.send(b"x", properties={"k": "v" * 6_000_000}), 10)
            await batching.send(b"after")
            got = [(await consumer.receive(10000)) for _ in range(4)]
            assert [len(m.data()) for m in got] == [3 * 1024 * 1024, 3 * 1024 * 1024, len(big), 5]
            assert got[2].data() == big and got[2].properties() == properties
    run(main())


def test_a_sender_waiting_for_room_is_released_when_the_connection_closes(embedded):
    async def main():
        async with client_for(embedded) as client:
            producer = await client.create_producer(unique())
            conn = producer._partitions[0].conn
            conn.pause_writing()  # the transport's buffer is full
            waiting = asyncio.ensure_future(conn.drain())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            conn.abort()
            await asyncio.wait_for(waiting, 2)  # waited forever on a dead connection
            await producer.send(b"after the reconnect")
    run(main())


def test_a_batch_closed_by_its_byte_limit_goes_out_while_send_async_goes_on(embedded):
    """send_async lets the loop write each batch it closes, also one closed by its byte limit
    before the next message opened another (the batch then is not empty): those sat unwritten
    until the pending limit was reached, half the rate at 100 B with batches of 5 000."""
    async def main():
        async with client_for(embedded) as client:
            producer = await client.create_producer(
                unique(), batching_max_messages=5000, batching_max_allowed_size_in_bytes=16 * 1024,
                batching_max_publish_delay_ms=10_000, max_pending_messages=10_000)
            partition = producer._partitions[0]
            futures = [await producer.send_async(bytes(1000)) for _ in range(16 * 3 + 1)]
            # the third batch, closed by the last call, went to the socket before that call
            # returned; before, nothing had been written yet
            assert not partition.conn.session._out  # nothing queued but unwritten
            assert partition._batch.num_messages == 1  # three closed by bytes, the fourth open
            await producer.flush()
            assert len({(await f).entry_id for f in futures}) == 4
    run(main())


def test_a_send_async_cancelled_in_its_wait_sends_nothing_and_one_that_returned_sent_its_message(embedded):
    """The loop runs after a batch that send_async closed at the start of the next call, before
    its message is queued: a task cancelled there has sent nothing. The wait used to come after the
    closing call's own message was queued, and a task cancelled in it got CancelledError for a
    message that was published (a retry sent it twice)."""
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "c", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_max_messages=2,
                                                    batching_max_publish_delay_ms=10_000)
            outcomes: dict[int, object] = {}

            async def sender():
                for i in (1, 2, 3):
                    outcomes[i] = "cancelled"
                    outcomes[i] = await producer.send_async(b"msg-%d" % i)
            task = asyncio.ensure_future(sender())
            await asyncio.sleep(0)  # the task runs to its first wait: msg-2 closed the batch
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert outcomes[3] == "cancelled"
            assert all(isinstance(outcomes[i], asyncio.Future) for i in (1, 2))
            await producer.flush()
            assert [m.data() for m in await consumer.receive_many(10, 2000)] == [b"msg-1", b"msg-2"]
            assert await consumer.receive_many(10, 300) == []
    run(main())


def test_a_send_async_waiting_for_room_when_its_producer_closes_raises_already_closed(embedded):
    """As a call made after close() does (and the official client's AlreadyClosed): it used to
    return a future failing with ConnectionClosedError, which `except AlreadyClosedError` missed."""
    async def main():
        async with client_for(embedded) as client:
            producer = await client.create_producer(unique(), batching_max_publish_delay_ms=200,
                                                    max_pending_messages=1, block_if_queue_full=True)
            first = await producer.send_async(b"first")
            blocked = asyncio.ensure_future(producer.send_async(b"second"))
            await asyncio.sleep(0.01)
            assert not blocked.done()  # waits for room: the first is pending in its batch
            await producer.close()
            assert (await first).entry_id == 0
            with pytest.raises(errors.AlreadyClosedError):
                await blocked
    run(main())


def test_the_message_size_limit_counts_metadata_and_payload_as_the_official_client_does(embedded):
    limit = 5 * 1024 * 1024

    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "c", initial_position=EARLIEST)
            for batching in (False, True):
                producer = await client.create_producer(topic, batching_enabled=batching)
                near = b"n" * (limit - 512)  # fits with its metadata: the official client sends it
                await producer.send(near)
                assert (await consumer.receive(10000)).data() == near
                with pytest.raises(errors.MessageTooBigError):
                    await producer.send(b"o" * (limit - 1))  # with its metadata it does not fit
                await producer.close()
    run(main())


def test_queue_full_and_send_timeout(tmp_path):
    from ..peers import BrokerThread

    broker = BrokerThread(tmp_path, v1_port=None).start()

    async def main():
        async with client_for(broker, operation_timeout_seconds=2) as client:
            producer = await client.create_producer("q", max_pending_messages=2, block_if_queue_full=False,
                                                    batching_enabled=False, send_timeout_millis=400)
            broker.stop()  # nothing will be acknowledged now
            first = await producer.send_async(b"1")
            await producer.send_async(b"2")
            with pytest.raises(errors.ProducerQueueFullError):
                await producer.send_async(b"3")
            with pytest.raises(errors.TimeoutError):
                await first
    try:
        run(main())
    finally:
        broker.stop()


def test_token_auth(tmp_path):
    from ..peers import BrokerThread

    broker = BrokerThread(tmp_path, v1_port=None, auth_tokens={"secret"}).start()

    async def main():
        async with client_for(broker, authentication=AuthenticationToken("secret")) as client:
            producer = await client.create_producer("auth")
            await producer.send(b"ok")
        async with client_for(broker, authentication=AuthenticationToken(lambda: "wrong")) as client:
            with pytest.raises((errors.AuthenticationError, errors.ConnectionClosedError)):
                await client.create_producer("auth")
    try:
        run(main())
    finally:
        broker.stop()


def test_tls(tmp_path):
    import ssl

    from ..peers import BrokerThread

    cert, key = self_signed_certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    broker = BrokerThread(tmp_path / "data", v1_port=None, tls_port=0, ssl_context=context).start()

    async def main():
        url = broker.broker.service_url_tls
        async with Client(url, tls_trust_certs_file_path=str(cert), tls_validate_hostname=True,
                          operation_timeout_seconds=10) as client:
            consumer = await client.subscribe("tls", "s", initial_position=EARLIEST)
            producer = await client.create_producer("tls")
            await producer.send(b"secret")
            assert (await consumer.receive(5000)).data() == b"secret"
        async with Client(url, operation_timeout_seconds=5) as untrusted:
            with pytest.raises(errors.ConnectionClosedError):
                await untrusted.create_producer("tls")
    try:
        run(main())
    finally:
        broker.stop()


def test_blocking_facade(embedded):
    from pulsarwire import blocking  # pulsarwire's own types; `sync` is the official surface
    topic = unique()
    client = blocking.Client(embedded.url, operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(topic, "s", initial_position=EARLIEST)
        producer = client.create_producer(topic)
        results = []
        for i in range(20):
            producer.send_async(b"%d" % i, lambda error, mid: results.append((error, mid)))
        producer.flush()
        assert len(results) == 20 and all(error is None for error, _ in results)
        assert producer.send(b"sync").entry_id >= 0
        received = [consumer.receive(5000) for _ in range(21)]
        assert [m.data() for m in received][-1] == b"sync"
        for m in received:
            consumer.acknowledge(m)
        with pytest.raises(errors.TimeoutError):
            consumer.receive(100)
        producer.send_many([b"many-%d" % i for i in range(5)])
        many = []
        while len(many) < 5:
            batch = consumer.receive_many(10, 5000)  # the asyncio client's call, without await
            assert batch
            many += batch
        assert [m.data() for m in many] == [b"many-%d" % i for i in range(5)]
        assert consumer.receive_many(10, 100) == []
        reader = client.create_reader(topic, MessageId.earliest)
        assert reader.read_next(5000).data() == b"0"
    finally:
        client.close()


def test_bad_arguments_are_typed(embedded):
    async def main():
        with pytest.raises(ValueError):
            Client("ftp://127.0.0.1:1")  # http:// is a service URL too (HTTP lookup)
        async with client_for(embedded) as client:
            producer = await client.create_producer(unique())
            with pytest.raises(TypeError):
                await producer.send("not bytes")
            with pytest.raises(ValueError):
                await client.create_producer(unique(), batching_enabled=True, chunking_enabled=True)
        async with Client("pulsar://127.0.0.1:1", connection_timeout_ms=500, operation_timeout_seconds=1) as client:
            with pytest.raises(errors.ConnectTimeoutError):  # refused until the operation timeout
                await client.create_producer("nowhere")
    run(main())


def test_receive_with_timeout_misses_no_wakeup():
    """A message queued between receive() starting to wait and its waiter existing must wake it."""
    from pulsarwire.client import Consumer
    from pulsarwire.messages import Delivery, Message

    class Owner:
        _last_dequeued = None

        def _message_consumed(self, count):
            pass

    class Unit(Delivery):
        __slots__ = ("owner",)

    async def main():
        client = Client("pulsar://127.0.0.1:1")
        consumer = Consumer(client.context, ["persistent://public/default/t"], "s")
        from pulsarwire import codec
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        (single,) = codec.split_messages(md, b"x")
        unit = Unit(md, 1, 1, -1, "t")
        unit.owner = Owner()
        message = Message(single, unit)
        loop = asyncio.get_running_loop()
        task = loop.create_task(consumer.receive(3000))
        loop.call_soon(consumer._queue.put, message)  # runs after receive() starts waiting
        started = loop.time()
        assert (await task) is message
        assert loop.time() - started < 1.0
    run(main())


def test_deliver_after_is_held_by_shared_subscriptions(embedded):
    async def main():
        topic = unique()
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "delayed", consumer_type=ConsumerType.Shared)
            producer = await client.create_producer(topic)
            loop = asyncio.get_running_loop()
            sent = loop.time()
            await producer.send(b"later", deliver_after_ms=600)
            await producer.send(b"now")
            assert (await consumer.receive(5000)).data() == b"now"
            late = await consumer.receive(5000)
            assert late.data() == b"later" and loop.time() - sent >= 0.55
    run(main())


def test_broker_initiated_close_re_lookups_and_recreates(embedded):
    async def main():
        topic = "persistent://public/default/" + unique("unload")
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST, ack_group_time_ms=0)
            producer = await client.create_producer(topic, batching_enabled=False)
            await producer.send(b"before")
            consumer.acknowledge(await consumer.receive(5000))
            assert embedded.call(embedded.broker.unload_topic, topic) == 2
            await producer.send(b"after")  # queued until the producer is re-created
            assert (await consumer.receive(5000)).data() == b"after"
            assert consumer.is_connected()
    run(main())


def test_lookup_follows_redirects(embedded):
    """A broker that does not own the topic redirects; the client follows to the owner."""
    from pulsarwire import codec

    async def fake_broker(reader, writer):
        frames = codec.FrameReader()
        while data := await reader.read(65536):
            frames.feed(data)
            for frame in frames:
                kind = frame.command.type
                if kind == pb.BaseCommand.CONNECT:
                    reply = pb.BaseCommand(type=pb.BaseCommand.CONNECTED,
                                           connected=pb.CommandConnected(server_version="redirector"))
                elif kind == pb.BaseCommand.LOOKUP:
                    reply = pb.BaseCommand(type=pb.BaseCommand.LOOKUP_RESPONSE, lookupTopicResponse=(
                        pb.CommandLookupTopicResponse(request_id=frame.command.lookupTopic.request_id,
                                                      response=pb.CommandLookupTopicResponse.Redirect,
                                                      brokerServiceUrl=embedded.url, authoritative=True)))
                elif kind == pb.BaseCommand.PARTITIONED_METADATA:
                    reply = pb.BaseCommand(type=pb.BaseCommand.PARTITIONED_METADATA_RESPONSE,
                                           partitionMetadataResponse=pb.CommandPartitionedTopicMetadataResponse(
                                               request_id=frame.command.partitionMetadata.request_id, partitions=0))
                else:
                    continue
                writer.write(codec.encode_command(reply))
        writer.close()

    async def main():
        server = await asyncio.start_server(fake_broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=5) as client:
                topic = unique("redirected")
                consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
                producer = await client.create_producer(topic)
                await producer.send(b"via redirect")
                assert (await consumer.receive(5000)).data() == b"via redirect"
                assert len(client._pool) == 2  # the redirector and the owner, one connection each
        finally:
            server.close()
    run(main())


def test_send_many_entry_reader_and_topics_of_namespace(embedded):
    async def main():
        topic = "persistent://public/default/" + unique("many")
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic, batching_max_messages=4)
            done = await producer.send_columns([b"m%d" % i for i in range(10)],
                                            partition_keys=[f"k{i}" if i % 2 else None for i in range(10)],
                                            properties=[{"i": str(i)} for i in range(10)],
                                            event_timestamps=[None] * 9 + [123])
            await producer.flush()
            assert len(await done) == 10
            assert len(await (await producer.send_columns([]))) == 0
            with pytest.raises(ValueError):
                await producer.send_columns([b"a", b"b"], event_timestamps=[1])
            reader = await client.create_reader(topic, MessageId.earliest)
            got = [await reader.read_next(5000) for _ in range(10)]
            assert [m.data() for m in got] == [b"m%d" % i for i in range(10)]
            assert got[1].partition_key() == "k1" and got[2].partition_key() in (None, "")
            assert got[9].properties() == {"i": "9"} and got[9].event_timestamp() == 123
            with pytest.raises(TypeError):
                await producer.send_columns(["text"])
            # whole entries from entry 1 on (inclusive): 4 + 4 + 2 messages were sent as 3 batches
            entries_reader = await client.create_entry_reader(topic, MessageId(0, 1))
            assert await entries_reader.wait(5)
            entries = entries_reader.take(10)
            while sum(e.num_messages for e in entries) < 6:
                assert await entries_reader.wait(5)
                entries += entries_reader.take(10)
            assert [(e.entry_id, e.num_messages) for e in entries] == [(1, 4), (2, 2)]
            assert topic in await client.get_topics_of_namespace("public/default")
    run(main())


def test_consumer_sends_held_acknowledgements_before_the_permits_that_refill_its_queue(embedded):
    """A broker that dispatches from the acknowledged position when permits arrive (pulsar-lite
    0.2.0) re-sent most of a backlog while acknowledgements waited for their group's timer."""
    async def main():
        topic = unique("ack-order")
        async with client_for(embedded) as client:
            producer = await client.create_producer(topic, batching_enabled=False)  # an ack per message
            await (await producer.send_many([b"m%d" % i for i in range(60)]))
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST, receiver_queue_size=10,
                                              ack_group_time_ms=60_000)
            session = consumer._partitions[0].conn.session
            acknowledged, sent, at_flows = [0], [0], []
            ack, flow = session.ack, session.flow

            def recording_ack(consumer_id, message_ids, *args, **kwargs):
                sent[0] += len(message_ids)
                return ack(consumer_id, message_ids, *args, **kwargs)

            def recording_flow(*args, **kwargs):
                at_flows.append((acknowledged[0], sent[0]))
                return flow(*args, **kwargs)
            session.ack, session.flow = recording_ack, recording_flow
            for _ in range(60):
                consumer.acknowledge(await consumer.receive(5000))
                acknowledged[0] += 1
            # when permits go out, every acknowledgement made before has gone out ahead of them
            assert len(at_flows) >= 5 and all(made == gone for made, gone in at_flows), at_flows
    run(main())


def test_a_producer_compressing_where_it_pays_sends_what_does_not_shrink_uncompressed(embedded):
    import os

    async def main():
        topic = unique()
        noise = [os.urandom(1000) for _ in range(50)]
        text = [b"%d " % i * 300 for i in range(50)]
        async with client_for(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, compression_type="ZSTD", compress_where_it_pays=True,
                                                    batching_max_messages=50)
            for batch in (noise, text):  # after the noise, 15 batches go without trying: a new producer
                await asyncio.gather(*[await producer.send_async(p) for p in batch])
            plain = await client.create_producer(topic, compression_type="ZSTD", compress_where_it_pays=True,
                                                 batching_max_messages=50)
            await asyncio.gather(*[await plain.send_async(p) for p in text])
            single = await client.create_producer(topic, compression_type="ZSTD", compress_where_it_pays=True,
                                                  batching_enabled=False)
            await single.send(noise[0])
            await single.send(text[0])  # skipped: the producer's last try did not pay
            got = await drain(consumer, 152)
            assert [m.data() for m in got] == noise + text + text + [noise[0], text[0]]
            reader = await client.create_entry_reader(topic, got[0].message_id())
            entries = []
            while len(entries) < 5:
                assert await reader.wait(10)
                entries += reader.take(10)
            assert [e.metadata.compression for e in entries] == [pb.NONE, pb.NONE, pb.ZSTD, pb.NONE, pb.NONE]
            assert entries[2].metadata.uncompressed_size > 10 * len(entries[2].payload)
            await reader.close()
    run(main())
