"""A reader's place in a log and the runs of records read ahead for it."""
from __future__ import annotations

import concurrent.futures
import contextlib
import mmap

from .files import READ_AHEAD_BYTES, FilePool
from .segment import PendingRun, ReadRun, Segment


class LogReader:
    """One reader's place in a log (TopicLog.reader()): the entry it asks for next, the run of
    records read ahead for it (Segment.read_run, at most READ_AHEAD_BYTES) and the run after
    that, read meanwhile on the pool's reader thread. Its two buffers come from the log's pool
    (FilePool.run_buffers), which bounds how many readers hold some; close() gives them back.
    A broker reading on its event loop asks wait_for() first, so that the loop never waits on
    the disk: what is not at hand is read on the reader thread, and read() then finds it."""

    __slots__ = ("log", "pool", "next_read", "run", "prefetch", "single", "buffers", "used_at", "spent",
                 "given_back", "__weakref__")

    def __init__(self, topic_log: object, pool: FilePool) -> None:
        self.log = topic_log  # the TopicLog it reads
        self.pool = pool  # that log's
        self.next_read = -1
        self.run: ReadRun | None = None
        self.prefetch: PendingRun | None = None
        self.single: PendingRun | None = None  # one record read on the reader thread (wait_for)
        self.buffers: list[mmap.mmap] = []
        self.used_at = 0.0
        self.spent: tuple[Segment, int] | None = None  # the segment it read last, and where it stopped
        self.given_back = 0  # what it gave back of that segment: all before this position

    def done_before(self, segment: Segment, start: int, end: int) -> None:
        """It has read [start, end) of `segment` in order (a run, or one record when it has no
        buffers): give back the pages of what it read before (read through the page cache, they
        would stay there). All of the segment up to `start`, not the last read alone: the page
        cache holds files in folios of up to several MiB, and a folio is given back only when the
        range covers it whole. Within a segment, once half a run's worth more was read since it
        last did (a call per record would be a system call per record)."""
        spent, self.spent = self.spent, (segment, end)
        if spent is None:
            self.given_back = 0
        elif spent[0] is not segment:
            last, stopped = spent
            last.drop_range(0, stopped)
            self.given_back = 0
        elif start - self.given_back >= READ_AHEAD_BYTES // 2:
            segment.drop_range(0, start)
            self.given_back = start

    def prefetched(self, segment: Segment | None, index: int) -> ReadRun | None:
        """The run read ahead, when it is the one starting at `index` of `segment` (waiting for
        the reader thread if need be); None otherwise, or when it failed (read again, in place).
        With no segment it only waits for a read in flight and drops it."""
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is None:
            return None
        try:
            got = prefetch.future.result()  # also when it is not wanted: the thread writes into the buffer
        except Exception:  # noqa: BLE001 - read_run reads it again and reports what fails
            return None
        if segment is None or prefetch.segment is not segment or prefetch.first != index:
            return None
        return ReadRun(segment, index, prefetch.end, prefetch.start, memoryview(prefetch.buffer)[:got])

    def wait_for(self, segment: Segment, index: int, in_order: bool) -> concurrent.futures.Future[int] | None:
        """None when read() has committed record `index` of `segment` at hand (in its run, or
        read ahead for it); else the future of the read, on the pool's reader thread, after which
        it has: a run read ahead when it reads in order with buffers, else that record alone.
        None too where no read can be started (read() then reads it, and reports what fails)."""
        run = self.run
        if run is not None and run.segment is segment and run.first <= index < run.end:
            return None
        single = self.single
        if single is not None and single.segment is segment and single.first == index:
            return None if single.future.done() else single.future
        if in_order:
            prefetch = self.prefetch
            if prefetch is not None:
                if not prefetch.future.done():
                    return prefetch.future  # it writes into a buffer of this reader's: wait for it first
                if prefetch.segment is segment and prefetch.first == index:
                    return None
            buffers = self.pool.run_buffers(self)
            if buffers is not None:
                self.prefetch = self.run = None  # the first buffer is read into again
                self.prefetch = segment.prefetch_run(index, buffers[0])
                if self.prefetch is not None:
                    return self.prefetch.future
        self.single = segment.read_later(index)
        return None if self.single is None else self.single.future

    def landed(self, segment: Segment, index: int) -> ReadRun | None:
        """Record `index` of `segment` as wait_for() read it alone, once that read is done; None
        otherwise, or when it failed (read() reads it again and reports what fails)."""
        single = self.single
        if single is None or single.segment is not segment or single.first != index or not single.future.done():
            return None
        self.single = None
        try:
            got = single.future.result()
        except Exception:  # noqa: BLE001 - read again, in place, by the caller
            return None
        return ReadRun(segment, index, single.end, single.start, memoryview(single.buffer)[:got])

    def prefetch_after(self, segment: Segment, run: ReadRun) -> None:
        """Start reading the run after `run`, in the same segment, into the other buffer."""
        data = run.data
        if run.end >= segment.committed_count or not isinstance(data, memoryview) or not self.buffers:
            return
        buffer = self.buffers[1] if data.obj is self.buffers[0] else self.buffers[0]
        self.prefetch = segment.prefetch_run(run.end, buffer)

    def give_up_buffers(self) -> list[mmap.mmap]:
        """Its buffers, for another reader: the read in flight is waited for (the pool gives
        away only those of a reader idle for READ_RUN_IDLE: its reads are long done) and its runs
        are dropped (the bodies read from them were copied out), and the pages it read given back."""
        self.prefetched(None, -1)
        self.run = self.single = None
        spent, self.spent = self.spent, None
        if spent is not None:
            last, stopped = spent
            last.drop_range(0, stopped)
        buffers, self.buffers = self.buffers, []
        self.pool.drop_run_buffers(self)
        return buffers

    def close(self) -> None:
        """Give its buffers back (it may read again: it then asks for new ones); a read still in
        flight is not waited for: its buffers are closed once it is done."""
        prefetch, self.prefetch = self.prefetch, None
        buffers = self.give_up_buffers()
        if prefetch is not None and not prefetch.future.done():
            prefetch.future.add_done_callback(lambda _: _close_buffers(buffers))
        else:
            _close_buffers(buffers)


def _close_buffers(buffers: list[mmap.mmap]) -> None:
    for buffer in buffers:
        with contextlib.suppress(BufferError):  # a view of it still held: freed with it
            buffer.close()
