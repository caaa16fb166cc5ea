"""Faults and abuse as the official client meets them, black-box (first written from issue 11's
reproductions): a full disk, damaged logs, a descriptor limit, hostile raw sockets, tokens and
names, access modes, kill -9.

Each test starts the broker as a subprocess (`python -m pulsarwire broker ...`), damages or
abuses it as an outsider could (a full file system, a byte flipped on disk, a descriptor limit,
raw sockets, the official client), and checks the promise: acknowledged means durable, one bad
byte or one bad client costs that alone, every error is answered.
"""
from __future__ import annotations

import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

from pulsarwire import codec
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.broker import metafile

from ..helpers import self_signed_certificate, wait_until
from ..peers import free_port, wait_for_port

pulsar = pytest.importorskip("pulsar")

HEADER = struct.Struct(">IIQI")  # a log record's header, as the storage module documents it


# -- the broker as an outsider starts it ------------------------------------------------------

class Broker:
    def __init__(self, data_dir, *extra: str, limits: dict | None = None, port: int | None = None) -> None:
        self.data_dir = str(data_dir)
        self.extra = list(extra)
        self.limits = limits or {}
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(os.path.dirname(self.data_dir) + "-logs", f"broker-{uuid.uuid4().hex[:6]}.log")

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> "Broker":
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        limits = self.limits

        def preexec():
            for which, value in limits.items():
                resource.setrlimit(which, value)

        self._log = open(self.log_path, "ab")
        args = ["--port", str(self.port)] if "--port" not in self.extra else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", self.data_dir, *args,
             "--v1-port", "-1", *self.extra],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=preexec)
        if wait:
            wait_for_port(self.port, process=self.process)
        return self

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process:
            self._log.close()

    def restart(self) -> "Broker":
        self.stop()
        return self.start()


@pytest.fixture
def broker_factory(tmp_path):
    started: list[Broker] = []

    def make(*extra, data_dir=None, **kwargs) -> Broker:
        b = Broker(data_dir or tmp_path / "data", *extra, **kwargs)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


def official(url, **options):
    options.setdefault("operation_timeout_seconds", 10)
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **options)


def topic_name(prefix="repro") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


def read_all(url, topic, *, timeout_ms=600, limit=None) -> list[bytes]:
    """Everything a fresh official consumer receives from the start of the topic (never empty
    here): the first message may take long on a loaded machine, the end is a `timeout_ms` gap."""
    client = official(url)
    try:
        consumer = client.subscribe(topic, f"read-{uuid.uuid4().hex[:6]}",
                                    initial_position=pulsar.InitialPosition.Earliest,
                                    receiver_queue_size=1000)
        out = []
        while limit is None or len(out) < limit:
            try:
                msg = consumer.receive(timeout_millis=timeout_ms if out else 30_000)
            except pulsar.Timeout:
                break
            out.append(msg.data())
            consumer.acknowledge(msg)
        return out
    finally:
        client.close()


def produce(url, topic, payloads, **options) -> list:
    client = official(url)
    try:
        options.setdefault("batching_enabled", False)
        producer = client.create_producer(topic, **options)
        ids = []
        for payload in payloads:
            ids.append(producer.send(payload))
        producer.close()
        return ids
    finally:
        client.close()


def topic_dir(data_dir, topic) -> str:
    root = os.path.join(str(data_dir), "topics")
    matches = [d for d in os.listdir(root) if topic.rsplit("/", 1)[1] in d]
    assert len(matches) == 1, matches
    return os.path.join(root, matches[0])


def segments(directory) -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".log"))


# -- raw protocol --------------------------------------------------------------------------------

def frame(command: pb.BaseCommand) -> bytes:
    return codec.encode_command(command)


def connect_frame(**fields) -> bytes:
    return frame(pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=pb.CommandConnect(
        client_version="repro", protocol_version=21, **fields)))


class Raw:
    """A hand-driven Pulsar connection."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, timeout: float = 5.0) -> pb.BaseCommand:
        """The next command from the broker (payload, if any, skipped)."""
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 8:
                total, cmd_size = struct.unpack_from(">II", self.buf)
                if len(self.buf) >= 4 + total:
                    cmd = pb.BaseCommand.FromString(self.buf[8:8 + cmd_size])
                    self.buf = self.buf[4 + total:]
                    return cmd
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the broker")
            self.buf += chunk

    def until(self, kind, timeout: float = 5.0) -> pb.BaseCommand:
        deadline = time.monotonic() + timeout
        while True:
            cmd = self.command(max(0.05, deadline - time.monotonic()))
            if cmd.type == kind:
                return cmd

    def handshake(self) -> None:
        self.send(connect_frame())
        assert self.until(pb.BaseCommand.CONNECTED).type == pb.BaseCommand.CONNECTED

    def closed_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                self.sock.settimeout(max(0.05, deadline - time.monotonic()))
                try:
                    if not self.sock.recv(65536):
                        return True
                except socket.timeout:
                    return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        return False

    def close(self) -> None:
        self.sock.close()


def producer_frame(topic, producer_id=1, request_id=1, name=None) -> bytes:
    cmd = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=request_id)
    if name:
        cmd.producer_name = name
    return frame(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=cmd))


def send_frame(producer_id, sequence_id, payload, *, num_messages=1, batch_count=None, name="raw") -> bytes:
    md = pb.MessageMetadata(producer_name=name, sequence_id=sequence_id,
                            publish_time=int(time.time() * 1000))
    if batch_count is not None:
        md.num_messages_in_batch = batch_count
    send = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(
        producer_id=producer_id, sequence_id=sequence_id, num_messages=num_messages))
    return codec.encode_payload_command(send, md, payload)


# -- 1. disk full ----------------------------------------------------------------------------

class SmallDisk:
    """An 8 MiB file system for the data dir: a tmpfs when we may mount one, else a file-size
    rlimit on the broker (writes past it fail with EFBIG, as a full disk fails with ENOSPC).
    `grow()` gives the space back while the broker runs."""

    SIZE = 8 * 1024 * 1024

    def __init__(self, tmp_path) -> None:
        self.path = tmp_path
        self.path.mkdir(parents=True)
        self.mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.SIZE}", "tmpfs",
                                       str(self.path)], capture_output=True).returncode == 0
        self.data_dir = self.path / "data"
        self.broker: Broker | None = None

    @property
    def limits(self) -> dict:
        if self.mounted:
            return {}
        return {resource.RLIMIT_FSIZE: (self.SIZE, resource.RLIM_INFINITY)}

    def grow(self) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,size=256m", str(self.path)], check=True)
        else:
            resource.prlimit(self.broker.process.pid, resource.RLIMIT_FSIZE,
                             (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    def release(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def test_disk_full_fails_sends_then_recovers_with_every_acknowledged_message(tmp_path):
    disk = SmallDisk(tmp_path / "disk")
    broker = Broker(disk.data_dir, limits=disk.limits)
    disk.broker = broker
    topic = topic_name("full")
    payloads = [b"%04d" % i + os.urandom(64 * 1024 - 4) for i in range(200)]  # 12.5 MiB > 8 MiB
    try:
        broker.start()
        # phase 1, raw: a send that cannot be stored is answered with SendError, never a receipt
        raw = Raw(broker.port)
        raw.handshake()
        raw.send(producer_frame(topic, name="raw-writer"))
        raw.until(pb.BaseCommand.PRODUCER_SUCCESS)
        acked, failed_seq = [], None
        for seq, payload in enumerate(payloads):
            raw.send(send_frame(1, seq, payload, name="raw-writer"))
            answer = raw.command()
            if answer.type == pb.BaseCommand.SEND_ERROR:
                failed_seq = seq
                break
            assert answer.type == pb.BaseCommand.SEND_RECEIPT, answer
            assert answer.send_receipt.message_id.entryId == seq
            acked.append(payload)
        assert failed_seq is not None, "200 x 64 KiB all acknowledged on an 8 MiB disk"
        log_text = broker.log_text()
        assert re.search(r"space|too large|EFBIG|ENOSPC|errno 2[78]", log_text, re.I), log_text[-2000:]
        # the same send again, once space returns, is stored (it is no duplicate)
        disk.grow()
        raw.send(send_frame(1, failed_seq, payloads[failed_seq], name="raw-writer"))
        answer = raw.command()
        assert answer.type == pb.BaseCommand.SEND_RECEIPT, answer
        assert answer.send_receipt.message_id.entryId == failed_seq
        acked.append(payloads[failed_seq])
        raw.close()
        broker.restart()
        assert read_all(broker.url, topic) == acked
        broker.kill()
        disk.release()
        disk = SmallDisk(tmp_path / "again")
        broker = Broker(disk.data_dir, limits=disk.limits)
        disk.broker = broker
        broker.start()
        client = official(broker.url)
        producer = client.create_producer(topic, batching_enabled=False)
        # phase 2: sends in flight while the disk is full, then space returns: all of them are
        # stored exactly once and answered with real message ids (a resend is no duplicate)
        acked = []
        rest = payloads
        results = {}

        def callback_for(i):
            return lambda res, msg_id: results.__setitem__(i, (res, msg_id))

        for i, payload in enumerate(rest):
            producer.send_async(payload, callback_for(i))
        deadline = time.monotonic() + 20
        while not re.search(r"space|EFBIG|too large", broker.log_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        disk.grow()
        deadline = time.monotonic() + 30
        while len(results) < len(rest) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(results) == len(rest), f"{len(results)} of {len(rest)} answered"
        assert all(res == pulsar.Result.Ok for res, _ in results.values()), \
            {str(res) for res, _ in results.values()}
        assert all(msg_id.ledger_id() >= 0 and msg_id.entry_id() >= 0 for _, msg_id in results.values())
        acked += rest
        client.close()
        broker.restart()
        stored = read_all(broker.url, topic)
        assert len(stored) == len(set(stored)), "duplicates stored"
        missing = [p[:4] for p in acked if p not in set(stored)]
        assert not missing, f"acknowledged then lost: {missing}"
        # everything acknowledged arrives in order
        order = [s for s in stored if s in set(acked)]
        assert order == [p for p in payloads if p in set(acked)]
    finally:
        broker.stop()
        disk.release()


def test_disk_full_cursors_persist_again_once_space_returns(tmp_path):
    disk = SmallDisk(tmp_path / "disk")
    broker = Broker(disk.data_dir, limits=disk.limits)
    disk.broker = broker
    topic = topic_name("cursor")
    try:
        broker.start()
        produce(broker.url, topic, [b"m%d" % i for i in range(20)])
        client = official(broker.url)
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        # fill the disk with another topic until sends fail
        filler = Raw(broker.port)
        filler.handshake()
        filler.send(producer_frame(topic_name("filler"), name="filler"))
        filler.until(pb.BaseCommand.PRODUCER_SUCCESS)
        for seq in range(200):
            filler.send(send_frame(1, seq, os.urandom(64 * 1024), name="filler"))
            if filler.command().type == pb.BaseCommand.SEND_ERROR:
                break
        else:
            pytest.fail("the disk never filled")
        for _ in range(10):  # acks while the disk is full
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        time.sleep(1.0)
        disk.grow()
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        cursors = os.path.join(topic_dir(broker.data_dir, topic), "cursors.json")

        def persisted_position() -> int:
            try:
                with open(cursors) as fh:
                    return metafile.decode(fh.buffer.read())["sub"]["mark_delete"]
            except (OSError, ValueError, KeyError):
                return -1
        wait_until(lambda: persisted_position() == 19)  # the broker persists cursors in the background
        broker.kill()
        try:
            client.close()
        except pulsar.PulsarException:
            pass  # NotConnected: the official client may already have seen the broker go
        broker.start()
        client = official(broker.url)
        consumer = client.subscribe(topic, "sub")
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1500)  # all 20 were acknowledged and that was kept
        client.close()
    finally:
        broker.stop()
        disk.release()


# -- 2. broker-assigned producer names -----------------------------------------------------------

def test_assigned_producer_names_are_unique_across_restarts(broker_factory):
    broker = broker_factory()
    topic = topic_name("names")
    client = official(broker.url)
    first = client.create_producer(topic, batching_enabled=False)
    first_name = first.producer_name()
    for i in range(10):
        first.send(b"old-%d" % i)
    client.close()
    broker.restart()
    client = official(broker.url)
    second = client.create_producer(topic, batching_enabled=False)
    assert second.producer_name() != first_name
    ids = [second.send(b"new-%d" % i) for i in range(5)]
    assert all(i.ledger_id() >= 0 and i.entry_id() >= 0 for i in ids), [str(i) for i in ids]
    # both at once: the old name is not refused as busy
    third = client.create_producer(topic, batching_enabled=False)
    assert third.producer_name() not in (first_name, second.producer_name())
    third.send(b"third")
    client.close()
    assert len(read_all(broker.url, topic)) == 16


# -- 3. cumulative ack past the end ----------------------------------------------------------

def test_cumulative_ack_beyond_the_end_skips_nothing(broker_factory):
    broker = broker_factory()
    topic = topic_name("ackend")
    produce(broker.url, topic, [b"a", b"b"])
    client = official(broker.url)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    first = consumer.receive(timeout_millis=5000)
    beyond = pulsar.MessageId(first.message_id().partition(), first.message_id().ledger_id(), 1_000_000, -1)
    consumer.acknowledge_cumulative(beyond)
    time.sleep(0.5)
    client.close()
    produce(broker.url, topic, [b"c", b"d"])
    broker.restart()
    client = official(broker.url)
    consumer = client.subscribe(topic, "sub")
    got = []
    while b"c" not in got or b"d" not in got:  # a Timeout here: skipped
        got.append(consumer.receive(timeout_millis=30_000).data())
    client.close()
    assert b"c" in got and b"d" in got, got


def test_raw_cumulative_ack_beyond_the_end_is_refused_or_clamped(broker_factory):
    broker = broker_factory()
    topic = topic_name("ackraw")
    ids = produce(broker.url, topic, [b"a", b"b"])
    raw = Raw(broker.port)
    raw.handshake()
    raw.send(frame(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
        topic=topic, subscription="sub", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
        request_id=1, initialPosition=pb.CommandSubscribe.Earliest))))
    raw.until(pb.BaseCommand.SUCCESS)
    ack = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Cumulative, request_id=2)
    ack.message_id.add(ledgerId=ids[0].ledger_id(), entryId=10**9)
    raw.send(frame(pb.BaseCommand(type=pb.BaseCommand.ACK, ack=ack)))
    time.sleep(0.3)
    raw.close()
    produce(broker.url, topic, [b"c"])
    client = official(broker.url)
    consumer = client.subscribe(topic, "sub")
    assert consumer.receive(timeout_millis=5000).data() in (b"a", b"b", b"c")
    client.close()


# -- 5. num_messages claims --------------------------------------------------------------------

@pytest.mark.parametrize("claim", ["send", "metadata", "metadata-only"])
def test_num_messages_claim_does_not_stall_consumers(broker_factory, claim):
    broker = broker_factory()
    topic = topic_name("claim")
    client = official(broker.url)
    consumer = client.subscribe(topic, "sub", receiver_queue_size=100,
                                initial_position=pulsar.InitialPosition.Earliest)
    raw = Raw(broker.port)
    raw.handshake()
    raw.send(producer_frame(topic))
    success = raw.until(pb.BaseCommand.PRODUCER_SUCCESS)
    name = success.producer_success.producer_name
    if claim == "send":
        raw.send(send_frame(1, 0, b"liar", num_messages=10**9, name=name))
    else:  # a batch of one that claims 10**9 (the official consumer would read past its end)
        batch = codec.BatchBuilder()
        batch.add(b"liar")
        raw.send(send_frame(1, 0, batch.build(), num_messages=10**9 if claim == "metadata" else 1,
                            batch_count=10**9, name=name))
    answer = raw.command()
    assert answer.type in (pb.BaseCommand.SEND_RECEIPT, pb.BaseCommand.SEND_ERROR), answer
    raw.close()
    produce(broker.url, topic, [b"honest-%d" % i for i in range(20)])
    got = []
    deadline = time.monotonic() + 10
    while len([g for g in got if g.startswith(b"honest")]) < 20 and time.monotonic() < deadline:
        try:
            got.append(consumer.receive(timeout_millis=500).data())
        except pulsar.Timeout:
            pass
    client.close()
    assert len([g for g in got if g.startswith(b"honest")]) == 20, got


# -- 4. one bad byte ----------------------------------------------------------------------------

def fill(url, topic, count=2000) -> list[bytes]:
    client = official(url)
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=count)
    payloads = [b"entry-%05d" % i for i in range(count)]
    for payload in payloads:
        producer.send_async(payload, None)
    producer.flush()
    client.close()
    return payloads


def positions(idx_path) -> list[int]:
    with open(idx_path, "rb") as fh:
        raw = fh.read()
    return [struct.unpack_from(">Q", raw, i)[0] for i in range(0, len(raw) - len(raw) % 8, 8)]


def flip(path, offset) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def stored_2000(broker_factory, tmp_path):
    broker = broker_factory()
    topic = topic_name("corrupt")
    payloads = fill(broker.url, topic)
    broker.stop()
    directory = topic_dir(broker.data_dir, topic)
    log_path = segments(directory)[0]
    return broker, topic, payloads, log_path, log_path[:-4] + ".idx"


def read_timed(url, topic):
    started = time.monotonic()
    got = read_all(url, topic)
    return got, time.monotonic() - started


def test_flipped_byte_costs_that_entry_alone(stored_2000):
    broker, topic, payloads, log_path, idx_path = stored_2000
    flip(log_path, positions(idx_path)[1000] + HEADER.size + 12)
    broker.start()
    got, took = read_timed(broker.url, topic)
    assert got == payloads[:1000] + payloads[1001:], (len(got), took)
    assert took < 15
    assert "1000" in broker.log_text()


def test_flipped_header_byte_costs_that_entry_alone(stored_2000):
    broker, topic, payloads, log_path, idx_path = stored_2000
    flip(log_path, positions(idx_path)[1000] + 1)  # the record's size field
    broker.start()
    got, _ = read_timed(broker.url, topic)
    assert got == payloads[:1000] + payloads[1001:], len(got)


def test_log_truncated_mid_file_opens_and_keeps_what_is_whole(stored_2000):
    broker, topic, payloads, log_path, idx_path = stored_2000
    cut = positions(idx_path)[1500] + 7
    os.truncate(log_path, cut)
    broker.start()
    assert read_all(broker.url, topic) == payloads[:1500]
    produce(broker.url, topic, [b"after-cut"])
    assert read_all(broker.url, topic) == payloads[:1500] + [b"after-cut"]
    assert re.search(r"torn|truncat", broker.log_text(), re.I)


def test_deleted_index_and_bad_byte_lose_only_that_entry(stored_2000):
    broker, topic, payloads, log_path, idx_path = stored_2000
    where = positions(idx_path)[1000]
    os.unlink(idx_path)
    flip(log_path, where + HEADER.size + 12)
    broker.start()
    got = read_all(broker.url, topic)
    assert got == payloads[:1000] + payloads[1001:], len(got)
    assert "1000" in broker.log_text()


def test_deleted_index_and_bad_byte_in_the_last_entry(stored_2000):
    broker, topic, payloads, log_path, idx_path = stored_2000
    where = positions(idx_path)[1999]
    os.unlink(idx_path)
    flip(log_path, where + HEADER.size + 12)
    broker.start()
    got = read_all(broker.url, topic)
    assert got == payloads[:1999], len(got)
    produce(broker.url, topic, [b"next"])
    assert read_all(broker.url, topic)[-1:] == [b"next"]


def _segmented(tmp_path, count=2000):
    """2000 entries over several small segments (the in-process broker takes a segment size)."""
    from ..peers import BrokerThread
    broker = BrokerThread(tmp_path / "seg", segment_bytes=8 * 1024).start()
    topic = topic_name("segments")
    payloads = fill(broker.url, topic, count)
    broker.stop()
    return broker, topic, payloads, segments(topic_dir(broker.data_dir, topic))


def test_damaged_non_last_segment_bad_byte(tmp_path):
    broker, topic, payloads, logs = _segmented(tmp_path)
    assert len(logs) >= 4
    second = logs[1]
    base = int(os.path.basename(second)[:-4])
    pos = positions(second[:-4] + ".idx")
    flip(second, pos[3] + HEADER.size + 12)
    broker.start()
    try:
        got = read_all(broker.url, topic)
    finally:
        broker.stop()
    assert got == payloads[:base + 3] + payloads[base + 4:], len(got)


def test_damaged_non_last_segment_truncated(tmp_path):
    broker, topic, payloads, logs = _segmented(tmp_path)
    second, third = logs[1], logs[2]
    base = int(os.path.basename(second)[:-4])
    next_base = int(os.path.basename(third)[:-4])
    pos = positions(second[:-4] + ".idx")
    os.truncate(second, pos[5] + 3)  # entries base+5 .. next_base-1 are gone for good
    broker.start()
    try:
        got, took = read_timed(broker.url, topic)
        produce(broker.url, topic, [b"after"])
        tail = read_all(broker.url, topic)[-1:]
    finally:
        broker.stop()
    assert got == payloads[:base + 5] + payloads[next_base:], len(got)
    assert tail == [b"after"]


# -- 6. file descriptors ------------------------------------------------------------------------

def open_fds(pid) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_600_topics_under_a_1024_descriptor_limit(broker_factory):
    broker = broker_factory(limits={resource.RLIMIT_NOFILE: (1024, 1024)})
    prefix = f"fd-{uuid.uuid4().hex[:6]}"

    async def open_600():
        import asyncio

        from pulsarwire import Client
        async with Client(broker.url, operation_timeout_seconds=30) as client:
            async def one(i):
                producer = await client.create_producer(f"persistent://public/default/{prefix}-{i}")
                await producer.send(b"t%d" % i)
            await asyncio.gather(*(one(i) for i in range(600)))  # all 600 stay open meanwhile
            assert open_fds(broker.process.pid) < 900

    import asyncio
    asyncio.run(open_600())
    for i in (0, 299, 599):  # every topic still readable, new clients still served
        assert read_all(broker.url, f"persistent://public/default/{prefix}-{i}") == [b"t%d" % i]
    produce(broker.url, topic_name("fd-after"), [b"ok"])


def test_connection_flood_under_the_descriptor_limit_gets_an_answer(broker_factory):
    broker = broker_factory(limits={resource.RLIMIT_NOFILE: (256, 256)})
    socks = []
    try:
        for _ in range(300):
            try:
                s = socket.create_connection(("127.0.0.1", broker.port), timeout=2)
                s.sendall(connect_frame())
                socks.append(s)
            except OSError:
                break
        time.sleep(0.5)
        # a client arriving now is answered (served, or refused with an error), never left hanging
        started = time.monotonic()
        raw = None
        try:
            raw = Raw(broker.port, timeout=10)
            raw.send(connect_frame())
            answer = raw.command(timeout=10)
            assert answer.type in (pb.BaseCommand.CONNECTED, pb.BaseCommand.ERROR), answer
        except ConnectionError:
            pass  # closed at once is an answer too
        finally:
            if raw:
                raw.close()
        assert time.monotonic() - started < 8
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)
    produce(broker.url, topic_name("after-flood"), [b"ok"])


# -- 7. unbounded buffering -----------------------------------------------------------------

def test_consumer_that_never_reads_is_bounded(broker_factory):
    broker = broker_factory()
    topic = topic_name("stuck")
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", broker.port))
    stuck = Raw.__new__(Raw)
    stuck.sock, stuck.buf = raw, b""
    stuck.handshake()
    stuck.send(frame(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
        topic=topic, subscription="stuck", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
        request_id=1, initialPosition=pb.CommandSubscribe.Earliest))))
    stuck.until(pb.BaseCommand.SUCCESS)
    stuck.send(frame(pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(
        consumer_id=1, messagePermits=10**6))))
    before = broker.rss_mb()
    client = official(broker.url)
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=200)
    chunk = os.urandom(100 * 1024)
    for i in range(1500):  # ~150 MB the consumer never reads
        producer.send_async(chunk, None)
    producer.flush()
    client.close()
    grown = broker.rss_mb() - before
    # the entry cache (--max-cache-bytes, 64 MiB) and one output budget may grow; 150 MB of queued output may not
    assert grown < 90, f"broker grew {grown:.0f} MB"
    stuck.close()
    produce(broker.url, topic_name("still-serving"), [b"ok"])


def test_unfinished_big_frames_before_connect_are_refused_and_freed(broker_factory):
    broker = broker_factory()
    before = broker.rss_mb()
    socks = []
    block = b"\0" * (1024 * 1024)
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=0.2)
        try:
            s.sendall(struct.pack(">I", 5 * 1024 * 1024) + block)
        except OSError:
            pass  # refused at its header: the broker stopped reading
        socks.append(s)
    peak = broker.rss_mb() - before
    for s in socks:
        s.close()
    wait_until(lambda: broker.rss_mb() - before < 60)  # freed once the broker has seen the connections close
    after = broker.rss_mb() - before
    assert peak < 150, f"{peak:.0f} MB held for 100 unfinished frames"
    assert after < 60, f"{after:.0f} MB still held after the connections closed"
    produce(broker.url, topic_name("after-frames"), [b"ok"])


def test_slowloris_before_connect_is_closed(broker_factory):
    broker = broker_factory("--handshake-timeout", "1", "--frame-timeout", "1")
    raw = Raw(broker.port)
    data = connect_frame()
    started = time.monotonic()
    closed = False
    for i in range(len(data)):
        try:
            raw.send(data[i:i + 1])
        except OSError:
            closed = True
            break
        if raw.closed_within(0.3):
            closed = True
            break
    assert closed and time.monotonic() - started < 5


def test_slowloris_frame_after_connect_is_closed_but_idle_clients_are_not(broker_factory):
    broker = broker_factory("--handshake-timeout", "1", "--frame-timeout", "1")
    idle = Raw(broker.port)
    idle.handshake()
    raw = Raw(broker.port)
    raw.handshake()
    ping = frame(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing()))
    started = time.monotonic()
    closed = False
    for i in range(len(ping) * 20):
        try:
            raw.send(ping[i % len(ping):i % len(ping) + 1])
        except OSError:
            closed = True
            break
        if raw.closed_within(0.3):
            closed = True
            break
    assert closed and time.monotonic() - started < 5
    # a connected client quiet between frames is no slowloris
    idle.send(ping)
    assert idle.until(pb.BaseCommand.PONG).type == pb.BaseCommand.PONG


def test_unread_ping_flood_is_bounded(broker_factory):
    broker = broker_factory()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", broker.port))
    flood = Raw.__new__(Raw)
    flood.sock, flood.buf = sock, b""
    flood.handshake()
    before = broker.rss_mb()
    ping = frame(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing()))
    block = ping * 100_000
    sock.settimeout(1.0)
    sent = 0
    try:
        for _ in range(20):  # 2 M pings, the replies never read
            sock.sendall(block)
            sent += 100_000
    except (socket.timeout, OSError):
        pass  # the broker stopped reading from us: back-pressure
    grown = broker.rss_mb() - before
    sock.close()
    assert grown < 15, f"{grown:.1f} MB for {sent} unread pings"


def test_connection_limit_answers_an_error(broker_factory):
    broker = broker_factory("--max-connections", "5")
    held = []
    for _ in range(5):
        r = Raw(broker.port)
        r.handshake()
        held.append(r)
    client = official(broker.url, operation_timeout_seconds=2)
    started = time.monotonic()
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic_name("limit"))
    assert time.monotonic() - started < 5
    client.close()
    for r in held:
        r.close()
    time.sleep(0.3)
    produce(broker.url, topic_name("limit-after"), [b"ok"])


# -- 8. auth and TLS ------------------------------------------------------------------------

def test_wrong_token_is_an_authentication_error_quickly(broker_factory):
    broker = broker_factory("--auth-token", "right-token")
    client = official(broker.url, authentication=pulsar.AuthenticationToken("wrong-token"),
                      operation_timeout_seconds=30)
    started = time.monotonic()
    with pytest.raises(pulsar.PulsarException) as info:
        client.create_producer(topic_name("auth"))
    took = time.monotonic() - started
    client.close()
    assert isinstance(info.value, (pulsar.AuthenticationError, pulsar.AuthorizationError)), repr(info.value)
    assert took < 5, took
    good = official(broker.url, authentication=pulsar.AuthenticationToken("right-token"))
    good.create_producer(topic_name("auth")).send(b"ok")
    good.close()


def refused_everything(raw: Raw) -> bool:
    """After a CONNECT without valid credentials: the broker refused it, or refuses every request."""
    try:
        if raw.command().type != pb.BaseCommand.CONNECTED:
            return True
        topic = topic_name("sneak")
        raw.send(producer_frame(topic, request_id=1))
        if raw.command().type != pb.BaseCommand.ERROR:
            return False
        raw.send(frame(pb.BaseCommand(type=pb.BaseCommand.LOOKUP, lookupTopic=pb.CommandLookupTopic(
            topic=topic, request_id=2))))
        answer = raw.command()
        if answer.type == pb.BaseCommand.LOOKUP_RESPONSE:
            return answer.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
        return answer.type == pb.BaseCommand.ERROR
    except ConnectionError:
        return True


def test_no_token_is_refused(broker_factory):
    broker = broker_factory("--auth-token", "right-token")
    for auth in ({}, {"auth_method_name": "token", "auth_data": b""},
                 {"auth_method_name": "token", "auth_data": b"wrong"}):
        raw = Raw(broker.port)
        raw.send(connect_frame(**auth))
        assert refused_everything(raw), auth
        raw.close()


def test_empty_auth_token_never_admits_a_tokenless_connect(tmp_path):
    broker = Broker(tmp_path / "data", "--auth-token", "")
    broker.start(wait=False)
    try:
        try:
            wait_for_port(broker.port, timeout=10, process=broker.process)
        except RuntimeError:
            assert broker.process.returncode != 0
            return  # refused at startup
        for auth in ({}, {"auth_method_name": "token", "auth_data": b""}):
            raw = Raw(broker.port)
            raw.send(connect_frame(**auth))
            assert refused_everything(raw), auth
            raw.close()
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    return str(cert), str(key)


def listening_ports(pid) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].split(":")[1], 16))
    return ports


def test_tls_only_broker_from_the_cli(tmp_path, certificate):
    cert, key = certificate
    tls_port = free_port()
    broker = Broker(tmp_path / "data", "--port", "-1", "--tls-port", str(tls_port), "--tls-cert-file", cert,
                    "--tls-key-file", key, port=tls_port)
    broker.start()
    try:
        assert listening_ports(broker.process.pid) == {tls_port}
        client = official(f"pulsar+ssl://127.0.0.1:{tls_port}", tls_trust_certs_file_path=cert)
        topic = topic_name("tls")
        consumer = client.subscribe(topic, "sub")
        client.create_producer(topic).send(b"over tls")
        assert consumer.receive(timeout_millis=5000).data() == b"over tls"
        client.close()
        plain = Raw(tls_port)  # plaintext on the TLS port is no way in
        plain.send(connect_frame())
        try:
            assert plain.command(timeout=3).type != pb.BaseCommand.CONNECTED
        except (ConnectionError, socket.timeout, OSError):
            pass
    finally:
        broker.stop()


# -- 9. topic names -------------------------------------------------------------------------

BAD_NAMES = [".", "..", "", "x" * 300, "a/../../b"]


@pytest.mark.parametrize("local", BAD_NAMES, ids=["dot", "dotdot", "empty", "long", "traversal"])
def test_invalid_topic_names_get_an_error_reply_and_store_nothing_outside(broker_factory, local):
    broker = broker_factory()
    before = set(os.listdir(broker.data_dir))
    raw = Raw(broker.port)
    raw.handshake()
    name = f"persistent://public/default/{local}"
    raw.send(producer_frame(name, producer_id=1, request_id=1))
    answer = raw.command()
    assert answer.type == pb.BaseCommand.ERROR, answer
    raw.send(frame(pb.BaseCommand(type=pb.BaseCommand.LOOKUP, lookupTopic=pb.CommandLookupTopic(
        topic=name, request_id=2))))
    answer = raw.command()
    if answer.type == pb.BaseCommand.LOOKUP_RESPONSE:
        assert answer.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed, answer
    else:
        assert answer.type == pb.BaseCommand.ERROR, answer
    raw.send(frame(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
        topic=name, subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
        request_id=3))))
    assert raw.command().type == pb.BaseCommand.ERROR
    # the connection is still good
    raw.send(producer_frame(topic_name("valid"), producer_id=2, request_id=4))
    assert raw.until(pb.BaseCommand.PRODUCER_SUCCESS).producer_success.request_id == 4
    raw.close()
    assert set(os.listdir(broker.data_dir)) - before <= {"topics", "ledger-ids.json"}
    for root, dirs, files in os.walk(os.path.dirname(broker.data_dir)):
        for entry in dirs + files:
            path = os.path.join(root, entry)
            assert path.startswith(broker.data_dir) or "-logs" in path or path == broker.data_dir, path


def test_official_client_gets_an_error_for_a_long_name(broker_factory):
    broker = broker_factory()
    client = official(broker.url, operation_timeout_seconds=2)
    started = time.monotonic()
    with pytest.raises(pulsar.PulsarException):
        client.create_producer("persistent://public/default/" + "y" * 300)
    assert time.monotonic() - started < 5
    client.create_producer(topic_name("fine")).send(b"ok")
    client.close()


# -- 10. protocol completeness ------------------------------------------------------------------

def test_official_reader_seek(broker_factory):
    broker = broker_factory()
    topic = topic_name("seek")
    client = official(broker.url)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    for i in range(10):
        ids.append(producer.send(b"m%d" % i))
        time.sleep(0.003)  # distinct publish times, for the seek by time
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    first = [reader.read_next(5000) for _ in range(10)]
    assert [m.data() for m in first] == [b"m%d" % i for i in range(10)]
    reader.seek(ids[3])
    assert reader.read_next(5000).data() in (b"m3", b"m4")
    reader.seek(first[6].publish_timestamp())
    assert reader.read_next(5000).data() == b"m6"
    reader.seek(pulsar.MessageId.earliest)
    assert reader.read_next(5000).data() == b"m0"
    client.close()


def test_exclusive_access_mode(broker_factory):
    broker = broker_factory()
    topic = topic_name("excl")
    client = official(broker.url, operation_timeout_seconds=5)
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic)
    first.close()
    client.create_producer(topic).send(b"now shared")
    client.close()


def test_wait_for_exclusive_waits(broker_factory):
    import threading
    broker = broker_factory()
    topic = topic_name("wait")
    client = official(broker.url, operation_timeout_seconds=30)
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    box = {}

    def second():
        box["p"] = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)

    t = threading.Thread(target=second, daemon=True)
    t.start()
    time.sleep(1.0)
    assert "p" not in box
    first.close()
    t.join(10)
    assert "p" in box
    box["p"].send(b"mine now")
    client.close()


def test_official_pattern_subscription(broker_factory):
    broker = broker_factory()
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    for suffix in ("a", "b"):
        produce(broker.url, f"persistent://public/default/{prefix}-{suffix}", [suffix.encode()])
    produce(broker.url, f"persistent://public/default/other{prefix}", [b"no"])
    client = official(broker.url)
    consumer = client.subscribe(re.compile(f"persistent://public/default/{prefix}-.*"), "pat",
                                initial_position=pulsar.InitialPosition.Earliest)
    got = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(2))
    assert got == [b"a", b"b"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=500)
    client.close()


def test_message_ids_unique_across_topics(broker_factory):
    broker = broker_factory()
    seen = set()
    for i in range(3):
        (msg_id,) = produce(broker.url, topic_name(f"ids{i}"), [b"x"])
        seen.add((msg_id.ledger_id(), msg_id.entry_id()))
    broker.restart()
    (msg_id,) = produce(broker.url, topic_name("ids-late"), [b"x"])
    seen.add((msg_id.ledger_id(), msg_id.entry_id()))
    assert len(seen) == 4, seen


# -- kill -9 ----------------------------------------------------------------------------------

def test_kill_9_loses_nothing_acknowledged(broker_factory):
    broker = broker_factory()
    topic = topic_name("kill")
    client = official(broker.url)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1,
                                      send_timeout_millis=3000, max_pending_messages=5000)
    acked = set()

    def done(res, msg_id, payload):
        if res == pulsar.Result.Ok:
            acked.add(payload)

    payloads = [b"k%06d" % i for i in range(30000)]
    for i, payload in enumerate(payloads):
        producer.send_async(payload, lambda res, mid, p=payload: done(res, mid, p))
        if i == 15000:
            broker.kill()
            break
        if i % 1000 == 0:
            time.sleep(0.01)
    time.sleep(0.5)
    snapshot = set(acked)
    client.close()
    assert len(snapshot) > 1000
    broker.start()
    stored = read_all(broker.url, topic)
    assert not snapshot - set(stored), f"{len(snapshot - set(stored))} acknowledged then lost"
    assert len(stored) == len(set(stored))
