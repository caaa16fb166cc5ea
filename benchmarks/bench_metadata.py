"""Metadata load against a broker subprocess (issue 32 item 2): how long an honest client's PING
waits while another client makes many topics or V1 groups, and what the broker holds after.

    python benchmarks/bench_metadata.py [--topics 10000] [--joins 3000] [--json FILE]

Scenarios, each on a fresh broker:
  producers on new topics     one connection pipelines --topics PRODUCER requests, each on a new topic
  subscriptions on new topics the same with durable SUBSCRIBEs (each one's cursor on disk before its answer)
  V1 JOINs                    --joins JOINs, one at a time, each to a new group

Reported: the honest client's worst and median PING round trip (a PING every 5 ms on a connection
of its own), the scenario's wall time, the V1 JOIN latency (mean of the first and of the last 10 %),
and the broker's resident memory after. Run it with PYTHONPATH pointing at another tree to
measure that one (flags it does not know are left out).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pulsarwire import codec  # noqa: E402
from pulsarwire._proto import PulsarApi_pb2 as pb  # noqa: E402

T = pb.BaseCommand


def command(kind, field, sub) -> bytes:
    cmd = T(type=kind)
    getattr(cmd, field).CopyFrom(sub)
    return codec.encode_command(cmd)


CONNECT = command(T.CONNECT, "connect", pb.CommandConnect(client_version="bench-metadata", protocol_version=21))
PING = command(T.PING, "ping", pb.CommandPing())
PONG = command(T.PONG, "pong", pb.CommandPong())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Frames:
    """Commands read off a raw connection (payloads skipped); the broker's PINGs answered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def next(self) -> pb.BaseCommand:
        while True:
            total = struct.unpack(">I", self._take(4))[0]
            frame = self._take(total)
            size = struct.unpack(">I", frame[:4])[0]
            cmd = T.FromString(frame[4:4 + size])
            if cmd.type == T.PING:
                self.sock.sendall(PONG)
                continue
            return cmd


def connect(port: int) -> tuple[socket.socket, Frames]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(CONNECT)
    frames = Frames(sock)
    assert frames.next().type == T.CONNECTED
    return sock, frames


class Broker:
    def __init__(self, flags: dict[str, str]) -> None:
        known = subprocess.run([sys.executable, "-m", "pulsarwire", "broker", "--help"], capture_output=True,
                               text=True, check=True).stdout
        self.dir = tempfile.TemporaryDirectory(prefix="bench-metadata-")
        self.port, self.v1_port = free_port(), free_port()
        extra = [item for flag, value in flags.items() if flag in known for item in (flag, value)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pulsarwire", "broker", "--data-dir", self.dir.name, "--port", str(self.port),
             "--v1-port", str(self.v1_port), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.v1_port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self.dir.cleanup()


class Pinger(threading.Thread):
    """An honest client: a PING every 5 ms, each round trip recorded."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock, self.frames = connect(port)
        self.rtts: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            start = time.perf_counter()
            self.sock.sendall(PING)
            while self.frames.next().type != T.PONG:
                pass
            self.rtts.append(time.perf_counter() - start)
            time.sleep(0.005)

    def stop(self) -> dict:
        self.done.set()
        self.join(60)
        self.sock.close()
        return {"ping_worst_ms": round(max(self.rtts) * 1000, 1),
                "ping_median_ms": round(statistics.median(self.rtts) * 1000, 2), "pings": len(self.rtts)}


def topic_flood(count: int, subscribe: bool) -> dict:
    broker = Broker({})
    try:
        pinger = Pinger(broker.port)
        pinger.start()
        time.sleep(0.2)
        sock, frames = connect(broker.port)
        requests = []
        for i in range(count):
            topic = f"persistent://public/default/flood-{i}"
            if subscribe:
                requests.append(command(T.SUBSCRIBE, "subscribe", pb.CommandSubscribe(
                    topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared, consumer_id=i, request_id=i)))
            else:
                requests.append(command(T.PRODUCER, "producer", pb.CommandProducer(
                    topic=topic, producer_id=i, request_id=i)))
        start = time.perf_counter()
        sender = threading.Thread(target=sock.sendall, args=(b"".join(requests),), daemon=True)
        sender.start()
        answered = errors = 0
        while answered < count:
            cmd = frames.next()
            if cmd.type in (T.SUCCESS, T.PRODUCER_SUCCESS):
                answered += 1
            elif cmd.type == T.ERROR:
                answered += 1
                errors += 1
        elapsed = time.perf_counter() - start
        result = dict(pinger.stop(), seconds=round(elapsed, 2), errors=errors, rss_mb=round(broker.rss_mb(), 1))
        sock.close()
        return result
    finally:
        broker.stop()


def v1_joins(count: int) -> dict:
    broker = Broker({})
    try:
        pinger = Pinger(broker.port)
        pinger.start()
        time.sleep(0.2)
        latencies = []
        with socket.create_connection(("127.0.0.1", broker.v1_port), timeout=60) as sock, \
                sock.makefile("rb") as answers:
            start = time.perf_counter()
            for i in range(count):
                sent = time.perf_counter()
                sock.sendall(f"V1|{i}|JOIN|group-{i} joined m\n".encode())
                answer = answers.readline()
                latencies.append(time.perf_counter() - sent)
                assert b"|OK|" in answer, answer
            elapsed = time.perf_counter() - start
        tenth = max(1, count // 10)
        return dict(pinger.stop(), seconds=round(elapsed, 2),
                    join_first_ms=round(statistics.mean(latencies[:tenth]) * 1000, 2),
                    join_last_ms=round(statistics.mean(latencies[-tenth:]) * 1000, 2),
                    rss_mb=round(broker.rss_mb(), 1))
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--joins", type=int, default=3_000)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results = {
        "producers on new topics": topic_flood(args.topics, subscribe=False),
        "subscriptions on new topics": topic_flood(args.topics, subscribe=True),
        "V1 JOINs": v1_joins(args.joins),
    }
    for name, figures in results.items():
        print(f"{name:28} " + "  ".join(f"{key}={value}" for key, value in figures.items()), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
