"""Faults: a broker killed and restarted mid-stream, a proxy that drops, stalls,
splits and corrupts traffic, and a peer that sends malformed frames."""
from __future__ import annotations

import asyncio
import random
import struct

import pytest

from pulsarwire import Client, InitialPosition, errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.session import ClientSession, Connected, CorruptMessage

from ..peers import BrokerProcess, BrokerThread, free_port
from ..helpers import run


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 whose behaviour the test changes while traffic flows."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self.split = False
        self.stalled = False
        self.inject_to_client = b""
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.connections = 0

    async def start(self) -> "FaultyProxy":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        self.drop_all()
        self._server.close()
        await self._server.wait_closed()

    def drop_all(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, client_reader, client_writer) -> None:
        self.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers += [client_writer, server_writer]
        try:
            await asyncio.gather(self._pump(client_reader, server_writer, False),
                                 self._pump(server_reader, client_writer, True), return_exceptions=True)
        except asyncio.CancelledError:
            pass

    async def _pump(self, reader, writer, to_client: bool) -> None:
        rng = random.Random(7)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                while self.stalled:
                    await asyncio.sleep(0.02)
                if to_client and self.inject_to_client:
                    data, self.inject_to_client = self.inject_to_client + data, b""
                if self.split:
                    pos = 0
                    while pos < len(data):
                        step = rng.randint(1, 7)
                        writer.write(data[pos:pos + step])
                        pos += step
                        await writer.drain()
                else:
                    writer.write(data)
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()


async def _send_all(producer, count, pause=0.002):
    futures = []
    for i in range(count):
        futures.append(await producer.send_async(b"msg-%05d" % i))
        await asyncio.sleep(pause)
    return await asyncio.gather(*futures)


async def _receive_all(consumer, count, timeout_ms=20000):
    seen: list[bytes] = []
    distinct: set[bytes] = set()
    while len(distinct) < count:
        message = await consumer.receive(timeout_ms)
        consumer.acknowledge(message)
        if message.data() not in distinct:
            distinct.add(message.data())
            seen.append(message.data())
    return seen


def test_broker_killed_and_restarted_mid_stream(tmp_path):
    """kill -9 while producing: every message is delivered, none twice, consumer resumes."""
    broker = BrokerProcess(tmp_path / "data", extra=["--deduplication"]).start()
    count = 1500

    async def main():
        async with Client(broker.url, operation_timeout_seconds=5, initial_backoff_seconds=0.05,
                          max_backoff_seconds=0.5, keep_alive_interval_seconds=1) as client:
            consumer = await client.subscribe("crash", "s", initial_position=InitialPosition.Earliest)
            producer = await client.create_producer("crash", batching_max_messages=50)
            sending = asyncio.ensure_future(_send_all(producer, count, pause=0.001))
            await asyncio.sleep(0.4)
            broker.kill()
            await asyncio.sleep(0.5)
            broker.start()
            ids = await sending
            assert len(ids) == count
            received = await _receive_all(consumer, count)
            assert received == [b"msg-%05d" % i for i in range(count)]
            # the broker deduplicated the resends: the log holds each message once
            reader = await client.create_reader("crash", __import__("pulsarwire").MessageId.earliest)
            stored = []
            while await reader.has_message_available():
                stored.append((await reader.read_next(5000)).data())
            assert stored == [b"msg-%05d" % i for i in range(count)]
    try:
        run(main(), timeout=120)
    finally:
        broker.stop()


def test_proxy_that_drops_stalls_splits_and_corrupts(tmp_path):
    proxy_port = free_port()
    broker = BrokerThread(tmp_path, v1_port=None, advertised_url=f"pulsar://127.0.0.1:{proxy_port}").start()
    count = 600

    async def main():
        proxy = await FaultyProxy(proxy_port, broker.broker.port).start()
        try:
            async with Client(f"pulsar://127.0.0.1:{proxy_port}", operation_timeout_seconds=3,
                              keep_alive_interval_seconds=0.3, initial_backoff_seconds=0.05,
                              max_backoff_seconds=0.3) as client:
                consumer = await client.subscribe("faulty", "s", initial_position=InitialPosition.Earliest)
                producer = await client.create_producer("faulty", batching_max_messages=20)
                receiving = asyncio.ensure_future(_receive_all(consumer, count))
                sending = asyncio.ensure_future(_send_all(producer, count, pause=0.003))
                proxy.split = True
                await asyncio.sleep(0.3)
                proxy.split = False
                proxy.drop_all()                      # both connections die mid-stream
                await asyncio.sleep(0.3)
                proxy.stalled = True                  # a silent peer: keep-alive must notice
                await asyncio.sleep(1.5)
                proxy.drop_all()
                proxy.stalled = False
                await asyncio.sleep(0.3)
                proxy.inject_to_client = struct.pack(">I", 0x7FFFFFFF)  # a frame size no one can honour
                ids = await sending
                received = await receiving
                assert len(ids) == count
                assert received == [b"msg-%05d" % i for i in range(count)]
                assert proxy.connections >= 3
        finally:
            await proxy.stop()
    try:
        run(main(), timeout=120)
    finally:
        broker.stop()


def _frame(command) -> bytes:
    from pulsarwire import codec
    return codec.encode_command(command)


def test_session_rejects_commands_outside_its_state():
    session = ClientSession()
    session.connect()
    with pytest.raises(errors.ProtocolError):
        session.receive_data(_frame(pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT, send_receipt=pb.CommandSendReceipt(
            producer_id=1, sequence_id=1))))
    assert session.state.value == "closed"


def test_session_handshake_ping_and_auth_challenge():
    session = ClientSession(auth_method_name="token", auth_data=lambda: b"t0k")
    session.connect()
    connect = pb.BaseCommand.FromString(session.data_to_send()[8:])
    assert connect.connect.auth_method_name == "token" and connect.connect.auth_data == b"t0k"
    events = session.receive_data(_frame(pb.BaseCommand(
        type=pb.BaseCommand.CONNECTED, connected=pb.CommandConnected(server_version="x", protocol_version=21,
                                                                     max_message_size=1 << 20))))
    assert events == [Connected("x", 21, 1 << 20)]
    session.receive_data(_frame(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())))
    pong = pb.BaseCommand.FromString(session.data_to_send()[8:])
    assert pong.type == pb.BaseCommand.PONG
    session.receive_data(_frame(pb.BaseCommand(type=pb.BaseCommand.AUTH_CHALLENGE,
                                               authChallenge=pb.CommandAuthChallenge())))
    answer = pb.BaseCommand.FromString(session.data_to_send()[8:])
    assert answer.authResponse.response.auth_data == b"t0k"


def test_session_maps_errors_and_reports_corrupt_messages():
    from pulsarwire import codec
    from pulsarwire.session import RequestFailed

    session = ClientSession()
    session.connect()
    session.receive_data(_frame(pb.BaseCommand(type=pb.BaseCommand.CONNECTED,
                                               connected=pb.CommandConnected(server_version="x"))))
    rid = session.lookup("persistent://public/default/t")
    response = pb.CommandLookupTopicResponse(request_id=rid, response=pb.CommandLookupTopicResponse.Failed,
                                             error=pb.TopicNotFound, message="gone")
    (event,) = session.receive_data(_frame(pb.BaseCommand(type=pb.BaseCommand.LOOKUP_RESPONSE,
                                                          lookupTopicResponse=response)))
    assert isinstance(event, RequestFailed) and isinstance(event.error, errors.TopicNotFoundError)
    message = pb.BaseCommand(type=pb.BaseCommand.MESSAGE, message=pb.CommandMessage(
        consumer_id=3, message_id=pb.MessageIdData(ledgerId=1, entryId=2)))
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    raw = bytearray(codec.encode_payload_command(message, md, b"payload"))
    raw[-1] ^= 0xFF
    (event,) = session.receive_data(bytes(raw))
    assert isinstance(event, CorruptMessage) and event.consumer_id == 3
    assert isinstance(event.error, errors.ChecksumMismatchError)
    with pytest.raises(errors.FrameTooLargeError):
        session.receive_data(struct.pack(">I", 0x7FFFFFFF))


def test_malformed_frames_from_a_peer_reconnect_cleanly(tmp_path):
    """A corrupt Message is rejected alone; a broken stream closes and the client reconnects."""
    proxy_port = free_port()
    broker = BrokerThread(tmp_path, v1_port=None, advertised_url=f"pulsar://127.0.0.1:{proxy_port}").start()

    async def main():
        proxy = await FaultyProxy(proxy_port, broker.broker.port).start()
        try:
            async with Client(f"pulsar://127.0.0.1:{proxy_port}", operation_timeout_seconds=3,
                              initial_backoff_seconds=0.05, max_backoff_seconds=0.2) as client:
                consumer = await client.subscribe("malformed", "s", initial_position=InitialPosition.Earliest)
                producer = await client.create_producer("malformed", batching_enabled=False)
                await producer.send(b"before")
                assert (await consumer.receive(5000)).data() == b"before"
                proxy.inject_to_client = b"\x00\x00\x00\x05\x00\x00\x00\x01\xff"  # a command that does not parse
                await producer.send(b"after")
                # "before" may come again: its ack was still grouped when the stream broke
                seen = [(await consumer.receive(10000)).data()]
                while seen[-1] != b"after":
                    seen.append((await consumer.receive(10000)).data())
                assert set(seen) <= {b"before", b"after"}
                assert proxy.connections >= 2
        finally:
            await proxy.stop()
    try:
        run(main(), timeout=60)
    finally:
        broker.stop()


def test_official_client_sees_its_send_timeout_while_the_disk_stays_full(tmp_path):
    """Issue 26 goal 6: while the disk stays full, sends the broker cannot store reach the
    application as errors within about their send timeout (a SendError alone made the official
    client reconnect and resend over and over, never timing out); storing resumes by itself once
    space returns, and every message acknowledged is stored, once."""
    import threading
    import time

    pulsar = pytest.importorskip("pulsar")
    from ..helpers import FillingDisk

    disk = FillingDisk()
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk).start()
    topic = "persistent://public/default/full-disk"
    client = pulsar.Client(broker.url, operation_timeout_seconds=10)
    results: dict[bytes, object] = {}
    lock = threading.Lock()

    def callback(payload):
        def done(result, message_id):
            with lock:
                results[payload] = result
        return done
    try:
        producer = client.create_producer(topic, send_timeout_millis=1500, batching_enabled=False)
        producer.send(b"before")
        disk.room = 2000  # a few records fit
        full = [b"full-%03d" % i for i in range(60)]
        for payload in full:
            producer.send_async(payload, callback(payload))
            time.sleep(0.01)
        deadline = time.monotonic() + 8
        while len(results) < len(full) and time.monotonic() < deadline:
            time.sleep(0.1)
        with lock:
            answered = dict(results)
        assert len(answered) == len(full), f"{len(full) - len(answered)} sends never answered"
        assert any(result != pulsar.Result.Ok for result in answered.values())
        assert broker.call(broker.broker.pulsar.stats)["out_of_space"] >= 1
        disk.room = None  # space returns: storing resumes by itself
        after = [b"after-%03d" % i for i in range(20)]
        for payload in after:
            producer.send_async(payload, callback(payload))
        producer.flush()
        deadline = time.monotonic() + 10
        while not all(p in results for p in after) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(results.get(p) == pulsar.Result.Ok for p in after), {str(results.get(p)) for p in after}
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        stored = []
        while reader.has_message_available():
            stored.append(reader.read_next(5000).data())
        acknowledged = [b"before"] + [p for p in full + after if results.get(p) == pulsar.Result.Ok]
        assert [m for m in stored if m in set(acknowledged)] == acknowledged  # in order, none lost
        assert len(stored) == len(set(stored))  # and none twice
    finally:
        client.close()
        broker.stop()
