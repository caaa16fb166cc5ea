"""Hostile clients against the embedded broker, each attack on a fresh broker subprocess with
the same memory bounds, with figures: the worst PING latency of an honest client connected
before the attack (and how long a new honest connection takes to be CONNECTED during it), the
broker's resident memory (VmRSS sampled at 20 Hz) against its configured budget, and its open
descriptors (peak, against its limit).

    python benchmarks/hostile_suite.py [--json FILE] [--skip-slowloris] [--only NAME]

Attacks (issue 11 item 7, issue 26 goals 3 and 5, issue 30 item 5, issue 32 items 1 and 5):
  non-reading consumer      80 MB backlog, a consumer with 1 M permits that never reads
  100 non-reading consumers 48 entries of 1 MiB, 100 subscriptions that never read
  big frames pre-CONNECT    100 connections each starting a 5 MiB frame before CONNECT
  big frames post-CONNECT   100 connected connections each holding 5 MiB - 1 of a 5 MiB frame
  PING flood                2 M PINGs on one connection that never reads the PONGs
  connection limit          150 connections against --max-connections 100
  idle connections          1 000 connections that never CONNECT, then 300 that CONNECT and idle
  stalled TLS handshakes    1 100 TCP connections to --tls-port that never start a handshake, under
                            a descriptor limit of 1 024
  fuzzed frames             20 000 requests with edge values and flipped bytes
  slowloris                 1 byte/s: before CONNECT, and inside a frame after CONNECT

Targets: honest PING at most 100 ms, and the broker's growth in memory within its configured
budget (--memory-budget for output and the entry cache, plus --max-input-bytes for unfinished
frames), under every attack.

Flags the broker does not know (an older build) are left out, so the same script measures a
baseline: run it with PYTHONPATH pointing at the older tree.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
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


MEMORY_BUDGET = 128 * MiB
CACHE_BYTES = 32 * MiB
INPUT_BYTES = 64 * MiB
BUDGET_FLAGS = {"--memory-budget": str(MEMORY_BUDGET), "--max-cache-bytes": str(CACHE_BYTES),
                "--max-input-bytes": str(INPUT_BYTES)}
PING_TARGET_MS = 100.0


class Broker:
    """One broker subprocess: its memory, descriptors and log."""

    def __init__(self, flags: dict[str, str] | None = None, *, nofile: int | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        known = broker_flags()
        self.dir = tempfile.TemporaryDirectory(prefix="hostile-")
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        extra = []
        for flag, value in dict(BUDGET_FLAGS, **(flags or {})).items():
            if flag in known:
                extra += [flag, value]
        if tls:
            extra += ["--tls-port", str(self.tls_port), "--tls-cert-file", tls[0], "--tls-key-file", tls[1]]
        self.flags = extra
        self.nofile = nofile
        self.log_path = os.path.join(self.dir.name, "broker.log")

        def lower_limit():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", os.path.join(self.dir.name, "data"),
                 "--port", str(self.port), "--v1-port", "-1", *extra], stdout=log_file,
                stderr=subprocess.STDOUT, preexec_fn=lower_limit)
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
        self.peak_fds = 0
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

    def descriptors(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.process.pid}/fd"))
        except OSError:
            return 0

    def fd_limit(self) -> int:
        with open(f"/proc/{self.process.pid}/limits") as fh:
            for line in fh:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
        return 0

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def sample(self):
        """Sample VmRSS and descriptors at 20 Hz while the block runs (self.peak, self.peak_fds)."""
        broker = self

        class Sampler:
            def __enter__(self):
                broker.peak = broker.rss()
                broker.peak_fds = broker.descriptors()
                broker._sampling = True
                self.thread = threading.Thread(target=self.run, daemon=True)
                self.thread.start()
                return broker

            def run(self):
                while broker._sampling:
                    broker.peak = max(broker.peak, broker.rss())
                    broker.peak_fds = max(broker.peak_fds, broker.descriptors())
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


class HonestClient:
    """A client connected before the attack that PINGs every 20 ms and times each PONG; the
    worst latency is what the attack cost it (a PONG missing for 5 s counts as 5 000 ms)."""

    def __init__(self, port: int) -> None:
        self.sock = connect(port)
        self.sock.settimeout(5)
        self.worst_ms = 0.0
        self.pings = 0
        self.failed = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        reader = codec.FrameReader()
        pong = command(T.PONG, "pong", pb.CommandPong())
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sock.sendall(PING)
                answered = False
                while not answered:
                    data = self.sock.recv(65536)
                    if not data:
                        raise ConnectionError("closed by the broker")
                    reader.feed(data)
                    for frame in reader:
                        if frame.type == T.PONG:
                            answered = True
                        elif frame.type == T.PING:
                            self.sock.sendall(pong)
            except (OSError, ConnectionError) as exc:
                self.failed = str(exc) or type(exc).__name__
                self.worst_ms = max(self.worst_ms, 5000.0)
                return
            self.worst_ms = max(self.worst_ms, (time.monotonic() - started) * 1000)
            self.pings += 1
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def honest_connect_ms(port: int) -> float | str:
    """How long a new connection takes to be CONNECTED, or why it was not."""
    started = time.monotonic()
    try:
        connect(port).close()
    except (OSError, RuntimeError) as exc:
        return f"refused: {exc}"
    return round((time.monotonic() - started) * 1000, 1)


def attack(broker: Broker, run) -> dict:
    """Run `run()` (the attack, returning its own figures) while an honest client PINGs, and add
    what it cost: the honest PING and connect, memory and descriptors."""
    time.sleep(0.3)
    before = broker.rss()
    honest = HonestClient(broker.port)
    try:
        with broker.sample():
            figures = run()
            connect_ms = honest_connect_ms(broker.port)
            time.sleep(0.5)
    finally:
        honest.stop()
    growth = broker.peak - before
    budget = MEMORY_BUDGET + INPUT_BYTES
    log = broker.log_text()
    return dict(figures, worst_ping_ms=round(honest.worst_ms, 1), honest_pings=honest.pings,
                honest_failed=honest.failed, honest_connect_ms=connect_ms,
                rss_before_mb=mb(before), peak_rss_mb=mb(broker.peak), growth_mb=mb(growth),
                budget_mb=mb(budget), peak_fds=broker.peak_fds, fd_limit=broker.fd_limit(),
                tracebacks=log.count("Traceback"), emfile_log_lines=log.count("Too many open files"),
                ping_ok=honest.worst_ms <= PING_TARGET_MS and not honest.failed, memory_ok=growth <= budget)


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


# attacks: each returns its own figures; `attack` adds the honest client's, memory and descriptors

def _publish(port: int, topic: str, count: int, size: int) -> None:
    producer = connect(port)
    producer.sendall(command(T.PRODUCER, "producer", pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))
    payload = b"x" * size
    frames = []
    for seq in range(count):
        md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1)
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1))
        frames.append(codec.encode_payload_command(send, md, payload))
    receipts = threading.Thread(target=_read_until, args=(producer, count + 1, T.SEND_RECEIPT))
    receipts.start()
    step = max(1, (4 * MiB) // size)
    for start in range(0, count, step):
        producer.sendall(b"".join(frames[start:start + step]))
    receipts.join()
    producer.close()


def _subscribe(port: int, topic: str, subscription: str, receive_buffer: int | None = None) -> socket.socket:
    s = socket.socket()
    if receive_buffer:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(CONNECT)
    s.sendall(command(T.SUBSCRIBE, "subscribe", pb.CommandSubscribe(
        topic=topic, subscription=subscription, subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
        request_id=1, initialPosition=pb.CommandSubscribe.Earliest)))
    s.sendall(command(T.FLOW, "flow", pb.CommandFlow(consumer_id=1, messagePermits=1_000_000)))
    return s


def non_reading_consumer(messages: int = 20_000, size: int = 4096) -> dict:
    broker = Broker()
    try:
        topic = "persistent://public/default/unread"
        _publish(broker.port, topic, messages, size)
        held = []

        def run():
            held.append(_subscribe(broker.port, topic, "s", receive_buffer=16 * 1024))
            time.sleep(4)
            return {"backlog_mb": mb(messages * size)}
        figures = attack(broker, run)
        for s in held:
            s.close()
        time.sleep(2)
        return dict(figures, rss_after_close_mb=mb(broker.rss()))
    finally:
        broker.stop()


def many_non_reading_consumers(consumers: int = 100, entries: int = 48, size: int = MiB) -> dict:
    broker = Broker()
    try:
        topic = "persistent://public/default/unread-by-many"
        _publish(broker.port, topic, entries, size)
        held = []

        def run():
            for i in range(consumers):
                held.append(_subscribe(broker.port, topic, f"never-{i}", receive_buffer=16 * 1024))
            time.sleep(4)
            return {"consumers": consumers, "topic_mb": mb(entries * size)}
        figures = attack(broker, run)
        for s in held:
            s.close()
        time.sleep(2)
        return dict(figures, rss_after_close_mb=mb(broker.rss()))
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
    socks = []
    try:
        def run():
            taken = 0
            for _ in range(connections):
                s = connect(broker.port, handshake=after_connect)
                data = (frame).to_bytes(4, "big") + b"\0" * (frame - 1)
                taken += send_until_blocked(s, data, 0.3)
                socks.append(s)
            time.sleep(1)
            return {"connections": connections, "closed_by_broker": sum(closed_by_peer(s) for s in socks),
                    "bytes_taken_mb": mb(taken)}
        figures = attack(broker, run)
        for s in socks:
            s.close()
        time.sleep(2)
        return dict(figures, rss_after_close_mb=mb(broker.rss()))
    finally:
        broker.stop()


def slowloris(limit: float = 60.0) -> dict:
    broker = Broker()
    try:
        def run():
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
            return {f"{name}_closed_after_s": round(closed_at[name], 1) if name in closed_at
                    else f"open after {limit:.0f}s" for name in ("before_connect", "inside_frame")}
        return attack(broker, run)
    finally:
        broker.stop()


def ping_flood(count: int = 2_000_000) -> dict:
    broker = Broker()
    try:
        def run():
            s = connect(broker.port)
            taken = send_until_blocked(s, PING * count, 3.0)
            time.sleep(1)
            s.close()
            return {"pings": count, "pings_taken": taken // len(PING)}
        return attack(broker, run)
    finally:
        broker.stop()


def _connect_answer(port: int, source: str = "127.0.0.1") -> tuple[socket.socket, str]:
    s = socket.socket()
    s.settimeout(5)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(CONNECT)
    reader = codec.FrameReader()
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return s, "closed without an answer"
            reader.feed(data)
            frame = reader.next_frame()
            if frame is not None:
                if frame.type == T.CONNECTED:
                    return s, "connected"
                return s, frame.command.error.message if frame.type == T.ERROR else f"frame {frame.type}"
    except OSError as exc:
        return s, f"closed: {exc}"


def connection_limit(limit: int = 100, attempts: int = 150) -> dict:
    broker = Broker({"--max-connections": str(limit)})
    socks = []
    try:
        def run():
            answers = []
            for _ in range(attempts):
                s, answer = _connect_answer(broker.port, "127.0.0.2")
                socks.append(s)
                answers.append(answer)
            refusals = [a for a in answers if a != "connected"]
            return {"limit": limit if "--max-connections" in broker.flags else "none", "attempts": attempts,
                    "accepted": answers.count("connected"), "refused": len(refusals),
                    "refusal": refusals[0] if refusals else ""}
        return attack(broker, run)
    finally:
        for s in socks:
            s.close()
        broker.stop()


def idle_connections(silent: int = 1000, connected: int = 300) -> dict:
    """From one other address: connections that never CONNECT, then connections that CONNECT and
    send nothing more. The honest client (127.0.0.1) must still get in."""
    broker = Broker()
    socks = []
    try:
        def run():
            for _ in range(silent):
                try:
                    s = socket.socket()
                    s.bind(("127.0.0.2", 0))
                    s.connect(("127.0.0.1", broker.port))
                    socks.append(s)
                except OSError:
                    break
            time.sleep(0.5)
            closed = sum(closed_by_peer(s) for s in socks)
            answers = []
            for _ in range(connected):
                s, answer = _connect_answer(broker.port, "127.0.0.3")
                socks.append(s)
                answers.append(answer)
            return {"silent": silent, "silent_closed_by_broker": closed, "connected_idle": connected,
                    "connected_accepted": answers.count("connected")}
        return attack(broker, run)
    finally:
        for s in socks:
            s.close()
        broker.stop()


def _certificate(directory: str) -> tuple[str, str] | None:
    if shutil.which("openssl") is None:
        return None
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def stalled_tls_handshakes(connections: int = 1100, nofile: int = 1024) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        files = _certificate(directory)
        if files is None:
            return {"skipped": "openssl is needed"}
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * connections)), hard))
        broker = Broker(nofile=nofile, tls=files)
        socks = []
        try:
            def run():
                failed = 0
                for _ in range(connections):  # from another address than the honest client's
                    try:
                        s = socket.socket()
                        socks.append(s)
                        s.settimeout(2)
                        s.bind(("127.0.0.2", 0))
                        s.connect(("127.0.0.1", broker.tls_port))
                    except OSError:
                        failed += 1
                time.sleep(1)
                closed = sum(closed_by_peer(s) for s in socks)
                return {"connections": connections, "nofile": nofile, "connect_failed": failed,
                        "closed_by_broker_within_1s": closed}
            figures = attack(broker, run)
            started = time.monotonic()
            while not all(closed_by_peer(s) for s in socks) and time.monotonic() - started < 30:
                time.sleep(0.5)
            open_left = sum(not closed_by_peer(s) for s in socks)
            return dict(figures, all_closed_after_s=round(time.monotonic() - started, 1) if not open_left
                        else f"{open_left} open after 30 s")
        finally:
            for s in socks:
                s.close()
            broker.stop()


def fuzzed_frames(frames: int = 20_000, per_connection: int = 20) -> dict:
    from tests.broker.test_hostile import _fuzz_frame  # the generator the test suite runs 1 200 of

    broker = Broker()
    try:
        def run():
            rng = random.Random(32)
            survived = 0
            for _ in range(frames // per_connection):
                s = connect(broker.port)
                s.sendall(b"".join(_fuzz_frame(rng) for _ in range(per_connection)) + PING)
                reader = codec.FrameReader(1 << 30)
                try:
                    while True:
                        data = s.recv(65536)
                        if not data:
                            break
                        reader.feed(data)
                        if any(frame.type == T.PONG for frame in reader):
                            survived += 1
                            break
                except OSError:
                    pass
                s.close()
            return {"frames": frames, "connections_still_serving": survived,
                    "connections": frames // per_connection}
        return attack(broker, run)
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--skip-slowloris", action="store_true", help="skip the slowest attack (30 s+)")
    parser.add_argument("--only", action="append", help="run only the attacks whose name contains this")
    args = parser.parse_args()
    scenarios = [("non-reading consumer", non_reading_consumer),
                 ("100 non-reading consumers", many_non_reading_consumers),
                 ("big frames before CONNECT", lambda: big_frames(False)),
                 ("big frames after CONNECT", lambda: big_frames(True)),
                 ("PING flood", ping_flood),
                 ("connection limit", connection_limit),
                 ("idle connections", idle_connections),
                 ("stalled TLS handshakes", stalled_tls_handshakes),
                 ("fuzzed frames", fuzzed_frames)]
    if not args.skip_slowloris:
        scenarios.append(("slowloris", slowloris))
    if args.only:
        scenarios = [(name, run) for name, run in scenarios if any(o in name for o in args.only)]
    results = {}
    print(f"budget: --memory-budget {mb(MEMORY_BUDGET)} MiB (--max-cache-bytes {mb(CACHE_BYTES)}), "
          f"--max-input-bytes {mb(INPUT_BYTES)} MiB; targets: honest PING <= {PING_TARGET_MS:.0f} ms, growth "
          f"<= {mb(MEMORY_BUDGET + INPUT_BYTES)} MiB", flush=True)
    for name, run in scenarios:
        started = time.monotonic()
        results[name] = run()
        print(f"{name:28s} {json.dumps(results[name])}  ({time.monotonic() - started:.0f}s)", flush=True)
    print(f"\n{'attack':28s} {'worst PING ms':>13s} {'new conn ms':>12s} {'growth MiB':>10s} {'peak RSS MiB':>12s} "
          f"{'peak fds':>9s}  targets")
    for name, r in results.items():
        if "worst_ping_ms" not in r:
            print(f"{name:28s} {r}")
            continue
        locked_out = isinstance(r["honest_connect_ms"], str)
        met = " ".join(word for word, missed in (("PING over", not r["ping_ok"]), ("memory over", not r["memory_ok"]),
                                                 ("locked out", locked_out)) if missed) or "ok"
        connect_ms = "refused" if locked_out else str(r["honest_connect_ms"])
        print(f"{name:28s} {r['worst_ping_ms']:13.1f} {connect_ms:>12s} {r['growth_mb']:10.1f} "
              f"{r['peak_rss_mb']:12.1f} {r['peak_fds']:4d}/{r['fd_limit']:<4d}  {met}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
