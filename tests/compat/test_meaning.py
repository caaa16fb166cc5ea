"""Calls that must mean what they mean in the official `pulsar-client` (issue 14, "wrong
meaning"): each scenario runs with the official client against the embedded broker where it
can, and pulsarwire must give the same observable result."""
from __future__ import annotations

import time

import pytest

from pulsarwire import Client, InitialPosition, MessageId, errors

from ..conftest import unique
from ..helpers import client_for, run, wait_until_async

pulsar = pytest.importorskip("pulsar")

EARLIEST = InitialPosition.Earliest


ours = client_for  # pulsarwire's asyncio client, beside the official one


@pytest.fixture
def official(embedded):
    client = pulsar.Client(embedded.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield client
    client.close()


def _value(field):
    return field() if callable(field) else field


def ids_of(mid):
    """(ledger, entry, batch index) of either client's MessageId."""
    return _value(mid.ledger_id), _value(mid.entry_id), _value(mid.batch_index)


def official_drain(consumer, timeout_ms=500):
    got = []
    while True:
        try:
            message = consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return got
        consumer.acknowledge(message)
        got.append(message.data())


async def drain(consumer, timeout_ms=500):
    got = []
    while True:
        try:
            message = await consumer.receive(timeout_ms)
        except errors.TimeoutError:
            return got
        consumer.acknowledge(message)
        got.append(message.data())


# 1. initial_sequence_id ---------------------------------------------------------------------

def test_initial_sequence_id_is_the_last_published_one(embedded, official):
    """The first message takes initial + 1, so a producer restarted with its last acknowledged
    sequence id loses nothing; a duplicate's receipt is (-1, -1), not 2**64 - 1."""
    def with_official(topic):
        consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = official.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=5,
                                            batching_enabled=False)
        first = producer.send(b"first")
        last = producer.last_sequence_id()
        producer.close()
        restarted = official.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=last,
                                             batching_enabled=False)
        after_restart = restarted.send(b"after restart")
        restarted.close()
        stale = official.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=3,
                                         batching_enabled=False)
        duplicate = stale.send(b"duplicate")
        stale_last = stale.last_sequence_id()
        stale.close()
        received = official_drain(consumer)
        return (last, ids_of(first)[1] >= 0, ids_of(after_restart)[1] >= 0, ids_of(duplicate)[:2],
                stale_last, received)

    async def with_ours(topic):
        async with ours(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=5,
                                                    batching_enabled=False)
            first = await producer.send(b"first")
            last = producer.last_sequence_id()
            await producer.close()
            restarted = await client.create_producer(topic, producer_name=f"{topic}-p",
                                                     initial_sequence_id=last, batching_enabled=False)
            after_restart = await restarted.send(b"after restart")
            await restarted.close()
            stale = await client.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=3,
                                                 batching_enabled=False)
            duplicate = await stale.send(b"duplicate")
            stale_last = stale.last_sequence_id()
            await stale.close()
            received = await drain(consumer)
            return (last, ids_of(first)[1] >= 0, ids_of(after_restart)[1] >= 0, ids_of(duplicate)[:2],
                    stale_last, received)

    deduplicated = [unique("seq"), unique("seq")]
    for topic in deduplicated:  # a duplicate is dropped only where deduplication is on, as in Pulsar
        embedded.set_policy("deduplicationEnabled", True, topic=topic)
    expected = with_official(deduplicated[0])
    assert expected == (6, True, True, (-1, -1), 4, [b"first", b"after restart"])
    assert run(with_ours(deduplicated[1])) == expected


def test_initial_sequence_id_zero_leaves_the_broker_in_charge(embedded, official):
    """The official client treats 0 as unset: a producer comes back after the broker's last id
    (which a broker tells where deduplication is on)."""
    def with_official(topic):
        producer = official.create_producer(topic, producer_name=f"{topic}-p", batching_enabled=False)
        for i in range(3):
            producer.send(b"%d" % i)
        producer.close()
        again = official.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=0,
                                         batching_enabled=False)
        mid = again.send(b"next")
        result = again.last_sequence_id(), ids_of(mid)[1]
        again.close()
        return result

    async def with_ours(topic):
        async with ours(embedded) as client:
            producer = await client.create_producer(topic, producer_name=f"{topic}-p", batching_enabled=False)
            for i in range(3):
                await producer.send(b"%d" % i)
            await producer.close()
            again = await client.create_producer(topic, producer_name=f"{topic}-p", initial_sequence_id=0,
                                                 batching_enabled=False)
            mid = await again.send(b"next")
            return again.last_sequence_id(), ids_of(mid)[1]

    deduplicated = [unique("seq0"), unique("seq0")]
    for topic in deduplicated:  # the broker tells a producer its last id only with deduplication on
        embedded.set_policy("deduplicationEnabled", True, topic=topic)
    expected = with_official(deduplicated[0])
    assert expected == (3, 3)
    assert run(with_ours(deduplicated[1])) == expected


# 4. batched send ids -------------------------------------------------------------------------

def test_batched_send_returns_the_id_the_consumer_sees(embedded, official):
    """With batching on, even a batch of one carries batch index 0, on send and on receive."""
    def with_official(topic):
        consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = official.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                            batching_max_publish_delay_ms=200)
        sent = [producer.send(b"alone")]
        later = []
        for i in range(3):
            producer.send_async(b"%d" % i, lambda result, mid: later.append(mid))
        producer.flush()
        deadline = time.monotonic() + 5  # its callbacks run on its own thread, maybe after flush returns
        while len(later) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        sent += sorted(later, key=ids_of)
        received = [consumer.receive(5000).message_id() for _ in range(4)]
        return [ids_of(m) for m in sent], [ids_of(m) for m in received]

    async def with_ours(topic):
        async with ours(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                                    batching_max_publish_delay_ms=200)
            sent = [await producer.send(b"alone")]
            futures = [await producer.send_async(b"%d" % i) for i in range(3)]
            await producer.flush()
            sent += [f.result() for f in futures]
            received = [(await consumer.receive(5000)).message_id() for _ in range(4)]
            assert sent == received  # MessageId equality too, not only the numbers
            return [ids_of(m) for m in sent], [ids_of(m) for m in received]

    official_sent, official_received = with_official(unique("batchid"))
    assert official_sent == official_received
    assert official_sent[0][1:] == (0, 0)
    our_sent, our_received = run(with_ours(unique("batchid")))
    assert our_sent == our_received
    # ledger ids are unique per broker, so each topic has its own: compare entry and batch index
    assert [m[1:] for m in our_sent] == [m[1:] for m in official_sent]


# 2. seek -------------------------------------------------------------------------------------

def _sorted_ids(ids):
    return sorted(ids, key=ids_of)


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_consumer_seek_is_exclusive_unless_inclusive(embedded, official, batching, inclusive):
    def with_official(topic):
        producer = official.create_producer(topic, batching_enabled=batching, batching_max_messages=2)
        ids = []
        for i in range(6):
            producer.send_async(b"%d" % i, lambda result, mid: ids.append(mid))
        producer.flush()
        deadline = time.monotonic() + 5  # its callbacks run on its own thread, maybe after flush returns
        while len(ids) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        ids = _sorted_ids(ids)
        consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest,
                                      start_message_id_inclusive=inclusive)
        first = [consumer.receive(5000) for _ in range(6)]
        for message in first:
            consumer.acknowledge(message)
        consumer.seek(ids[2])
        return [m.data() for m in first], official_drain(consumer, 700)

    async def with_ours(topic):
        async with ours(embedded) as client:
            producer = await client.create_producer(topic, batching_enabled=batching, batching_max_messages=2)
            futures = [await producer.send_async(b"%d" % i) for i in range(6)]
            await producer.flush()
            ids = [f.result() for f in futures]
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST,
                                              start_message_id_inclusive=inclusive)
            first = [await consumer.receive(5000) for _ in range(6)]
            for message in first:
                consumer.acknowledge(message)
            await consumer.seek(ids[2])
            after = await drain(consumer, 700)
            await consumer.close()
            again = await client.subscribe(topic, "s")
            # pulsarwire acknowledges what a seek skips, so it does not come back later
            assert await drain(again, 300) == []
            return [m.data() for m in first], after

    expected = with_official(unique("seek"))
    assert expected == ([b"0", b"1", b"2", b"3", b"4", b"5"],
                        [b"2", b"3", b"4", b"5"] if inclusive else [b"3", b"4", b"5"])
    assert run(with_ours(unique("seek"))) == expected


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_reader_keeps_its_inclusiveness_after_seek(embedded, batching, inclusive):
    """start_message_id_inclusive decides for the start and for every seek after it."""
    async def main(topic):
        async with ours(embedded) as client:
            producer = await client.create_producer(topic, batching_enabled=batching, batching_max_messages=2)
            futures = [await producer.send_async(b"%d" % i) for i in range(6)]
            await producer.flush()
            ids = [f.result() for f in futures]
            reader = await client.create_reader(topic, ids[1], start_message_id_inclusive=inclusive)
            first = (await reader.read_next(5000)).data()
            await reader.seek(ids[3])
            after_seek = [(await reader.read_next(5000)).data() for _ in range(3 if inclusive else 2)]
            with pytest.raises(errors.TimeoutError):
                await reader.read_next(300)
            await reader.seek(ids[4])
            after_second_seek = (await reader.read_next(5000)).data()
            await reader.seek(MessageId.earliest)
            from_earliest = (await reader.read_next(5000)).data()
            return first, after_seek, after_second_seek, from_earliest

    first, after_seek, after_second_seek, from_earliest = run(main(unique("rseek")))
    assert first == (b"1" if inclusive else b"2")
    assert after_seek == ([b"3", b"4", b"5"] if inclusive else [b"4", b"5"])
    assert after_second_seek == (b"4" if inclusive else b"5")
    assert from_earliest == b"0"


# 3. redelivery after grouped acks --------------------------------------------------------------

@pytest.mark.parametrize("consumer_type", ["Exclusive", "Shared"])
def test_redeliver_unacknowledged_keeps_what_was_just_acknowledged(embedded, official, consumer_type):
    def with_official(topic):
        producer = official.create_producer(topic, batching_enabled=False)
        consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest,
                                      consumer_type=getattr(pulsar.ConsumerType, consumer_type))
        for i in range(4):
            producer.send(b"%d" % i)
        messages = [consumer.receive(5000) for _ in range(4)]
        consumer.acknowledge(messages[0])
        consumer.acknowledge(messages[1])
        consumer.redeliver_unacknowledged_messages()
        return official_drain(consumer, 1000)

    async def with_ours(topic):
        from pulsarwire import ConsumerType
        async with ours(embedded) as client:
            producer = await client.create_producer(topic, batching_enabled=False)
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST, ack_group_time_ms=5000,
                                              consumer_type=getattr(ConsumerType, consumer_type))
            for i in range(4):
                await producer.send(b"%d" % i)
            messages = [await consumer.receive(5000) for _ in range(4)]
            consumer.acknowledge(messages[0])
            consumer.acknowledge(messages[1])
            consumer.redeliver_unacknowledged_messages()
            return await drain(consumer, 1000)

    expected = with_official(unique("redeliver"))
    assert expected == [b"2", b"3"]
    assert run(with_ours(unique("redeliver"))) == expected


# 7. typed errors -------------------------------------------------------------------------------

#: the official exception class -> pulsarwire's
OFFICIAL_TO_OURS = {
    "AlreadyClosed": "AlreadyClosedError",
    "MessageTooBig": "MessageTooBigError",
    "CumulativeAcknowledgementNotAllowedError": "CumulativeAcknowledgementNotAllowedError",
    "Timeout": "TimeoutError",
}


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return type(exc).__name__
    return None


async def _araised(call):
    try:
        await call()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__
    return None


def test_errors_are_typed_as_the_official_ones(embedded):
    topic = unique("typed")
    client = pulsar.Client(embedded.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "s")
    shared = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    producer.send(b"one")
    message = consumer.receive(5000)
    shared_message = shared.receive(5000)
    expected = {
        "too big": _raised(lambda: producer.send(b"x" * (6 * 1024 * 1024))),
        "cumulative on shared": _raised(lambda: shared.acknowledge_cumulative(shared_message)),
        "receive timeout": _raised(lambda: consumer.receive(100)),
    }
    producer.close()
    consumer.close()
    reader.close()
    expected.update({
        "send after close": _raised(lambda: producer.send(b"late")),
        "flush after close": _raised(producer.flush),
        "receive after close": _raised(lambda: consumer.receive(100)),
        "ack after close": _raised(lambda: consumer.acknowledge(message)),
        "seek after close": _raised(lambda: consumer.seek(pulsar.MessageId.earliest)),
        "read after close": _raised(lambda: reader.read_next(100)),
    })
    client.close()
    expected["subscribe after client close"] = _raised(lambda: client.subscribe(topic, "late"))
    expected = {k: OFFICIAL_TO_OURS[v] for k, v in expected.items()}

    async def with_ours():
        async with ours(embedded) as client:
            producer = await client.create_producer(topic, batching_enabled=False)
            consumer = await client.subscribe(topic, "s2")
            shared = await client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared)
            reader = await client.create_reader(topic, MessageId.earliest)
            await producer.send(b"two")
            message = await consumer.receive(5000)
            shared_message = await shared.receive(5000)
            got = {
                "too big": await _araised(lambda: producer.send(b"x" * (6 * 1024 * 1024))),
                "cumulative on shared": _raised(lambda: shared.acknowledge_cumulative(shared_message)),
                "receive timeout": await _araised(lambda: consumer.receive(100)),
            }
            await producer.close()
            await consumer.close()
            await reader.close()
            got.update({
                "send after close": await _araised(lambda: producer.send(b"late")),
                "flush after close": await _araised(producer.flush),
                "receive after close": await _araised(lambda: consumer.receive(100)),
                "ack after close": _raised(lambda: consumer.acknowledge(message)),
                "seek after close": await _araised(lambda: consumer.seek(MessageId.earliest)),
                "read after close": await _araised(lambda: reader.read_next(100)),
            })
        got["subscribe after client close"] = await _araised(lambda: client.subscribe(topic, "late"))
        return got

    from pulsarwire import ConsumerType
    assert run(with_ours()) == expected


def test_blocking_facade_after_close_raises_already_closed(embedded):
    from pulsarwire import blocking
    client = blocking.Client(embedded.url, operation_timeout_seconds=10)
    producer = client.create_producer(unique("closed"))
    consumer = client.subscribe(unique("closed"), "s")
    client.close()
    client.close()  # closing twice is harmless
    with pytest.raises(errors.AlreadyClosedError):
        producer.send(b"late")
    with pytest.raises(errors.AlreadyClosedError):
        consumer.receive(100)
    with pytest.raises(errors.AlreadyClosedError):
        client.create_producer(unique("closed"))


def test_drop_in_facade_after_close_raises_already_closed(embedded):
    from pulsarwire import sync
    client = sync.Client(embedded.url, operation_timeout_seconds=10)
    producer = client.create_producer(unique("closed"))
    consumer = client.subscribe(unique("closed"), "s")
    client.close()
    with pytest.raises(sync.AlreadyClosed):  # as the official client: a second close is refused
        client.close()
    with pytest.raises(errors.AlreadyClosedError):
        producer.send(b"late")
    with pytest.raises(errors.AlreadyClosedError):
        consumer.receive(100)
    with pytest.raises(errors.AlreadyClosedError):
        client.create_producer(unique("closed"))


def test_timeout_error_is_the_builtin_one(embedded):
    assert issubclass(errors.TimeoutError, TimeoutError)
    assert issubclass(errors.AlreadyClosedError, errors.ConnectionClosedError)  # old handlers still catch it

    async def main():
        async with ours(embedded) as client:
            consumer = await client.subscribe(unique("timeout"), "s")
            with pytest.raises(TimeoutError):  # the builtin name catches it
                await consumer.receive(50)
    run(main())


# 5. refused connections -------------------------------------------------------------------------

def test_refused_connection_times_out_after_the_operation_timeout():
    from ..peers import free_port
    url = f"pulsar://127.0.0.1:{free_port()}"  # nothing listens there
    client = pulsar.Client(url, operation_timeout_seconds=1, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    started = time.monotonic()
    with pytest.raises(pulsar.Timeout):
        client.create_producer("nowhere")
    official_took = time.monotonic() - started
    client.close()

    async def main():
        async with Client(url, operation_timeout_seconds=1, initial_backoff_seconds=0.05) as client:
            started = time.monotonic()
            with pytest.raises(errors.ConnectTimeoutError) as caught:
                await client.create_producer("nowhere")
            return time.monotonic() - started, caught.value
    took, error = run(main())
    assert isinstance(error, errors.TimeoutError) and isinstance(error, errors.ConnectError)
    assert 0.8 < official_took < 3 and 0.8 < took < 3  # both retry until the operation timeout


def test_connection_refused_at_first_is_retried(tmp_path):
    """A broker that comes up within the operation timeout is reached, by both clients."""
    import threading

    from ..peers import BrokerThread, free_port

    port = free_port()
    url = f"pulsar://127.0.0.1:{port}"
    broker = BrokerThread(tmp_path, v1_port=None, port=port)
    starter = threading.Timer(1.0, broker.start)
    starter.start()
    try:
        official = pulsar.Client(url, operation_timeout_seconds=15,
                                 logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        official.create_producer("late").send(b"official")
        official.close()
    finally:
        starter.join()
        broker.stop()

    broker = BrokerThread(tmp_path, v1_port=None, port=port)
    starter = threading.Timer(1.0, broker.start)

    async def main():
        async with Client(url, operation_timeout_seconds=15, initial_backoff_seconds=0.05,
                          max_backoff_seconds=0.3) as client:
            starter.start()
            producer = await client.create_producer("late")
            return await producer.send(b"ours")
    try:
        assert run(main()).entry_id >= 0
    finally:
        starter.join()
        broker.stop()


# 6. incomplete chunked messages ----------------------------------------------------------------

CHUNK = 60_000


@pytest.fixture(scope="module")
def small_frames(tmp_path_factory):
    """A broker with a 64 KiB message limit, so chunked messages have small chunks."""
    from ..peers import BrokerThread
    broker = BrokerThread(tmp_path_factory.mktemp("chunks"), v1_port=None, max_message_size=64 * 1024).start()
    yield broker
    broker.stop()


def _publish_first_chunks(broker, topic, count, chunks_per_message=3):
    """`count` chunked messages of which only the first chunk is ever published, then b"done"."""
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb

    async def main():
        async with ours(broker) as client:
            producer = await client.create_producer(topic, producer_name=f"{topic}-chunks", batching_enabled=False)
            part = producer._partitions[0]
            receipts = []
            for i in range(count):
                sequence_id = 1000 + i
                metadata = pb.MessageMetadata(
                    producer_name=part.producer_name, sequence_id=sequence_id, publish_time=int(time.time() * 1000),
                    uuid=f"{part.producer_name}-{sequence_id}", num_chunks_from_msg=chunks_per_message,
                    total_chunk_msg_size=chunks_per_message * CHUNK, chunk_id=0)
                command = pb.BaseCommand(type=pb.BaseCommand.SEND)
                command.send.producer_id = part.producer_id
                command.send.sequence_id = sequence_id
                command.send.num_messages = 1
                command.send.is_chunk = True
                part.conn.write_frame(codec.encode_payload_command(command, metadata, b"c" * CHUNK))
                receipts.append(sequence_id)
            marker = await client.create_producer(topic, batching_enabled=False)
            await marker.send(b"done")  # stored after every first chunk (same connection, in order)
    run(main())


def _backlog(broker, topic, subscription):
    core = broker.broker.core
    return broker.call(lambda: core.topic(f"persistent://public/default/{topic}")
                       .subscriptions[subscription].backlog())


def test_chunk_bounds_default_as_official():
    import inspect
    official = inspect.signature(pulsar.Client.subscribe).parameters
    from pulsarwire.client import Consumer
    our = inspect.signature(Consumer.__init__).parameters
    for name in ("max_pending_chunked_message", "auto_ack_oldest_chunked_message_on_queue_full"):
        assert our[name].default == official[name].default
    assert our["expire_time_of_incomplete_chunked_message_ms"].default == 60_000  # the C++ core's default


@pytest.mark.parametrize("auto_ack", [False, True], ids=["leave-unacked", "auto-ack"])
def test_never_completing_chunked_messages_keep_memory_bounded(small_frames, auto_ack):
    """150 first chunks of messages that never complete: at most max_pending_chunked_message (10)
    are held; the oldest are dropped, acknowledged only with auto_ack_oldest_..., as officially."""
    def with_official(topic):
        client = pulsar.Client(small_frames.url, operation_timeout_seconds=10,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest,
                                    auto_ack_oldest_chunked_message_on_queue_full=auto_ack)
        message = consumer.receive(10_000)
        consumer.acknowledge(message)
        time.sleep(0.5)  # grouped acks go out
        consumer.close()
        client.close()
        return message.data(), _backlog(small_frames, topic, "s")

    async def with_ours(topic):
        async with ours(small_frames) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST,
                                              auto_ack_oldest_chunked_message_on_queue_full=auto_ack)
            message = await consumer.receive(10_000)
            consumer.acknowledge(message)
            held = consumer._partitions[0]._chunks
            buffered = sum(len(payload) for _, parts in held.values() for _, _, payload in parts)
            assert len(held) <= 10 and buffered <= 10 * CHUNK
            assert consumer.dropped_chunked_messages == 140
            await consumer.close()  # sends the acks, then waits for the broker to answer the close
        return message.data(), _backlog(small_frames, topic, "s")

    official_topic, our_topic = unique("chunks"), unique("chunks")
    _publish_first_chunks(small_frames, official_topic, 150)
    _publish_first_chunks(small_frames, our_topic, 150)
    expected = with_official(official_topic)
    # auto-ack: the 140 oldest are acknowledged, the 10 still held stay; otherwise all 150 stay
    assert expected == (b"done", 10 if auto_ack else 150)
    assert run(with_ours(our_topic)) == expected


def test_incomplete_chunked_messages_expire(small_frames):
    topic = unique("expire")
    _publish_first_chunks(small_frames, topic, 3)

    async def main():
        async with ours(small_frames) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST,
                                              expire_time_of_incomplete_chunked_message_ms=300)
            consumer.acknowledge(await consumer.receive(10_000))
            assert len(consumer._partitions[0]._chunks) == 3
            await wait_until_async(lambda: not consumer._partitions[0]._chunks)
            assert len(consumer._partitions[0]._chunks) == 0 and consumer.dropped_chunked_messages == 3
            consumer.flush_acks()
            return await wait_until_async(lambda: _backlog(small_frames, topic, "s") == 0)
    assert run(main()) is True  # expired ones are acknowledged, as the official client does


def test_chunked_messages_still_complete(small_frames):
    topic = unique("whole")

    async def main():
        async with ours(small_frames) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST, max_pending_chunked_message=2)
            producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
            payloads = [bytes([i]) * (3 * CHUNK) for i in range(5)]
            for payload in payloads:
                await producer.send(payload)
            got = [(await consumer.receive(10_000)).data() for _ in payloads]
            return got == payloads and consumer.dropped_chunked_messages == 0
    assert run(main())


def test_a_chunked_message_id_names_its_first_chunk_and_a_reader_can_start_at_it(small_frames):
    """As the official client's chunk message id: the id of a chunked message (as send() returns it
    and as it is received) names its first chunk too, so that a reader starting at it inclusively
    starts at that chunk and reads the message (it started at the last chunk and skipped it), and
    serialize() carries it."""
    topic = unique("chunk-id")

    async def main():
        async with ours(small_frames) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
            big = bytes(range(256)) * (3 * CHUNK // 256)
            await producer.send(b"before")
            sent = await producer.send(big)
            await producer.send(b"after")
            received = [await consumer.receive(10_000) for _ in range(3)]
            got = received[1].message_id()
            assert received[1].data() == big and got == sent and got.first_chunk == sent.first_chunk
            assert sent.first_chunk is not None and sent.first_chunk < (sent.ledger_id, sent.entry_id)
            assert str(sent).startswith(f"({sent.first_chunk[0]},{sent.first_chunk[1]},-1,-1);")
            assert MessageId.deserialize(sent.serialize()).first_chunk == sent.first_chunk
            for start, inclusive, expected in ((sent, True, [big, b"after"]), (sent, False, [b"after"]),
                                               (MessageId.deserialize(got.serialize()), True, [big, b"after"])):
                reader = await client.create_reader(topic, start, start_message_id_inclusive=inclusive)
                assert [(await reader.read_next(10_000)).data() for _ in expected] == expected
                await reader.seek(start)  # back to it: the same
                assert [(await reader.read_next(10_000)).data() for _ in expected] == expected
                await reader.close()
    run(main())


def test_message_over_the_batch_byte_limit_is_a_batch_of_one(embedded, official):
    """The official client still batches it (index 0); a delayed message goes alone (index -1)."""
    import datetime

    def with_official(topic):
        consumer = official.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = official.create_producer(topic, batching_enabled=True, batching_max_allowed_size_in_bytes=1000)
        sent = [producer.send(b"x" * 5000), producer.send(b"y", deliver_after=datetime.timedelta(milliseconds=1))]
        received = [consumer.receive(5000).message_id() for _ in range(2)]
        return [ids_of(m) for m in sent], [ids_of(m) for m in received]

    async def with_ours(topic):
        async with ours(embedded) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, batching_enabled=True,
                                                    batching_max_allowed_size_in_bytes=1000)
            sent = [await producer.send(b"x" * 5000), await producer.send(b"y", deliver_after_ms=1)]
            received = [(await consumer.receive(5000)).message_id() for _ in range(2)]
            return [ids_of(m) for m in sent], [ids_of(m) for m in received]

    expected = with_official(unique("bigbatch"))
    # (ledger, entry, batch index): each topic has its own ledger id, so compare entry and index
    assert [[ids[1:] for ids in side] for side in expected] == [[(0, 0), (1, -1)]] * 2
    got = run(with_ours(unique("bigbatch")))
    assert [[ids[1:] for ids in side] for side in got] == [[ids[1:] for ids in side] for side in expected]
