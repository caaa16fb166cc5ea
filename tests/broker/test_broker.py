"""Embedded broker: durability across restarts, kill -9 during acknowledged
produce, storage recovery, and protocol edge cases."""
from __future__ import annotations

import asyncio
import os
import threading

import pytest

from pulsarwire import Client, InitialPosition, MessageId, errors
from pulsarwire.broker.storage import Cursor, TopicLog

from ..peers import BrokerProcess, BrokerThread
from ..helpers import run


def test_restart_keeps_messages_cursors_and_partitions(tmp_path):
    broker = BrokerThread(tmp_path, v1_port=None, deduplication=True).start()
    topic = "persistent://public/default/durable"
    broker.call(broker.broker.create_partitioned_topic, topic + "-p", 2)

    async def first():
        async with Client(broker.url) as client:
            consumer = await client.subscribe(topic, "keep", initial_position=InitialPosition.Earliest,
                                              ack_group_time_ms=0)
            producer = await client.create_producer(topic, producer_name="durable-producer")
            for i in range(10):
                await producer.send(b"%d" % i)
            for _ in range(4):
                consumer.acknowledge(await consumer.receive(5000))
            await asyncio.sleep(0.5)  # cursors are persisted on a 0.2 s cadence
            return producer.last_sequence_id()

    last_sequence = run(first())
    broker.restart()

    async def second():
        async with Client(broker.url) as client:
            assert len(await client.get_topic_partitions(topic + "-p")) == 2
            consumer = await client.subscribe(topic, "keep")
            assert (await consumer.receive(5000)).data() == b"4"
            producer = await client.create_producer(topic, producer_name="durable-producer")
            assert producer.last_sequence_id() == last_sequence  # dedup state survived
            reader = await client.create_reader(topic, MessageId.earliest)
            assert (await reader.read_next(5000)).data() == b"0"
    try:
        run(second())
    finally:
        broker.stop()


def test_kill_9_during_acknowledged_produce_loses_nothing(tmp_path):
    """Every message the official client saw acknowledged is there after kill -9."""
    pulsar = pytest.importorskip("pulsar")
    broker = BrokerProcess(tmp_path / "data").start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=5,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    acknowledged: list[bytes] = []
    lock = threading.Lock()

    def on_sent(result, message_id, payload):
        if result == pulsar.Result.Ok:
            with lock:
                acknowledged.append(payload)

    try:
        producer = client.create_producer("kill9", batching_enabled=True, batching_max_messages=20,
                                          send_timeout_millis=3000, block_if_queue_full=True)
        for i in range(3000):
            payload = b"k-%05d" % i
            producer.send_async(payload, lambda r, m, p=payload: on_sent(r, m, p))
            if i == 1500:
                broker.kill()
                break
        with lock:
            survivors = list(acknowledged)
        assert survivors, "nothing was acknowledged before the kill"
    finally:
        try:
            client.close()
        except pulsar.PulsarException:
            pass  # the broker is dead: closing the producer cannot reach it (NotConnected)
    broker.start()

    async def check():
        async with Client(broker.url) as ours:
            reader = await ours.create_reader("kill9", MessageId.earliest)
            stored = set()
            while await reader.has_message_available():
                stored.add((await reader.read_next(5000)).data())
            missing = [p for p in survivors if p not in stored]
            assert not missing, f"{len(missing)} acknowledged messages lost"
    try:
        run(check())
    finally:
        broker.stop()


def test_torn_tail_is_truncated_on_recovery(tmp_path):
    log = TopicLog(str(tmp_path), segment_bytes=4096)
    for i in range(200):
        log.append(b"entry-%d" % i, None, 1000 + i, 1)
    log.close()
    segments = sorted(f for f in os.listdir(tmp_path) if f.endswith(".log"))
    assert len(segments) > 1
    last = tmp_path / segments[-1]
    with open(last, "ab") as fh:
        fh.write(b"\x00\x00\x00\x40" + b"torn")  # a record whose body never made it
    log = TopicLog(str(tmp_path), segment_bytes=4096)
    assert log.next_entry_id == 200
    assert log.read(199).body == b"entry-199"
    assert asyncio.run(log.find_by_publish_time(1100)) == 100
    assert log.append(b"next", None, 5000, 1) == 200
    log.close()
    # an index lost entirely is rebuilt from the log
    for name in os.listdir(tmp_path):
        if name.endswith(".idx"):
            os.remove(tmp_path / name)
    log = TopicLog(str(tmp_path), segment_bytes=4096)
    assert log.next_entry_id == 201 and log.read(57).body == b"entry-57"
    log.close()


def test_corrupted_record_in_the_middle_is_reported(tmp_path):
    log = TopicLog(str(tmp_path))
    for i in range(5):
        log.append(b"entry-%d" % i, None, i, 1)
    log.close()
    path = tmp_path / sorted(f for f in os.listdir(tmp_path) if f.endswith(".log"))[0]
    data = bytearray(path.read_bytes())
    data[25] ^= 0xFF  # inside entry 0's body
    path.write_bytes(bytes(data))
    log = TopicLog(str(tmp_path))
    from pulsarwire.broker.storage import StorageError
    with pytest.raises(StorageError):
        log.read(0)
    assert log.read(4).body == b"entry-4"
    log.close()


def test_cursor_acknowledgement_rules():
    cursor = Cursor()
    cursor.ack(2)
    assert cursor.mark_delete == -1 and cursor.is_acked(2)
    cursor.ack(0)
    cursor.ack(1)
    assert cursor.mark_delete == 2 and not cursor.acked
    cursor.ack_partial(3, 0b110)
    cursor.ack_partial(3, 0b100)
    assert not cursor.is_acked(3) and cursor.partial[3] == 0b100
    cursor.ack_partial(3, 0)
    assert cursor.mark_delete == 3
    cursor.ack_cumulative(10)
    assert cursor.is_acked(7) and not cursor.is_acked(11)
    assert Cursor.from_json(cursor.to_json()).mark_delete == 10


def test_protocol_errors_on_the_wire(tmp_path):
    """Raw bytes at the broker: commands before CONNECT, garbage, unknown producer ids."""
    import socket
    import struct

    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb

    broker = BrokerThread(tmp_path, v1_port=None).start()
    try:
        with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as s:
            s.sendall(codec.encode_command(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())))
            assert s.recv(100) == b""  # closed: nothing allowed before CONNECT
        with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as s:
            s.sendall(struct.pack(">I", 0x7FFFFFFF))
            assert s.recv(100) == b""  # closed: frame over the limit
        with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as s:
            reader = codec.FrameReader()
            connect = pb.BaseCommand(type=pb.BaseCommand.CONNECT,
                                     connect=pb.CommandConnect(client_version="raw", protocol_version=21))
            send = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(producer_id=99, sequence_id=0))
            md = pb.MessageMetadata(producer_name="x", sequence_id=0, publish_time=1)
            s.sendall(codec.encode_command(connect) + codec.encode_payload_command(send, md, b"?"))
            frames = []
            while len(frames) < 2:
                reader.feed(s.recv(4096))
                frames.extend(reader)
            assert frames[0].type == pb.BaseCommand.CONNECTED
            assert frames[1].type == pb.BaseCommand.SEND_ERROR
    finally:
        broker.stop()
    with pytest.raises(errors.PulsarWireError):
        raise errors.ProtocolError("typed")


def test_a_partitioned_topic_gains_partitions_but_never_loses_them(tmp_path):
    from pulsarwire.broker.core import BrokerCore
    topic = "persistent://public/default/parted"
    core = BrokerCore(str(tmp_path))
    core.open()
    core.create_partitioned_topic(topic, 3)
    core.create_partitioned_topic(topic, 3)  # the same count again is fine
    with pytest.raises(ValueError, match="never removed"):
        core.create_partitioned_topic(topic, 2)  # partition 2's messages would become unreachable
    core.create_partitioned_topic(topic, 5)
    core.close()
    core = BrokerCore(str(tmp_path))
    core.open()
    assert core.partitions_of(topic) == 5
    core.close()


def test_a_subscription_survives_kill_9_right_after_it_was_made(tmp_path):
    """A subscription is on disk once its subscribe is answered: after kill -9, it is not made
    again at its initial position (Latest), which would skip what was published meanwhile."""
    broker = BrokerProcess(tmp_path / "data").start()

    async def before_the_kill():
        async with Client(broker.url) as client:
            await client.subscribe("subkill", "s")  # Latest: starts at the end, which is empty
            producer = await client.create_producer("subkill", batching_enabled=False)
            await producer.send(b"1")
            await producer.send(b"2")
            broker.kill()  # before the 0.2 s round that writes changed cursors

    try:
        run(before_the_kill())
    except errors.PulsarWireError:
        pass  # closing against a dead broker
    broker.start()

    async def after_the_restart():
        async with Client(broker.url) as client:
            consumer = await client.subscribe("subkill", "s")
            assert (await consumer.receive(5000)).data() == b"1"
    try:
        run(after_the_restart())
    finally:
        broker.stop()


def test_a_second_broker_on_a_data_dir_in_use_is_refused(tmp_path):
    """Two brokers appending to the same logs lost what one of them acknowledged."""
    from pulsarwire.broker.server import Broker
    from pulsarwire.broker.storage import DataDirInUseError

    async def main():
        async with Broker(str(tmp_path), v1_port=None):
            with pytest.raises(DataDirInUseError, match="in use by another broker"):
                await Broker(str(tmp_path), v1_port=None).start()
        async with Broker(str(tmp_path), v1_port=None) as first:  # free again once the first stopped
            # a broker whose listener cannot start gives the data dir back
            with pytest.raises(OSError):
                await Broker(str(tmp_path / "other"), v1_port=None, port=first.port).start()
            async with Broker(str(tmp_path / "other"), v1_port=None):
                pass
    run(main())


def test_big_entries_reach_the_consumer_whole_whatever_the_socket_takes_of_them(tmp_path, monkeypatch):
    """A consumer's big entry goes to the socket from where it lies (one writev of the frame's
    head and the stored body); whatever part of it the socket takes, none or some of the head,
    some of the body, the rest goes through the transport and the consumer reads every message."""
    real_writev = os.writev
    takes = []  # what each direct write took: none, into the head, into the body, all

    def congested_writev(fd, buffers):
        head, body = buffers
        kind = len(takes) % 4
        takes.append(kind)
        if kind == 0:
            raise BlockingIOError
        if kind == 1:
            return os.write(fd, bytes(head[:7]))
        if kind == 2:
            return os.write(fd, bytes(head) + bytes(body[:1000]))
        return real_writev(fd, buffers)
    monkeypatch.setattr(os, "writev", congested_writev)
    broker = BrokerThread(tmp_path, v1_port=None).start()
    topic = "persistent://public/default/big-entries"
    big = [os.urandom(300_000) for _ in range(6)]
    small = [os.urandom(1024) for _ in range(2000)]

    async def go():
        async with Client(broker.url) as client:
            alone = await client.create_producer(topic, batching_enabled=False)
            for value in big:
                await alone.send(value)
            batched = await client.create_producer(topic, batching_max_messages=1000,
                                                   batching_max_publish_delay_ms=1000)
            await asyncio.gather(*(batched.send(value) for value in small))
        async with Client(broker.url) as client:  # a backlog, read on a connection of its own
            consumer = await client.subscribe(topic, "all", initial_position=InitialPosition.Earliest)
            got = [(await consumer.receive(10_000)).data() for _ in range(len(big) + len(small))]
            assert got == big + small
    try:
        run(go())
    finally:
        broker.stop()
    assert {0, 1, 2, 3} <= set(takes)
