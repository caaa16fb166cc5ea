"""Hostile clients against the embedded broker, each scenario on a fresh broker subprocess,
with figures: the broker's resident memory (VmRSS sampled at 20 Hz, VmHWM peak) and what it
did with each hostile connection.

    python benchmarks/hostile_suite.py [--json FILE] [--skip-slowloris]

Scenarios (issue 11 item 7):
  non-reading consumer    80 MB backlog, a consumer with 1 M permits that never reads
  big frames pre-CONNECT  100 connections each starting a 5 MiB frame before CONNECT
  big frames post-CONNECT 100 connected connections each holding 5 MiB - 1 of a 5 MiB frame
  slowloris               1 byte/s: before CONNECT, and inside a frame after CONNECT
  PING flood              2 M PINGs on one connection that never reads the PONGs
  connection limit        150 connections against --max-connections 100

Flags the broker does not know (an older build) are left out, so the same script measures a
baseline: run it with PYTHONPATH pointing at the older tree.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pulsarwire import codec  # noqa: E402
from pulsarwire._proto import PulsarApi_pb2 as pb  # noqa: E402

T = pb.BaseCommand
MiB = 1024 * 1024


def command(kind, field, sub) -> bytes:
    cmd = T(type=kind)
    getattr(cmd, field).CopyFrom(sub)
    return codec.encode_command(cmd)


CONNECT = command(T.CONNECT, "connect", pb.CommandConnect(client_version="hostile", protocol_version=21))
PING = command(T.PING, "ping", pb.CommandPing())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_flags() -> str:
    return subprocess.run([sys.executable, "-m", "pulsarwire", "broker", "--help"],
                          capture_output=True, text=True, check=True).stdout


class Broker:
    """One broker subprocess and its memory."""

    def __init__(self, flags: dict[str, str] | None = None) -> None:
        known = broker_flags()
        self.dir = tempfile.TemporaryDirectory(prefix="hostile-")
        self.port = free_port()
        extra = []
        for flag, value in (flags or {}).items():
            if flag in known:
                extra += [flag, value]
        self.flags = extra
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", self.dir.name, "--port", str(self.port),
             "--v1-port", "-1", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("broker did not start") from None
                time.sleep(0.05)
        self.peak = 0
        self._sampling = False

    def status(self, key: str) -> int:
        """A /proc/<pid>/status figure in bytes (VmRSS, VmHWM)."""
        with open(f"/proc/{self.process.pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def rss(self) -> int:
        return self.status("VmRSS")

    def sample(self):
        """Sample VmRSS at 20 Hz while the block runs; self.peak is the highest seen."""
        broker = self

        class Sampler:
            def __enter__(self):
                broker.peak = broker.rss()
                broker._sampling = True
                self.thread = threading.Thread(target=self.run, daemon=True)
                self.thread.start()
                return broker

            def run(self):
                while broker._sampling:
                    broker.peak = max(broker.peak, broker.rss())
                    time.sleep(0.05)

            def __exit__(self, *exc):
                broker._sampling = False
                self.thread.join()

        return Sampler()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.dir.cleanup()


def connect(port: int, *, handshake: bool = True, timeout: float = 5) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if handshake:
        s.sendall(CONNECT)
        reader = codec.FrameReader()
        while True:
            data = s.recv(65536)
            if not data:
                raise RuntimeError("closed during the handshake")
            reader.feed(data)
            frame = reader.next_frame()
            if frame is not None:
                if frame.type != T.CONNECTED:
                    raise RuntimeError(f"handshake answered with {frame.type}")
                break
    return s


def closed_by_peer(s: socket.socket, wait: float = 0.0) -> bool:
    s.settimeout(wait or 0.001)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (socket.timeout, BlockingIOError):
        return False
    except OSError:
        return True


def send_until_blocked(s: socket.socket, data: bytes, timeout: float) -> int:
    """Send `data`; returns the bytes the peer took before blocking for `timeout` (or closing)."""
    s.settimeout(timeout)
    view = memoryview(data)
    sent = 0
    try:
        while sent < len(view):
            sent += s.send(view[sent:sent + MiB])
    except (socket.timeout, OSError):
        pass
    return sent


def mb(value: int) -> float:
    return round(value / MiB, 1)


# scenarios

def non_reading_consumer(messages: int = 20_000, size: int = 4096) -> dict:
    broker = Broker()
    try:
        topic = "persistent://public/default/unread"
        producer = connect(broker.port)
        producer.sendall(command(T.PRODUCER, "producer", pb.CommandProducer(topic=topic, producer_id=1,
                                                                           request_id=1)))
        payload = b"x" * size
        frames = []
        for seq in range(messages):
            md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1)
            send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1))
            frames.append(codec.encode_payload_command(send, md, payload))
        receipts = threading.Thread(target=_read_until, args=(producer, messages + 1, T.SEND_RECEIPT))
        receipts.start()
        for start in range(0, messages, 500):
            producer.sendall(b"".join(frames[start:start + 500]))
        receipts.join()
        producer.close()
        time.sleep(0.5)
        before = broker.rss()
        with broker.sample():
            consumer = connect(broker.port)
            consumer.sendall(command(T.SUBSCRIBE, "subscribe", pb.CommandSubscribe(
                topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
                request_id=1, initialPosition=pb.CommandSubscribe.Earliest)))
            consumer.sendall(command(T.FLOW, "flow", pb.CommandFlow(consumer_id=1, messagePermits=1_000_000)))
            time.sleep(4)
        peak = broker.peak
        consumer.close()
        time.sleep(2)
        return {"backlog_mb": mb(messages * size), "rss_before_mb": mb(before), "peak_rss_mb": mb(peak),
                "growth_mb": mb(peak - before), "rss_after_close_mb": mb(broker.rss())}
    finally:
        broker.stop()


def _read_until(s: socket.socket, count: int, kind: int) -> None:
    reader = codec.FrameReader()
    seen = 0
    s.settimeout(60)
    while seen < count:
        data = s.recv(1 << 20)
        if not data:
            return
        reader.feed(data)
        for frame in reader:
            seen += frame.type == kind or frame.type == T.PRODUCER_SUCCESS


def big_frames(after_connect: bool, connections: int = 100, frame: int = 5 * MiB) -> dict:
    broker = Broker()
    try:
        before = broker.rss()
        socks, closed, taken = [], 0, 0
        with broker.sample():
            for _ in range(connections):
                s = connect(broker.port, handshake=after_connect)
                data = (frame).to_bytes(4, "big") + b"\0" * (frame - 1)
                taken += send_until_blocked(s, data, 0.3)
                socks.append(s)
            time.sleep(1)
            closed = sum(closed_by_peer(s) for s in socks)
        peak = broker.peak
        held = broker.rss()
        for s in socks:
            s.close()
        time.sleep(2)
        return {"connections": connections, "closed_by_broker": closed, "bytes_taken_mb": mb(taken),
                "rss_before_mb": mb(before), "peak_rss_mb": mb(peak), "rss_while_open_mb": mb(held),
                "rss_after_close_mb": mb(broker.rss())}
    finally:
        broker.stop()


def slowloris(limit: float = 60.0) -> dict:
    broker = Broker()
    try:
        before = connect(broker.port, handshake=False)
        inside = connect(broker.port)
        header = (1000).to_bytes(4, "big")
        started = time.monotonic()
        closed_at: dict[str, float] = {}
        sent = 0
        while len(closed_at) < 2 and time.monotonic() - started < limit:
            for name, s in (("before_connect", before), ("inside_frame", inside)):
                if name in closed_at:
                    continue
                byte = header[sent:sent + 1] if sent < 4 else b"\0"
                try:
                    s.send(byte)
                except OSError:
                    closed_at[name] = time.monotonic() - started
                    continue
                if closed_by_peer(s):
                    closed_at[name] = time.monotonic() - started
            sent += 1
            time.sleep(1.0)
        before.close()
        inside.close()
        return {name: round(closed_at[name], 1) if name in closed_at else f"open after {limit:.0f}s"
                for name in ("before_connect", "inside_frame")}
    finally:
        broker.stop()


def ping_flood(count: int = 2_000_000) -> dict:
    broker = Broker()
    try:
        s = connect(broker.port)
        before = broker.rss()
        with broker.sample():
            taken = send_until_blocked(s, PING * count, 3.0)
            time.sleep(1)
        s.close()
        return {"pings": count, "pings_taken": taken // len(PING), "rss_before_mb": mb(before),
                "peak_rss_mb": mb(broker.peak), "growth_mb": mb(broker.peak - before)}
    finally:
        broker.stop()


def connection_limit(limit: int = 100, attempts: int = 150) -> dict:
    broker = Broker({"--max-connections": str(limit)})
    try:
        socks, accepted, refused, other = [], 0, 0, []
        for _ in range(attempts):
            s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
            s.sendall(CONNECT)
            reader = codec.FrameReader()
            frame = None
            try:
                while frame is None:
                    data = s.recv(65536)
                    if not data:
                        break
                    reader.feed(data)
                    frame = reader.next_frame()
            except OSError:
                pass
            if frame is not None and frame.type == T.CONNECTED:
                accepted += 1
            elif frame is not None and frame.type == T.ERROR:
                refused += 1
                other.append(frame.command.error.message)
            else:
                other.append("closed without an answer")
            socks.append(s)
        for s in socks:
            s.close()
        return {"limit": limit if "--max-connections" in broker.flags else "none", "attempts": attempts,
                "accepted": accepted, "refused_with_error": refused,
                "refusal": other[0] if other else ""}
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--skip-slowloris", action="store_true", help="skip the slowest scenario (30 s+)")
    args = parser.parse_args()
    scenarios = [("non-reading consumer", non_reading_consumer),
                 ("big frames before CONNECT", lambda: big_frames(False)),
                 ("big frames after CONNECT", lambda: big_frames(True)),
                 ("PING flood", ping_flood),
                 ("connection limit", connection_limit)]
    if not args.skip_slowloris:
        scenarios.append(("slowloris (seconds until closed)", slowloris))
    results = {}
    for name, run in scenarios:
        started = time.monotonic()
        results[name] = run()
        print(f"{name:34s} {json.dumps(results[name])}  ({time.monotonic() - started:.0f}s)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
