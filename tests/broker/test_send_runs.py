"""The broker stores Send frames that arrive together as runs (one call to the topic for each
producer's run of plain frames). Every frame of a run must be answered as if it came alone:
these tests write many frames in one go, so that they are read from one receive buffer, with
frames in the middle that the run cannot take."""
from __future__ import annotations

import asyncio

from pulsarwire import codec
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire._codec_py import BatchBuilder

from ..peers import BrokerThread
from ..helpers import run
from ..helpers import FillingDisk

T = pb.BaseCommand
TOPIC = "persistent://public/default/runs"
NO_ENTRY = 0xFFFFFFFFFFFFFFFF  # a duplicate's receipt carries entry id -1


def send_frame(producer_id: int, sequence_id: int, *, batch: int = 0, claimed: int | None = None,
               deliver_at: int | None = None, chunk: bool = False, highest: int | None = None) -> bytes:
    """A Send frame of one message, or of a batch of `batch` messages that claims `claimed`."""
    md = pb.MessageMetadata(producer_name=f"runner-{producer_id}", sequence_id=sequence_id, publish_time=1)
    payload = b"p%d-%d" % (producer_id, sequence_id)
    if batch:
        builder = BatchBuilder()
        for i in range(batch):
            builder.add(b"%s.%d" % (payload, i))
        md.num_messages_in_batch = claimed if claimed is not None else batch
        payload = builder.build()
    if deliver_at is not None:
        md.deliver_at_time = deliver_at
    send = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=max(batch, 1))
    if highest is not None:
        send.highest_sequence_id = highest
    if chunk:
        md.uuid, md.chunk_id, md.num_chunks_from_msg, md.total_chunk_msg_size = "u", 0, 1, len(payload)
        send.is_chunk = True
    return codec.encode_payload_frame(T(type=T.SEND, send=send), codec.encode_metadata_and_payload(md, payload))


class RawConnection:
    def __init__(self, port: int) -> None:
        self.port = port
        self.frames = codec.FrameReader(1 << 20)

    async def open(self, producers: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(codec.encode_command(T(type=T.CONNECT, connect=pb.CommandConnect(
            client_version="runs", protocol_version=19))))
        assert (await self.answer()).type == T.CONNECTED
        for producer_id in range(1, producers + 1):
            self.writer.write(codec.encode_command(T(type=T.PRODUCER, producer=pb.CommandProducer(
                topic=TOPIC, producer_id=producer_id, request_id=producer_id, producer_name=f"runner-{producer_id}"))))
            assert (await self.answer()).type == T.PRODUCER_SUCCESS

    async def answer(self):
        while True:
            frame = self.frames.next_frame()
            if frame is not None:
                return frame.command
            self.frames.feed(await asyncio.wait_for(self.reader.read(65536), 10))

    async def exchange(self, frames: list[bytes]) -> list[tuple]:
        """Write every frame at once; each answer as (producer, sequence id, entry id or error)."""
        self.writer.write(b"".join(frames))
        answers = []
        for _ in frames:
            command = await self.answer()
            if command.type == T.SEND_RECEIPT:
                r = command.send_receipt
                answers.append((r.producer_id, r.sequence_id, r.message_id.entryId))
            else:
                assert command.type == T.SEND_ERROR, command
                e = command.send_error
                answers.append((e.producer_id, e.sequence_id, pb.ServerError.Name(e.error)))
        return answers


def test_a_run_answers_each_frame_as_if_it_came_alone(tmp_path):
    """Two producers interleaved, resends (duplicates) within the run, a delayed message, a
    chunk, a batch that claims more messages than it holds and a batch with a higher
    highest_sequence_id, all in one write: answered in order, each as the general path would."""
    broker = BrokerThread(tmp_path, v1_port=None, deduplication=True).start()

    async def main():
        conn = RawConnection(broker.broker.port)
        await conn.open(producers=2)
        frames = [send_frame(1, 0), send_frame(1, 1), send_frame(2, 0), send_frame(1, 1), send_frame(1, 2),
                  send_frame(1, 3, deliver_at=1), send_frame(1, 4, batch=3), send_frame(1, 5, batch=2, claimed=3),
                  send_frame(1, 6, chunk=True), send_frame(2, 1), send_frame(2, 0), send_frame(1, 7, highest=9),
                  send_frame(1, 8), send_frame(1, 10)]
        answers = await conn.exchange(frames)
        assert answers == [(1, 0, 0), (1, 1, 1), (2, 0, 2), (1, 1, NO_ENTRY), (1, 2, 3), (1, 3, 4), (1, 4, 5),
                           (1, 5, "ChecksumError"), (1, 6, 6), (2, 1, 7), (2, 0, NO_ENTRY), (1, 7, 8),
                           (1, 8, NO_ENTRY), (1, 10, 9)]
        conn.writer.close()
        topic = broker.broker.core.topics[TOPIC]
        assert topic.last_sequence == {"runner-1": 10, "runner-2": 1}
        counts = [broker.call(topic.log.read, i).num_messages for i in range(10)]
        assert counts == [1, 1, 1, 1, 1, 3, 1, 1, 1, 1]
    try:
        run(main())
    finally:
        broker.stop()


def test_a_run_across_a_new_segment_is_stored_whole_and_read_back_after_a_restart(tmp_path):
    broker = BrokerThread(tmp_path, v1_port=None, segment_bytes=2000).start()

    async def main():
        conn = RawConnection(broker.broker.port)
        await conn.open(producers=1)
        answers = await conn.exchange([send_frame(1, i, batch=4) for i in range(60)])
        assert answers == [(1, i, i) for i in range(60)]
        conn.writer.close()
    try:
        run(main())
        broker.restart()
        topic = broker.broker.core.topics.get(TOPIC) or broker.call(broker.broker.core.topic, TOPIC)
        assert len(topic.log._segments) >= 3  # two new segments started inside the run
        bodies = [broker.call(topic.log.read, i).body for i in range(60)]
        for i, body in enumerate(bodies):
            assert bytes(body).endswith(b"p1-%d.3" % i)
        assert topic.last_sequence == {"runner-1": 59}
    finally:
        broker.stop()


def test_a_run_in_a_failed_commit_is_answered_with_errors_and_can_be_sent_again(tmp_path):
    disk = FillingDisk()
    broker = BrokerThread(tmp_path, v1_port=None, file_ops=disk).start()

    async def main():
        conn = RawConnection(broker.broker.port)
        await conn.open(producers=1)
        assert await conn.exchange([send_frame(1, 0)]) == [(1, 0, 0)]
        disk.room = 0
        answers = await conn.exchange([send_frame(1, i) for i in range(1, 20)])
        assert answers == [(1, i, "PersistenceError") for i in range(1, 20)]
        disk.room = None
        answers = await conn.exchange([send_frame(1, i) for i in range(1, 20)])
        assert answers == [(1, i, i) for i in range(1, 20)]
        conn.writer.close()
    try:
        run(main())
    finally:
        broker.stop()


def _random_frames(rng, count: int) -> list[bytes]:
    """Frames of two producers with resends, batches (some malformed), delayed messages and chunks."""
    frames, next_sequence = [], {1: 0, 2: 0}
    for _ in range(count):
        producer = rng.choice((1, 2))
        sequence_id = next_sequence[producer]
        if sequence_id and rng.random() < 0.2:
            sequence_id = rng.randrange(sequence_id)  # a resend
        else:
            next_sequence[producer] += 1
        kind = rng.random()
        if kind < 0.3:
            frames.append(send_frame(producer, sequence_id, batch=rng.randint(2, 5)))
        elif kind < 0.35:
            frames.append(send_frame(producer, sequence_id, batch=2, claimed=4))
        elif kind < 0.4:
            frames.append(send_frame(producer, sequence_id, deliver_at=1))
        elif kind < 0.45:
            frames.append(send_frame(producer, sequence_id, chunk=True))
        else:
            frames.append(send_frame(producer, sequence_id))
    return frames


def test_random_frames_sent_together_are_answered_and_stored_as_when_sent_one_at_a_time(tmp_path):
    import random
    for seed in range(4):
        frames = _random_frames(random.Random(seed), 80)
        outcomes = []
        for together in (True, False):
            broker = BrokerThread(tmp_path / f"{seed}-{together}", v1_port=None, segment_bytes=3000).start()

            async def main():
                conn = RawConnection(broker.broker.port)
                await conn.open(producers=2)
                if together:
                    answers = await conn.exchange(frames)
                else:
                    answers = [(await conn.exchange([frame]))[0] for frame in frames]
                conn.writer.close()
                return answers
            try:
                answers = run(main())
                topic = broker.broker.core.topics[TOPIC]
                log = topic.log
                stored = [bytes(broker.call(log.read, i).body) for i in range(log.first_entry_id, log.next_entry_id)]
                outcomes.append((answers, stored, dict(topic.last_sequence)))
            finally:
                broker.stop()
        assert outcomes[0] == outcomes[1], f"seed {seed}"


def _plain(value):
    """A twin's output as plain values (views as bytes), to compare the twins'."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def _staging_twins():
    """(codec twin, broker staging twin) pairs: the Cython staging reads the Cython codec's frames."""
    from pulsarwire.broker import _staging_py
    from ..conftest import TWINS
    staging = {"python": _staging_py}
    try:
        from pulsarwire.broker import _staging
        staging["cython"] = _staging
    except ImportError:  # extension not built: only the pure twin can be tested
        pass
    return [(twin, staging[twin.IMPLEMENTATION]) for twin in TWINS if twin.IMPLEMENTATION in staging]


def test_the_staging_twin_follows_the_codec_twin():
    from pulsarwire.broker import staging
    assert staging.IMPLEMENTATION == codec.IMPLEMENTATION


def test_the_twins_plan_and_answer_a_run_alike():
    # what the broker stores of a run, and the receipts it queues for it, from broker/staging:
    # the same in both twins for random frames (resends, claimed highest ids, good and
    # malformed batches, delayed messages, chunks) and any last stored sequence id
    import random
    for seed in range(60):
        rng = random.Random(seed)
        data = b"".join(_random_frames(rng, 40))
        last = rng.choice([-1, 0, 3, 10, 2**63])
        first_id = rng.choice([0, 7, 2**40])
        start_at = rng.random()  # where the run starts, as a fraction of the producer's frames
        seen = []
        for twin, staging in _staging_twins():
            reader = twin.FrameReader(1 << 20, send_fast_path=True)
            reader.feed(data)
            frames = []
            while (frame := reader.next_frame()) is not None:
                if type(frame) is twin.SendFrame:
                    frames.append(frame)
            producer_frames = [frame for frame in frames if frame.producer_id == 1]
            start = int(start_at * len(producer_frames))
            planned = staging.plan_send_run(producer_frames, start, len(producer_frames), last, first_id, -1)
            out, sends = [b"first"], []
            queued = staging.queue_send_receipts(out, sends, "batch", 1, producer_frames, start, planned[0], 99, -1)
            assert queued == sum(len(data) for data in out[1:])
            seen.append((len(frames), _plain(planned), out, sends))
        assert all(result == seen[0] for result in seen), f"seed {seed}"


def test_the_twins_stage_entries_alike():
    # a log's records for a run: headers, positions, entries, and where the segment's limit stops it;
    # a body that could change (a view of a bytearray, a bytearray, a strided view) is copied
    import random
    import struct
    header = struct.Struct(">IIQI")

    def entry(*fields):
        return fields

    for seed in range(40):
        rng = random.Random(seed)
        bodies = []
        for _ in range(rng.randrange(0, 12)):
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
            bodies.append(rng.choice([raw, memoryview(raw), memoryview(raw)[1:], bytearray(raw),
                                      memoryview(bytearray(raw)), memoryview(raw)[::2]]))
        checksums = [rng.randrange(2**32) for _ in bodies]
        times = [rng.randrange(2**63) for _ in bodies]
        counts = [rng.randrange(1, 100) for _ in bodies]
        size = rng.choice([0, 100, 5000])
        limit = size + rng.choice([1, 50, 200, 10**9])
        seen = []
        for _, staging in _staging_twins():
            records, positions, entries, end = staging.stage_entries(bodies, checksums, times, counts, 7, size,
                                                                     limit, header, entry)
            for body in records[1::2]:
                assert type(body) is bytes or (type(body) is memoryview and type(body.obj) is bytes
                                               and body.c_contiguous)
            seen.append(([bytes(r) for r in records], positions, [(e[0], bytes(e[1]), *e[2:]) for e in entries], end))
        assert all(result == seen[0] for result in seen), f"seed {seed}"
        records, positions, entries, end = seen[0]
        assert len(entries) == len(positions) == len(records) // 2
        assert all(position < limit for position in positions)
        assert end == size + sum(header.size + len(body) for body in records[1::2])
