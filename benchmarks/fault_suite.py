"""Storage fault suite for the embedded broker: each scenario injects one fault, then
counts what producers saw acknowledged, what a reader finds after a restart, and what
was lost. `lost` counts acknowledged messages that are neither readable nor destroyed by
the injected damage itself; it must be 0 in every row.

    python benchmarks/fault_suite.py [--only disk_full,kill9,...] [--kill-runs 5] [--json out.json]

Scenarios: disk_full (the disk fills mid-stream, then space returns), disk_full_tmpfs (a real
ENOSPC on an 8 MiB tmpfs, the official client; root only), corrupt_entry (one
flipped byte in entry 1000 of 2000), truncated_file (the log cut mid-record),
index_deleted_bad_byte (no index and a damaged record header), damaged_segment (a middle
segment cut in half, its index gone), fd_limit (600 topics under a 256-descriptor limit),
fd_exhausted (no descriptors left: an error reply, then service again), kill9 (kill -9
while producing; only needs the command line, so it also runs against older trees).
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import free_port  # noqa: E402

TOPIC = "persistent://public/default/faults"
# errors_surfaced: what the broker made visible: failed commits (each answered SendError), skipped
# corrupt entries, storage warnings and errors logged, or error replies a client received


class _ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record) -> None:
        self.count += 1


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float = 20.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited: {process.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("broker did not start")


BROKER_TREE: str | None = None  # --broker-tree: broker subprocesses run from this source tree


def _start_process(data_dir: str, port: int, limit: int | None = None, extra=()) -> subprocess.Popen:
    def lower_limit():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    env = dict(os.environ)
    if BROKER_TREE:
        env["PYTHONPATH"] = BROKER_TREE
    process = subprocess.Popen([sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", data_dir,
                                "--port", str(port), "--v1-port", "-1", *extra],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=lower_limit,
                               cwd=BROKER_TREE or None, env=env)
    _wait_for_port(port, process)
    return process


def _stop_process(process: subprocess.Popen) -> str:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.stderr.read().decode(errors="replace")


async def _read_all(url: str, topic: str = TOPIC) -> list[bytes]:
    from pulsarwire import Client, MessageId
    async with Client(url, operation_timeout_seconds=10) as client:
        reader = await client.create_reader(topic, MessageId.earliest)
        out = []
        while await reader.has_message_available():
            out.append((await reader.read_next(5000)).data())
        return out


async def _produce(url: str, count: int, prefix: bytes = b"m", topic: str = TOPIC) -> list[bytes]:
    from pulsarwire import Client
    async with Client(url) as client:
        producer = await client.create_producer(topic, batching_enabled=False)
        futures = [await producer.send_async(b"%s-%04d" % (prefix, i)) for i in range(count)]
        await asyncio.gather(*futures)
        return [b"%s-%04d" % (prefix, i) for i in range(count)]


def _row(name, acknowledged, damaged, readable_set, errors, note=""):
    lost = len([m for m in acknowledged if m not in readable_set and m not in damaged])
    return dict(scenario=name, acknowledged=len(acknowledged), damaged=len(damaged),
                readable=len([m for m in acknowledged if m in readable_set]), lost=lost,
                errors_surfaced=errors, note=note)


async def _in_process(data_dir: str, **options):
    from pulsarwire.broker.server import Broker
    broker = Broker(data_dir, v1_port=None, **options)
    await broker.start()
    return broker


# scenarios

async def disk_full(work: str) -> dict:
    from pulsarwire import Client
    from pulsarwire.broker.storage import FileOps

    class FillingDisk(FileOps):
        room: int | None = None

        def pwrite(self, fd, data, offset):
            if self.room is None:
                return super().pwrite(fd, data, offset)
            if self.room <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            written = super().pwrite(fd, bytes(data[:self.room]), offset)
            self.room -= written
            return written

        def truncate(self, fd, size):
            if self.room is not None:  # a truncated file gives its space back
                self.room += max(0, os.fstat(fd).st_size - size)
            super().truncate(fd, size)

    disk = FillingDisk()
    broker = await _in_process(work, file_ops=disk)
    acknowledged, failed = [], 0
    async with Client(broker.service_url, initial_backoff_seconds=0.05) as client:
        producer = await client.create_producer(TOPIC, batching_enabled=False, send_timeout_millis=2000)
        disk.room = 64 * 1024  # about 60 of the 200 1 KiB messages fit
        payloads = [b"full-%04d-" % i + b"x" * 1000 for i in range(200)]
        futures = [await producer.send_async(p) for p in payloads]
        for payload, result in zip(payloads, await asyncio.gather(*futures, return_exceptions=True)):
            if isinstance(result, BaseException):
                failed += 1
            else:
                acknowledged.append(payload)
        disk.room = None  # space returns: the same producer goes on
        after = [b"after-%04d" % i for i in range(50)]
        await asyncio.gather(*[await producer.send_async(p) for p in after])
        acknowledged += after
    stats = broker.storage_stats()
    await broker.stop()
    broker = await _in_process(work)
    readable = set(await _read_all(broker.service_url))
    await broker.stop()
    return _row("disk_full", acknowledged, [], readable, stats["failed_commits"],
                f"{failed} sends failed (SendError, then send timeout); 50 sent after space returned")


async def disk_full_tmpfs(work: str, counter: _ErrorCounter) -> dict:
    """A real ENOSPC: the broker (a subprocess) on an 8 MiB tmpfs, the official client sending
    200 messages of 64 KiB (12.5 MiB). Needs root to mount; skipped otherwise."""
    import pulsar
    mount_point = os.path.join(work, "tmpfs")
    os.makedirs(mount_point)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mount_point],
                                           capture_output=True).returncode != 0:
        return dict(scenario="disk_full_tmpfs", acknowledged="-", damaged="-", readable="-", lost=0,
                    errors_surfaced="-", note="skipped: cannot mount a tmpfs (needs root)")
    try:
        data_dir = os.path.join(mount_point, "data")
        port = free_port()
        url = f"pulsar://127.0.0.1:{port}"
        process = _start_process(data_dir, port)
        payloads = [b"%03d-" % i + b"x" * (64 * 1024) for i in range(200)]
        acknowledged, failed = [], []
        client = pulsar.Client(url, operation_timeout_seconds=5,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            producer = client.create_producer(TOPIC, batching_enabled=False, send_timeout_millis=5000,
                                              block_if_queue_full=True)
            for payload in payloads:
                producer.send_async(payload, lambda result, _id, p=payload:
                                    (acknowledged if result == pulsar.Result.Ok else failed).append(p))
            deadline = time.monotonic() + 30
            while len(acknowledged) + len(failed) < len(payloads) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            try:
                client.close()
            except pulsar.PulsarException:
                pass  # the producer is still retrying its unstored messages on the full disk
        stderr = _stop_process(process)
        process = _start_process(data_dir, port)
        try:
            readable = set(await _read_all(url))
        finally:
            _stop_process(process)
        errors = stderr.count("group commit")
        return _row("disk_full_tmpfs", list(acknowledged), [], readable, errors,
                    f"official client, 200 x 64 KiB on 8 MiB; {len(failed)} sends failed")
    finally:
        subprocess.run(["umount", "-l", mount_point], capture_output=True)


def _write_topic(root: str, count: int, segment_bytes: int = 64 * 1024 * 1024) -> tuple[str, list[bytes]]:
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    from pulsarwire.broker.storage import TopicLog, topic_directory
    directory = topic_directory(root, TOPIC)
    topic_log = TopicLog(directory, segment_bytes=segment_bytes)
    payloads = []
    for i in range(count):
        md = pb.MessageMetadata(producer_name="writer", sequence_id=i, publish_time=1000 + i)
        payloads.append(b"m-%04d" % i)
        topic_log.append(codec.encode_metadata_and_payload(md, payloads[-1]), None, 1000 + i, 1)
    topic_log.close()
    return directory, payloads


def _segments(directory: str) -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".log"))


def _positions(log_path: str) -> list[int]:
    with open(log_path[:-4] + ".idx", "rb") as fh:
        raw = fh.read()
    return [int.from_bytes(raw[i:i + 8], "big") for i in range(0, len(raw), 8)]


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0xFF]))


async def _reopen_and_read(work: str, counter: _ErrorCounter) -> tuple[set, int]:
    broker = await _in_process(work)
    readable = set(await _read_all(broker.service_url))
    stats = broker.storage_stats()
    await broker.stop()
    return readable, stats


async def corrupt_entry(work: str, counter: _ErrorCounter) -> dict:
    from pulsarwire import Client, InitialPosition
    directory, payloads = _write_topic(work, 2000)
    log_path = _segments(directory)[0]
    _flip(log_path, _positions(log_path)[1000] + 30)
    broker = await _in_process(work)
    got = set()
    async with Client(broker.service_url) as client:  # a subscription, the way most clients read
        consumer = await client.subscribe(TOPIC, "all", initial_position=InitialPosition.Earliest)
        while True:
            batch = await consumer.receive_many(1000, timeout_millis=1500)
            if not batch:
                break
            got.update(m.data() for m in batch)
            for m in batch:
                consumer.acknowledge(m)
        connected = consumer.is_connected()
    stats = broker.storage_stats()
    await broker.stop()
    return _row("corrupt_entry", payloads, [payloads[1000]], got, stats["skipped_entries"],
                f"consumer still connected: {connected}; the entry is skipped and logged")


async def truncated_file(work: str, counter: _ErrorCounter) -> dict:
    directory, payloads = _write_topic(work, 2000)
    log_path = _segments(directory)[0]
    os.truncate(log_path, _positions(log_path)[1500] + 7)
    before = counter.count
    readable, _ = await _reopen_and_read(work, counter)
    return _row("truncated_file", payloads, payloads[1500:], readable, counter.count - before,
                "cut inside entry 1500: the torn tail is truncated and logged")


async def index_deleted_bad_byte(work: str, counter: _ErrorCounter) -> dict:
    directory, payloads = _write_topic(work, 2000)
    log_path = _segments(directory)[0]
    offset = _positions(log_path)[1000] + 1  # inside the record's size field
    os.remove(log_path[:-4] + ".idx")
    _flip(log_path, offset)
    before = counter.count
    readable, _ = await _reopen_and_read(work, counter)
    return _row("index_deleted_bad_byte", payloads, [payloads[1000]], readable, counter.count - before,
                "index rebuilt by scanning; resynchronised past the bad record")


async def damaged_segment(work: str, counter: _ErrorCounter) -> dict:
    directory, payloads = _write_topic(work, 2000, segment_bytes=8 * 1024)
    segments = _segments(directory)
    middle = segments[len(segments) // 2]
    positions = _positions(middle)
    base = int(os.path.basename(middle)[:-4])
    cut = os.path.getsize(middle) // 2
    damaged = [payloads[base + i] for i, p in enumerate(positions) if p + 20 + 6 + 30 > cut]
    os.truncate(middle, cut)
    os.remove(middle[:-4] + ".idx")
    before = counter.count
    readable, _ = await _reopen_and_read(work, counter)
    return _row("damaged_segment", payloads, [d for d in damaged if d not in readable], readable,
                counter.count - before, f"segment {len(segments) // 2} of {len(segments)} cut in half")


async def fd_limit(work: str, counter: _ErrorCounter) -> dict:
    from pulsarwire import Client, InitialPosition
    port = free_port()
    process = _start_process(work, port, limit=256)
    url = f"pulsar://127.0.0.1:{port}"
    acknowledged, readable, errors = [], set(), 0

    async def one(client, i):
        nonlocal errors
        topic = f"persistent://public/default/fd-{i}"
        try:
            producer = await client.create_producer(topic)
            await producer.send(b"t-%d" % i)
            acknowledged.append(b"t-%d" % i)
            await producer.close()
            consumer = await client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
            message = await consumer.receive(10000)
            readable.add(message.data())
            await consumer.close()
        except Exception:  # noqa: BLE001 - counted
            errors += 1
    try:
        async with Client(url, operation_timeout_seconds=10) as client:
            for start in range(0, 600, 50):
                await asyncio.gather(*(one(client, i) for i in range(start, start + 50)))
    finally:
        alive = process.poll() is None
        _stop_process(process)
    return _row("fd_limit", acknowledged, [], readable, errors,
                f"600 topics, RLIMIT_NOFILE 256; broker alive: {alive}")


async def fd_exhausted(work: str, counter: _ErrorCounter) -> dict:
    from pulsarwire import Client
    port = free_port()
    process = _start_process(work, port, limit=40, extra=("--max-connections", "200"))
    url = f"pulsar://127.0.0.1:{port}"
    errors, acknowledged, note = 0, [], ""
    try:
        async with Client(url, operation_timeout_seconds=5) as client:
            await client.create_producer("persistent://public/default/before")
            hogs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
            await asyncio.sleep(0.3)
            try:
                await client.create_producer(TOPIC)
            except Exception as exc:  # noqa: BLE001 - the expected error reply
                errors += 1
                note = f"{type(exc).__name__} while starved"
            for _, writer in hogs:
                writer.close()
            await asyncio.sleep(1.5)
            producer = await client.create_producer(TOPIC)
            await producer.send(b"after")
            acknowledged.append(b"after")
    finally:
        _stop_process(process)
    process = _start_process(work, port)
    try:
        readable = set(await _read_all(url))
    finally:
        _stop_process(process)
    return _row("fd_exhausted", acknowledged, [], readable, errors, note + "; same connection served after")


async def kill9(work: str, counter: _ErrorCounter, runs: int) -> dict:
    """kill -9 while a producer streams (batching on); everything acknowledged must be there."""
    from pulsarwire import Client
    acknowledged, readable = [], set()
    for run in range(runs):
        data_dir = os.path.join(work, f"run{run}")
        port = free_port()
        process = _start_process(data_dir, port)
        url = f"pulsar://127.0.0.1:{port}"
        topic = f"persistent://public/default/kill9-{run}"
        acked_here = []
        async with Client(url, operation_timeout_seconds=2, initial_backoff_seconds=0.05) as client:
            producer = await client.create_producer(topic, batching_max_messages=20, send_timeout_millis=2000)
            futures = []
            for i in range(3000):
                payload = b"k%d-%05d" % (run, i)
                future = await producer.send_async(payload)
                future.add_done_callback(lambda f, p=payload: acked_here.append(p)
                                         if not f.cancelled() and f.exception() is None else None)
                futures.append(future)
                if i == 1500:
                    process.send_signal(signal.SIGKILL)
                    process.wait(10)
                    break
                if i % 50 == 0:
                    await asyncio.sleep(0.005)  # the kill lands while sends are in flight
            await asyncio.gather(*futures, return_exceptions=True)
        acknowledged += acked_here
        process = _start_process(data_dir, port)
        try:
            readable |= set(await _read_all(url, topic))
        finally:
            _stop_process(process)
    return _row("kill9", acknowledged, [], readable, 0, f"{runs} runs, kill -9 after 1500 sends each")


SCENARIOS = ["disk_full", "disk_full_tmpfs", "corrupt_entry", "truncated_file", "index_deleted_bad_byte",
             "damaged_segment",
             "fd_limit", "fd_exhausted", "kill9"]


async def main_async(only: list[str], kill_runs: int) -> list[dict]:
    counter = _ErrorCounter()
    logging.getLogger("pulsarwire.broker").addHandler(counter)
    logging.getLogger("pulsarwire.broker").propagate = False  # counted, not printed
    logging.getLogger("pulsarwire").addHandler(logging.NullHandler())  # the clients' retries: not printed
    rows = []
    for name in only:
        work = tempfile.mkdtemp(prefix=f"fault-{name}-")
        try:
            if name == "disk_full":
                row = await disk_full(work)
            elif name == "kill9":
                row = await kill9(work, counter, kill_runs)
            else:
                row = await globals()[name](work, counter)
        except Exception as exc:  # noqa: BLE001 - a scenario that breaks is a row too
            row = dict(scenario=name, acknowledged="-", damaged="-", readable="-", lost="?",
                       errors_surfaced="-", note=f"FAILED: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows.append(row)
        print(_format(row), flush=True)
    return rows


def _format(row: dict) -> str:
    return ("{scenario:<24} {acknowledged:>12} {damaged:>8} {readable:>9} {lost:>5} {errors_surfaced:>7}  "
            "{note}").format(**row)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--kill-runs", type=int, default=5, help="kill -9 runs")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--broker-tree", help="run the broker subprocesses (kill9, fd_*, disk_full_tmpfs) "
                                              "from this source tree, e.g. an older checkout to compare")
    args = parser.parse_args()
    global BROKER_TREE
    BROKER_TREE = args.broker_tree
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    print("{:<24} {:>12} {:>8} {:>9} {:>5} {:>7}  {}".format(
        "scenario", "acknowledged", "damaged", "readable", "lost", "errors", "note"), flush=True)
    rows = asyncio.run(main_async(only, args.kill_runs))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(row["lost"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
