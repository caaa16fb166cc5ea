"""Damaged metadata files (issue 26): each costs only what it described.

The matrix: every metadata file x {flipped byte, truncated, emptied, wrong JSON type, deleted,
damaged with its previous copy damaged too}, against a broker subprocess read with the official
client. One broker start per damage kind: each topic-level file is damaged on a topic of its own
and every broker-level file at once, so a start shows that the broker starts, that every other
topic is intact and that no acknowledged message is lost. docs/guarantees.md says what each
cell costs. Then the pieces one by one, in process: the file format, each recovery, the fsck
command, a start on a full disk, idle topics closing, V1 group writes in batches.
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys

import pulsar
import pytest

from pulsarwire import codec
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.broker import metafile
from pulsarwire.broker.core import BrokerCore, InvalidTopicName
from pulsarwire.broker.fsck import check, repair
from pulsarwire.broker.storage import FileOps, topic_directory

from ..conftest import unique
from ..peers import BrokerThread, free_port, terminate, wait_for_port
from ..helpers import run

NS = "persistent://public/default/"
TOPIC_FILES = ("state.json", "cursors.json", "ledgers.json", "producer-epoch.json", "schema.json")
BROKER_FILES = ("broker.json", "ledger-ids.json", "topics.json", "groups.json", "offsets.json")
DAMAGES = ("flip", "truncate", "empty", "wrong-type", "delete", "no-good-copy")
MESSAGES = 8
ACKED = 3  # the subscription "sub" of each topic acknowledged its first ACKED messages
V1_OFFSET = 5


def victim(file_name: str) -> str:
    """The topic whose `file_name` a cell damages (one topic per file, so one start tests them all)."""
    return NS + "victim-" + file_name.split(".")[0]


TOPICS = [victim(f) for f in TOPIC_FILES] + [NS + "bystander"]


def damage(path: str, how: str) -> None:
    """Damage a metadata file as a disk or an editor would."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if how == "flip":
        middle = len(raw) // 2 + len(raw) // 4  # in the JSON, past the header
        raw = raw[:middle] + bytes([raw[middle] ^ 0x5A]) + raw[middle + 1:]
    elif how == "truncate":
        raw = raw[:len(raw) // 2]
    elif how == "empty":
        raw = b""
    elif how == "wrong-type":  # valid JSON as an editor leaves it: the other container type
        raw = b"{}" if isinstance(metafile.decode(raw), list) else b"[]"
    elif how == "delete":
        os.remove(path)
        return
    elif how == "no-good-copy":
        damage(path, "flip")
        damage(path + metafile.PREVIOUS, "truncate")
        return
    with open(path, "wb") as fh:
        fh.write(raw)


class CliBroker:
    """`python -m pulsarwire broker` on free ports (Pulsar and V1); its log is kept for the checks."""

    def __init__(self, data_dir, *flags: str) -> None:
        self.port, self.v1_port = free_port(), free_port()
        self.log_path = os.path.join(os.path.dirname(str(data_dir)), f"broker-{self.port}.log")
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(data_dir), "--port", str(self.port),
                 "--v1-port", str(self.v1_port), "--v1-partitions", "1", *flags],
                stdout=log_file, stderr=subprocess.STDOUT)
        wait_for_port(self.port, process=self.process)
        wait_for_port(self.v1_port, process=self.process)

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def stop(self) -> str:
        terminate(self.process)
        assert self.process.returncode == 0, self.log()
        return self.log()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()


def v1(port: int, *requests: str) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock, sock.makefile("rb") as answers:
        replies = []
        for i, request in enumerate(requests):
            sock.sendall(f"V1|{i}|{request}\n".encode())
            replies.append(answers.readline().decode().rstrip("\n"))
        return replies


def _client(url: str) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A data dir with every metadata file: per topic a schema, an exclusive producer's epoch,
    deduplication state and a durable subscription that acknowledged ACKED messages; a
    partitioned topic; a V1 group with a committed offset."""
    data = tmp_path_factory.mktemp("template") / "data"
    broker = CliBroker(data, "--partitioned-topic", "parted=2")
    client = _client(broker.url)
    try:
        for topic in TOPICS:
            producer = client.create_producer(topic, schema=pulsar.schema.StringSchema(), batching_enabled=False,
                                              access_mode=pulsar.ProducerAccessMode.Exclusive,
                                              producer_name="writer-" + topic.rsplit("/", 1)[1])
            for i in range(MESSAGES):
                producer.send(f"{topic}:{i}")
            producer.close()
            consumer = client.subscribe(topic, "sub", schema=pulsar.schema.StringSchema(),
                                        consumer_type=pulsar.ConsumerType.Shared,
                                        initial_position=pulsar.InitialPosition.Earliest)
            received = [consumer.receive(5000) for _ in range(MESSAGES)]
            for message in received[:ACKED]:
                consumer.acknowledge(message)
            consumer.close()
        producer = client.create_producer(NS + "parted")
        for i in range(4):
            producer.send(b"parted:%d" % i)
        producer.close()
    finally:
        client.close()
    assert v1(broker.v1_port, "PRODUCE|v1t k:v", "JOIN|g v1t m1", f"COMMIT|g v1t m1 1 0 {V1_OFFSET}")[1:] == [
        "V1|1|OK|generation=1 assigned=[0]", "V1|2|OK|committed=true"]
    broker.stop()
    for topic in TOPICS:  # each subscription's acknowledgements are on disk
        with open(os.path.join(topic_directory(str(data), topic), "cursors.json"), "rb") as fh:
            assert metafile.decode(fh.read())["sub"]["mark_delete"] == ACKED - 1
    return data


def _targets(data: str) -> list[str]:
    return [os.path.join(data, name) for name in BROKER_FILES] + \
        [os.path.join(topic_directory(data, victim(name)), name) for name in TOPIC_FILES]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_metadata_file_costs_only_what_it_described(template, tmp_path, how):
    data = str(tmp_path / "data")
    shutil.copytree(template, data)
    for path in _targets(data):
        damage(path, how)
    broker = CliBroker(data)
    client = _client(broker.url)
    try:
        for topic in TOPICS:
            expected = [f"{topic}:{i}" for i in range(MESSAGES)]
            reader = client.create_reader(topic, pulsar.MessageId.earliest, schema=pulsar.schema.StringSchema())
            stored = []
            while reader.has_message_available():
                stored.append(reader.read_next(5000).value())
            reader.close()
            assert stored == expected, topic  # nothing acknowledged is lost
            consumer = client.subscribe(topic, "sub", schema=pulsar.schema.StringSchema(),
                                        consumer_type=pulsar.ConsumerType.Shared)
            unacknowledged = set(expected[ACKED:])
            delivered = set()
            while not unacknowledged <= delivered:  # redelivery at worst, never a skip
                message = consumer.receive(5000)
                delivered.add(message.value())
                consumer.acknowledge(message)
            consumer.close()
            producer = client.create_producer(topic, schema=pulsar.schema.StringSchema())
            producer.send("after")  # the topic takes writes
            producer.close()
        consumer = client.subscribe(NS + "parted", "psub", initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(consumer.receive(5000).data() for _ in range(4)) == [b"parted:%d" % i for i in range(4)]
        consumer.close()
    finally:
        client.close()
    offset = "offset=-1" if how == "no-good-copy" else f"offset={V1_OFFSET}"  # lost with no copy: that group only
    replies = v1(broker.v1_port, "OFFSET|g v1t 0", "CONSUME|v1t 0 0")
    assert replies[0] == f"V1|0|OK|{offset}" and replies[1].startswith("V1|1|OK|messages=0:v ")
    log = broker.stop()
    assert "Traceback" not in log
    for path in _targets(data):  # each logged at ERROR, with its path and what a start did
        assert re.search(rf"ERROR metadata file {re.escape(path)} is damaged \(.*\); it held .*; "
                         r"(restored|rebuilt|lost|deduplication)", log), (path, log)
    assert check(data) == []  # the start put every file right


# -- the file format ------------------------------------------------------------------------

def test_a_metadata_file_is_checked_and_keeps_its_previous_copy(tmp_path):
    path = str(tmp_path / "m.json")
    metafile.write(path, {"n": 1})
    metafile.write(path, {"n": 2})
    assert metafile.load(path).data == {"n": 2}
    assert metafile.load(path + metafile.PREVIOUS).data == {"n": 1}
    for how, problem in (("flip", "checksum mismatch"), ("truncate", "truncated"), ("empty", "empty")):
        metafile.write(path, {"n": 3, "padding": "x" * 40})
        damage(path, how)
        loaded = metafile.load(path)
        assert (loaded.source, loaded.data) == (metafile.PREVIOUS_COPY, {"n": 2})
        assert problem in loaded.problem
        metafile.write(path, {"n": 2})  # a damaged file never becomes the previous copy
        assert metafile.load(path + metafile.PREVIOUS).source == metafile.CURRENT
    with open(path, "w") as fh:  # a release before this format wrote plain JSON: still read
        json.dump({"legacy": True}, fh)
    assert metafile.load(path, metafile.expect(dict)).source == metafile.CURRENT
    wrong_type = metafile.load(path, metafile.expect(list))  # the previous copy holds a dict too
    assert wrong_type.source == metafile.LOST and "a dict where a list belongs" in wrong_type.problem
    with open(path, "wb") as fh:
        fh.write(metafile.encode({"x": 1}).replace(b"metadata 1", b"metadata 9"))
    assert "newer" in metafile.load(path).problem


def test_writes_of_one_file_waiting_behind_each_other_become_one(tmp_path):
    writer = metafile.MetadataWriter()
    path = str(tmp_path / "m.json")
    futures = [writer.write(path, {"n": i}) for i in range(200)]
    for future in futures:
        future.result(10)
    writer.close()
    assert metafile.load(path).data == {"n": 199}
    assert writer.written + writer.coalesced == 200 and writer.written < 200


# -- recovery, in process ---------------------------------------------------------------------

def _entry(i: int) -> bytes:
    return codec.encode_metadata_and_payload(pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=i),
                                             b"m-%d" % i)


def _fill(core: BrokerCore, topic_name: str, count: int) -> None:
    topic = core.topic(topic_name)
    for i in range(count):
        core.publish(topic, "p", i, None, False, _entry(i), None, i, None, None)
    core.commit()


def test_a_topic_whose_files_are_all_damaged_opens_and_redelivers(tmp_path, caplog):
    core = BrokerCore(str(tmp_path))
    core.open()
    name = NS + unique("all")
    topic = core.topic(name)
    subscription = topic.subscription("sub", 0, True, True, None)
    for i in range(3):
        core.publish(topic, "p", i, None, False, _entry(i), None, i, None, None)
    core.commit()
    subscription.cursor.ack_cumulative(1)
    subscription.dirty = True
    topic.register_schema({"type": 2, "name": "s", "data": "", "properties": {}})
    ledger = topic.ledger_id
    core.close()
    directory = topic_directory(str(tmp_path), name)
    for file_name in TOPIC_FILES:
        if file_name != "producer-epoch.json":  # no exclusive producer: none written
            damage(os.path.join(directory, file_name), "no-good-copy")
    core = BrokerCore(str(tmp_path))
    core.open()
    with caplog.at_level(logging.ERROR):
        topic = core.topic(name)
    assert topic.cursors_lost and not topic.subscriptions
    assert topic.last_sequence == {"p": 2}  # rebuilt from the log
    again = topic.subscription("sub", 0, True, False, None)  # Latest asked: earliest given, as it may be the lost one
    assert again.cursor.mark_delete == -1
    assert topic.ledger_id != ledger and topic.ledger_of(0) == 0
    core.close()
    core = BrokerCore(str(tmp_path))
    core.open()
    assert core.topic(name).cursors_lost  # remembered: a subscription made later starts early too
    core.close()


def test_a_topic_that_cannot_open_is_a_metadata_error_the_client_is_answered(tmp_path, monkeypatch):
    from pulsarwire import Client
    from pulsarwire.broker import topic
    from pulsarwire.errors import PulsarWireError

    def unreadable(self):
        raise ValueError("a cursor no check foresaw")
    broken = NS + unique("broken")
    broker = BrokerThread(tmp_path, v1_port=None).start()
    try:
        with pytest.raises(metafile.MetadataError):
            broker.call(lambda: (monkeypatch.setattr(topic.Topic, "_load_cursors", unreadable),
                                 broker.broker.core.topic(broken)))

        async def main():
            async with Client(broker.url, operation_timeout_seconds=5) as client:
                with pytest.raises(PulsarWireError, match="cannot be opened"):
                    await client.create_producer(broken)
                monkeypatch.undo()
                producer = await client.create_producer(NS + unique("fine"))  # the broker goes on
                await producer.send(b"x")
        run(main())
    finally:
        broker.stop()


def test_lost_broker_files_never_reuse_a_generation_or_a_ledger_id(tmp_path):
    core = BrokerCore(str(tmp_path))
    core.open()
    first = core.topic(NS + "a").ledger_id
    generation = core.generation
    core.close()
    for name in ("broker.json", "ledger-ids.json"):
        damage(str(tmp_path / name), "no-good-copy")
    core = BrokerCore(str(tmp_path))
    core.open()
    assert core.generation > generation + 1 and core.topic(NS + "b").ledger_id > first
    core.close()


def test_fsck_reports_without_changing_and_repair_does_what_a_start_would(tmp_path, capsys):
    from pulsarwire.cli import main
    core = BrokerCore(str(tmp_path))
    core.open()
    core.create_partitioned_topic(NS + "p", 2)
    _fill(core, NS + "p-partition-1", 2)
    core.topic(NS + "t").subscription("s", 0, True, True, None)
    core.close()
    cursors = os.path.join(topic_directory(str(tmp_path), NS + "t"), "cursors.json")
    damage(cursors, "flip")
    damage(str(tmp_path / "topics.json"), "no-good-copy")
    open(str(tmp_path / "broker.json.tmp"), "wb").close()
    before = {p: open(p, "rb").read() for p in (cursors, str(tmp_path / "topics.json"))}
    assert main(["fsck", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{cursors}: checksum mismatch; a start: its previous copy is used" in out
    assert "topics.json" in out and "broker.json.tmp" in out and "nothing changed" in out
    assert {p: open(p, "rb").read() for p in before} == before  # nothing changed
    assert main(["broker", "--check", str(tmp_path), "--repair"]) == 0
    assert check(str(tmp_path)) == [] and not os.path.exists(tmp_path / "broker.json.tmp")
    assert metafile.load(str(tmp_path / "topics.json")).data == {NS + "p": 2}
    assert repair(str(tmp_path)) == []


# -- a full disk at start; idle topics; V1 groups ---------------------------------------------

class FullDisk(FileOps):
    """Metadata writes refused with ENOSPC while `full` (entries would still fit: the broker
    must refuse them itself)."""

    def __init__(self) -> None:
        self.full = False

    def replace_file(self, path, data):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().replace_file(path, data)


def test_the_broker_starts_read_only_on_a_full_disk_and_writes_once_space_returns(tmp_path):
    from pulsarwire import Client, InitialPosition, MessageId
    from pulsarwire.errors import PulsarWireError
    topic = NS + "full"
    broker = BrokerThread(tmp_path, v1_port=None).start()

    async def fill():
        async with Client(broker.url) as client:
            producer = await client.create_producer(topic)
            for i in range(3):
                await producer.send(b"%d" % i)
    run(fill())
    broker.stop()
    disk = FullDisk()
    disk.full = True
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk).start()  # before: ENOSPC writing broker.json
    try:
        assert broker.broker.core.read_only

        async def read_and_write():
            async with Client(broker.url, operation_timeout_seconds=5) as client:
                reader = await client.create_reader(topic, MessageId.earliest)
                assert [(await reader.read_next(5000)).data() for _ in range(3)] == [b"0", b"1", b"2"]
                producer = await client.create_producer(topic, send_timeout_millis=3000)
                with pytest.raises(PulsarWireError):  # each try answered SendError "...serves reads only..."
                    await producer.send(b"refused")
                assert broker.broker.storage_stats()["failed_commits"] > 0
                with pytest.raises(PulsarWireError):  # no new topic either
                    await client.create_producer(NS + unique("new"))
                disk.full = False
                for _ in range(100):
                    if not broker.broker.core.read_only:
                        break
                    await asyncio.sleep(0.1)
                assert not broker.broker.core.read_only
                producer = await client.create_producer(topic)
                await producer.send(b"3")
                consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
                assert [(await consumer.receive(5000)).data() for _ in range(4)] == [b"0", b"1", b"2", b"3"]
        run(read_and_write())
    finally:
        broker.stop()


def test_idle_topics_are_closed_and_open_again_on_use(tmp_path):
    core = BrokerCore(str(tmp_path))
    core.open()
    names = [NS + "idle-%d" % i for i in range(20)]
    for name in names:
        _fill(core, name, 2)
    busy = core.topic(names[0])
    busy.subscription("reader", 0, False, True, None)  # a reader holds it open
    assert core.unload_idle_topics(10.0, now=1000.0) == 0  # idle from now on
    assert core.unload_idle_topics(10.0, now=1011.0) == 19
    assert list(core.topics) == [names[0]] and core.storage_stats()["unloaded_topics"] == 19
    reopened = core.topic(names[5])
    assert reopened.log.next_entry_id == 2 and reopened.last_sequence == {"p": 1}
    core.close()


def test_topics_opened_off_the_event_loop_share_one_opening_and_read_their_latest_files(tmp_path):
    core = BrokerCore(str(tmp_path))
    core.open()
    name = NS + "opened-off-loop"

    async def opens():
        first, second = await asyncio.gather(core.open_topic(name), core.open_topic(name))
        assert first is second and core.topics[name] is first
        _fill(core, name, 3)
        core.save()
        core.metadata.wait()
        assert core.unload_idle_topics(10.0, now=1000.0) == 0
        assert core.unload_idle_topics(10.0, now=1011.0) == 1
        reopened = await core.open_topic(name)  # reads what the closed topic wrote last
        assert reopened is not first and reopened.log.next_entry_id == 3 and reopened.last_sequence == {"p": 2}
        with pytest.raises(InvalidTopicName):
            await core.open_topic(NS + "a/../b")
    asyncio.run(opens())
    assert not core._preloaded
    core.close()


def test_many_v1_joins_share_group_writes(tmp_path):
    broker = BrokerThread(tmp_path, port=0, v1_port=0).start()
    try:
        async def joins():
            readers, writers = zip(*[await asyncio.open_connection("127.0.0.1", broker.v1_port) for _ in range(20)])
            for round_ in range(10):
                for i, writer in enumerate(writers):
                    writer.write(f"V1|{round_}|JOIN|g{round_}-{i} t m\n".encode())
            answers = [await reader.readline() for reader in readers for _ in range(10)]
            for writer in writers:
                writer.close()
            return answers
        answers = asyncio.run(joins())
        assert len(answers) == 200 and all(b"|OK|generation=1" in a for a in answers)
        groups = broker.broker.v1._groups_file
        assert groups.writes < 200  # each write holds the JOINs made while the one before it was on its way
        with open(tmp_path / "groups.json", "rb") as fh:
            assert len(metafile.decode(fh.read())) == 200  # every answered JOIN is on disk
    finally:
        broker.stop()


class HeldCursorWrites(FileOps):
    """cursors.json writes wait while `held` is clear, or fail while `failing`."""

    def __init__(self) -> None:
        import threading
        self.released = threading.Event()
        self.released.set()
        self.failing = False

    def replace_file(self, path, data):
        if path.endswith("cursors.json"):
            if self.failing:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.released.wait(30)
        super().replace_file(path, data)


def test_a_new_subscription_is_answered_once_on_disk_while_the_loop_goes_on(tmp_path):
    from pulsarwire import Client, InitialPosition
    from pulsarwire.errors import PulsarWireError
    disk = HeldCursorWrites()
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk).start()
    topic = NS + unique("held")
    try:
        async def main():
            async with Client(broker.url, operation_timeout_seconds=10) as client:
                producer = await client.create_producer(topic)
                await producer.send(b"before")
                disk.released.clear()
                subscribing = asyncio.ensure_future(
                    client.subscribe(topic, "new", initial_position=InitialPosition.Earliest))
                await asyncio.sleep(0.3)
                assert not subscribing.done()  # not answered: its cursor is not on disk yet
                await producer.send(b"meanwhile")  # the broker serves meanwhile
                disk.released.set()
                consumer = await subscribing
                assert [(await consumer.receive(5000)).data() for _ in range(2)] == [b"before", b"meanwhile"]
                disk.failing = True
                with pytest.raises(PulsarWireError, match="not stored"):
                    await client.subscribe(topic, "refused")
                disk.failing = False
                await client.subscribe(topic, "refused")  # the same subscription, stored now
        run(main())
    finally:
        disk.released.set()
        broker.stop()
    with open(os.path.join(topic_directory(str(tmp_path), topic), "cursors.json"), "rb") as fh:
        assert set(metafile.decode(fh.read())) == {"new", "refused"}


@pytest.mark.parametrize("file_name, wrong", [
    ("cursors.json", {"sub": {"mark_delete": 1, "acked": "abc"}}),
    ("cursors.json", {"sub": {"mark_delete": "1"}}),
    ("state.json", {"dedup": {"p": "x"}}),
    ("schema.json", [{"type": 2}]),
    ("ledgers.json", [[5, 1], [0, 2]]),
    ("producer-epoch.json", {"epoch": -1}),
])
def test_json_of_the_right_type_but_the_wrong_shape_is_damage(tmp_path, file_name, wrong):
    core = BrokerCore(str(tmp_path))
    core.open()
    name = NS + unique("shape")
    core.topic(name)
    core.close()
    path = os.path.join(topic_directory(str(tmp_path), name), file_name)
    with open(path, "w") as fh:  # as an editor leaves it: plain JSON
        json.dump(wrong, fh)
    assert check(str(tmp_path))[0].path == path
    core = BrokerCore(str(tmp_path))
    core.open()
    topic = core.topic(name)  # opens, whatever the file says
    assert topic.subscription("sub", 0, True, True, None).cursor.mark_delete == -1
    core.close()


class HeldWrites(FileOps):
    """Writes of files whose name ends with `suffix` wait while `released` is clear, or fail while `failing`."""

    def __init__(self, suffix: str) -> None:
        import threading
        self.suffix = suffix
        self.released = threading.Event()
        self.released.set()
        self.failing = False

    def replace_file(self, path, data):
        if path.endswith(self.suffix):
            if self.failing:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.released.wait(30)
        super().replace_file(path, data)


def _held_request_cases():
    from pulsarwire.client import ProducerAccessMode
    from pulsarwire.schema import StringSchema

    async def schema(client, topic):
        return await client.create_producer(topic, schema=StringSchema())

    async def epoch(client, topic):
        return await client.create_producer(topic, access_mode=ProducerAccessMode.Exclusive)

    async def partitioned(client, topic):  # the broker makes new topics partitioned (default partitions)
        return await client.create_producer(topic)

    async def unsubscribe(client, topic):
        consumer = await client.subscribe(topic, unique("sub"))
        return consumer.unsubscribe
    return {"schema.json": (schema, None), "producer-epoch.json": (epoch, None),
            "topics.json": (partitioned, None), "cursors.json": (unsubscribe, "unsubscribe")}


@pytest.mark.parametrize("file_name", ["schema.json", "producer-epoch.json", "topics.json", "cursors.json"])
def test_requests_that_write_metadata_are_answered_once_on_disk_while_the_loop_goes_on(tmp_path, file_name):
    """A new schema version, an exclusive producer's epoch, a partitioned topic the broker makes,
    an unsubscribe: each is answered once on disk, PersistenceError when it cannot be written,
    and the event loop serves others while the write waits (it is the writer thread's)."""
    from pulsarwire import Client
    from pulsarwire.errors import PulsarWireError
    disk = HeldWrites(file_name)
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk,
                          default_partitions=2 if file_name == "topics.json" else 0).start()
    make, then = _held_request_cases()[file_name]
    try:
        async def main():
            async with Client(broker.url, operation_timeout_seconds=10) as client:
                other = await client.create_producer(NS + unique("other"))
                for _ in range(4):  # every partition of it written to once: what its opening and first
                    # entry put on the metadata writer is on disk before that writer is held (a held
                    # write holds every metadata write queued behind it, this topic's too)
                    await other.send(b"before")
                topic = NS + unique("held")
                if then is not None:  # the request comes after a setup that writes the same file
                    finish = await make(client, topic)
                    await asyncio.sleep(0.2)
                disk.released.clear()
                started = asyncio.get_running_loop().time()
                request = asyncio.ensure_future(finish() if then is not None else make(client, topic))
                await asyncio.sleep(0.3)
                assert not request.done()  # not answered: not on disk yet
                await other.send(b"meanwhile")  # the broker serves meanwhile
                assert asyncio.get_running_loop().time() - started < 2
                disk.released.set()
                await request
                disk.failing = True
                with pytest.raises(PulsarWireError):
                    if then is not None:
                        await (await make(client, NS + unique("refused")))()
                    else:
                        await make(client, NS + unique("refused"))
                disk.failing = False
        run(main())
    finally:
        disk.released.set()
        broker.stop()


def test_a_v1_topic_is_created_off_the_event_loop_and_answered_once_on_disk(tmp_path):
    disk = HeldWrites("topics.json")
    broker = BrokerThread(tmp_path, v1_port=0, file_ops=disk).start()

    def ask(sock, line: str) -> str:
        sock.sendall(line.encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            reply += chunk
        return reply.decode()
    try:
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=10) as first, \
                socket.create_connection(("127.0.0.1", broker.v1_port), timeout=10) as second:
            assert "|OK|" in ask(first, "V1|1|PRODUCE|known k:v")
            disk.released.clear()
            first.sendall(b"V1|2|PRODUCE|new-topic k:v\n")
            assert "|OK|" in ask(second, "V1|3|PRODUCE|known k:w")  # served while the new topic is written
            first.settimeout(0.3)
            with pytest.raises(socket.timeout):
                first.recv(1)  # not answered: the new topic is not on disk yet
            first.settimeout(10)
            disk.released.set()
            assert ask(first, "V1|4|PRODUCE|new-topic k:x").startswith("V1|2|OK|")
            disk.failing = True
            assert "|ERR|" in ask(second, "V1|5|PRODUCE|refused k:v")
            disk.failing = False
            assert "|OK|" in ask(second, "V1|6|PRODUCE|refused k:v")
    finally:
        disk.released.set()
        broker.stop()
