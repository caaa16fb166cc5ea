"""Hostile clients against the embedded broker (issue 11, items 2, 3, 5, 7, 8, 9): each test
speaks raw frames or raw lines, so nothing a well-behaved client would do hides the fault."""
from __future__ import annotations

import os
import re
import socket
import time

import pytest

from pulsarwire import codec
from pulsarwire._proto import PulsarApi_pb2 as pb

from ..helpers import self_signed_certificate, wait_until
from ..peers import BrokerThread, free_port

T = pb.BaseCommand


def command(kind, field, sub) -> bytes:
    cmd = T(type=kind)
    getattr(cmd, field).CopyFrom(sub)
    return codec.encode_command(cmd)


class Raw:
    """A raw Pulsar connection: frames out, decoded frames in."""

    def __init__(self, port: int, *, connect: bool = True, token: str | None = None, timeout: float = 5,
                 receive_buffer: int | None = None) -> None:
        self.sock = socket.socket()
        if receive_buffer:  # a small TCP window: what the client does not read stays in the broker
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.reader = codec.FrameReader()
        self.pending: list = []
        self.request_id = 0
        if connect:
            c = pb.CommandConnect(client_version="hostile", protocol_version=21)
            if token is not None:
                c.auth_method_name = "token"
                c.auth_data = token.encode()
            self.sock.sendall(command(T.CONNECT, "connect", c))
            self.connected = self.next()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Raw":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next(self, skip_pings: bool = True):
        """The next frame (PINGs from the broker answered and skipped); None when the broker closed."""
        while True:
            while not self.pending:
                data = self.sock.recv(1 << 16)
                if not data:
                    return None
                self.reader.feed(data)
                self.pending.extend(self.reader)
            frame = self.pending.pop(0)
            if skip_pings and frame.type == T.PING:
                self.send(command(T.PONG, "pong", pb.CommandPong()))
                continue
            return frame

    def rid(self) -> int:
        self.request_id += 1
        return self.request_id

    def producer(self, topic: str, producer_id: int = 1, name: str | None = None):
        c = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=self.rid())
        if name is not None:
            c.producer_name = name
        self.send(command(T.PRODUCER, "producer", c))
        return self.next()

    def subscribe(self, topic: str, sub: str = "s", consumer_id: int = 1, earliest: bool = True):
        c = pb.CommandSubscribe(topic=topic, subscription=sub, subType=pb.CommandSubscribe.Exclusive,
                                consumer_id=consumer_id, request_id=self.rid(),
                                initialPosition=pb.CommandSubscribe.Earliest if earliest
                                else pb.CommandSubscribe.Latest)
        self.send(command(T.SUBSCRIBE, "subscribe", c))
        return self.next()

    def flow(self, consumer_id: int, permits: int) -> None:
        self.send(command(T.FLOW, "flow", pb.CommandFlow(consumer_id=consumer_id, messagePermits=permits)))

    def publish(self, producer_id: int, sequence_id: int, payload: bytes, *, num_messages: int = 1,
                metadata: pb.MessageMetadata | None = None):
        md = metadata or pb.MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1)
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id,
                                                 num_messages=num_messages))
        self.send(codec.encode_payload_command(send, md, payload))
        return self.next()

    def ping(self) -> bool:
        self.send(command(T.PING, "ping", pb.CommandPing()))
        frame = self.next(skip_pings=False)
        return frame is not None and frame.type == T.PONG


@pytest.fixture
def broker(tmp_path):
    b = BrokerThread(tmp_path / "data", v1_port=0).start()
    yield b
    b.stop()


# item 9: topic names

BAD_NAMES = [".", "..", "", "../escape", "a/../../b", "persistent://public/default/..",
             "persistent://public/default/", "persistent://public//x", "x" * 300,
             "persistent://public/default/" + "\u00e9" * 120, "new\nline"]


def _stored_outside_topics(data_dir) -> list[str]:
    """Anything the broker wrote outside <data>/topics/<one directory per topic>/ (its own state
    files in the root are fine)."""
    strays = []
    for root, dirs, files in os.walk(data_dir):
        rel = os.path.relpath(root, data_dir)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        if depth < 2:
            strays += [os.path.join(rel, f) for f in files if f.endswith((".log", ".idx", "cursors.json",
                                                                         "state.json"))]
    return strays


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n[:32]))
def test_invalid_topic_names_are_refused_on_the_pulsar_port(broker, name):
    with Raw(broker.broker.port) as raw:
        answer = raw.producer(name)
        assert answer.type == T.ERROR and answer.command.error.error == pb.InvalidTopicName
        assert answer.command.error.request_id == raw.request_id
        answer = raw.subscribe(name)
        assert answer.type == T.ERROR and answer.command.error.error == pb.InvalidTopicName
        rid = raw.rid()
        raw.send(command(T.PARTITIONED_METADATA, "partitionMetadata",
                         pb.CommandPartitionedTopicMetadata(topic=name, request_id=rid)))
        answer = raw.next().command.partitionMetadataResponse
        assert answer.request_id == rid and answer.error == pb.InvalidTopicName
        rid = raw.rid()
        raw.send(command(T.LOOKUP, "lookupTopic", pb.CommandLookupTopic(topic=name, request_id=rid)))
        answer = raw.next().command.lookupTopicResponse
        assert answer.request_id == rid and answer.error == pb.InvalidTopicName
        assert raw.ping()  # the connection lives on
    assert _stored_outside_topics(broker.broker.data_dir) == []
    assert not os.path.exists(os.path.join(os.path.dirname(broker.broker.data_dir), "escape"))


def test_invalid_topic_names_are_refused_on_the_v1_port(broker):
    with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as s:
        f = s.makefile("rwb")
        for i, name in enumerate([".", "..", "../escape", "a/../b", "x" * 300,
                                  "persistent://public/default/..", "persistent://public/default/."]):
            f.write(f"V1|{i}|PRODUCE|{name} k:v\n".encode())
            f.flush()
            line = f.readline().decode()
            assert line.startswith(f"V1|{i}|ERR|BAD_REQUEST|"), line
        f.write(b"V1|99|PING|\n")
        f.flush()
        assert f.readline().startswith(b"V1|99|OK")
    assert _stored_outside_topics(broker.broker.data_dir) == []


# item 2: broker-assigned producer names

def test_assigned_producer_names_are_unique_across_restarts(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None, deduplication=True).start()
    topic = "persistent://public/default/names"
    try:
        with Raw(broker.broker.port) as raw:
            first = raw.producer(topic).command.producer_success
            for seq in range(5):
                receipt = raw.publish(1, seq, b"before").command.send_receipt
                assert receipt.message_id.entryId == seq
        broker.restart()
        with Raw(broker.broker.port) as raw:
            second = raw.producer(topic).command.producer_success
            assert second.producer_name != first.producer_name
            assert second.last_sequence_id == -1  # no inherited dedup state
            receipt = raw.publish(1, 0, b"after").command.send_receipt
            assert receipt.message_id.entryId == 5  # stored, not answered as a duplicate (-1)
            # the first producer's name is free for its owner to come back with, not busy
            back = raw.producer(topic, producer_id=2, name=first.producer_name).command.producer_success
            assert back.last_sequence_id == 4
    finally:
        broker.stop()


# item 3: acknowledgements of entries that do not exist

def _ack(raw: Raw, consumer_id: int, entry_id: int, cumulative: bool) -> int:
    rid = raw.rid()
    ack = pb.CommandAck(consumer_id=consumer_id, request_id=rid,
                        ack_type=pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual)
    ack.message_id.add(ledgerId=0, entryId=entry_id)
    raw.send(command(T.ACK, "ack", ack))
    return rid


def test_acks_beyond_the_end_of_the_topic_are_refused(broker):
    topic = "persistent://public/default/acks"
    with Raw(broker.broker.port) as raw:
        raw.producer(topic)
        for seq in range(3):
            raw.publish(1, seq, b"m%d" % seq)
        assert raw.subscribe(topic).type == T.SUCCESS
        for entry_id, cumulative in [(1000, True), (999, False), (3, True), ((1 << 64) - 1, False),
                                     ((1 << 63) + 5, True)]:
            rid = _ack(raw, 1, entry_id, cumulative)
            answer = raw.next().command.ackResponse
            assert answer.request_id == rid and answer.HasField("error"), (entry_id, cumulative)
        for seq in range(3, 5):
            raw.publish(1, seq, b"m%d" % seq)
        raw.flow(1, 10)
        got = [raw.next() for _ in range(5)]
        assert [f.command.message.message_id.entryId for f in got] == [0, 1, 2, 3, 4]
    subscription = broker.broker.topics[topic].subscriptions["s"]
    assert subscription.cursor.mark_delete == -1 and not subscription.cursor.acked


# item 5: a producer's num_messages claim

def _batch(count: int, claimed_in_batch: int | None = None, sequence_id: int = 0):
    builder = codec.BatchBuilder()
    for i in range(count):
        builder.add(b"b%d" % i)
    md = pb.MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1,
                            num_messages_in_batch=count if claimed_in_batch is None else claimed_in_batch)
    return md, builder.build()


def test_num_messages_claims_cannot_stall_consumers(broker):
    topic = "persistent://public/default/claims"
    with Raw(broker.broker.port, timeout=5) as raw:
        raw.producer(topic)
        huge = 10 ** 9
        raw.publish(1, 0, b"single", num_messages=huge)  # not a batch: 1 message
        md, payload = _batch(2, sequence_id=1)
        raw.publish(1, 1, payload, num_messages=huge, metadata=md)  # a real batch of 2
        md, payload = _batch(2, claimed_in_batch=huge, sequence_id=2)
        # a batch that does not split is refused (consumers would read past its end)
        refused = raw.publish(1, 2, payload, num_messages=huge, metadata=md).command
        assert refused.type == T.SEND_ERROR and refused.send_error.error == pb.ChecksumError
        for seq in range(3, 6):
            raw.publish(1, seq, b"plain")
        log = broker.broker.topics[topic].log
        assert [log.read(e).num_messages for e in range(5)] == [1, 2, 1, 1, 1]
        assert raw.subscribe(topic).type == T.SUCCESS
        raw.flow(1, 10)
        got = [raw.next() for _ in range(5)]  # the old broker stalled after the first entry
        assert [f.command.message.message_id.entryId for f in got] == list(range(5))


# item 8: authentication and TLS

def test_official_client_gets_an_authentication_error_promptly(tmp_path):
    pulsar = pytest.importorskip("pulsar")
    broker = BrokerThread(tmp_path / "data", v1_port=None, auth_tokens={"secret"}).start()
    try:
        for auth in (pulsar.AuthenticationToken("wrong"), None):
            client = pulsar.Client(broker.url, authentication=auth, operation_timeout_seconds=20)
            try:
                for attempt in (lambda: client.create_producer("auth-topic"),
                                lambda: client.subscribe("auth-topic", "s")):
                    started = time.monotonic()
                    with pytest.raises(pulsar.AuthenticationError):
                        attempt()
                    assert time.monotonic() - started < 5  # not a TimeOut after retries
            finally:
                client.close()
        client = pulsar.Client(broker.url, authentication=pulsar.AuthenticationToken("secret"))
        try:
            client.create_producer("auth-topic").send(b"ok")
        finally:
            client.close()
    finally:
        broker.stop()


def test_unauthenticated_connection_is_refused_every_request(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None, auth_tokens={"secret"}, handshake_timeout=2.0).start()
    try:
        for token in ("wrong", None, ""):
            with Raw(broker.broker.port, token=token) as raw:
                answer = raw.producer("persistent://public/default/refused")
                assert answer.type == T.ERROR and answer.command.error.error == pb.AuthenticationError
                assert answer.command.error.request_id == raw.request_id
                answer = raw.subscribe("persistent://public/default/refused")
                assert answer.command.error.error == pb.AuthenticationError
                rid = raw.rid()
                raw.send(command(T.LOOKUP, "lookupTopic", pb.CommandLookupTopic(topic="x", request_id=rid)))
                answer = raw.next().command.lookupTopicResponse
                assert answer.request_id == rid and answer.error == pb.AuthenticationError
                answer = raw.publish(1, 0, b"sneaky")
                assert answer.type == T.SEND_ERROR and answer.command.send_error.error == pb.AuthenticationError
        assert broker.broker.topics == {}
        with Raw(broker.broker.port, token="wrong") as raw:  # closed by the handshake timeout
            assert _closed_by_broker(raw.sock, 6)
        assert _stats(broker)["handshake_timeouts"] >= 1
    finally:
        broker.stop()


def test_anonymous_role_and_grants_authorize_per_namespace(tmp_path):
    """--anonymous-role admits a CONNECT without credentials as that role; --grant limits each
    role to its namespaces (AuthorizationError elsewhere); a wrong token is still refused; a JWT
    token acts as its subject; a topic of an unknown tenant is TopicNotFound whatever the role."""
    import base64
    import json

    jwt = ".".join(base64.urlsafe_b64encode(part).rstrip(b"=").decode() for part in (
        b'{"alg":"HS256"}', json.dumps({"sub": "reader"}).encode(), b"signature"))
    broker = BrokerThread(tmp_path / "data", v1_port=None, auth_tokens={jwt}, anonymous_role="anonymous",
                          grants={"public/default": {"anonymous"}, "public/private": {"reader"}},
                          handshake_timeout=5.0).start()

    def lookup(raw, topic):
        rid = raw.rid()
        raw.send(command(T.LOOKUP, "lookupTopic", pb.CommandLookupTopic(topic=topic, request_id=rid)))
        return raw.next().command.lookupTopicResponse

    try:
        with Raw(broker.broker.port) as anonymous:
            connect = pb.CommandLookupTopicResponse.Connect
            assert lookup(anonymous, "persistent://public/default/open").response == connect
            assert anonymous.producer("persistent://public/default/open").type == T.PRODUCER_SUCCESS
            assert lookup(anonymous, "persistent://public/private/closed").error == pb.AuthorizationError
            answer = anonymous.producer("persistent://public/private/closed")
            assert answer.type == T.ERROR and answer.command.error.error == pb.AuthorizationError
            assert lookup(anonymous, "persistent://no-such-tenant/ns/t").error == pb.TopicNotFound
        with Raw(broker.broker.port, token=jwt) as reader:  # the role "reader", the JWT's subject
            assert reader.subscribe("persistent://public/private/closed").type == T.SUCCESS
            assert lookup(reader, "persistent://public/default/open").error == pb.AuthorizationError
        with Raw(broker.broker.port, token="wrong") as refused:
            assert lookup(refused, "persistent://public/default/open").error == pb.AuthenticationError
        assert "persistent://public/private/closed" in broker.broker.topics
    finally:
        broker.stop()


def test_authorization_needs_authentication(tmp_path):
    import subprocess
    import sys

    from pulsarwire.broker.server import Broker

    with pytest.raises(ValueError):
        Broker(str(tmp_path / "a"), v1_port=None, anonymous_role="anonymous")
    with pytest.raises(ValueError):
        Broker(str(tmp_path / "b"), v1_port=None, auth_tokens={"t"}, grants={"no-namespace": {"r"}})
    done = subprocess.run([sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir",
                           str(tmp_path / "c"), "--port", str(free_port()), "--v1-port", "-1",
                           "--grant", "public/default=r"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "need authentication" in done.stderr


def test_empty_auth_token_is_refused_at_startup(tmp_path):
    import subprocess
    import sys

    from pulsarwire.broker.server import Broker

    with pytest.raises(ValueError):
        Broker(str(tmp_path / "a"), v1_port=None, auth_tokens={""})
    done = subprocess.run([sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(tmp_path / "b"),
                           "--port", str(free_port()), "--v1-port", "-1", "--auth-token", ""],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "auth-token" in done.stderr


def test_cli_tls_only_broker(tmp_path):
    import subprocess
    import sys

    from ..peers import terminate, wait_for_port

    pulsar = pytest.importorskip("pulsar")
    cert, key = self_signed_certificate(tmp_path)
    tls_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(tmp_path / "data"), "--port", "-1",
         "--v1-port", "-1", "--tls-port", str(tls_port), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(tls_port, process=process)
        banner = process.stdout.readline()
        assert f"pulsar+ssl://127.0.0.1:{tls_port}" in banner and "pulsar://" not in banner
        client = pulsar.Client(f"pulsar+ssl://127.0.0.1:{tls_port}", tls_trust_certs_file_path=str(cert),
                               operation_timeout_seconds=10)
        try:
            consumer = client.subscribe("tls-only", "s", initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer("tls-only").send(b"over tls")
            assert consumer.receive(10000).data() == b"over tls"
        finally:
            client.close()
    finally:
        terminate(process)
    bad = subprocess.run([sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(tmp_path / "x"),
                          "--port", "-1", "--v1-port", "-1"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "--tls-port" in bad.stderr


# item 7: bounded buffering, handshake and frame deadlines, connection limit

def _stats(broker) -> dict:
    return broker.call(broker.broker.pulsar.stats)


def _closed_by_broker(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except socket.timeout:
        return False
    except ConnectionError:
        return True


@pytest.fixture
def strict(tmp_path):
    b = BrokerThread(tmp_path / "data", v1_port=None, handshake_timeout=0.5, frame_timeout=1.0,
                     max_connections=4, max_output_bytes=64 * 1024).start()
    yield b
    b.stop()


def test_connection_without_connect_is_closed_after_the_handshake_timeout(strict):
    with socket.create_connection(("127.0.0.1", strict.broker.port)) as idle:
        started = time.monotonic()
        assert _closed_by_broker(idle, 5)
        assert time.monotonic() - started < 3
    with Raw(strict.broker.port, token="unused") as raw:  # auth is off: a connected one stays
        assert not _closed_by_broker(raw.sock, 1.5)
    assert _stats(strict)["handshake_timeouts"] == 1


def test_big_frame_before_connect_is_refused_at_its_header(strict):
    with socket.create_connection(("127.0.0.1", strict.broker.port)) as s:
        s.sendall((5 * 1024 * 1024).to_bytes(4, "big") + b"\0" * 60000)
        assert _closed_by_broker(s, 3)
    stats = _stats(strict)
    assert stats["oversized_frames_before_connect"] == 1 and stats["input_bytes"] == 0
    with Raw(strict.broker.port) as raw:  # after CONNECT, big frames are fine
        raw.producer("persistent://public/default/big")
        receipt = raw.publish(1, 0, b"x" * (1024 * 1024))
        assert receipt.type == T.SEND_RECEIPT


def test_slowloris_frame_is_closed_by_the_frame_timeout(strict):
    with Raw(strict.broker.port) as raw:
        frame = command(T.PING, "ping", pb.CommandPing())
        started = time.monotonic()
        closed = False
        for byte in frame * 20:
            try:
                raw.sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            raw.sock.settimeout(0.25)
            try:
                if raw.sock.recv(65536) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
        assert closed and time.monotonic() - started < 4
    assert _stats(strict)["frame_timeouts"] == 1


def test_connections_over_the_limit_are_refused_with_an_error(strict):
    held = [Raw(strict.broker.port) for _ in range(4)]
    try:
        with Raw(strict.broker.port, connect=False) as extra:
            answer = extra.next()
            assert answer.type == T.ERROR and answer.command.error.error == pb.ServiceNotReady
            assert "too many connections" in answer.command.error.message
            assert extra.next() is None
        held.pop().close()
        assert wait_until(lambda: _stats(strict)["connections"] == 3)
        with Raw(strict.broker.port) as again:
            assert again.connected.type == T.CONNECTED
    finally:
        for raw in held:
            raw.close()
    assert _stats(strict)["refused_connections"] == 1


def test_ping_flood_that_never_reads_is_bounded(strict):
    ping = command(T.PING, "ping", pb.CommandPing())
    pong = command(T.PONG, "pong", pb.CommandPong())
    with Raw(strict.broker.port, receive_buffer=16 * 1024) as raw:
        raw.sock.settimeout(0.5)
        sent = 0
        try:
            for _ in range(200):  # up to 2 M pings, until the socket buffers are full and the broker
                raw.sock.sendall(ping * 10_000)  # stops reading
                sent += 10_000
        except socket.timeout:
            pass  # part of the last chunk may have gone: count only what is known
        assert sent < 2_000_000
        stats = _stats(strict)
        budget = 64 * 1024
        assert stats["output_pauses"] >= 1 and stats["paused_connections"] == 1
        assert stats["peak_connection_output_bytes"] <= budget + 64 * 1024
        assert stats["output_bytes"] <= budget + 64 * 1024
        # reading resumes the broker: every ping sent in full is answered
        raw.sock.settimeout(10)
        received = 0
        while received < sent * len(pong):
            data = raw.sock.recv(1 << 20)
            assert data
            received += len(data)


def test_consumer_that_never_reads_is_bounded_and_its_memory_freed_on_close(strict):
    topic = "persistent://public/default/unread"
    body = b"p" * 4096
    with Raw(strict.broker.port) as producer:
        producer.producer(topic)
        for seq in range(3000):  # 12 MB: more than the kernel's socket buffers take
            producer.publish(1, seq, body)
    consumer = Raw(strict.broker.port, receive_buffer=16 * 1024)
    assert consumer.subscribe(topic).type == T.SUCCESS
    consumer.flow(1, 100_000)
    assert wait_until(lambda: _stats(strict)["paused_connections"] == 1)
    stats = _stats(strict)
    assert stats["output_bytes"] <= 64 * 1024 + 2 * len(body) + 1024
    consumer.close()  # without reading: what was queued for it is dropped
    assert wait_until(lambda: _stats(strict)["connections"] == 0)
    assert _stats(strict)["output_bytes"] == 0
    with Raw(strict.broker.port) as again:  # the unread messages go to the next consumer, all of them
        again.subscribe(topic)
        again.flow(1, 5000)
        ids = [again.next().command.message.message_id.entryId for _ in range(3000)]
        assert sorted(ids) == list(range(3000))


def test_unfinished_big_frames_are_freed_when_their_connections_close(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    try:
        held = [Raw(broker.broker.port) for _ in range(4)]
        for raw in held:
            raw.sock.sendall((5 * 1024 * 1024).to_bytes(4, "big") + b"\0" * (3 * 1024 * 1024))
        assert wait_until(lambda: _stats(broker)["input_bytes"] >= 4 * 3 * 1024 * 1024)
        for raw in held:
            raw.close()
        assert wait_until(lambda: _stats(broker)["connections"] == 0)
        assert _stats(broker)["input_bytes"] == 0
    finally:
        broker.stop()


def _abort(raw: Raw) -> None:
    import struct
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


def test_unfinished_frames_of_all_connections_share_one_input_budget(tmp_path):
    import threading

    budget = 6 * 1024 * 1024
    broker = BrokerThread(tmp_path / "data", v1_port=None, max_input_bytes=budget).start()
    try:
        hostile = [Raw(broker.broker.port) for _ in range(3)]
        for raw in hostile:
            raw.sock.settimeout(1)
            try:
                raw.sock.sendall((5 * 1024 * 1024).to_bytes(4, "big") + b"\0" * (4 * 1024 * 1024))
            except socket.timeout:
                pass  # the broker stopped reading this one
        stats = wait_until(lambda: (lambda s: s if s.get("input_pauses") else None)(_stats(broker)))
        assert stats and stats["input_bytes"] <= budget + 3 * 256 * 1024
        with Raw(broker.broker.port, timeout=30) as legit:  # a loaded CI machine may be slow to sweep
            assert legit.ping()  # complete small frames still pass
            legit.producer("persistent://public/default/budget")
            # abort (RST): a plain close would queue its FIN behind the unsent body, which a broker
            # that paused reading never takes in, so only the frame timeout would notice it
            threading.Timer(0.5, lambda: [_abort(raw) for raw in hostile]).start()
            receipt = legit.publish(1, 0, b"y" * (1024 * 1024))  # waits for the budget, then goes
            assert receipt.type == T.SEND_RECEIPT
        assert wait_until(lambda: _stats(broker)["input_bytes"] == 0)
    finally:
        broker.stop()


def test_cli_limit_flags(tmp_path):
    import subprocess
    import sys

    from ..peers import terminate, wait_for_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(tmp_path / "data"), "--port", str(port),
         "--v1-port", "-1", "--max-connections", "1", "--handshake-timeout", "0.5",
         "--max-frame-before-connect", "1024", "--frame-timeout", "1", "--max-output-bytes", "65536",
         "--max-input-bytes", str(6 * 1024 * 1024), "--max-cache-bytes", str(1024 * 1024),
         "--max-connections-per-address", "8", "--authenticated-share", "0.5", "--idle-timeout", "60",
         "--memory-budget", str(16 * 1024 * 1024)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, process=process)
        first = wait_until(lambda: _connected(port))  # once the broker has seen the probe go
        with first:
            with Raw(port, connect=False) as second:
                answer = second.next()
                assert answer.type == T.ERROR and answer.command.error.error == pb.ServiceNotReady
        wait_until(lambda: _connected(port)).close()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall((2048).to_bytes(4, "big"))  # over --max-frame-before-connect
            assert _closed_by_broker(s, 3)
        with socket.create_connection(("127.0.0.1", port)) as idle:
            assert _closed_by_broker(idle, 3)  # --handshake-timeout
    finally:
        terminate(process)


def _connected(port: int) -> Raw | None:
    """A connected Raw, or None (closed) when the broker refused it."""
    raw = Raw(port)
    if raw.connected is not None and raw.connected.type == T.CONNECTED:
        return raw
    raw.close()
    return None


def test_count_batch_and_send_frame_batch_fields_in_both_twins():
    """The codec parts item 5 relies on, identical in both twins."""
    from pulsarwire import _codec_py
    from pulsarwire.errors import BadBatchError

    from ..conftest import TWINS

    builder = _codec_py.BatchBuilder()
    for i in range(3):
        builder.add(b"m%d" % i, properties={"k": "v"})
    payload = builder.build()
    outcomes = []
    for twin in TWINS:
        assert twin.count_batch(payload, 3) == 3
        assert twin.count_batch(memoryview(payload), 3) == 3
        errors = []
        for bad_payload, count in [(payload, 2), (payload, 4), (payload + b"\0", 3), (payload[:-1], 3),
                                   (payload, -1), (payload, 10 ** 9), (b"", 1)]:
            with pytest.raises(BadBatchError) as caught:
                twin.count_batch(bad_payload, count)
            errors.append(str(caught.value))
        reader = twin.FrameReader(send_fast_path=True)
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=3,
                                compression=0)
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=0, num_messages=3))
        reader.feed(twin.encode_payload_command(send, md, payload))
        plain = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, compression=2)
        reader.feed(twin.encode_payload_command(send, plain, b"not a batch"))
        frames = list(reader)
        assert [type(f).__name__ for f in frames] == ["SendFrame", "SendFrame"]
        fields = [(f.num_messages_in_batch, f.compression) for f in frames]
        assert fields == [(3, 0), (None, 2)]
        outcomes.append(errors)
    assert all(o == outcomes[0] for o in outcomes)


def _smm_entry(smm: bytes, payload: bytes) -> bytes:
    return len(smm).to_bytes(4, "big") + smm + payload


def test_count_entry_batch_steps_over_the_metadata_and_agrees_with_the_general_parse():
    """count_entry_batch (the broker's per-entry message count) reads [u32 size][metadata][batch];
    its fast loop over payload_size-and-sequence_id entries gives what count_batch and
    split_messages give, errors included, in both twins."""
    from pulsarwire import _codec_py
    from pulsarwire.errors import BadBatchError

    from ..conftest import TWINS

    metadata = b"\x0a\x01p"  # any bytes: only its size is read
    head = len(metadata).to_bytes(4, "big") + metadata
    cases = {
        "plain": b"".join(_smm_entry(b"\x18\x02", b"ab") for _ in range(3)),
        "sequence ids": b"".join(_smm_entry(b"\x18\x02\x40" + _codec_py.varint_bytes(300 * i), b"ab")
                                 for i in range(3)),
        "two-byte size": b"".join(_smm_entry(b"\x18\x90\x01", bytes(144)) for _ in range(3)),
        "mixed": _smm_entry(b"\x18\x02", b"ab") + _smm_entry(b"\x12\x01k\x18\x01", b"a")
        + _smm_entry(b"\x18\x00\x40\x05", b""),
        "payload past the end": _smm_entry(b"\x18\x02", b"ab") * 2 + _smm_entry(b"\x18\x05", b"ab"),
        "size past the metadata": _smm_entry(b"\x18", b"") * 3,
        "cut": _smm_entry(b"\x18\x02", b"ab") * 2 + b"\0\0",
        "left over": _smm_entry(b"\x18\x02", b"ab") * 3 + b"x",
        "trailing field": _smm_entry(b"\x18\x02\x40\x01\x48\x01", b"ab") * 3,
    }
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=3)
    outcomes = []
    for twin in TWINS:
        seen = {}
        for name, batch in cases.items():
            try:
                seen[name] = twin.count_entry_batch(head + batch, 3)
                assert twin.count_batch(batch, 3) == 3 and len(twin.split_messages(md, batch)) == 3
            except BadBatchError as exc:
                seen[name] = str(exc)
                with pytest.raises(BadBatchError, match=re.escape(str(exc))):
                    twin.count_batch(batch, 3)
        for bad in (b"\0\0\0", b"\0\0\0\x09abc"):
            with pytest.raises(BadBatchError):
                twin.count_entry_batch(bad, 1)
        outcomes.append(seen)
    assert outcomes[0]["plain"] == outcomes[0]["sequence ids"] == outcomes[0]["trailing field"] == 3
    assert outcomes[0]["mixed"] == outcomes[0]["two-byte size"] == 3
    assert all(isinstance(outcomes[0][name], str) for name in ("payload past the end", "size past the metadata",
                                                             "cut", "left over"))
    assert all(o == outcomes[0] for o in outcomes)


def test_v1_connections_over_the_limit_are_refused(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=0, max_connections=2).start()
    try:
        held = [socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) for _ in range(2)]
        for s in held:
            s.sendall(b"V1|1|PING|\n")
            assert s.recv(1000).startswith(b"V1|1|OK")
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as extra:
            line = extra.makefile("rb").readline()
            assert line.startswith(b"V1|0|ERR|TOO_MANY_CONNECTIONS|")
            assert extra.recv(100) == b""
        for s in held:
            s.close()
    finally:
        broker.stop()


# the entry cache: one budget for every open topic

def test_entry_cache_is_one_budget_shared_by_every_topic(tmp_path):
    from pulsarwire.broker.storage import EntryCache, TopicLog

    cache = EntryCache(64 * 1024)
    logs = [TopicLog(str(tmp_path / f"t{i}"), cache=cache) for i in range(20)]
    body = {(i, n): os.urandom(1000) + b"%d-%d" % (i, n) for i in range(20) for n in range(10)}
    for n in range(10):
        for i, topic_log in enumerate(logs):
            topic_log.append(body[i, n], None, 1, 1)
            assert topic_log.commit()
            assert cache.bytes <= 64 * 1024  # 20 own budgets of 32 MiB each would hold all 200 KB
    assert cache.evicted_entries > 0
    # topic 0 is the least recently used until a cache hit makes it the most recently used
    logs[0].read(9)
    kept, oldest_of_next = list(logs[0]._cache), list(logs[2]._cache)
    logs[1].append(b"x" * 1000, None, 1, 1)  # over the budget: topic 2's oldest go (an eviction step)
    assert list(logs[0]._cache) == kept
    assert len(list(logs[2]._cache)) < len(oldest_of_next) and \
        list(logs[2]._cache) == oldest_of_next[len(oldest_of_next) - len(logs[2]._cache):]
    assert cache.bytes <= cache.max_bytes - cache.max_bytes // cache.EVICT_STEP
    for i, topic_log in enumerate(logs):  # evicted entries come back from disk
        assert [bytes(topic_log.read(n).body) for n in range(10)] == [body[i, n] for n in range(10)]
    for topic_log in logs:
        topic_log.close()
    assert cache.bytes == 0 and cache.log_count == 0


def test_the_entry_cache_counts_a_viewed_receive_buffer_whole_and_once(tmp_path):
    """A body that views a receive buffer is kept without a copy; the cache counts the whole
    buffer, once for all the bodies that view it, until the last of them is evicted."""
    from pulsarwire.broker.storage import EntryCache, TopicLog

    cache = EntryCache(32 * 1024)
    viewing, other = (TopicLog(str(tmp_path / name), cache=cache) for name in ("viewing", "other"))
    received = os.urandom(10_000)
    viewing.append(memoryview(received)[:1000], None, 1, 1)
    assert cache.bytes == 10_000
    viewing.append(memoryview(received)[1000:], None, 1, 1)
    assert cache.bytes == 10_000
    assert viewing._cache[0].body.obj is received and viewing._cache[1].body.obj is received
    viewing.append(bytearray(b"changes"), None, 1, 1)  # not bytes: copied, it must not change while queued
    assert type(viewing._cache[2].body) is bytes and cache.bytes == 10_007
    assert viewing.commit()
    for _ in range(40):  # the buffer is counted until both views are evicted
        other.append(os.urandom(1000), None, 1, 1)
        assert other.commit()
        assert cache.bytes <= cache.max_bytes
    assert not viewing._cache and not cache._viewed
    assert [bytes(viewing.read(n).body) for n in range(3)] == [received[:1000], received[1000:], b"changes"]
    for topic_log in (viewing, other):
        topic_log.close()
    assert cache.bytes == 0


def test_many_topics_written_by_a_client_stay_within_max_cache_bytes(tmp_path):
    budget = 256 * 1024
    broker = BrokerThread(tmp_path / "data", v1_port=None, max_cache_bytes=budget).start()
    try:
        topics = [f"persistent://public/default/cached-{i}" for i in range(40)]
        payloads = {}
        with Raw(broker.broker.port) as raw:
            for i, topic in enumerate(topics):
                assert raw.producer(topic, producer_id=i).type == T.PRODUCER_SUCCESS
                for n in range(4):
                    payloads[i, n] = os.urandom(16 * 1024)
                    assert raw.publish(i, n, payloads[i, n]).type == T.SEND_RECEIPT
        stats = broker.call(broker.broker.storage_stats)
        assert 0 < stats["cache_bytes"] <= budget == stats["max_cache_bytes"]
        assert stats["cache_evicted_entries"] > 0
        with Raw(broker.broker.port) as raw:  # the first topic's entries left the cache long ago
            assert raw.subscribe(topics[0]).type == T.SUCCESS
            raw.flow(1, 10)
            got = [raw.next() for _ in range(4)]
            assert [bytes(f.payload) for f in got] == [payloads[0, n] for n in range(4)]
        assert broker.call(broker.broker.storage_stats)["cache_bytes"] <= budget
    finally:
        broker.stop()


# the V1 port: deadlines, line length, output budget

def _v1_stats(broker) -> dict:
    return broker.call(broker.broker.v1.stats)


def _v1_lines(sock: socket.socket, timeout: float = 5) -> list[bytes]:
    """Every line the broker sends until it closes the connection."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionError:
            break
        if not chunk:
            break
        data += chunk
    return data.splitlines(keepends=True)


@pytest.fixture
def strict_v1(tmp_path):
    b = BrokerThread(tmp_path / "data", v1_port=0, handshake_timeout=0.5, frame_timeout=1.0, max_connections=3,
                     max_output_bytes=64 * 1024).start()
    yield b
    b.stop()


def test_v1_half_sent_line_is_closed_after_the_frame_timeout(strict_v1):
    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) as s:
        s.sendall(b"V1|1|PING|\nV1|PRO")
        started = time.monotonic()
        lines = _v1_lines(s)
        assert time.monotonic() - started < 3
        assert lines[0] == b"V1|1|OK|PONG\n"
        assert lines[1].startswith(b"V1|0|ERR|BAD_REQUEST|request line not completed within 1s")
        assert len(lines) == 2
    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) as s:
        for piece in (b"V1|2|", b"PI", b"NG|\n"):  # slow, but each line within the timeout
            s.sendall(piece)
            time.sleep(0.2)  # the line takes 0.4 s: well within the 1 s timeout, also on a loaded machine
        assert s.makefile("rb").readline() == b"V1|2|OK|PONG\n"
    assert _v1_stats(strict_v1)["line_timeouts"] == 1
    assert wait_until(lambda: _v1_stats(strict_v1)["connections"] == 0)


def test_v1_silent_connections_are_closed_after_the_handshake_timeout(strict_v1):
    """Without tokens a V1 connection must send a valid request within the handshake timeout
    (issue 30: silent connections filling the limit locked every client out)."""
    held = [socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) for _ in range(3)]
    try:
        held[1].sendall(b"V1|1|PING|\n")
        assert held[1].makefile("rb").readline() == b"V1|1|OK|PONG\n"
        for s in (held[0], held[2]):
            assert _v1_lines(s) == [b"V1|0|ERR|BAD_REQUEST|no valid request within 0.5s\n"]
        assert not _closed_by_broker(held[1], 1.0)  # established: an idle client keeps its place
        with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) as newcomer:
            newcomer.sendall(b"V1|2|PING|\n")
            assert newcomer.makefile("rb").readline() == b"V1|2|OK|PONG\n"
    finally:
        for s in held:
            s.close()
    assert _v1_stats(strict_v1)["idle_timeouts"] == 2


def test_v1_connection_without_auth_is_closed_after_the_handshake_timeout(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=0, auth_tokens={"secret"}, handshake_timeout=0.5).start()
    try:
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as idle:
            started = time.monotonic()
            lines = _v1_lines(idle)
            assert time.monotonic() - started < 3
            assert lines == [b"V1|0|ERR|UNAUTHORIZED|no AUTH within 0.5s\n"]
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as authed:
            authed.sendall(b"V1|1|AUTH|secret\n")
            assert authed.makefile("rb").readline() == b"V1|1|OK|authenticated=true\n"
            assert not _closed_by_broker(authed, 1.5)
        assert _v1_stats(broker)["handshake_timeouts"] == 1
    finally:
        broker.stop()


def test_v1_line_over_the_limit_is_refused_after_the_lines_before_it(strict_v1):
    from pulsarwire.broker.v1 import MAX_LINE

    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) as s:
        s.sendall(b"V1|1|PING|\n" + b"V1|2|PING|" + b"x" * MAX_LINE + b"\nV1|3|PING|\n")
        lines = _v1_lines(s)
        assert lines[0] == b"V1|1|OK|PONG\n"
        assert lines[1] == b"V1|0|ERR|BAD_REQUEST|request line longer than %d bytes\n" % MAX_LINE
        assert len(lines) == 2  # nothing after it is read
    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) as s:
        try:  # no newline at all: refused once it passes the limit, not held until it ends
            s.sendall(b"V1|1|PING|" + b"x" * (MAX_LINE + 1))
        except ConnectionError:
            pass
        assert _v1_lines(s)[0].startswith(b"V1|0|ERR|BAD_REQUEST|request line longer than")
    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=5) as s:
        s.sendall(b"V1|1|PING|" + b"x" * (MAX_LINE - 10) + b"\n")  # at the limit: answered
        assert s.makefile("rb").readline().startswith(b"V1|1|ERR|BAD_REQUEST|")
    assert _v1_stats(strict_v1)["oversized_lines"] == 2


def test_v1_line_over_the_limit_from_a_client_still_sending_gets_its_error_not_a_reset(strict_v1):
    """Closing a socket with unread input resets it, and the reset destroys the error line before
    the client reads it: the broker sends the error, shuts its side, then drops what still comes."""
    from pulsarwire.broker.v1 import MAX_LINE

    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=10) as s:
        s.sendall(b"V1|1|PING|" + b"x" * (2 * MAX_LINE))  # twice the limit, no newline: all of it sent
        assert _v1_lines(s, timeout=10) == [b"V1|0|ERR|BAD_REQUEST|request line longer than %d bytes\n" % MAX_LINE]
    deadline = time.monotonic() + 5
    while _v1_stats(strict_v1)["lingering_connections"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _v1_stats(strict_v1)["lingering_connections"] == 0


def test_v1_lingering_after_an_overlong_line_is_bounded(strict_v1):
    """A client that goes on sending after its error is cut off: LINGER_BYTES dropped at most."""
    from pulsarwire.broker.v1 import LINGER_BYTES, MAX_LINE

    with socket.create_connection(("127.0.0.1", strict_v1.v1_port), timeout=10) as s:
        sent = 0
        chunk = b"x" * 65536
        s.sendall(b"V1|1|PING|")
        started = time.monotonic()
        try:
            while time.monotonic() - started < 20:
                s.sendall(chunk)
                sent += len(chunk)
        except (ConnectionError, socket.timeout):
            pass
        assert time.monotonic() - started < 15  # not read for ever
        assert sent < MAX_LINE + LINGER_BYTES + 16 * 1024 * 1024  # past the drop budget: cut (socket buffers aside)
    deadline = time.monotonic() + 5
    while _v1_stats(strict_v1)["lingering_connections"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _v1_stats(strict_v1)["lingering_connections"] == 0


def _v1_partition_of_30_kb(broker, topic: bytes) -> int:
    """Write 30 records of 1000 bytes under one key (so one partition, whose CONSUME reply is
    about 30 KB); returns the partition."""
    with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as s, s.makefile("rb") as reader:
        for i in range(30):
            s.sendall(b"V1|%d|PRODUCE|%s k:%s acks=1\n" % (i, topic, b"v" * 1000))
            reply = reader.readline()
            assert reply.startswith(b"V1|%d|OK|partition=" % i)
    return int(reply.split(b"partition=")[1].split()[0])


def test_v1_pipelined_requests_without_reading_hold_at_most_the_output_budget(strict_v1):
    topic = b"pipelined"
    partition = _v1_partition_of_30_kb(strict_v1, topic)
    requests = b"".join(b"V1|%d|CONSUME|%s %d 0\n" % (i, topic, partition) for i in range(2000))
    hostile = socket.socket()
    hostile.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hostile.connect(("127.0.0.1", strict_v1.v1_port))
    hostile.settimeout(0.2)
    try:
        try:
            hostile.sendall(requests)  # 60 MB of replies if the broker answered them all
        except (socket.timeout, ConnectionError):
            pass
        # caught while paused, before the frame timeout aborts it
        stats = wait_until(lambda: (lambda s: s if s["paused_connections"] == 1 else None)(_v1_stats(strict_v1)),
                            step=0.01)
        assert stats and stats["paused_connections"] == 1 and stats["output_pauses"] >= 1
        # the budget, one reply over it, and the lines waiting for their turn
        assert stats["held_bytes"] <= 64 * 1024 + 40 * 1024 + len(requests)
        # it read none of its replies for the frame timeout: aborted, what it held is freed
        assert wait_until(lambda: _v1_stats(strict_v1)["output_timeouts"] == 1)
        stats = _v1_stats(strict_v1)
        assert stats["connections"] == 0 and stats["held_bytes"] == 0
        assert _closed_by_broker(hostile, 3)
    finally:
        hostile.close()


def test_v1_slow_reader_that_takes_its_replies_is_not_timed_out(strict_v1):
    topic = b"slow-reader"
    partition = _v1_partition_of_30_kb(strict_v1, topic)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", strict_v1.v1_port))
    with s:
        s.sendall(b"".join(b"V1|%d|CONSUME|%s %d 0\n" % (i, topic, partition) for i in range(300)))
        assert wait_until(lambda: _v1_stats(strict_v1)["paused_connections"] == 1)
        s.settimeout(5)
        deadline = time.monotonic() + 2.5  # well past the 1 s frame timeout, reading all along
        while time.monotonic() < deadline:
            assert s.recv(16 * 1024)
            time.sleep(0.1)
        stats = _v1_stats(strict_v1)
        assert stats["output_timeouts"] == 0 and stats["connections"] == 1


def test_v1_pipelined_requests_read_late_are_all_answered_in_order(strict_v1):
    topic = b"read-late"
    partition = _v1_partition_of_30_kb(strict_v1, topic)
    count = 300  # 9 MB of replies: far over the output budget and the socket buffers
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # what is not read stays in the broker
    s.connect(("127.0.0.1", strict_v1.v1_port))
    s.settimeout(5)
    with s, s.makefile("rb") as reader:
        s.sendall(b"".join(b"V1|%d|CONSUME|%s %d 0\n" % (i, topic, partition) for i in range(count)))
        assert wait_until(lambda: _v1_stats(strict_v1)["paused_connections"] == 1)
        expected = b"messages=" + b",".join(b"%d:%s" % (n, b"v" * 1000) for n in range(30)) + b" hw=30\n"
        for i in range(count):
            assert reader.readline() == b"V1|%d|OK|" % i + expected
    assert _v1_stats(strict_v1)["output_pauses"] >= 1


def test_pulsar_and_v1_connections_share_the_descriptor_room(tmp_path, monkeypatch):
    from pulsarwire.broker import server

    monkeypatch.setattr(server, "descriptor_limit", lambda: 16 + server._SPARE_DESCRIPTORS + 20)
    broker = BrokerThread(tmp_path / "data", v1_port=0, max_open_files=16).start()
    try:
        assert (broker.broker.pulsar.max_connections, broker.broker.v1.max_connections) == (10, 10)
        held = [socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) for _ in range(10)]
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as extra:
            assert _v1_lines(extra)[0].startswith(b"V1|0|ERR|TOO_MANY_CONNECTIONS|")
        for s in held:
            s.close()
    finally:
        broker.stop()
    alone = BrokerThread(tmp_path / "alone", v1_port=None, max_open_files=16).start()
    try:
        assert alone.broker.pulsar.max_connections == 20  # without V1 the Pulsar port has all of it
    finally:
        alone.stop()


def _send_numbered(client, topic: str, count: int) -> None:
    """Messages b"0" to b"<count - 1>", one entry each, all stored when it returns."""
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    producer.close()


def _numbered_topic(broker, client, name: str, count: int):
    """The broker's Topic `name`, holding messages b"0" to b"<count - 1>" (see _send_numbered)."""
    _send_numbered(client, name, count)
    return broker.call(lambda: broker.broker.core.topics[f"persistent://public/default/{name}"])


def _drain(consumer, timeout_ms: int = 700) -> list:
    """Every message the consumer receives until none comes for `timeout_ms`: what comes
    without waiting (to check that nothing more comes; see _take for what the broker owes)."""
    from pulsarwire import sync
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_ms))
        except sync.Timeout:
            return got


def _take(consumer, count: int) -> list:
    """The `count` messages the broker owes the consumer, each waited for up to 30 s (on a loaded
    machine one can take longer than _drain's gap), then whatever more comes without waiting."""
    return [consumer.receive(30_000) for _ in range(count)] + _drain(consumer)


def test_a_consumer_that_acknowledges_nothing_holds_at_most_max_unacked_messages(tmp_path):
    """As Pulsar's maxUnackedMessagesPerConsumer: a consumer of a shared subscription that keeps
    granting permits but acknowledges nothing gets that many messages, then nothing until it
    acknowledges half; so what the broker tracks for it stays bounded. Nothing is lost: the rest follows the acks."""
    from pulsarwire import sync

    broker = BrokerThread(tmp_path / "data", v1_port=None, max_unacked_messages_per_consumer=100).start()
    client = sync.Client(broker.url)
    try:
        topic = _numbered_topic(broker, client, "unacked", 300)
        consumer = client.subscribe("unacked", "s", consumer_type=sync.ConsumerType.Shared, receiver_queue_size=1000,
                                    initial_position=sync.InitialPosition.Earliest)

        held = _take(consumer, 100)
        assert len(held) == 100
        subscription = broker.call(lambda: topic.subscriptions["s"])
        assert broker.call(lambda: (len(subscription.owner), subscription.consumers[0].blocked)) == (100, True)
        for message in held[:49]:  # 51 still held: above half, still blocked
            consumer.acknowledge(message)
        assert _drain(consumer) == []
        consumer.acknowledge(held[49])  # 50 held: half, taking again, up to 100 held
        more = _take(consumer, 50)
        assert len(more) == 50
        for message in held[50:] + more:
            consumer.acknowledge(message)
        rest = _take(consumer, 100)  # up to 100 held again
        for message in rest:
            consumer.acknowledge(message)
        rest += _take(consumer, 50)
        assert sorted(int(m.data()) for m in held + more + rest) == list(range(300))
    finally:
        client.close()
        broker.stop()


def test_an_exclusive_consumer_that_acknowledges_nothing_is_tracked_as_a_range_past_the_bound(tmp_path):
    """Exclusive and Failover consumers are not blocked at max_unacked_messages (as in Pulsar), so
    past max_tracked_entries what the active consumer is sent is one range, not an entry each:
    the broker's memory stays bounded, and nothing is lost: a redelivery or the next consumer
    gets every entry not acknowledged, tracked or not."""
    from pulsarwire import sync

    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    client = sync.Client(broker.url)
    try:
        topic = _numbered_topic(broker, client, "range", 300)
        broker.call(lambda: setattr(topic, "max_tracked_entries", 50))

        def subscribe():
            return client.subscribe("range", "s", receiver_queue_size=1000, negative_ack_redelivery_delay_ms=10,
                                    initial_position=sync.InitialPosition.Earliest)

        def tracked():
            subscription = topic.subscriptions["s"]
            return len(subscription.owner), subscription._untracked_from

        consumer = subscribe()
        held = _take(consumer, 300)
        assert [int(m.data()) for m in held] == list(range(300))
        assert broker.call(tracked) == (50, 50)
        consumer.acknowledge_cumulative(held[99])
        assert wait_until(lambda: broker.call(tracked) == (0, 100))
        consumer.redeliver_unacknowledged_messages()
        again = _take(consumer, 200)
        assert [int(m.data()) for m in again] == list(range(100, 300))
        assert broker.call(tracked) == (50, 150)
        consumer.negative_acknowledge(again[20])  # tracked: entry 120
        consumer.negative_acknowledge(again[80])  # untracked: entry 180
        nacked = _take(consumer, 2)
        assert sorted((int(m.data()), m.redelivery_count()) for m in nacked) == [(120, 1), (180, 1)]
        consumer.close()  # nothing acknowledged past 99: the next consumer gets all of it
        consumer = subscribe()
        rest = _take(consumer, 200)
        assert sorted(int(m.data()) for m in rest) == list(range(100, 300))
        consumer.acknowledge_cumulative(max(rest, key=lambda m: int(m.data())))
        assert wait_until(lambda: broker.call(tracked) == (0, None))
    finally:
        client.close()
        broker.stop()


def test_a_failover_consumer_taking_over_gets_the_untracked_range_too(tmp_path):
    from pulsarwire import sync

    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    client = sync.Client(broker.url)
    try:
        topic = _numbered_topic(broker, client, "failover-range", 300)
        broker.call(lambda: setattr(topic, "max_tracked_entries", 50))

        def subscribe(name):
            return client.subscribe("failover-range", "s", consumer_type=sync.ConsumerType.Failover,
                                    consumer_name=name, receiver_queue_size=1000,
                                    initial_position=sync.InitialPosition.Earliest)

        first = subscribe("b")
        assert [int(m.data()) for m in _take(first, 300)] == list(range(300))
        assert broker.call(lambda: topic.subscriptions["s"]._untracked_from) == 50
        second = subscribe("a")  # first by name: the active consumer now
        assert sorted(int(m.data()) for m in _take(second, 300)) == list(range(300))
    finally:
        client.close()
        broker.stop()


def test_deduplication_state_keeps_at_most_max_dedup_producers_names(tmp_path):
    """Each producer name that sent costs the topic's deduplication state an entry, written with
    every save: past the bound the names of producers not attached are forgotten, the ones
    attached longest ago first, and never an attached producer's."""
    from pulsarwire import sync

    broker = BrokerThread(tmp_path / "data", v1_port=None, deduplication=True).start()
    client = sync.Client(broker.url)
    try:
        steady = client.create_producer("dedup-names", producer_name="steady")
        steady.send(b"first", sequence_id=10)
        topic = broker.call(lambda: broker.broker.core.topics["persistent://public/default/dedup-names"])
        broker.call(lambda: setattr(topic, "max_dedup_producers", 4))
        for n in range(8):
            producer = client.create_producer("dedup-names", producer_name=f"once-{n}")
            producer.send(b"%d" % n, sequence_id=5)
            producer.close()
        names = broker.call(lambda: list(topic.last_sequence))
        assert len(names) <= 4 and "steady" in names and "once-7" in names
        assert steady.send(b"again", sequence_id=10).entry_id() == -1  # still a duplicate for it
        forgotten = client.create_producer("dedup-names", producer_name="once-0")
        assert forgotten.send(b"0 again", sequence_id=5).entry_id() >= 0  # starts afresh
    finally:
        client.close()
        broker.stop()


def test_a_reader_acknowledges_what_it_read_so_the_broker_stops_tracking_it(tmp_path):
    """As the official readers do, a pulsarwire Reader acknowledges cumulatively what it has
    read: the broker's non-durable subscription then holds nothing for it (an Exclusive
    subscription has no unacknowledged limit, so a reader that never acknowledged would cost
    the broker memory for every entry it read)."""
    from pulsarwire import sync

    broker = BrokerThread(tmp_path / "data", v1_port=None).start()
    client = sync.Client(broker.url)
    try:
        _send_numbered(client, "read-all", 200)
        reader = client.create_reader("read-all", sync.MessageId.earliest)
        assert [int(reader.read_next(5000).data()) for _ in range(200)] == list(range(200))

        def held():
            topic = broker.broker.core.topics["persistent://public/default/read-all"]
            return sum(len(s.owner) for s in topic.subscriptions.values())

        deadline = time.monotonic() + 10
        while broker.call(held) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.call(held) == 0
    finally:
        client.close()
        broker.stop()


def test_v1_connections_probe_a_silent_peer_with_tcp_keepalive(tmp_path):
    """V1 has no heartbeat per connection: TCP keep-alive probes find a peer that vanished without
    a word (host down) in about 90 s, so its place among the connections is given back."""
    from pulsarwire.broker.v1 import KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES

    broker = BrokerThread(tmp_path / "data", v1_port=0).start()
    try:
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=5) as s:
            s.sendall(b"V1|1|PING|\n")
            assert s.recv(1000).startswith(b"V1|1|OK")

            def options():
                (connection,) = broker.broker.v1.connections
                sock = connection.transport.get_extra_info("socket")
                return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))

            keepalive, idle, interval, probes = broker.call(options)
            assert keepalive and (idle, interval, probes) == (KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES)
    finally:
        broker.stop()


# issue 32 item 5 / issue 26 goal 3: no exception escapes a request handler

def _broker_process(tmp_path, *flags: str, nofile: int | None = None, tls: tuple | None = None):
    """A broker subprocess logging to a file: (process, Pulsar port, log path). `nofile` lowers its
    descriptor limit; `tls` (cert, key) adds a TLS port, whose number is the process's `tls_port`."""
    import resource
    import subprocess
    import sys

    from ..peers import wait_for_port

    port = free_port()
    extra = list(flags)
    tls_port = None
    if tls is not None:
        tls_port = free_port()
        extra += ["--tls-port", str(tls_port), "--tls-cert-file", tls[0], "--tls-key-file", tls[1]]
    log_path = tmp_path / "broker.log"

    def lower_limit():
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(tmp_path / "data"), "--port",
             str(port), "--v1-port", "-1", *extra], stdout=log_file, stderr=subprocess.STDOUT,
            preexec_fn=lower_limit)
    wait_for_port(port, process=process)
    process.tls_port = tls_port
    return process, port, log_path


_INVALID_UTF8_MARK = "\u2603MARK"  # replaced by as many bytes that are not UTF-8 once encoded
_FUZZ_STRINGS = ["persistent://public/default/fuzz", "fuzz", "a/../b", "", "x" * 300, "persistent://public//x",
                 "bad\x00name", "non-persistent://public/default/f", "persistent://public/default/fuzz-partition-0",
                 "public/default", "public", "\u00e9" * 200, ".*", "(a+)+$", "s", "token",
                 "persistent://public/default/" + _INVALID_UTF8_MARK]
_FUZZ_FIELDS = {T.LOOKUP: "lookupTopic", T.PARTITIONED_METADATA: "partitionMetadata", T.PRODUCER: "producer",
                T.CLOSE_PRODUCER: "close_producer", T.SUBSCRIBE: "subscribe", T.FLOW: "flow", T.ACK: "ack",
                T.REDELIVER_UNACKNOWLEDGED_MESSAGES: "redeliverUnacknowledgedMessages", T.SEEK: "seek",
                T.UNSUBSCRIBE: "unsubscribe", T.CLOSE_CONSUMER: "close_consumer",
                T.GET_LAST_MESSAGE_ID: "getLastMessageId", T.GET_TOPICS_OF_NAMESPACE: "getTopicsOfNamespace",
                T.GET_SCHEMA: "getSchema", T.PING: "ping", T.AUTH_RESPONSE: "authResponse",
                T.GET_OR_CREATE_SCHEMA: "getOrCreateSchema", T.CONNECT: "connect", T.SEND: "send"}


def _fuzz_value(rng, field, depth: int):
    from google.protobuf.descriptor import FieldDescriptor as F

    kind = field.cpp_type
    if kind == F.CPPTYPE_STRING:
        if field.type == F.TYPE_BYTES:
            return rng.randbytes(rng.choice([0, 1, 8, 40]))
        return rng.choice(_FUZZ_STRINGS)
    if kind == F.CPPTYPE_BOOL:
        return rng.random() < 0.5
    if kind == F.CPPTYPE_ENUM:
        return rng.choice(field.enum_type.values).number
    if kind in (F.CPPTYPE_UINT64, F.CPPTYPE_INT64):
        values = [0, 1, 2, (1 << 63) - 1, rng.randrange(1 << 40)]
        values += [(1 << 64) - 1, 1 << 63] if kind == F.CPPTYPE_UINT64 else [-1, -(1 << 63)]
        return rng.choice(values)
    if kind in (F.CPPTYPE_UINT32, F.CPPTYPE_INT32):
        return rng.choice([0, 1, 2, 21, (1 << 31) - 1] + ([(1 << 32) - 1] if kind == F.CPPTYPE_UINT32 else [-1]))
    if kind in (F.CPPTYPE_DOUBLE, F.CPPTYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e300])
    return None  # a message: filled by _fuzz_fill


def _fuzz_fill(rng, message, depth: int = 0) -> None:
    """Set a random choice of `message`'s fields (every required one) to edge values."""
    from google.protobuf.descriptor import FieldDescriptor as F

    for field in message.DESCRIPTOR.fields:
        required = field.is_required
        if not required and rng.random() < 0.5:
            continue
        if field.cpp_type == F.CPPTYPE_MESSAGE:
            if depth > 2 and not required:
                continue
            if field.is_repeated:
                for _ in range(rng.randrange(3)):
                    _fuzz_fill(rng, getattr(message, field.name).add(), depth + 1)
            else:
                _fuzz_fill(rng, getattr(message, field.name), depth + 1)
                getattr(message, field.name).SetInParent()
        elif field.is_repeated:
            getattr(message, field.name).extend(_fuzz_value(rng, field, depth) for _ in range(rng.randrange(4)))
        else:
            setattr(message, field.name, _fuzz_value(rng, field, depth))


def _fuzz_frame(rng) -> bytes:
    """One request with edge-valued fields, sometimes with bytes of its command flipped."""
    kind = rng.choice(sorted(set(_FUZZ_FIELDS) - {T.CONNECT}) if rng.random() < 0.98 else [T.CONNECT])
    cmd = T(type=kind)
    _fuzz_fill(rng, getattr(cmd, _FUZZ_FIELDS[kind]))
    getattr(cmd, _FUZZ_FIELDS[kind]).SetInParent()
    if kind == T.SEND:
        metadata = pb.MessageMetadata()
        _fuzz_fill(rng, metadata)
        data = codec.encode_payload_command(cmd, metadata, rng.randbytes(rng.choice([0, 10, 300])))
    else:
        data = codec.encode_command(cmd)
    mark = _INVALID_UTF8_MARK.encode()
    data = data.replace(mark, b"\xff" * len(mark))
    if rng.random() < 0.05:  # flip bytes inside the command, keeping the frame's sizes
        body = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            body[rng.randrange(8, len(body))] ^= 1 << rng.randrange(8)
        data = bytes(body)
    return data


def test_fuzzed_requests_get_typed_errors_never_a_traceback(tmp_path):
    """1 200 seeded requests with edge values (bad names, names that are not UTF-8, unknown ids,
    extreme numbers, flipped bytes) after CONNECT: the broker answers or closes that connection,
    logs no traceback, and serves an honest client throughout."""
    import random

    rng = random.Random(20260326)
    process, port, log_path = _broker_process(tmp_path)
    topic = "persistent://public/default/fuzz"
    try:
        survived = 0
        for _ in range(60):
            with Raw(port) as raw:
                raw.producer(topic)
                raw.subscribe(topic)
                raw.send(b"".join(_fuzz_frame(rng) for _ in range(20)))
                raw.sock.settimeout(10)
                try:
                    raw.send(command(T.PING, "ping", pb.CommandPing()))
                    frame = raw.next()  # the answers come first, in order; then the PONG
                    while frame is not None and frame.type != T.PONG:
                        frame = raw.next()
                    survived += frame is not None
                except ConnectionError:
                    pass
        assert survived >= 30  # most bad requests cost an error reply, not the connection
        with Raw(port) as honest:
            assert honest.ping()
            honest.producer("persistent://public/default/after-fuzz")
            assert honest.publish(1, 0, b"fine").type == T.SEND_RECEIPT
            assert honest.subscribe("persistent://public/default/after-fuzz").type == T.SUCCESS
            honest.flow(1, 10)
            assert honest.next().type == T.MESSAGE
        assert process.poll() is None
    finally:
        terminate_process = __import__("tests.peers", fromlist=["terminate"]).terminate
        terminate_process(process)
    log_text = log_path.read_text(errors="replace")
    assert "Traceback" not in log_text and "Fatal error" not in log_text, log_text[-3000:]
    assert "pulsarwire: error" not in log_text and process.returncode in (0, -15), log_text[-3000:]


def test_topic_names_that_are_not_utf8_and_get_schema_of_a_bad_name_are_answered(broker):
    with Raw(broker.broker.port) as raw:
        cmd = command(T.PRODUCER, "producer", pb.CommandProducer(
            topic="persistent://public/default/" + _INVALID_UTF8_MARK, producer_id=1, request_id=7))
        mark = _INVALID_UTF8_MARK.encode()
        raw.send(cmd.replace(mark, b"\xff" * len(mark)))
        answer = raw.next()
        assert answer.type == T.ERROR and answer.command.error.error == pb.InvalidTopicName
        raw.send(command(T.GET_SCHEMA, "getSchema", pb.CommandGetSchema(request_id=8, topic="a/../b")))
        answer = raw.next()
        assert answer.type == T.GET_SCHEMA_RESPONSE
        assert answer.command.getSchemaResponse.error_code == pb.InvalidTopicName
        assert raw.ping()  # the connection stays usable


def test_a_request_whose_handler_fails_is_answered_and_the_connection_stays_up(broker, monkeypatch):
    """A failure the broker did not foresee (here a damaged metadata read) answers that request with
    a typed error at once, instead of leaving the client to its timeout."""
    from pulsarwire.broker.core import BrokerCore

    def damaged(self, name):
        raise ValueError("topics.json holds a list, not an object")
    monkeypatch.setattr(BrokerCore, "partitions_of", damaged)
    with Raw(broker.broker.port) as raw:
        raw.send(command(T.PARTITIONED_METADATA, "partitionMetadata", pb.CommandPartitionedTopicMetadata(
            topic="persistent://public/default/m", request_id=5)))
        answer = raw.next().command.partitionMetadataResponse
        assert answer.request_id == 5 and answer.error == pb.MetadataError
        assert "topics.json" in answer.message
        assert raw.ping()


# issue 32 item 1: TLS handshakes count from the first byte; a descriptor in reserve to refuse with

def _closed_soon(sock: socket.socket, timeout: float) -> bool:
    try:
        return _closed_by_broker(sock, timeout)
    except OSError:
        return True


def _tls_connect(port: int, cert) -> bool:
    """A TLS client's handshake and CONNECT: whether the broker answered CONNECTED."""
    import ssl

    context = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        with context.wrap_socket(plain, server_hostname="127.0.0.1") as tls:
            tls.sendall(command(T.CONNECT, "connect", pb.CommandConnect(client_version="tls", protocol_version=21)))
            reader = codec.FrameReader()
            while True:
                data = tls.recv(65536)
                if not data:
                    return False
                reader.feed(data)
                frame = reader.next_frame()
                if frame is not None:
                    return frame.type == T.CONNECTED


def test_tls_connections_that_never_handshake_count_against_the_limit_and_the_timeout(tmp_path):
    from ..peers import terminate

    cert, key = self_signed_certificate(tmp_path)
    process, port, log_path = _broker_process(tmp_path, "--max-connections", "20", "--handshake-timeout", "1",
                                              tls=(str(cert), str(key)))
    try:
        stalled = [socket.create_connection(("127.0.0.1", process.tls_port), timeout=5) for _ in range(50)]
        closed = sum(_closed_soon(s, 0.05) for s in stalled)
        assert closed >= 30  # past --max-connections at once, handshake or not
        assert all(_closed_soon(s, 5) for s in stalled)  # --handshake-timeout bounds a stalled handshake
        for s in stalled:
            s.close()
        assert _tls_connect(process.tls_port, cert)
        with Raw(port) as plain:
            assert plain.connected.type == T.CONNECTED
    finally:
        terminate(process)
    assert process.returncode in (0, -15)


def test_a_tls_session_holds_a_small_read_buffer_counted_in_the_output_budget(tmp_path):
    """Each accepted TLS connection, handshake or not, holds TLS_READ_BUFFER_BYTES (asyncio's own
    start_tls: 256 KiB), and that is counted in the broker's output budget until it closes."""
    from pulsarwire.broker.listener import TLS_READ_BUFFER_BYTES
    from pulsarwire.broker.server import tls_context

    from ..peers import BrokerThread

    cert, key = self_signed_certificate(tmp_path)
    broker = BrokerThread(tmp_path / "data", v1_port=None, http_port=None, tls_port=free_port(),
                          ssl_context=tls_context(str(cert), str(key))).start()
    service = broker.broker.pulsar
    try:
        before = service.output_total
        stalled = [socket.create_connection(("127.0.0.1", broker.broker.tls_port), timeout=5) for _ in range(10)]
        assert wait_until(lambda: service.output_total - before == 10 * TLS_READ_BUFFER_BYTES)
        buffers = {len(c.transport._ssl_protocol._ssl_buffer) for c in service.connections
                   if c.transport is not None and hasattr(c.transport, "_ssl_protocol")}
        assert buffers <= {TLS_READ_BUFFER_BYTES}
        assert _tls_connect(broker.broker.tls_port, cert)  # a handshake through the small buffer
        for s in stalled:
            s.close()
        assert wait_until(lambda: service.output_total == before)
    finally:
        broker.stop()


def test_a_flood_past_the_descriptors_is_refused_from_the_reserve_without_flooding_the_log(tmp_path):
    """With --max-connections past what the descriptor limit holds, a flood takes every descriptor:
    the broker still accepts and refuses (ServiceNotReady, from a descriptor kept in reserve), logs
    that at most once a second, and serves again once the flood goes."""
    from ..peers import terminate

    process, port, log_path = _broker_process(tmp_path, "--max-connections", "1000", nofile=96)
    try:
        with Raw(port) as honest:
            flood = []
            for _ in range(150):
                try:
                    flood.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    break
            time.sleep(1.5)
            answers = []
            for s in flood:
                s.settimeout(0.01)
                try:
                    answers.append(s.recv(4096))
                except (socket.timeout, OSError):
                    pass
            assert any(b"no room for another connection" in a for a in answers)
            assert honest.ping()  # a connection served before the flood goes on
            for s in flood:
                s.close()
        with wait_until(lambda: _connected(port)) as again:
            assert again.ping()
    finally:
        terminate(process)
    log_text = log_path.read_text(errors="replace")
    assert "Too many open files" not in log_text and "Traceback" not in log_text, log_text[-2000:]
    assert log_text.count("no descriptors left") <= 10


# issue 30 item 5, the Pulsar port: one address, or connections that never CONNECT, cannot lock others out

def _from(address: str, port: int) -> socket.socket:
    """A connection from another loopback address (127.0.0.0/8 is all loopback)."""
    s = socket.socket()
    s.settimeout(5)
    s.bind((address, 0))
    s.connect(("127.0.0.1", port))
    return s


def _answer(s: socket.socket, timeout: float = 2):
    """The first frame the broker sends on `s`, or None when it closed or sent nothing."""
    s.settimeout(timeout)
    reader = codec.FrameReader()
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return None
            reader.feed(data)
            frame = reader.next_frame()
            if frame is not None:
                return frame
    except (socket.timeout, OSError):
        return None


def test_one_address_holds_at_most_its_share_of_the_connections(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None, max_connections=40, max_connections_per_address=10).start()
    connect = command(T.CONNECT, "connect", pb.CommandConnect(client_version="greedy", protocol_version=21))
    greedy = []
    try:
        for _ in range(30):
            s = _from("127.0.0.2", broker.broker.port)
            s.sendall(connect)
            greedy.append(s)
        answers = [_answer(s) for s in greedy]
        assert sum(a is not None and a.type == T.CONNECTED for a in answers) == 10
        refused = [a for a in answers if a is not None and a.type == T.ERROR]
        assert len(refused) == 20 and all(a.command.error.error == pb.ServiceNotReady for a in refused)
        assert "from 127.0.0.2" in refused[0].command.error.message
        with Raw(broker.broker.port) as honest:  # another address still gets in
            assert honest.connected.type == T.CONNECTED and honest.ping()
        assert _stats(broker)["refused_address_connections"] == 20
    finally:
        for s in greedy:
            s.close()
        broker.stop()


def test_connections_that_never_connect_leave_a_share_of_places_to_those_that_do(tmp_path):
    """20 places, 40 connections that send nothing (auth on, so CONNECT means authenticated): they
    hold at most 15, each newer one taking the place of the one that waited longest, so a client with
    a token still gets in while they wait out the handshake timeout."""
    broker = BrokerThread(tmp_path / "data", v1_port=None, max_connections=20, max_connections_per_address=100,
                          auth_tokens={"secret"}, handshake_timeout=30).start()
    silent = []
    try:
        for _ in range(40):
            silent.append(socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5))
        assert wait_until(lambda: _stats(broker).get("displaced_unauthenticated_connections") == 25)
        assert _stats(broker)["unauthenticated_connections"] == 15
        assert sum(_closed_soon(s, 0.05) for s in silent) == 25  # the oldest ones
        with Raw(broker.broker.port, token="secret") as honest:
            assert honest.connected.type == T.CONNECTED and honest.ping()
            assert honest.producer("persistent://public/default/share").type == T.PRODUCER_SUCCESS
            # a wrong token takes no kept place: it stays among the connections that wait
            with Raw(broker.broker.port, token="guess") as wrong:
                assert wrong.ping()
                stats = _stats(broker)
                assert stats["unauthenticated_connections"] == 15 and stats["connections"] == 16
    finally:
        for s in silent:
            s.close()
        broker.stop()


def test_a_connection_idle_after_connect_is_closed_and_one_with_a_producer_is_not(tmp_path):
    broker = BrokerThread(tmp_path / "data", v1_port=None, idle_timeout=0.5).start()
    try:
        with Raw(broker.broker.port) as idle, Raw(broker.broker.port) as busy:
            busy.producer("persistent://public/default/busy")
            idle.sock.settimeout(5)
            started = time.monotonic()
            assert idle.ping()  # PINGs are no requests: they keep no connection open
            assert idle.next() is None and time.monotonic() - started < 5
            assert busy.ping()
            assert _stats(broker)["idle_timeouts"] == 1
    finally:
        broker.stop()


# issue 26 goal 5: one memory budget for the output of all connections and the entry cache

def test_consumers_that_never_read_stay_within_the_broker_wide_output_budget(tmp_path):
    """30 subscriptions that never read a topic of 40 entries of 256 KiB (10 MiB each, 300 MiB in
    all with a 4 MiB output budget per connection): the broker holds at most its output budget (the
    memory budget less the entry cache) plus a little per connection (a consumer whose kernel buffer
    is full gets nothing more), and an honest consumer still reads everything meanwhile."""
    entry, count, budget, cache = 256 * 1024, 40, 12 * 1024 * 1024, 4 * 1024 * 1024
    broker = BrokerThread(tmp_path / "data", v1_port=None, memory_budget=budget, max_cache_bytes=cache).start()
    topic = "persistent://public/default/unread-by-many"
    stuck = []
    try:
        with Raw(broker.broker.port) as producer:
            producer.producer(topic)
            for seq in range(count):
                assert producer.publish(1, seq, bytes([seq]) * entry).type == T.SEND_RECEIPT
        for i in range(30):
            raw = Raw(broker.broker.port, receive_buffer=4096)
            assert raw.subscribe(topic, sub=f"never-{i}").type == T.SUCCESS
            raw.flow(1, 1000)
            stuck.append(raw)
        assert wait_until(lambda: _stats(broker)["squeezed"] == 1)
        time.sleep(0.5)  # whatever could still be dispatched has been
        stats = _stats(broker)
        limit = budget - cache + entry + 30 * 64 * 1024
        assert stats["output_bytes"] <= limit and stats["max_total_output_bytes"] == budget - cache
        with Raw(broker.broker.port) as honest:
            honest.subscribe(topic, sub="reads")
            honest.flow(1, 1000)
            ids = [honest.next().command.message.message_id.entryId for _ in range(count)]
            assert ids == list(range(count))
        assert _stats(broker)["output_bytes"] <= limit
        for raw in stuck:
            raw.close()
        assert wait_until(lambda: _stats(broker)["squeezed"] == 0 and _stats(broker)["output_bytes"] == 0)
    finally:
        for raw in stuck:
            raw.close()
        broker.stop()


# issue 32 item 2: opening topics waits on the disk, off the event loop

@pytest.mark.parametrize("subscribe", [False, True], ids=["producers", "subscriptions"])
def test_a_flood_of_new_topics_does_not_hold_up_another_connection(broker, subscribe):
    """One connection pipelines requests on new topics (each one's folder, files and metadata
    made or read); another connection's PING and lookup are answered while the flood still
    goes on, not once it is over (the flood fits one turn of the event loop's request limit)."""
    count = 240
    requests = []
    for i in range(count):
        topic = f"persistent://public/default/flood-{i}"
        if subscribe:
            requests.append(command(T.SUBSCRIBE, "subscribe", pb.CommandSubscribe(
                topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared, consumer_id=i, request_id=i)))
        else:
            requests.append(command(T.PRODUCER, "producer", pb.CommandProducer(
                topic=topic, producer_id=i, request_id=i)))
    with Raw(broker.broker.port, timeout=30) as flood, Raw(broker.broker.port, timeout=30) as honest:
        flood.send(b"".join(requests))
        answered = 1 if flood.next() is not None else 0  # the flood is under way
        honest.send(command(T.PING, "ping", pb.CommandPing()) + command(T.LOOKUP, "lookupTopic", pb.CommandLookupTopic(
            topic="persistent://public/default/honest", request_id=1)))
        answers = [honest.next(skip_pings=False).type for _ in range(2)]
        assert sorted(answers) == sorted([T.PONG, T.LOOKUP_RESPONSE])
        # what the flood had been answered by then (and maybe a little after)
        flood.sock.setblocking(False)
        try:
            while True:
                data = flood.sock.recv(1 << 20)
                if not data:
                    break
                flood.reader.feed(data)
        except BlockingIOError:
            pass
        flood.pending.extend(flood.reader)
        before = answered + sum(1 for frame in flood.pending if frame.type != T.PING)
        assert before < count, "the other connection waited until the flood was over"
        flood.sock.setblocking(True)
        flood.sock.settimeout(30)
        while answered < count:
            frame = flood.next()
            assert frame is not None
            answered += 1
            assert frame.type == (T.SUCCESS if subscribe else T.PRODUCER_SUCCESS), frame
