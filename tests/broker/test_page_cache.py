"""The page cache the storage keeps, and reads of what is past the entry cache.

A log's appends keep about `page_cache_bytes` of the page cache behind its end: the writeback
of older bytes is started early and their pages given back once clean; full segments are given
back after their fsync. Readers in order past the entry cache read runs of records with one
read (through the page cache, giving back what they have read; O_DIRECT around it where asked
and the file system has it). None of it changes what is
on disk or what a read returns: every entry reads back as written, a damaged one is still that
entry's error alone."""
from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
import threading
import time

import pytest

from pulsarwire.broker import storage
from pulsarwire.broker.storage import HEADER_SIZE, CorruptEntryError, FileOps, FilePool, TopicLog


class Recorder(FileOps):
    """Records the page cache calls; `direct` False refuses O_DIRECT as tmpfs does."""

    def __init__(self, direct: bool = True) -> None:
        self.writebacks: list[tuple[int, int]] = []
        self.drops: list[tuple[int, int]] = []
        self.direct_opens = 0
        self.direct = direct

    def start_writeback(self, fd, offset, size):
        self.writebacks.append((offset, size))
        super().start_writeback(fd, offset, size)

    def drop_cached(self, fd, offset, size):
        self.drops.append((offset, size))
        super().drop_cached(fd, offset, size)

    def open_direct(self, path):
        self.direct_opens += 1
        if not self.direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().open_direct(path)


def _body(i: int, size: int = 1000) -> bytes:
    return (b"%08d" % i) * (size // 8)


def _fill(topic_log: TopicLog, count: int, size: int = 1000, per_commit: int = 10) -> None:
    for i in range(count):
        topic_log.append(_body(i, size), None, i, 1)
        if i % per_commit == per_commit - 1:
            assert topic_log.commit()
    assert topic_log.commit()


def test_appends_keep_about_the_window_of_page_cache_and_read_back_whole(tmp_path):
    ops = Recorder()
    window = 64 * 1024
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=ops, page_cache_bytes=window), cache_bytes=0)
    _fill(topic_log, 1000)  # about 1 MB, one segment
    segment = topic_log._segments[-1]
    # writeback started for consecutive spans, in steps of half the window
    assert ops.writebacks and ops.writebacks[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(ops.writebacks, ops.writebacks[1:]))
    assert all(n >= window // 2 for _, n in ops.writebacks)
    # pages were given back only more than the window behind the end at the time
    assert ops.drops and max(a + n for a, n in ops.drops) <= segment.committed_size - window
    assert [topic_log.read(i).body for i in range(1000)] == [_body(i) for i in range(1000)]
    topic_log.close()
    reopened = TopicLog(str(tmp_path))
    assert [reopened.read(i).body for i in range(1000)] == [_body(i) for i in range(1000)]
    reopened.close()


def test_without_a_window_nothing_is_given_back_and_reads_go_through_the_page_cache(tmp_path):
    ops = Recorder()
    topic_log = TopicLog(str(tmp_path), segment_bytes=50_000, pool=FilePool(ops=ops, page_cache_bytes=0),
                         cache_bytes=0)
    _fill(topic_log, 300)
    concurrent.futures.wait([future for _, future in topic_log._background_syncs])
    assert [topic_log.read(i).body for i in range(300)] == [_body(i) for i in range(300)]
    assert not ops.writebacks and not ops.drops and not ops.direct_opens
    topic_log.close()


def test_full_segments_are_given_back_after_their_fsync(tmp_path):
    ops = Recorder()
    topic_log = TopicLog(str(tmp_path), segment_bytes=50_000, pool=FilePool(ops=ops, page_cache_bytes=1 << 20))
    _fill(topic_log, 300)  # six segments
    concurrent.futures.wait([future for _, future in topic_log._background_syncs])
    whole = [(offset, size) for offset, size in ops.drops if offset == 0 and size >= 50_000]
    assert len(whole) == len(topic_log._segments) - 1
    topic_log.close()


@pytest.mark.parametrize("direct", [True, False])
def test_reads_in_order_past_the_cache_read_runs_across_segments(tmp_path, direct):
    ops = Recorder(direct=direct)
    topic_log = TopicLog(str(tmp_path), segment_bytes=300_000,
                         pool=FilePool(ops=ops, page_cache_bytes=1 << 16, direct_reads=True),
                         cache_bytes=0)
    sizes = [100 + (i * 7919) % 9000 for i in range(600)]  # records of many sizes, several segments
    for i, size in enumerate(sizes):
        topic_log.append(_body(i, size), None, i, 1)
    assert topic_log.commit()
    assert len(topic_log._segments) > 3
    reads = 0
    original = storage.Segment.read_run

    def counting(self, index, buffer):
        nonlocal reads
        reads += 1
        return original(self, index, buffer)

    storage.Segment.read_run = counting
    try:
        assert [topic_log.read(i).body for i in range(600)] == [_body(i, s) for i, s in enumerate(sizes)]
    finally:
        storage.Segment.read_run = original
    # about 3 MB in runs of up to READ_AHEAD_BYTES, a run ending at each segment's end
    assert reads <= 3_000_000 // (storage.READ_AHEAD_BYTES // 2) + len(topic_log._segments) + 1
    assert ops.direct_opens >= 1
    assert topic_log.pool.direct_reads == direct
    # out of order: one record at a time, the same bodies
    assert [topic_log.read(i).body for i in (599, 3, 300, 4)] == [_body(i, sizes[i]) for i in (599, 3, 300, 4)]
    topic_log.close()


@pytest.mark.parametrize("direct", [True, False])
def test_a_damaged_record_in_a_run_costs_that_entry_alone(tmp_path, direct):
    directory = str(tmp_path)
    topic_log = TopicLog(directory, cache_bytes=0)
    _fill(topic_log, 50)
    position = topic_log._segments[0].positions[20]
    topic_log.close()
    path = os.path.join(directory, sorted(f for f in os.listdir(directory) if f.endswith(".log"))[0])
    with open(path, "r+b") as fh:
        fh.seek(position + HEADER_SIZE + 100)
        byte = fh.read(1)
        fh.seek(position + HEADER_SIZE + 100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    reopened = TopicLog(directory, cache_bytes=0, pool=FilePool(page_cache_bytes=1 << 16, direct_reads=direct))
    bodies = []
    for i in range(50):
        try:
            bodies.append(reopened.read(i).body)
        except CorruptEntryError as exc:
            assert exc.entry_id == 20
            bodies.append(None)
    assert bodies == [None if i == 20 else _body(i) for i in range(50)]
    reopened.close()


@pytest.mark.parametrize("direct", [True, False])
def test_a_record_bigger_than_the_read_buffer_is_read_alone(tmp_path, direct):
    topic_log = TopicLog(str(tmp_path), cache_bytes=0, pool=FilePool(page_cache_bytes=1 << 16, direct_reads=direct))
    big = storage.READ_AHEAD_BYTES + 12345
    bodies = [_body(0), os.urandom(big), _body(2), os.urandom(big // 2), _body(4)]
    for i, body in enumerate(bodies):
        topic_log.append(body, None, i, 1)
    assert topic_log.commit()
    assert [topic_log.read(i).body for i in range(5)] == bodies
    topic_log.close()


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError):
        FilePool(page_cache_bytes=-1)


@pytest.mark.parametrize("direct", [True, False])
def test_runs_read_ahead_on_the_reader_thread_and_reads_out_of_order_meanwhile(tmp_path, direct):
    """A read in order starts reading the next run on the reader thread; reads out of order
    meanwhile, and a read in order of another place, still return what was written."""
    ops = Recorder(direct=direct)
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=ops, page_cache_bytes=1 << 16, direct_reads=True),
                         cache_bytes=0)
    sizes = [200 + (i * 104729) % 20000 for i in range(800)]  # about 8 MB: several runs
    for i, size in enumerate(sizes):
        topic_log.append(_body(i, size), None, i, 1)
    assert topic_log.commit()
    order = list(range(0, 300)) + [799, 5, 6, 7] + list(range(300, 500)) + [10] + list(range(600, 800))
    for i in order:
        assert topic_log.read(i).body == _body(i, sizes[i]), i
    reader = topic_log._reader
    assert reader.prefetch is None or reader.prefetch.buffer in reader.buffers
    topic_log.close()
    assert reader.prefetch is None and not reader.buffers and not topic_log.pool.run_holders()


def _counting_runs(monkeypatch):
    """The runs _Segment.read_run reads, as (segment base, first index), in a list."""
    runs = []
    original = storage.Segment.read_run

    def counting(self, index, buffer):
        runs.append((self.base, index))
        return original(self, index, buffer)

    monkeypatch.setattr(storage.Segment, "read_run", counting)
    return runs


def _backlog(tmp_path, count=600, read_runs=storage.DEFAULT_READ_RUNS, ops=None, **log_options):
    pool = FilePool(page_cache_bytes=1 << 16, read_runs=read_runs, ops=ops)
    topic_log = TopicLog(str(tmp_path), pool=pool, cache_bytes=0, **log_options)
    sizes = [100 + (i * 7919) % 20000 for i in range(count)]  # about 6 MB: several runs
    for i, size in enumerate(sizes):
        topic_log.append(_body(i, size), None, i, 1)
    assert topic_log.commit()
    return topic_log, sizes


def test_readers_at_different_places_each_read_runs(tmp_path, monkeypatch):
    """Two subscriptions reading one backlog at different places, in turns: each reads in runs
    of its own (not one record at a time, as when they shared the log's one run)."""
    topic_log, sizes = _backlog(tmp_path)
    runs = _counting_runs(monkeypatch)
    first, second = topic_log.reader(), topic_log.reader()
    plain_reads = 0
    original = storage.Segment.read

    def counting(self, index):
        nonlocal plain_reads
        plain_reads += 1
        return original(self, index)

    monkeypatch.setattr(storage.Segment, "read", counting)
    for step in range(300):
        assert topic_log.read(step, first).body == _body(step, sizes[step])
        assert topic_log.read(300 + step, second).body == _body(300 + step, sizes[300 + step])
    assert plain_reads == 2  # the first read of each: a reader reads ahead once it reads in order
    assert len(runs) <= 2 * (3_000_000 // (storage.READ_AHEAD_BYTES // 2) + 2)
    assert set(topic_log.pool.run_holders()) == {first, second}
    first.close()  # a subscription dropped: its buffers go back
    assert topic_log.pool.run_holders() == [second]
    assert topic_log.read(0, first).body == _body(0, sizes[0])  # and it may read again
    with pytest.raises(ValueError):
        _backlog(tmp_path / "other", count=1)[0].read(0, first)
    topic_log.close()
    assert not topic_log.pool.run_holders() and not first.buffers and not second.buffers


def test_readers_past_the_budget_read_one_record_at_a_time_until_buffers_idle(tmp_path, monkeypatch):
    ops = Recorder()
    topic_log, sizes = _backlog(tmp_path, count=200, read_runs=1, ops=ops)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    first, second = topic_log.reader(), topic_log.reader()
    runs = _counting_runs(monkeypatch)
    for step in range(50):  # the first holds the only buffers while it reads
        assert topic_log.read(step, first).body == _body(step, sizes[step])
        assert topic_log.read(100 + step, second).body == _body(100 + step, sizes[100 + step])
    assert runs and all(base + index < 50 for base, index in runs)  # the second read no run
    assert topic_log.pool.run_holders() == [first] and not second.buffers
    # the second, without buffers, read one record at a time and gave back what it read as it went
    assert second.spent is not None and second.given_back > 0
    assert (0, second.given_back) in ops.drops
    clock[0] += storage.READ_RUN_IDLE  # the first stops reading: the second gets its buffers
    assert topic_log.read(150, second).body == _body(150, sizes[150])
    assert topic_log.read(151, second).body == _body(151, sizes[151])
    assert topic_log.pool.run_holders() == [second] and not first.buffers and first.run is None
    assert any(base + index == 150 for base, index in runs)
    # the first reads on, correctly, one record at a time while the second reads
    assert [topic_log.read(i, first).body for i in range(50, 60)] == [_body(i, sizes[i]) for i in range(50, 60)]
    assert first.spent is not None and not first.buffers
    topic_log.close()  # closes every reader of the log, with buffers or not: what they read is given back
    assert first.spent is None and second.spent is None and not topic_log.pool.run_holders()


def test_a_subscription_reads_with_a_reader_of_its_own_and_gives_it_back(tmp_path):
    from pulsarwire.broker.topic import Topic
    pool = FilePool(page_cache_bytes=1 << 16)
    topic = Topic("t", str(tmp_path), segment_bytes=1 << 20, sync_policy="interval", on_append=lambda t: None,
                  pool=pool)
    for i in range(20):
        topic.log.append(_body(i, 5000), None, i, 1)
    assert topic.log.commit()
    durable = topic.subscription("durable", 0, True, True, None)
    passing = topic.subscription("passing", 0, False, True, None)
    assert durable.reader is not passing.reader and durable.reader.log is topic.log
    for subscription in (durable, passing):
        assert topic.log.read(3, subscription.reader).body == _body(3, 5000)
        topic.log._cache.clear()
        assert topic.log.read(4, subscription.reader).body == _body(4, 5000)
    assert set(pool.run_holders()) <= {durable.reader, passing.reader}
    # dispatch reads through the subscription's reader: two subscriptions at different places
    # each read runs (outside an event loop: read() waits for the disk)
    Taker = _taker_class()
    topic.log._cache.clear()
    runs_before = {id(durable.reader): durable.reader.run, id(passing.reader): passing.reader.run}
    takers = []
    for subscription in (durable, passing):
        taker = Taker(subscription)
        subscription.add_consumer(taker)
        taker.permits = 20
        subscription.dispatch()
        takers.append(taker)
    assert takers[0].got == list(range(20)) and takers[1].got == list(range(20))
    for subscription in (durable, passing):
        assert subscription.reader.run is not None and subscription.reader.run is not runs_before[id(subscription.reader)]
    topic.drop_subscription("durable")
    passing.consumers.clear()
    passing._drop_if_unused()  # non-durable, no consumers: dropped
    assert not pool.run_holders() and not durable.reader.buffers and not passing.reader.buffers
    topic.close()


def _taker_class():
    from pulsarwire.broker.subscription import ConsumerLink

    class Taker(ConsumerLink):
        """A consumer that takes whatever it is sent, in the entries' ids."""
        writable = True

        def __init__(self, subscription):
            super().__init__(subscription, "taker", 0)
            self.got = []

        def deliver(self, entry, redelivery_count, ack_set):
            self.got.append(entry.entry_id)

        def reached_end_of_topic(self):
            pass

        def evict(self):
            pass
    return Taker


class _Gated(FileOps):
    """Reads, once `armed`, wait for `gate` and note the thread that made them."""

    def __init__(self) -> None:
        self.armed = False
        self.gate = threading.Event()
        self.threads: set[int] = set()
        self.reads = 0

    def pread(self, fd, size, offset):
        self._wait()
        return super().pread(fd, size, offset)

    def pread_into(self, fd, buffer, offset):
        self._wait()
        return super().pread_into(fd, buffer, offset)

    def _wait(self):
        if not self.armed:
            return
        self.threads.add(threading.get_ident())
        self.reads += 1
        assert self.gate.wait(10)


def test_dispatch_reads_a_backlog_and_redeliveries_off_the_event_loop(tmp_path):
    """The event loop never waits on the disk: a subscription's dispatch that needs entries past
    the entry cache starts their read on the reader thread and goes on when it landed; the loop
    serves meanwhile, and every entry arrives in order, redeliveries (read out of order) too."""
    from pulsarwire.broker.topic import Topic
    ops = _Gated()
    pool = FilePool(ops=ops, page_cache_bytes=1 << 16)
    topic = Topic("t", str(tmp_path), segment_bytes=1 << 20, sync_policy="interval", on_append=lambda t: None,
                  pool=pool)
    for i in range(400):  # about 2 MB over two segments: several runs
        topic.log.append(_body(i, 5000), None, i, 1)
    assert topic.log.commit()
    topic.log._cache.clear()
    subscription = topic.subscription("s", 0, True, True, None)

    async def main():
        loop_thread = threading.get_ident()
        taker = _taker_class()(subscription)
        subscription.add_consumer(taker)
        taker.permits = 1000
        ops.armed = True
        subscription.dispatch()
        assert taker.got == []  # its read waits on the reader thread, not on the loop
        await asyncio.sleep(0.05)
        assert taker.got == [] and ops.reads == 1
        ops.gate.set()
        for _ in range(500):
            if len(taker.got) == 400:
                break
            await asyncio.sleep(0.01)
        assert taker.got == list(range(400))
        subscription.redeliver(taker, [7, 3, 250])
        for _ in range(500):
            if len(taker.got) == 403:
                break
            await asyncio.sleep(0.01)
        assert sorted(taker.got[400:]) == [3, 7, 250]
        assert loop_thread not in ops.threads and ops.reads > 3
    asyncio.run(main())
    ops.gate.set()
    topic.close()
    assert not pool.run_holders()


def test_runs_read_through_the_page_cache_give_back_what_was_read(tmp_path):
    """Where the file system has no O_DIRECT, a reader gives back the pages of its backlog as it
    goes: all of a segment up to its new run (a folio is given back only when covered whole),
    and all it read of a segment it has left; the rest when it closes."""
    ops = Recorder(direct=False)
    topic_log = TopicLog(str(tmp_path), segment_bytes=3_000_000, pool=FilePool(ops=ops, page_cache_bytes=1 << 16),
                         cache_bytes=0)
    sizes = [100 + (i * 7919) % 20000 for i in range(600)]  # about 6 MB, a few segments
    for i, size in enumerate(sizes):
        topic_log.append(_body(i, size), None, i, 1)
    assert topic_log.commit()
    concurrent.futures.wait([future for _, future in topic_log._background_syncs])
    assert len(topic_log._segments) >= 2
    reader = topic_log.reader()
    ops.drops.clear()
    assert [topic_log.read(i, reader).body for i in range(600)] == [_body(i, s) for i, s in enumerate(sizes)]
    # every drop starts at a segment's start; each segment left behind is given back whole
    assert ops.drops and all(offset == 0 for offset, _ in ops.drops)
    for segment in topic_log._segments[:-1]:
        assert (0, segment.committed_size) in ops.drops
    whole = {(0, segment.committed_size) for segment in topic_log._segments}
    assert [drop for drop in ops.drops if drop not in whole]  # within a segment too, not only when leaving it
    last = topic_log._segments[-1]
    reader.close()  # and what it read of the segment it is in
    assert ops.drops[-1] == (0, last.committed_size)
    topic_log.close()


def test_a_read_run_budget_below_one_is_refused():
    with pytest.raises(ValueError):
        FilePool(read_runs=0)


class RefusesDirectReads(FileOps):
    """Opens O_DIRECT descriptors, then refuses reads through them (EINVAL), as a file system
    whose alignment rules the reads do not meet would."""

    def pread_into(self, fd, buffer, offset):
        if _is_direct(fd):
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().pread_into(fd, buffer, offset)


def _is_direct(fd: int) -> bool:
    import fcntl
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))


def test_runs_of_whole_blocks_fall_back_to_the_page_cache_when_direct_reads_are_refused(tmp_path):
    ops = RefusesDirectReads()
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=ops, page_cache_bytes=1 << 16, direct_reads=True),
                         cache_bytes=0)
    body_size = storage.DIRECT_ALIGN - HEADER_SIZE  # every record one block: runs start and end on blocks
    bodies = [_body(i, body_size + 8)[:body_size] for i in range(1500)]
    for i, body in enumerate(bodies):
        topic_log.append(body, None, i, 1)
    assert topic_log.commit()
    assert topic_log._segments[0].positions[1] == storage.DIRECT_ALIGN
    assert [topic_log.read(i).body for i in range(1500)] == bodies
    assert not topic_log.pool.direct_reads  # refused once, then not tried again
    topic_log.close()


class Preallocations(FileOps):
    """Records preallocate calls as (file, offset, size); `refuse` raises ENOSPC for each, as a
    full disk does."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.refuse = refuse

    def preallocate(self, fd, offset, size):
        self.calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, size))
        if self.refuse:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().preallocate(fd, offset, size)


def _allocated_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors through /proc")
def test_segments_being_written_keep_blocks_allocated_ahead_and_give_them_back(tmp_path):
    ops = Preallocations()
    segment_bytes = 3 * storage.PREALLOCATE_BYTES // 2
    topic_log = TopicLog(str(tmp_path), segment_bytes=segment_bytes, pool=FilePool(ops=ops), cache_bytes=0)
    body = os.urandom(100_000)
    for i in range(600):  # about 60 MB: several segments
        topic_log.append(body, None, i, 1)
        if i % 20 == 19:
            assert topic_log.commit()
    assert topic_log.commit()
    segments = topic_log._segments
    assert len(segments) > 2 and ops.calls
    for segment in segments:
        assert os.path.getsize(segment.log_path) == segment.committed_size  # the size is the data's
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, offset, size in ops.calls:
        by_file.setdefault(path, []).append((offset, size))
    assert len(by_file) == len(segments)
    for calls in by_file.values():
        # from PREALLOCATE_FROM on, as much ahead as the segment holds at most, never past its
        # size, each call past the last one's end
        assert calls[0][0] >= storage.PREALLOCATE_FROM
        assert all(offset + size <= min(segment_bytes, 2 * offset) for offset, size in calls)
        assert all(a + n <= b for (a, n), (b, _) in zip(calls, calls[1:]))
    # full segments gave their spare blocks back
    page = 4096
    for segment in segments[:-1]:
        assert _allocated_bytes(segment.log_path) <= -(-segment.committed_size // page) * page + page
    last_path = segments[-1].log_path
    assert _allocated_bytes(last_path) > os.path.getsize(last_path)  # blocks ahead of the end
    topic_log.close()
    assert _allocated_bytes(last_path) <= -(-os.path.getsize(last_path) // page) * page + page  # and back
    reopened = TopicLog(str(tmp_path), segment_bytes=segment_bytes, cache_bytes=0)
    assert reopened.read(599).body == body and reopened.read(0).body == body
    reopened.close()


def test_a_small_segment_reserves_nothing(tmp_path):
    ops = Preallocations()
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=ops), cache_bytes=0)
    for i in range(50):
        topic_log.append(os.urandom(10_000), None, i, 1)
        assert topic_log.commit()
    assert not ops.calls  # 500 KB, under PREALLOCATE_FROM
    topic_log.close()


def test_a_refused_preallocation_stops_it_for_the_segment_and_writes_go_on(tmp_path):
    ops = Preallocations(refuse=True)
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=ops), cache_bytes=0)
    body = os.urandom(100_000)
    for i in range(300):
        topic_log.append(body, None, i, 1)
        if i % 20 == 19:
            assert topic_log.commit()
    assert topic_log.commit()
    assert len(ops.calls) == 1
    assert [topic_log.read(i).body for i in (0, 150, 299)] == [body] * 3
    topic_log.close()


def test_reads_off_the_loop_let_it_serve_while_the_disk_is_slow(tmp_path):
    """read_off_loop (V1's CONSUME, a seek by publish time, peek, compaction): while the disk
    holds a read, the loop serves other work; every entry reads back as written, in order and
    out of order, and no read is made on the loop's thread."""
    ops = _Gated()
    topic_log = TopicLog(str(tmp_path), pool=FilePool(ops=ops, page_cache_bytes=1 << 16), cache_bytes=0)
    sizes = [300 + (i * 7919) % 9000 for i in range(300)]
    for i, size in enumerate(sizes):
        topic_log.append(_body(i, size), None, i, 1)
    assert topic_log.commit()

    async def main():
        loop_thread = threading.get_ident()
        reader = topic_log.reader()
        ops.armed = True
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)
        ticking = asyncio.ensure_future(ticker())
        reading = asyncio.ensure_future(topic_log.read_off_loop(0, reader))
        await asyncio.sleep(0.05)
        assert not reading.done() and ticks >= 5  # the loop served while the read waited
        ops.gate.set()
        assert (await reading).body == _body(0, sizes[0])
        for i in list(range(1, 300)) + [17, 250, 3]:
            assert (await topic_log.read_off_loop(i, reader)).body == _body(i, sizes[i]), i
        assert (await topic_log.find_by_publish_time(123)) == 123
        ticking.cancel()
        assert loop_thread not in ops.threads
    asyncio.run(main())
    ops.gate.set()
    topic_log.close()


def test_a_read_that_fails_off_the_loop_is_read_again_and_nothing_is_skipped(tmp_path):
    """The reader thread's reads fail (EIO) a few times: dispatch reads those entries again and
    every one is delivered, in order; none is skipped or settled unread."""
    from pulsarwire.broker.topic import Topic

    class Failing(FileOps):
        def __init__(self):
            self.failures = 0
            self.armed = False

        def pread_into(self, fd, buffer, offset):
            if self.armed and self.failures < 3 and threading.current_thread() is not threading.main_thread():
                self.failures += 1
                raise OSError(errno.EIO, "Input/output error")
            return super().pread_into(fd, buffer, offset)

    ops = Failing()
    topic = Topic("t", str(tmp_path), segment_bytes=1 << 20, sync_policy="interval", on_append=lambda t: None,
                  pool=FilePool(ops=ops, page_cache_bytes=1 << 16))
    for i in range(300):
        topic.log.append(_body(i, 5000), None, i, 1)
    assert topic.log.commit()
    topic.log._cache.clear()
    subscription = topic.subscription("s", 0, True, True, None)

    async def main():
        taker = _taker_class()(subscription)
        subscription.add_consumer(taker)
        taker.permits = 1000
        ops.armed = True
        subscription.dispatch()
        for _ in range(500):
            if len(taker.got) == 300:
                break
            await asyncio.sleep(0.01)
        return taker.got
    assert asyncio.run(main()) == list(range(300))
    assert ops.failures == 3 and topic.log.stats.skipped_entries == 0
    topic.close()
