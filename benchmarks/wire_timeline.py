"""Where a latency goes, read off the wire: which side (client or broker) of an end-to-end
message or of a send() round trip takes the time, for the official client and pulsarwire
running the same program against one broker.

    python benchmarks/wire_timeline.py [--mode e2e|send] [--broker embedded|pulsar-lite]
        [--rate 1000] [--messages 3000] [--rounds 2] [--clients official,sync,asyncio] [--pin]

tcpdump records the loopback traffic of the broker's port (nanosecond timestamps, the same
clock as `time.time_ns()`; it needs tcpdump and the right to capture, else this exits saying
so). Each run is a process of its own: `sync_surface.py` (official client or
`pulsarwire.sync`) or, for e2e, pulsarwire's asyncio client on its own loop
(`bench_client.py --one`).

- e2e (`sync_surface.py e2e`: send_async at `--rate` with a 1 ms batching delay, a consumer
  thread): each payload starts with its send time (8 bytes, big-endian ns), found again in
  the packets that carry it (an 8-byte value within 2 s before the packet's time: random
  payload bytes match that by chance about once in 10^10 windows). Per message: the
  producer's side (stamp to its Send on the wire: the batching delay and the client's
  send path), the broker's (that Send to the delivery on the wire), and the consumer's
  side as the program's own median minus the wire's (the delivery's read, dispatch and
  hand-over to the caller).
- send (a loop of `send()`, no batching): per Send frame, the broker's time (Send to its
  receipt on the wire) and the client's turnaround (receipt to the next Send: reading the
  receipt, returning from send(), the next call up to its write).

--pin runs the broker on CPU 0 and the client on CPU 1 (taskset): unpinned, the two share
both cores as the scheduler places them.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import ROOT, BrokerUnderTest  # noqa: E402
from pulsarwire._proto import PulsarApi_pb2 as pb  # noqa: E402

SURFACE = str(ROOT / "benchmarks" / "sync_surface.py")
BENCH_CLIENT = str(ROOT / "benchmarks" / "bench_client.py")
MODULES = {"official": "pulsar", "sync": "pulsarwire.sync"}
PCAP_NANO = 0xA1B23C4D


def segments(path: str, broker_port: int) -> dict[tuple[int, bool], list[tuple[int, bytes]]]:
    """TCP payloads per (client port, from the broker), in capture order, with their times (ns)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return {}
    nano = struct.unpack_from("<I", data)[0] == PCAP_NANO
    link = struct.unpack_from("<I", data, 20)[0]
    link_header = {1: 14, 113: 16}.get(link, 0)  # Ethernet (lo), Linux cooked capture
    streams: dict[tuple[int, bool], list[tuple[int, bytes]]] = collections.defaultdict(list)
    at = 24
    while at + 16 <= len(data):
        seconds, fraction, length, _ = struct.unpack_from("<IIII", data, at)
        packet = data[at + 16:at + 16 + length]
        at += 16 + length
        ip = link_header
        tcp = ip + (packet[ip] & 0xF) * 4
        source, destination = struct.unpack_from(">HH", packet, tcp)
        payload = packet[tcp + (packet[tcp + 12] >> 4) * 4:]
        if payload:
            from_broker = source == broker_port
            streams[(destination if from_broker else source, from_broker)].append(
                (seconds * 1_000_000_000 + (fraction if nano else fraction * 1000), payload))
    return streams


def frames(stream: list[tuple[int, bytes]]) -> list[tuple[int, int]]:
    """(time of the packet that completed it, command type) of each frame of one direction."""
    out, buffer = [], b""
    for when, payload in stream:
        buffer += payload
        while len(buffer) >= 8:
            total = struct.unpack_from(">I", buffer)[0]
            if len(buffer) < 4 + total:
                break
            command_size = struct.unpack_from(">I", buffer, 4)[0]
            command = pb.BaseCommand()
            command.ParseFromString(buffer[8:8 + command_size])
            out.append((when, command.type))
            buffer = buffer[4 + total:]
    return out


def stamps(payload: bytes, when: int) -> list[int]:
    return [value for (value,) in (struct.unpack_from(">Q", payload, i) for i in range(len(payload) - 7))
            if when - 2_000_000_000 < value <= when]


def median_us(values: list[int], q: float = 0.5) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000 if ordered else float("nan")


CLIENT_PREFIX: list[str] = []  # taskset for the client under --pin


def capture(broker: BrokerUnderTest, command: list[str], path: str) -> dict:
    dump = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "0", "-B", "65536", "--time-stamp-precision=nano",
                             "-w", path, f"tcp port {broker.port}"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # tcpdump is listening
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        done = subprocess.run([*CLIENT_PREFIX, *command], capture_output=True, text=True, env=env, timeout=600)
        time.sleep(0.3)
    finally:
        dump.terminate()
        dump.wait()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{command[1]} failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def e2e_row(broker: BrokerUnderTest, client: str, rate: float, count: int, path: str) -> str:
    topic = f"wire-{time.time_ns()}"
    if client == "asyncio":
        command = [sys.executable, BENCH_CLIENT, "--one", json.dumps(["e2e", "pulsarwire", broker.url, topic, count,
                                                                      100, rate, "sub-ms"])]
    else:
        command = [sys.executable, SURFACE, MODULES[client], broker.url, topic, "e2e", str(count), "100",
                   f"rate={rate:g}"]
    result = capture(broker, command, path)
    sent: dict[int, int] = {}
    delivered: dict[int, int] = {}
    for (_, from_broker), stream in segments(path, broker.port).items():
        seen = delivered if from_broker else sent
        for when, payload in stream:
            for stamp in stamps(payload, when):
                seen.setdefault(stamp, when)
    both = [s for s in sent if s in delivered]
    producer = [sent[s] - s for s in both]
    in_broker = [delivered[s] - sent[s] for s in both]
    on_wire = [delivered[s] - s for s in both]
    app_p50 = result["p50_ms"] * 1000
    return (f"{client:9} program p50 {app_p50:6.0f} p99 {result['p99_ms'] * 1000:6.0f} | messages on the wire "
            f"{len(both):5} | producer's side p50 {median_us(producer):6.0f} | broker p50 {median_us(in_broker):5.0f} "
            f"p90 {median_us(in_broker, 0.9):5.0f} | consumer's side {app_p50 - median_us(on_wire):4.0f}  (us)")


def send_row(broker: BrokerUnderTest, client: str, count: int, path: str) -> str:
    result = capture(broker, [sys.executable, SURFACE, MODULES[client], broker.url, f"wire-{time.time_ns()}",
                              "send", str(count), "100", "batching=0"], path)
    events = sorted(event for stream in segments(path, broker.port).values() for event in frames(stream))
    sends = [when for when, kind in events if kind == pb.BaseCommand.SEND]
    receipts = [when for when, kind in events if kind == pb.BaseCommand.SEND_RECEIPT]
    in_broker, turnaround = [], []
    next_receipt = 0
    for i, when in enumerate(sends):
        while next_receipt < len(receipts) and receipts[next_receipt] < when:
            next_receipt += 1
        if next_receipt < len(receipts):
            in_broker.append(receipts[next_receipt] - when)
            if i + 1 < len(sends):
                turnaround.append(sends[i + 1] - receipts[next_receipt])
    return (f"{client:9} {result['msg_per_s']:8,.0f} msg/s ({1e6 / result['msg_per_s']:4.0f} us a send) | broker p50 "
            f"{median_us(in_broker):4.0f} p90 {median_us(in_broker, 0.9):4.0f} | client's turnaround p50 "
            f"{median_us(turnaround):4.0f} p90 {median_us(turnaround, 0.9):4.0f}  (us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("e2e", "send"), default="e2e")
    parser.add_argument("--broker", choices=("embedded", "pulsar-lite"), default="embedded")
    parser.add_argument("--rate", type=float, default=1000.0, help="e2e: messages a second")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="official,sync,asyncio")
    parser.add_argument("--pin", action="store_true", help="the broker on CPU 0, the client on CPU 1")
    args = parser.parse_args()
    clients = [c for c in args.clients.split(",") if c and not (args.mode == "send" and c == "asyncio")]
    if shutil.which("tcpdump") is None:
        sys.exit("wire_timeline needs tcpdump (Debian: apt-get install tcpdump) and the right to capture on lo")
    with tempfile.TemporaryDirectory() as scratch, \
            BrokerUnderTest(args.broker, os.path.join(scratch, "data"),
                            prefix=["taskset", "-c", "0"] if args.pin else None) as broker:
        if args.pin:
            CLIENT_PREFIX[:] = ["taskset", "-c", "1"]
        print(f"{args.broker}, {args.mode}" + (f" at {args.rate:g} msg/s" if args.mode == "e2e" else "") +
              (", pinned" if args.pin else ""), flush=True)
        for _ in range(args.rounds):
            for client in clients:
                path = os.path.join(scratch, f"{client}.pcap")
                row = e2e_row(broker, client, args.rate, args.messages, path) if args.mode == "e2e" else \
                    send_row(broker, client, args.messages, path)
                print("  " + row, flush=True)


if __name__ == "__main__":
    main()
