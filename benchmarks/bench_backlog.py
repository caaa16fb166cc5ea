"""Backlog reads at the storage level: subscriptions reading one log past the entry cache.

    flock -x /tmp/pulsarwire-cpu.lock python -m benchmarks.bench_backlog [--entries 40000] [--entry-bytes 11000] [--direct]

Writes one log of `--entries` entries (11 000 bytes each by default, about what 100 messages of
100 B make) with the broker's defaults (16 MiB page cache behind the end, so the backlog is read
from the disk), then reads it past the entry cache:
- "one reader": entries in order, through the log's own reader;
- "N readers, each its own": N readers starting at N evenly spaced places, taking turns entry
  by entry, each with a reader of its own (TopicLog.reader(), as each subscription has);
- "N readers, one shared": the same reads through the log's one reader (what a log did before
  readers had their own read-ahead: every read is out of order, so one record at a time,
  through the page cache, which keeps the pages).
Rates are messages/s counting 100 messages per entry, over every reader together; the best of
`--repeat` rounds, each after the log's pages are given back (posix_fadvise DONTNEED). Temporary files go under --dir (default: a new directory in the current one,
on the disk the broker would use, not a tmpfs).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pulsarwire.broker.storage import FilePool, TopicLog  # noqa: E402

MESSAGES_PER_ENTRY = 100


def _write(directory: str, entries: int, entry_bytes: int, direct: bool) -> TopicLog:
    topic_log = TopicLog(directory, pool=FilePool(direct_reads=direct), cache_bytes=0, segment_bytes=64 << 20)
    body = os.urandom(entry_bytes)
    for i in range(entries):
        topic_log.append(body, None, i, MESSAGES_PER_ENTRY)
        if i % 500 == 499:
            topic_log.commit()
    topic_log.commit()
    topic_log.sync()
    return topic_log


def _drop_page_cache(directory: str) -> None:
    """Give back the log's pages, so that every round reads from the disk (a read of single
    records goes through the page cache and leaves its pages there)."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read(topic_log: TopicLog, entries: int, readers: int, own: bool) -> float:
    """Messages/s of `readers` readers taking turns, each over its own 1/readers of the log."""
    _drop_page_cache(topic_log.directory)
    share = entries // readers
    handles = [topic_log.reader() if own else None for _ in range(readers)]
    start = time.perf_counter()
    for step in range(share):
        for k, handle in enumerate(handles):
            topic_log.read(k * share + step, handle)
    elapsed = time.perf_counter() - start
    for handle in handles:
        if handle is not None:
            handle.close()
    return share * readers * MESSAGES_PER_ENTRY / elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=40000)
    parser.add_argument("--entry-bytes", type=int, default=11000)
    parser.add_argument("--readers", default="2,4", help="comma-separated reader counts besides one")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=".")
    parser.add_argument("--direct", action="store_true", help="read backlogs with O_DIRECT (FilePool(direct_reads=True))")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-backlog-", dir=args.dir)
    try:
        topic_log = _write(os.path.join(root, "log"), args.entries, args.entry_bytes, args.direct)
        cases = [("one reader", 1, False)]
        for count in (int(n) for n in args.readers.split(",") if n):
            cases += [(f"{count} readers, each its own", count, True), (f"{count} readers, one shared", count, False)]
        print(f"{args.entries} entries of {args.entry_bytes} B ({args.entries * args.entry_bytes / 1e6:.0f} MB), "
              f"{MESSAGES_PER_ENTRY} messages each; best of {args.repeat}; "
              f"{'O_DIRECT' if topic_log.pool.direct_reads else 'through the page cache'}")
        for name, count, own in cases:
            best = max(_read(topic_log, args.entries, count, own) for _ in range(args.repeat))
            print(f"{name:<28} {best / 1e6:6.1f} M msg/s")
        topic_log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
