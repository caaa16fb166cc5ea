"""Storage faults in the embedded broker (issue 11, items 1, 4 and 6): a disk that fills,
corrupt and truncated files, and a process short of file descriptors. Faults are injected
through the storage's `FileOps` hook; the descriptor limit is a real rlimit on a broker
subprocess."""
from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os
import resource
import subprocess
import sys
import threading

import pytest

from pulsarwire import Client, InitialPosition, MessageId, codec, errors
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.broker import metafile
from pulsarwire.broker.core import DUPLICATE, BrokerCore
from pulsarwire.broker.topic import ProducerLink
from pulsarwire.broker.storage import HEADER_SIZE, CorruptEntryError, FileOps, FilePool, TopicLog, topic_directory

from ..helpers import FillingDisk, run, wait_until_async
from ..peers import BrokerThread, free_port, terminate, wait_for_port

TOPIC = "persistent://public/default/faults"
_U64 = 0xFFFFFFFFFFFFFFFF  # a duplicate's receipt carries entry id -1


def _entry(i: int) -> bytes:
    md = pb.MessageMetadata(producer_name="writer", sequence_id=i, publish_time=1000 + i)
    return codec.encode_metadata_and_payload(md, b"m-%04d" % i)


def _log_file(directory) -> str:
    return os.path.join(directory, sorted(f for f in os.listdir(directory) if f.endswith(".log"))[0])


# 1. disk full

def test_failed_commit_rolls_back_the_log_and_recovers_when_space_returns(tmp_path):
    disk = FillingDisk()
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=disk))
    for i in range(10):
        topic_log.append(b"good-%d" % i, None, i, 1)
    assert topic_log.commit()
    size = os.path.getsize(_log_file(tmp_path))
    disk.room = 50  # the next batch fits only partly
    batch_ids = [topic_log.append(b"lost-%d" % i, None, i, 1) for i in range(5)]
    batch = topic_log.batch
    assert not topic_log.commit()
    assert isinstance(batch.error, Exception) and "No space" in str(batch.error)
    assert os.path.getsize(_log_file(tmp_path)) == size  # truncated back to the last good record
    assert topic_log.next_entry_id == 10 and topic_log.committed_entry_id == 10
    with pytest.raises(KeyError):
        topic_log.read(batch_ids[0])
    disk.room = None  # space returns: the same ids are used again, at the right positions
    assert [topic_log.append(b"after-%d" % i, None, i, 1) for i in range(3)] == [10, 11, 12]
    assert topic_log.commit()
    topic_log.close()
    reopened = TopicLog(str(tmp_path))
    assert reopened.next_entry_id == 13
    assert [reopened.read(i).body for i in (0, 9, 10, 12)] == [b"good-0", b"good-9", b"after-0", b"after-2"]
    reopened.close()


def test_failed_truncate_still_writes_the_next_batch_at_its_position(tmp_path):
    disk = FillingDisk()
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=disk))
    topic_log.append(b"first", None, 1, 1)
    assert topic_log.commit()
    disk.room, disk.truncate_fails = 30, True  # a partial record stays behind on disk
    topic_log.append(b"x" * 100, None, 2, 1)
    assert not topic_log.commit()
    disk.room, disk.truncate_fails = None, False
    topic_log.append(b"second", None, 3, 1)
    assert topic_log.commit()
    topic_log.close()
    reopened = TopicLog(str(tmp_path))
    assert reopened.next_entry_id == 2 and reopened.read(1).body == b"second"
    reopened.close()


class VectoredDisk(FileOps):
    """A file system seen through `pwritev` (the group commit's call): each call takes at most
    `per_call` bytes (a short write), and past `room` bytes it fails with ENOSPC after writing
    what fits. `pwrite` is the base one, so only the vectored path is under test."""

    def __init__(self, per_call: int | None = None) -> None:
        self.per_call = per_call
        self.room: int | None = None
        self.calls = 0

    def pwritev(self, fd, buffers, offset):
        self.calls += 1
        data = b"".join(buffers)
        limit = len(data) if self.per_call is None else min(len(data), self.per_call)
        if self.room is not None:
            if self.room <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            limit = min(limit, self.room)
            self.room -= limit
        return os.pwrite(fd, data[:limit], offset)


def test_short_vectored_writes_go_on_from_where_they_stopped(tmp_path):
    disk = VectoredDisk(per_call=7)  # cuts headers and bodies at every place
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=disk))
    bodies = [b"entry-%d-" % i * (i % 5 + 1) for i in range(40)]
    for i, body in enumerate(bodies):
        topic_log.append(body, None, i, 1)
    assert topic_log.commit() and disk.calls > 40
    topic_log.close()
    reopened = TopicLog(str(tmp_path))
    assert reopened.next_entry_id == 40 and [reopened.read(i).body for i in range(40)] == bodies
    reopened.close()


def test_a_commit_of_more_buffers_than_iov_max_is_written_whole(tmp_path):
    disk = VectoredDisk()
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=disk))
    for i in range(1500):  # 3000 buffers: a header and a body each
        topic_log.append(b"m-%05d" % i, None, i, 1)
    assert topic_log.commit() and disk.calls >= 3
    topic_log.close()
    reopened = TopicLog(str(tmp_path))
    assert reopened.next_entry_id == 1500 and reopened.read(1499).body == b"m-01499"
    reopened.close()


def test_disk_full_in_a_vectored_commit_rolls_back_and_recovers(tmp_path):
    disk = VectoredDisk(per_call=64)
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=disk))
    for i in range(5):
        topic_log.append(b"good-%d" % i, None, i, 1)
    assert topic_log.commit()
    size = os.path.getsize(_log_file(tmp_path))
    disk.room = 100  # part of the next batch is written, then the disk is full
    for i in range(10):
        topic_log.append(b"lost-%d" % i * 8, None, i, 1)
    batch = topic_log.batch
    assert not topic_log.commit()
    assert "No space" in str(batch.error)
    assert os.path.getsize(_log_file(tmp_path)) == size
    assert topic_log.next_entry_id == topic_log.committed_entry_id == 5
    disk.room = None
    assert topic_log.append(b"after", None, 9, 1) == 5 and topic_log.commit()
    topic_log.close()
    reopened = TopicLog(str(tmp_path))
    assert reopened.next_entry_id == 6 and [reopened.read(i).body for i in (4, 5)] == [b"good-4", b"after"]
    reopened.close()


class FsyncRecorder(FileOps):
    """Records the thread of every fsync; the first `failures` of them fail with EIO."""

    def __init__(self, failures: int = 0) -> None:
        self.threads: list[str] = []
        self.failures = failures

    def fsync(self, fd):
        self.threads.append(threading.current_thread().name)
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


def test_full_segments_are_fsynced_off_the_event_loop_and_a_failed_one_again(tmp_path):
    ops = FsyncRecorder(failures=1)
    topic_log = TopicLog(str(tmp_path), segment_bytes=200, sync_policy="interval", pool=FilePool(ops=ops))
    for i in range(12):  # 70-byte records: a new segment every third one
        topic_log.append(b"%02d" % i * 25, None, i, 1)
        assert topic_log.commit()
    concurrent.futures.wait([future for _, future in topic_log._background_syncs])
    assert ops.threads and all(name.startswith("pulsarwire-fsync") for name in ops.threads)
    topic_log.sync()  # sees the failed one, counts it and starts it again
    assert topic_log.stats.failed_syncs == 1
    topic_log.close()
    assert ops.threads.count(threading.current_thread().name) == 2  # the last segment's, at close
    assert sum(name.startswith("pulsarwire-fsync") for name in ops.threads) == 2 * 3 + 1
    reopened = TopicLog(str(tmp_path))
    assert [reopened.read(i).body for i in range(12)] == [b"%02d" % i * 25 for i in range(12)]
    reopened.close()


def test_the_append_cache_keeps_the_newest_entries_within_its_bytes(tmp_path):
    topic_log = TopicLog(str(tmp_path), cache_bytes=100)
    for i in range(10):
        topic_log.append(b"%030d" % i, None, i, 1)
    assert list(topic_log._cache) == [7, 8, 9] and topic_log._shared_cache.bytes == 90
    topic_log.append(b"x" * 150, None, 10, 1)  # bigger than the cache: nothing stays
    assert not topic_log._cache and topic_log._shared_cache.bytes == 0
    assert topic_log.commit()
    assert [topic_log.read(i).body for i in (0, 9, 10)] == [b"%030d" % 0, b"%030d" % 9, b"x" * 150]
    topic_log.close()


def test_interval_sync_in_the_background_counts_and_retries_a_failure(tmp_path):
    ops = FsyncRecorder(failures=1)
    topic_log = TopicLog(str(tmp_path), sync_policy="interval", pool=FilePool(ops=ops))
    topic_log.append(b"one", None, 1, 1)
    topic_log.sync(background=True)  # commits, then hands the fsync to the worker
    assert topic_log.committed_entry_id == 1
    concurrent.futures.wait([future for _, future in topic_log._background_syncs])
    assert ops.threads and all(name.startswith("pulsarwire-fsync") for name in ops.threads)
    topic_log.sync(background=True)  # sees the failure: counted, logged, started again
    assert topic_log.stats.failed_syncs == 1
    concurrent.futures.wait([future for _, future in topic_log._background_syncs])
    assert len(ops.threads) == 3  # the failed log fsync, then the log and the index again
    topic_log.close()


def test_never_policy_sees_its_background_fsyncs_at_each_new_segment(tmp_path):
    ops = FsyncRecorder(failures=1)
    topic_log = TopicLog(str(tmp_path), segment_bytes=200, sync_policy="never", pool=FilePool(ops=ops))
    for i in range(30):  # ten segments, and no sync() call
        concurrent.futures.wait([future for _, future in topic_log._background_syncs])
        topic_log.append(b"%02d" % i * 25, None, i, 1)
        assert topic_log.commit()
    assert topic_log.stats.failed_syncs == 1  # seen at the next new segment, and started again
    assert len(topic_log._background_syncs) == 1  # the finished ones are let go
    topic_log.close()


def test_always_policy_fsyncs_a_full_segment_before_the_next(tmp_path):
    ops = FsyncRecorder()
    topic_log = TopicLog(str(tmp_path), segment_bytes=200, sync_policy="always", pool=FilePool(ops=ops))
    for i in range(6):
        topic_log.append(b"%02d" % i * 25, None, i, 1)
        assert topic_log.commit()
    assert set(ops.threads) == {threading.current_thread().name}
    topic_log.close()


def test_failed_commit_restores_dedup_state_so_a_resend_is_stored(tmp_path):
    disk = FillingDisk()
    core = BrokerCore(str(tmp_path), file_ops=disk, deduplication=True)
    core.open()
    topic = core.topic(TOPIC)
    assert core.publish(topic, "p", 0, None, False, _entry(0), None, 1, None, 1) == 0
    core.commit()
    disk.room = 0
    assert core.publish(topic, "p", 1, None, False, _entry(1), None, 1, None, 1) == 1
    assert core.publish(topic, "p", 1, None, False, _entry(1), None, 1, None, 1) == DUPLICATE  # pending
    batch = topic.log.batch
    core.commit()
    assert batch.error is not None
    assert topic.last_sequence["p"] == 0  # the failed send's sequence id is taken back
    assert core.storage_stats()["failed_commits"] == 1
    disk.room = None
    assert core.publish(topic, "p", 1, None, False, _entry(1), None, 1, None, 1) == 1  # not a duplicate
    core.commit()
    assert topic.log.batch.error is None and topic.last_sequence["p"] == 1
    core.close()


class _Link(ProducerLink):
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def evict(self) -> None:
        pass


def test_a_producer_with_an_unstored_send_must_resend_it_before_anything_later(tmp_path):
    """Sends pipelined after a failed one must not be stored after the gap: the resent ones
    would then be answered as duplicates, acknowledged and never stored."""
    disk = FillingDisk()
    core = BrokerCore(str(tmp_path), file_ops=disk)
    core.open()
    topic = core.topic(TOPIC)
    link = _Link("p")
    topic.producers["p"] = link
    disk.room = 0
    core.publish(topic, "p", 0, None, False, _entry(0), None, 1, None, 1)
    core.commit()
    assert topic.refuses(link, 1)  # would be stored after the gap
    assert not topic.refuses(link, 0)  # the resend of the failed one
    again = _Link("p")  # or the client re-created the producer
    topic.producers["p"] = again
    assert not topic.refuses(again, 1)
    disk.room = None
    assert core.publish(topic, "p", 0, None, False, _entry(0), None, 1, None, 1) == 0
    core.commit()
    core.close()


def test_sends_pipelined_after_a_failed_one_are_refused_not_stored_after_the_gap(tmp_path):
    """On one connection: seq 0 fails (disk full); space returns; seq 1 arrives before the
    client reacted, then seq 0 is resent. Before: seq 1 was stored and the resent seq 0 answered
    as a duplicate (acknowledged, never stored). Now seq 1 gets SendError, the resent seq 0 is
    stored, then seq 1: in order, each once."""
    disk = FillingDisk()
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk, deduplication=True).start()
    T = pb.BaseCommand

    def send(seq: int) -> bytes:
        md = pb.MessageMetadata(producer_name="raw", sequence_id=seq, publish_time=1)
        return codec.encode_payload_frame(T(type=T.SEND, send=pb.CommandSend(
            producer_id=1, sequence_id=seq, num_messages=1)), codec.encode_metadata_and_payload(md, b"%d" % seq))

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.broker.port)
        frames = codec.FrameReader(1 << 20)

        async def answer():
            while True:
                frame = frames.next_frame()
                if frame is not None:
                    return frame.command
                frames.feed(await asyncio.wait_for(reader.read(65536), 5))

        async def attach(producer_id_request: int):
            writer.write(codec.encode_command(T(type=T.PRODUCER, producer=pb.CommandProducer(
                topic=TOPIC, producer_id=1, request_id=producer_id_request, producer_name="raw"))))
            return (await answer()).producer_success.last_sequence_id

        writer.write(codec.encode_command(T(type=T.CONNECT, connect=pb.CommandConnect(
            client_version="raw", protocol_version=19))))
        assert (await answer()).type == T.CONNECTED
        assert await attach(1) == -1
        disk.room = 0
        writer.write(send(0))
        assert (await answer()).type == T.SEND_ERROR
        disk.room = None
        writer.write(send(1))
        writer.write(send(0))
        refused, resent = [(await answer()) for _ in range(2)]
        assert refused.type == T.SEND_ERROR and refused.send_error.sequence_id == 1
        assert (resent.send_receipt.sequence_id, resent.send_receipt.message_id.entryId) == (0, 0)
        writer.write(send(1))
        receipt = (await answer()).send_receipt
        assert (receipt.sequence_id, receipt.message_id.entryId) == (1, 1)
        writer.write(send(0))  # now truly a duplicate
        assert (await answer()).send_receipt.message_id.entryId == _U64
        writer.close()
    try:
        run(main())
    finally:
        broker.stop()


def test_disk_full_answers_send_errors_and_the_broker_recovers(tmp_path, caplog):
    """200 sends while the disk fills: each failed commit is answered SendError (the client
    resends), nothing is acknowledged unstored, and once space returns all 200 are stored
    exactly once, in order, also after a restart."""
    disk = FillingDisk()
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk).start()
    count = 200

    async def produce():
        async with Client(broker.url, operation_timeout_seconds=10, initial_backoff_seconds=0.05) as client:
            producer = await client.create_producer(TOPIC, batching_enabled=False, send_timeout_millis=30000)
            await producer.send(b"warm-up")
            disk.room = 3000  # about 20 records fit
            futures = [await producer.send_async(b"payload-%03d" % i) for i in range(count)]
            await asyncio.sleep(1.0)
            assert sum(f.done() and f.exception() is None for f in futures) < count  # some are stuck
            disk.room = None  # space returns
            await asyncio.wait_for(asyncio.gather(*futures), 30)
            await producer.close()

    caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
    try:
        run(produce())
        stats = broker.call(broker.broker.storage_stats)
        assert stats["failed_commits"] >= 1
        assert any("group commit" in r.getMessage() for r in caplog.records)
        broker.restart()

        async def read_back():
            async with Client(broker.url) as client:
                reader = await client.create_reader(TOPIC, MessageId.earliest)
                stored = []
                while await reader.has_message_available():
                    stored.append((await reader.read_next(5000)).data())
                return stored
        stored = run(read_back())
        assert stored == [b"warm-up"] + [b"payload-%03d" % i for i in range(count)]
    finally:
        broker.stop()


@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs (root only; skipped where it cannot be mounted)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_real_full_disk_loses_nothing_acknowledged_and_recovers(small_tmpfs):
    """A real ENOSPC: an 8 MiB tmpfs, 6 MiB of it taken by ballast; 100 sends of 32 KiB. Those
    that do not fit get errors (the client resends); once the ballast goes all 100 are stored
    exactly once, in order, also after a restart."""
    ballast = small_tmpfs / "ballast"
    ballast.write_bytes(b"\0" * (6 * 1024 * 1024))
    data_dir = small_tmpfs / "data"
    broker = BrokerThread(data_dir, v1_port=None).start()
    payloads = [b"%03d-" % i + b"x" * (32 * 1024) for i in range(100)]

    async def produce():
        async with Client(broker.url, initial_backoff_seconds=0.05) as client:
            producer = await client.create_producer(TOPIC, batching_enabled=False, send_timeout_millis=30000)
            futures = [await producer.send_async(p) for p in payloads]
            await asyncio.sleep(1.5)
            assert not all(f.done() for f in futures)  # the disk is full: some wait
            ballast.unlink()  # space returns
            await asyncio.wait_for(asyncio.gather(*futures), 30)
    try:
        run(produce())
        assert broker.call(broker.broker.storage_stats)["failed_commits"] >= 1
        broker.restart()

        async def read_back():
            async with Client(broker.url) as client:
                reader = await client.create_reader(TOPIC, MessageId.earliest)
                stored = []
                while await reader.has_message_available():
                    stored.append((await reader.read_next(5000)).data())
                return stored
        assert run(read_back()) == payloads
    finally:
        broker.stop()


def test_maintenance_survives_failing_state_writes_and_persists_later(tmp_path, caplog):
    disk = FillingDisk()
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk).start()
    cursors = os.path.join(topic_directory(str(tmp_path), TOPIC), "cursors.json")

    async def main():
        async with Client(broker.url) as client:
            consumer = await client.subscribe(TOPIC, "sub", initial_position=InitialPosition.Earliest,
                                              ack_group_time_ms=0)
            producer = await client.create_producer(TOPIC)
            await wait_until_async(lambda: os.path.exists(cursors))  # the subscription is on disk
            disk.json_fails = True
            for i in range(5):
                await producer.send(b"%d" % i)
                consumer.acknowledge(await consumer.receive(5000))
            await asyncio.sleep(0.8)
            with open(cursors) as fh:
                assert metafile.decode(fh.buffer.read())["sub"]["mark_delete"] < 4  # not persisted while failing
            assert not broker.broker._background.done()
            disk.json_fails = False

            def persisted() -> int:
                with open(cursors) as fh:
                    return metafile.decode(fh.buffer.read())["sub"]["mark_delete"]
            await wait_until_async(lambda: persisted() == 4)
            assert persisted() == 4  # retried and persisted

    caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
    try:
        run(main())
        assert any("cannot write" in r.getMessage() for r in caplog.records)
    finally:
        broker.stop()


# 4. corruption

def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _write_entries(directory, count: int, segment_bytes: int = 64 * 1024 * 1024) -> list[int]:
    topic_log = TopicLog(str(directory), segment_bytes=segment_bytes)
    ids = [topic_log.append(_entry(i), None, 1000 + i, 1) for i in range(count)]
    topic_log.close()
    return ids


async def _send_and_acknowledge(url: str, count: int, subscription: str) -> None:
    """Producer "p" sends `count` messages, unbatched, each received and acknowledged at once on
    `subscription` (from the earliest), then the cursor and the topic's state are given time to
    be written (0.3 s after changes)."""
    async with Client(url) as client:
        consumer = await client.subscribe(TOPIC, subscription, initial_position=InitialPosition.Earliest,
                                          ack_group_time_ms=0)
        producer = await client.create_producer(TOPIC, producer_name="p", batching_enabled=False)
        for i in range(count):
            await producer.send(b"%d" % i)
            consumer.acknowledge(await consumer.receive(5000))
        await asyncio.sleep(0.6)


def _remove_last_segments_and_state(directory) -> list[str]:
    """Delete the last two segments and the topic's state file (and its copy): nothing but a
    cursor may count their entries. Returns the segment logs there were."""
    logs = sorted(f for f in os.listdir(directory) if f.endswith(".log"))
    _remove_segments(directory, logs[-2:])
    for name in os.listdir(directory):
        if name.startswith("state.json"):
            os.remove(os.path.join(directory, name))
    return logs


def _remove_segments(directory, names: list[str]) -> None:
    """Delete these segments' log and index files (a careless operator, a failing disk)."""
    for name in names:
        os.remove(os.path.join(directory, name))
        os.remove(os.path.join(directory, name[:-4] + ".idx"))


def _position(directory, entry_id: int) -> int:
    with open(_log_file(directory)[:-4] + ".idx", "rb") as fh:
        fh.seek(8 * entry_id)
        return int.from_bytes(fh.read(8), "big")


def test_one_flipped_byte_costs_that_entry_alone_and_keeps_the_connection(tmp_path, caplog):
    directory = topic_directory(str(tmp_path), TOPIC)
    _write_entries(directory, 2000)
    _flip(_log_file(directory), _position(directory, 1000) + HEADER_SIZE + 10)
    broker = BrokerThread(tmp_path, v1_port=None).start()
    caplog.set_level(logging.ERROR, logger="pulsarwire.broker")

    async def consume():
        async with Client(broker.url) as client:
            consumer = await client.subscribe(TOPIC, "all", initial_position=InitialPosition.Earliest)
            got = []
            while len(got) < 1999:
                message = await consumer.receive(5000)
                got.append(message.data())
                consumer.acknowledge(message)
            assert consumer.is_connected()
            return got
    try:
        got = run(consume())
        assert got == [b"m-%04d" % i for i in range(2000) if i != 1000]
        stats = broker.call(broker.broker.storage_stats)
        assert stats["skipped_entries"] == 1 and stats["corrupt_entries"] >= 1
        assert any("entry 1000" in r.getMessage() and TOPIC in r.getMessage() for r in caplog.records)
    finally:
        broker.stop()


def test_log_cut_below_its_index_keeps_the_lost_ids_from_new_messages(tmp_path, caplog):
    """Records the index lists were stored whole (the index is written after them): a log cut
    below them lost entries a client may have been told are stored. They are reported at ERROR,
    read as lost, and their ids are never given to new messages, across restarts."""
    _write_entries(tmp_path, 100)
    path = _log_file(tmp_path)
    cut = _position(tmp_path, 60) + 7  # inside entry 60's header; the index still lists 100
    os.truncate(path, cut)
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    topic_log = TopicLog(str(tmp_path))
    assert topic_log.next_entry_id == 100
    assert topic_log.first_lost == 60
    assert topic_log.read(59).body == _entry(59)
    for lost in (60, 99):
        with pytest.raises(CorruptEntryError):
            topic_log.read(lost)
    assert os.path.getsize(path) == cut  # kept as found, not cut further as a torn write
    errors_logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("entries 60 to 99 are lost" in m for m in errors_logged)
    assert topic_log.append(_entry(100), None, 1, 1) == 100
    topic_log.close()
    caplog.clear()
    topic_log = TopicLog(str(tmp_path))  # again: the ids stay taken, the loss is still reported
    assert topic_log.next_entry_id == 101 and topic_log.first_lost == 60
    assert topic_log.read(100).body == _entry(100)
    with pytest.raises(CorruptEntryError):
        topic_log.read(80)
    assert any("entries 60 to 99 are unreadable" in r.getMessage() for r in caplog.records)
    topic_log.close()


def test_fsck_reads_the_logs_and_reports_missing_and_damaged_entries(tmp_path):
    from pulsarwire.broker.fsck import check

    directory = topic_directory(str(tmp_path), TOPIC)
    _write_entries(directory, 300, segment_bytes=4096)
    assert check(str(tmp_path)) == []
    logs = sorted(f for f in os.listdir(directory) if f.endswith(".log"))
    first_kept, last = int(logs[1][:-4]), os.path.join(directory, logs[-1])
    _remove_segments(directory, logs[:1])
    with open(last, "rb") as fh:
        size = len(fh.read())
    os.truncate(last, size - 10)  # the last record cut short, though its index lists it
    _flip(os.path.join(directory, logs[2]), HEADER_SIZE + 3)  # a body byte of the third segment's first record
    found = [str(f) for f in check(str(tmp_path))]
    assert any(f"entries 0 to {first_kept - 1} are lost" in f for f in found)
    assert any(logs[2] in f and "damaged (1 entry)" in f for f in found)
    assert any(logs[-1] in f and "299 to 299 are lost" in f for f in found)
    assert check(str(tmp_path)) and os.path.getsize(last) == size - 10  # nothing changed


def test_last_segments_deleted_after_the_state_counted_them_are_lost_entries_not_new_ids(tmp_path, caplog):
    """The topic's state (written 0.3 s after changes) counted entries whose segment files are
    gone: they are reported lost (ERROR), and the next message does not get one of their ids."""
    broker = BrokerThread(tmp_path, v1_port=None, segment_bytes=4096).start()

    async def produce():
        async with Client(broker.url) as client:
            producer = await client.create_producer(TOPIC, producer_name="p", batching_enabled=False)
            for i in range(300):
                await producer.send(b"%d" % i)
            await asyncio.sleep(0.6)  # the state written
    try:
        run(produce())
        broker.stop()
        directory = topic_directory(str(tmp_path), TOPIC)
        logs = sorted(f for f in os.listdir(directory) if f.endswith(".log"))
        assert len(logs) >= 3
        _remove_segments(directory, logs[-2:])
        kept = int(logs[-2][:-4])
        caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
        broker.start()

        async def again():
            async with Client(broker.url) as client:
                producer = await client.create_producer(TOPIC, producer_name="p", batching_enabled=False)
                return await producer.send(b"after")
        assert run(again()).entry_id == 300
        assert any(f"entries {kept} to 299 are lost" in r.getMessage() for r in caplog.records)
    finally:
        broker.stop()


def test_last_segments_deleted_with_the_state_lost_too_a_cursor_past_them_keeps_their_ids(tmp_path, caplog):
    """No topic state, but a subscription acknowledged entries the log no longer holds: they are
    lost entries (ERROR) and their ids are kept, rather than the cursor moved back onto ids that
    new messages would take."""
    broker = BrokerThread(tmp_path, v1_port=None, segment_bytes=4096).start()

    try:
        run(_send_and_acknowledge(broker.url, 300, "s1"))  # the cursor written
        broker.stop()
        directory = topic_directory(str(tmp_path), TOPIC)
        logs = _remove_last_segments_and_state(directory)
        kept = int(logs[-2][:-4])
        caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
        broker.start()

        async def again():
            async with Client(broker.url) as client:
                consumer = await client.subscribe(TOPIC, "s1")
                producer = await client.create_producer(TOPIC, producer_name="q", batching_enabled=False)
                sent = await producer.send(b"after")
                return sent, await consumer.receive(5000)
        sent, received = run(again())
        assert sent.entry_id == 300 and received.data() == b"after"
        assert any(f"subscriptions' cursors counted entries up to 299" in r.getMessage() and
                   f"entries {kept} to 299 are lost" in r.getMessage() for r in caplog.records)
    finally:
        broker.stop()


def test_lost_entries_nothing_counted_never_give_a_message_id_twice(tmp_path):
    """The last segments deleted with nothing on disk counting their entries (no topic state, no
    cursor past them): their entry ids are taken again, but in a ledger of their own (one a
    session, as Pulsar opens a new ledger at every load), so no message id is given twice, and an
    acknowledgement of an id given before the loss does not settle the message now at its entry."""
    broker = BrokerThread(tmp_path, v1_port=None, segment_bytes=4096).start()

    async def produce():
        async with Client(broker.url) as client:
            producer = await client.create_producer(TOPIC, producer_name="p", batching_enabled=False)
            return [await producer.send(b"%d" % i) for i in range(300)]
    try:
        before = run(produce())
        broker.stop()
        directory = topic_directory(str(tmp_path), TOPIC)
        logs = _remove_last_segments_and_state(directory)
        broker.start()

        async def after():
            async with Client(broker.url) as client:
                consumer = await client.subscribe(TOPIC, "late", ack_group_time_ms=0)
                producer = await client.create_producer(TOPIC, producer_name="q", batching_enabled=False)
                sent = [await producer.send(b"q%d" % i) for i in range(5)]
                first = await consumer.receive(5000)
                stale = next(mid for mid in before if mid.entry_id == first.message_id().entry_id)
                consumer.acknowledge(stale)  # an id of a lost entry, its entry id taken again
                await asyncio.sleep(0.3)
                await consumer.close()
                consumer = await client.subscribe(TOPIC, "late")
                again = await consumer.receive(5000)  # not settled by the stale acknowledgement
                return sent, first, again
        sent, first, again = run(after())
        given = {(mid.ledger_id, mid.entry_id) for mid in before}
        assert not given & {(mid.ledger_id, mid.entry_id) for mid in sent}
        assert sent[0].entry_id < 300  # the entry ids were taken again (nothing counted them)
        assert again.data() == first.data() == b"q0"
    finally:
        broker.stop()


def test_a_torn_write_the_index_never_listed_is_truncated(tmp_path, caplog):
    """A record cut short before its index entry was written (a crash mid-write) was never
    acknowledged: it is dropped (WARNING) and its id given to the next message."""
    _write_entries(tmp_path, 100)
    path = _log_file(tmp_path)
    idx = path[:-4] + ".idx"
    os.truncate(idx, 8 * 99)  # the index of a crash before entry 99's index entry was written
    os.truncate(path, os.path.getsize(path) - 5)  # and entry 99's record cut short
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    topic_log = TopicLog(str(tmp_path))
    assert topic_log.next_entry_id == 99 and topic_log.first_lost is None
    assert any("torn record" in r.getMessage() for r in caplog.records)
    assert topic_log.append(_entry(99), None, 1, 1) == 99
    topic_log.close()


def test_missing_first_segments_are_reported_and_a_subscription_goes_on_after_them(tmp_path, caplog):
    directory = topic_directory(str(tmp_path), TOPIC)
    _write_entries(directory, 300, segment_bytes=4096)
    logs = sorted(f for f in os.listdir(directory) if f.endswith(".log"))
    assert len(logs) >= 3
    first_kept = int(logs[1][:-4])
    broker = BrokerThread(tmp_path, v1_port=None).start()

    async def subscribe_first():
        async with Client(broker.url) as client:
            await client.subscribe(TOPIC, "s1", initial_position=InitialPosition.Earliest)
    try:
        run(subscribe_first())  # a durable subscription at entry 0, nothing acknowledged
        broker.stop()
        _remove_segments(directory, logs[:1])
        caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
        broker.start()

        async def consume():
            async with Client(broker.url) as client:
                consumer = await client.subscribe(TOPIC, "s1")
                got = []
                while len(got) < 300 - first_kept:
                    message = await consumer.receive(5000)
                    got.append(message.data())
                    consumer.acknowledge(message)
                return got
        assert run(consume()) == [b"m-%04d" % i for i in range(first_kept, 300)]
        messages = [r.getMessage() for r in caplog.records]
        assert any(f"the segments before it are missing, entries 0 to {first_kept - 1} are lost" in m
                   for m in messages)
        assert any(f"entries 0 to {first_kept - 1} are gone from the disk ({first_kept} not acknowledged)" in m
                   for m in messages)
        assert not any("FLOW failed" in m for m in messages)
    finally:
        broker.stop()


def test_log_cut_below_cursor_and_dedup_state_loses_nothing_later(tmp_path, caplog):
    """A log cut below what the cursor and the dedup snapshot had seen (a truncated file): the
    lost entries keep their ids, the dedup state is rebuilt from what the log still holds, so
    the resent and the new messages are stored and delivered, not dropped as duplicates."""
    broker = BrokerThread(tmp_path, v1_port=None, deduplication=True).start()

    try:
        run(_send_and_acknowledge(broker.url, 100, "sub"))  # cursor and dedup state persisted
        broker.stop()
        directory = topic_directory(str(tmp_path), TOPIC)
        os.truncate(_log_file(directory), _position(directory, 60) + 5)
        caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
        broker.start()

        async def second():
            async with Client(broker.url) as client:
                producer = await client.create_producer(TOPIC, producer_name="p", batching_enabled=False)
                assert producer.last_sequence_id() == 59
                consumer = await client.subscribe(TOPIC, "sub")
                await producer.send(b"again-60")
                assert (await consumer.receive(5000)).data() == b"again-60"
        run(second())
        messages = [r.getMessage() for r in caplog.records]
        assert any("entries 60 to 99 are lost" in m for m in messages)  # the cursor stays: ids are kept
        assert any("deduplication state" in m and "lost entries from 60 on" in m for m in messages)
    finally:
        broker.stop()


@pytest.mark.parametrize("entry", [150, 299 - 1])
def test_a_flipped_bit_in_an_index_entry_costs_no_entry_and_is_repaired(tmp_path, caplog, entry):
    """Opening trusts an index whose positions only look right (they increase): the first read
    that finds a whole record whose own header disagrees with where the index puts the next one
    reads it by its header, and corrects that position, in memory and in the file."""
    _write_entries(tmp_path, 300)
    idx = _log_file(tmp_path)[:-4] + ".idx"
    with open(idx, "r+b") as fh:
        fh.seek(8 * entry + 7)
        low = fh.read(1)[0]
        fh.seek(8 * entry + 7)
        fh.write(bytes([low ^ 1]))
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    topic_log = TopicLog(str(tmp_path))
    assert [topic_log.read(i).body for i in range(300)] == [_entry(i) for i in range(300)]
    assert any(f"the index puts entry {entry} at byte" in r.getMessage() for r in caplog.records)
    topic_log.close()  # (waits for the repair written on the fsync thread)
    caplog.clear()
    topic_log = TopicLog(str(tmp_path))
    assert [topic_log.read(i).body for i in range(300)] == [_entry(i) for i in range(300)]
    assert not caplog.records  # repaired on disk: nothing to correct again
    topic_log.close()


def _assert_reads(topic_log: TopicLog, count: int, corrupt: set[int]) -> None:
    """Entries 0 to count - 1 read as written, but those in `corrupt`, which read as corrupt."""
    for i in range(count):
        if i in corrupt:
            with pytest.raises(CorruptEntryError):
                topic_log.read(i)
        else:
            assert topic_log.read(i).body == _entry(i)


def _zeros_from_entry_300(directory) -> set[int]:
    """1 000 entries written, then 4 KiB of zeros from inside entry 300's body: the entries they cover."""
    _write_entries(directory, 1000)
    start = _position(directory, 300) + HEADER_SIZE + 5
    with open(_log_file(directory), "r+b") as fh:
        fh.seek(start)
        fh.write(bytes(4096))
    return {i for i in range(1000) if _position(directory, i) < start + 4096 and
            (i == 999 or _position(directory, i + 1) > start)}


def test_a_run_of_zeros_inside_a_segment_costs_the_entries_it_covers_alone(tmp_path, caplog):
    """4 KiB of zeros from inside a record (a lost page of the file): a zero header read as a
    whole empty record (size 0, and 0 is the CRC32C of no bytes), and the index was "corrected"
    one header at a time into the zeros and written so: every later entry was unreadable, for
    good. The entries the zeros cover are reported corrupt; the index stays; the rest reads."""
    covered = _zeros_from_entry_300(tmp_path)
    assert len(covered) > 3 and min(covered) == 300
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    for _ in range(2):  # and again once reopened: nothing of it was written to the index
        topic_log = TopicLog(str(tmp_path))
        _assert_reads(topic_log, 1000, covered)
        topic_log.close()
        assert not any("corrected" in r.getMessage() for r in caplog.records)


def test_a_run_of_zeros_found_by_a_scan_keeps_the_ids_after_it_by_the_index(tmp_path, caplog):
    """A start that scans the log (the index is inconsistent from entry 100 on) meets a run of
    zeros over several records: no header to follow through it, so the gap's entries are counted
    by the index's positions where it still lists both ends, not as one entry (which gave every
    entry after it the id of the one before; fsck said the last entries were lost)."""
    from pulsarwire.broker import fsck
    covered = _zeros_from_entry_300(tmp_path)
    findings = [str(f) for f in fsck.check_log(str(tmp_path))]
    assert len(findings) == 1 and f"({len(covered)} entries)" in findings[0], findings
    with open(_log_file(tmp_path)[:-4] + ".idx", "r+b") as fh:
        fh.seek(8 * 100)
        fh.write((2 ** 40).to_bytes(8, "big"))  # past the log's end: the index is trusted up to entry 100
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    topic_log = TopicLog(str(tmp_path))
    assert topic_log.next_entry_id == 1000
    _assert_reads(topic_log, 1000, covered)
    topic_log.close()
    assert any("rebuilding the index" in r.getMessage() for r in caplog.records)
    assert any("are damaged" in r.getMessage() and str(min(covered)) in r.getMessage() for r in caplog.records)


def test_a_run_of_zeros_in_a_segment_whose_index_is_lost_is_counted_by_the_next_segment(tmp_path, caplog):
    """Two faults in a segment that is not the last: its index deleted and a run of zeros over
    several records. Neither headers nor the index count the damaged range, but the next
    segment's first id says how many entries this one holds: the range holds the missing ones,
    and the entries after it keep their ids (they moved down by the count, so a cursor in the
    segment skipped intact messages, and the segment's last ids were reported lost)."""
    from pulsarwire.broker import fsck
    _write_entries(tmp_path, 300, segment_bytes=4096)
    bases = sorted(int(f[:-4]) for f in os.listdir(tmp_path) if f.endswith(".log"))
    assert len(bases) > 2
    count = bases[1]  # the first segment's entries
    start = _position(tmp_path, count // 2) + HEADER_SIZE + 3
    stop = _position(tmp_path, count // 2 + 4) + 5
    with open(_log_file(tmp_path), "r+b") as fh:
        fh.seek(start)
        fh.write(bytes(stop - start))
    os.remove(_log_file(tmp_path)[:-4] + ".idx")
    covered = set(range(count // 2, count // 2 + 5))
    findings = [str(f) for f in fsck.check_log(str(tmp_path))]
    assert len(findings) == 1 and "(5 entries)" in findings[0], findings
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    for _ in range(2):  # and once more, from the index written the first time
        topic_log = TopicLog(str(tmp_path))
        assert topic_log.next_entry_id == 300
        _assert_reads(topic_log, 300, covered)
        topic_log.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"entries {min(covered)} to {max(covered)} are unreadable, the ids after them are kept" in m
               for m in messages), messages
    assert not any("holds" in m and "of its" in m for m in messages)


def test_a_damaged_publish_time_in_a_record_header_does_not_move_a_seek_by_time(tmp_path, caplog):
    """A record header's publish time is outside the record's checksum: a seek by time reads the
    time from the entry's metadata (checked), and reports a header that disagrees."""
    broker = BrokerThread(tmp_path, v1_port=None).start()

    async def produce():
        async with Client(broker.url) as client:
            producer = await client.create_producer(TOPIC, batching_enabled=False)
            for i in range(300):
                await producer.send(b"%d" % i)
                if i % 25 == 24:
                    await asyncio.sleep(0.003)  # publish times apart
    try:
        run(produce())
        broker.stop()
        directory = topic_directory(str(tmp_path), TOPIC)
        with open(_log_file(directory), "r+b") as fh:
            fh.seek(_position(directory, 150) + 8)  # the first probed entry: the header's publish time (">IIQI")
            fh.write((0).to_bytes(8, "big"))
        caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
        broker.start()

        async def seek():
            async with Client(broker.url) as client:
                reader = await client.create_reader(TOPIC, MessageId.earliest)
                first = [await reader.read_next(5000) for _ in range(101)][-1]  # entry 100
                consumer = await client.subscribe(TOPIC, "by-time", initial_position=InitialPosition.Earliest)
                await consumer.seek(first.publish_timestamp())
                message = await consumer.receive(5000)
                return first, message
        first, message = run(seek())
        assert message.publish_timestamp() == first.publish_timestamp()
        assert int(message.data()) <= 100  # at entry 100's time, or an earlier one of the same millisecond
        assert any("record header holds publish time 0" in r.getMessage() for r in caplog.records)
    finally:
        broker.stop()


@pytest.mark.parametrize("where", ["body", "header"])
def test_deleted_index_and_bad_byte_keep_the_entries_after_it(tmp_path, caplog, where):
    _write_entries(tmp_path, 2000)
    offset = _position(tmp_path, 1000) + (HEADER_SIZE + 10 if where == "body" else 1)
    os.remove(_log_file(tmp_path)[:-4] + ".idx")
    _flip(_log_file(tmp_path), offset)
    caplog.set_level(logging.WARNING, logger="pulsarwire.broker")
    topic_log = TopicLog(str(tmp_path))
    assert topic_log.next_entry_id == 2000  # nothing after the bad record is dropped
    with pytest.raises(CorruptEntryError):
        topic_log.read(1000)
    assert [topic_log.read(i).body for i in (999, 1001, 1999)] == [_entry(999), _entry(1001), _entry(1999)]
    assert any("1000" in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    topic_log.close()


def test_damaged_middle_segment_reads_as_corrupt_entries_not_index_error(tmp_path, caplog):
    _write_entries(tmp_path, 300, segment_bytes=4096)
    logs = sorted(f for f in os.listdir(tmp_path) if f.endswith(".log"))
    assert len(logs) >= 3
    middle = os.path.join(tmp_path, logs[1])
    first_of_next = int(logs[2][:-4])
    os.truncate(middle, os.path.getsize(middle) // 2)
    os.remove(middle[:-4] + ".idx")
    caplog.set_level(logging.ERROR, logger="pulsarwire.broker")
    topic_log = TopicLog(str(tmp_path), segment_bytes=4096)
    assert topic_log.next_entry_id == 300
    with pytest.raises(CorruptEntryError):
        topic_log.read(first_of_next - 1)
    assert topic_log.read(first_of_next).body == _entry(first_of_next)
    assert topic_log.read(int(logs[1][:-4])).body == _entry(int(logs[1][:-4]))
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    topic_log.close()


# 6. file descriptors

def test_open_segment_files_stay_within_max_open_files(tmp_path):
    pool = FilePool(max_open_files=8)
    logs = [TopicLog(str(tmp_path / f"t{i}"), pool=pool, cache_bytes=0) for i in range(50)]
    for round_ in range(3):
        for i, topic_log in enumerate(logs):
            topic_log.append(b"%d-%d" % (i, round_), None, 1, 1)
            assert topic_log.commit()
            assert pool.open_count <= 8
    assert all(topic_log.read(2).body == b"%d-2" % i for i, topic_log in enumerate(logs))
    assert pool.open_count <= 8 and pool.stats.file_reopens > 0
    for topic_log in logs:
        topic_log.close()


def _limited_broker(data_dir, limit: int, *extra: str):
    port = free_port()

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(data_dir), "--port", str(port),
         "--v1-port", "-1", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=dict(os.environ), preexec_fn=lower_limit)
    wait_for_port(port, process=process)
    return process, f"pulsar://127.0.0.1:{port}"


def test_600_topics_under_a_256_descriptor_limit(tmp_path):
    process, url = _limited_broker(tmp_path, 256)

    async def one(client, i):
        topic = f"persistent://public/default/fd-{i}"
        producer = await client.create_producer(topic)
        await producer.send(b"t-%d" % i)
        await producer.close()
        consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        message = await consumer.receive(10000)
        consumer.acknowledge(message)
        await consumer.close()
        return message.data()

    async def main():
        async with Client(url, operation_timeout_seconds=20) as client:
            got = []
            for start in range(0, 600, 50):
                got += await asyncio.gather(*(one(client, i) for i in range(start, start + 50)))
            return got
    try:
        assert run(main(), timeout=120) == [b"t-%d" % i for i in range(600)]
        assert process.poll() is None
    finally:
        terminate(process)


def test_no_descriptors_left_is_answered_with_an_error_not_a_dropped_connection(tmp_path):
    """With an explicit --max-connections past the descriptor limit, connections take every
    descriptor: a request that needs a file is answered with an error, the connection stays up,
    and it works again once descriptors free up."""
    process, url = _limited_broker(tmp_path, 40, "--max-connections", "200")

    def descriptors() -> int:
        return len(os.listdir(f"/proc/{process.pid}/fd"))

    async def main():
        async with Client(url, operation_timeout_seconds=5) as client:
            await client.create_producer("persistent://public/default/before")
            before = descriptors()
            hogs = []
            for _ in range(40):  # take every descriptor the broker has left
                hogs.append(await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1])))
            assert await wait_until_async(lambda: descriptors() >= 40)  # the broker accepted them
            # a descriptor may still come free for a moment (the listener refuses the connections
            # left in its backlog from its reserve): each topic that opens holds its files, so
            # within a few topics one finds none left
            refused = None
            for attempt in range(10):
                starved = f"persistent://public/default/starved-{attempt}"
                try:
                    await client.create_producer(starved)
                except errors.PulsarWireError as exc:
                    refused = exc
                    break
            assert refused is not None, "no topic was refused with every descriptor taken"
            assert "open" in str(refused) or "Persistence" in type(refused).__name__
            for _, writer in hogs:
                writer.close()
            assert await wait_until_async(lambda: descriptors() <= before + 3 * attempt)  # the broker saw them go
            producer = await client.create_producer(starved)
            await producer.send(b"fine")  # the same connection, still up
    try:
        run(main(), timeout=60)
    finally:
        terminate(process)


def test_connections_past_the_descriptor_room_are_refused_with_an_error(tmp_path):
    """By default the connection limit fits the descriptor limit: connections past what it leaves
    room for are refused with an error (ServiceNotReady), so a flood cannot take the descriptors
    the served clients need."""
    process, url = _limited_broker(tmp_path, 40)

    async def main():
        async with Client(url, operation_timeout_seconds=5) as client:
            for _ in range(50):  # the port probe's connection may still hold the one place left
                try:
                    await client.create_producer("persistent://public/default/before")
                    break
                except errors.ServiceNotReadyError:
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("the broker never served the first client")
            hogs = []
            for _ in range(40):  # more connections than the broker has descriptors for
                hogs.append(await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1])))
            refused = 0
            for reader, _ in hogs:
                try:
                    answer = await asyncio.wait_for(reader.read(1024), 0.2)
                except asyncio.TimeoutError:
                    continue
                refused += b"too many connections" in answer
            assert refused >= 10
            producer = await client.create_producer("persistent://public/default/starved")
            await producer.send(b"fine")  # the same connection, still up
            for _, writer in hogs:
                writer.close()
    try:
        run(main(), timeout=60)
    finally:
        terminate(process)


def test_connection_flood_under_the_descriptor_limit_is_answered(tmp_path):
    """300 connections against a 256-descriptor broker: the connection limit is lowered to fit
    beside the segment files, so a client past it is refused with an error, not left unaccepted
    (EMFILE on accept), and clients are served again once the flood goes."""
    process, url = _limited_broker(tmp_path, 256)
    port = int(url.rsplit(":", 1)[1])
    T = pb.BaseCommand
    connect = codec.encode_command(T(type=T.CONNECT, connect=pb.CommandConnect(client_version="flood",
                                                                                protocol_version=19)))

    async def main():
        flood = []
        for _ in range(300):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(connect)
            flood.append((reader, writer))
        await asyncio.sleep(0.5)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(connect)
        frames = codec.FrameReader(1 << 20)
        frames.feed(await asyncio.wait_for(reader.read(65536), 5))
        answer = frames.next_frame().command
        assert answer.type in (T.CONNECTED, T.ERROR)
        if answer.type == T.ERROR:
            assert answer.error.error == pb.ServiceNotReady
        writer.close()
        for _, flooding in flood:
            flooding.close()
        await asyncio.sleep(0.5)
        async with Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("persistent://public/default/after-flood")
            await producer.send(b"ok")
    try:
        run(main(), timeout=60)
        assert process.poll() is None
    finally:
        terminate(process)
