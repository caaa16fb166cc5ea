"""V1 text protocol throughput of the embedded broker.

The broker runs in its own process (`pulsarwire broker`, default settings: an fsync every
second, acks answered once each group commit reached the OS); each client runs in a process of
its own and speaks raw V1 lines over a socket, so the client costs little beside the broker.

- produce: one connection sends N `PRODUCE <topic> <key>:<value> acks=1` lines (values of --size
  bytes, keys spread over the partitions) pipelined: a thread writes every line while the main
  thread reads the replies. Records/s is N over the time from the first byte sent to the last
  reply read.
- consume: --consumers connections, each in its own process, read the whole topic (every
  partition from offset 0 to its high watermark, one CONSUME per partition in flight). Records/s
  counts every record each connection got, over the time from the first CONSUME to the last reply.

For each the broker's CPU seconds (user + system, from /proc) per million records are reported.
Rounds start on a fresh broker and data directory; medians are reported.

    python benchmarks/bench_v1.py [--records 100000] [--size 100] [--consumers 4] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_broker import cpu_seconds  # noqa: E402
from benchmarks.common import BrokerUnderTest, free_port  # noqa: E402

TOPIC = "bench-v1"
PARTITIONS = 3


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def produce(port: int, records: int, size: int, result) -> None:
    """Pipelined PRODUCE acks=1 of `records` records on one connection: (seconds, errors)."""
    value = b"v" * size
    lines = [b"V1|%d|PRODUCE|%s k%d:%s acks=1\n" % (i, TOPIC.encode(), i % 64, value) for i in range(records)]
    chunks = [b"".join(lines[i:i + 512]) for i in range(0, records, 512)]
    sock = _connect(port)

    def send():
        for chunk in chunks:
            sock.sendall(chunk)
    started = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    answered = errors = 0
    tail = b""
    while answered < records:
        data = sock.recv(1 << 20)
        if not data:
            break
        data = tail + data
        cut = data.rfind(b"\n") + 1
        complete, tail = data[:cut], data[cut:]
        answered += complete.count(b"\n")
        errors += complete.count(b"|ERR|")
    elapsed = time.perf_counter() - started
    sender.join()
    sock.close()
    result.put((elapsed, errors + records - answered))


def consume(port: int, result) -> None:
    """Read every partition of the topic to its high watermark: (seconds, records)."""
    sock = _connect(port)
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    started = time.perf_counter()
    for partition in range(PARTITIONS):
        sock.sendall(b"V1|%d|CONSUME|%s %d 0\n" % (partition, TOPIC.encode(), partition))
    got = 0
    pending = PARTITIONS
    reader = sock.makefile("rb", buffering=1 << 20)
    while pending:
        line = reader.readline()
        head, _, payload = line.partition(b"|OK|messages=")
        if not payload:
            raise RuntimeError(f"unexpected reply {line[:200]!r}")
        partition = int(head.split(b"|")[1])
        body, _, hw = payload.rpartition(b" hw=")
        if body:
            got += body.count(b",") + 1  # values cannot hold a comma
            last = body[body.rfind(b",") + 1:]
            offsets[partition] = int(last[:last.index(b":")]) + 1
        if offsets[partition] >= int(hw):
            pending -= 1
        else:
            sock.sendall(b"V1|%d|CONSUME|%s %d %d\n" % (partition, TOPIC.encode(), partition, offsets[partition]))
    elapsed = time.perf_counter() - started
    sock.close()
    result.put((elapsed, got))


def one_round(records: int, size: int, consumers: int) -> dict:
    v1_port = free_port()
    data_dir = tempfile.mkdtemp(prefix="bench-v1-")
    with BrokerUnderTest("embedded", data_dir, extra=["--v1-port", str(v1_port),
                                                      "--v1-partitions", str(PARTITIONS)]) as broker:
        pid = broker.process.pid
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", v1_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        os.sync()
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        producer = context.Process(target=produce, args=(v1_port, records, size, queue))
        cpu = cpu_seconds(pid)
        producer.start()
        elapsed, errors = queue.get()
        producer.join()
        produce_cpu = cpu_seconds(pid) - cpu
        if errors:
            raise RuntimeError(f"{errors} PRODUCE requests failed")
        readers = [context.Process(target=consume, args=(v1_port, queue)) for _ in range(consumers)]
        cpu = cpu_seconds(pid)
        for reader in readers:
            reader.start()
        results = [queue.get() for _ in readers]
        for reader in readers:
            reader.join()
        consume_cpu = cpu_seconds(pid) - cpu
        got = sum(r[1] for r in results)
        if got != records * consumers:
            raise RuntimeError(f"consumers got {got} records, expected {records * consumers}")
        consume_elapsed = max(r[0] for r in results)
    return {"produce_records_per_s": records / elapsed, "produce_broker_cpu_s_per_m": produce_cpu / records * 1e6,
            "consume_records_per_s": got / consume_elapsed, "consume_broker_cpu_s_per_m": consume_cpu / got * 1e6}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write the rounds and medians here")
    args = parser.parse_args(argv)
    rounds = [one_round(args.records, args.size, args.consumers) for _ in range(args.repeat)]
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(f"V1, {args.records:,} records of {args.size} B, median of {args.repeat}:")
    print(f"  produce (1 connection, pipelined, acks=1): {medians['produce_records_per_s']:>12,.0f} records/s, "
          f"broker CPU {medians['produce_broker_cpu_s_per_m']:.2f} s per million")
    print(f"  consume ({args.consumers} connections):              {medians['consume_records_per_s']:>12,.0f} "
          f"records/s, broker CPU {medians['consume_broker_cpu_s_per_m']:.2f} s per million")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rounds": rounds, "medians": medians, "args": vars(args)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
