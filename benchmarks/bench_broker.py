"""Broker throughput: the embedded broker vs pulsar-lite, each driven by the
official client and by pulsarwire, in the same run.

For each broker and client: produce N messages (batching on) as fast as the
client can, then consume them from the backlog; each client at its best settings
from bench_client.py. The "raw-10" and "raw-100" rows take the client out of the
way: Send frames of 10 or 100 messages each, pipelined 500 deep, then one consumer
with a 100k-message window that acknowledges cumulatively as it goes; they measure
the broker itself. A raw run sends for at least --raw-seconds (and --raw-messages),
so that even 100 messages per entry make a run long enough for the rates and the
CPU clock (10 ms ticks) to mean something; each run starts after os.sync(), so the
previous run's writeback does not fall into it.

The raw driver is kept lighter than either broker, for both alike: it builds each
Send frame from a template (the batch payload is made once; a frame adds its
command, metadata and checksum, checked against the codec's encoder), and it
splits what it reads into frames by their size field and counts receipts and
messages by the command's type byte, with no protobuf object per frame. Its own
CPU per million messages is printed beside the broker's ("driver CPU"): at 100
per entry it is a small fraction of the broker's, so the driver is not what limits.

For each row the broker process's CPU time (user + system, from /proc) is reported
per million messages produced and consumed, its resident memory as the consumer
starts and its peak while the consumer reads (VmHWM, reset before the consumer
starts). A consumer that stops getting messages for --stall seconds is reported
as stalled with what it got. Rounds are interleaved (the brokers take turns going
first, each round on a fresh broker and data directory, removed after); medians
are reported, and the embedded / pulsar-lite produce ratio of every round.

--brokers may add "embedded-nosync": the embedded broker at pulsar-lite's durability
(--sync-policy never: each group commit reaches the OS before its receipts, and no fsync
but that of each full segment, on a worker thread; pulsar-lite 0.2.0 makes no fsync call,
as strace shows), beside the default "embedded" (an fsync every second); and
"embedded-keep": the default but keeping the page cache of what it wrote (--page-cache-bytes
0), so that a backlog is read from the page cache rather than the disk.

    python benchmarks/bench_broker.py [--messages 100000] [--size 100] [--repeat 3]
        [--raw-messages 500000] [--raw-seconds 2] [--clients raw-10,raw-100]
        [--brokers embedded,embedded-nosync,pulsar-lite]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

from crc32c import crc32c

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_client import official_client, official_produce, ours_produce, payload_list  # noqa: E402
from benchmarks.common import BrokerUnderTest  # noqa: E402
from pulsarwire._codec_py import varint_bytes as _varint  # noqa: E402

# Each client at a configuration bench_client.py finds among its best (no callback, 10 ms delay).
OFFICIAL_PRODUCE = dict(callback="none", delay_ms=10, max_messages=1000, pending=5000)
OURS_PRODUCE = dict(api="send_many", delay_ms=10, max_messages=1000, pending=5000)
CLIENTS = ("official", "pulsarwire", "raw-10", "raw-100")
# name -> (BrokerUnderTest kind, the embedded broker's extra arguments). "embedded" runs the
# defaults (an fsync every second); "embedded-nosync" runs about pulsar-lite's durability (each
# write reaches the OS before its receipt, the OS decides when it reaches the disk, but for the
# fsync of each full segment: pulsar-lite 0.2.0 makes no fsync call at all, as strace shows).
BROKERS = {"embedded": ("embedded", []), "embedded-nosync": ("embedded", ["--sync-policy", "never"]),
           "embedded-keep": ("embedded", ["--page-cache-bytes", "0"]),
           "pulsar-lite": ("pulsar-lite", [])}


def cpu_seconds(pid):
    """User + system CPU seconds the process has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak_rss(pid):
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def peak_rss_mb(pid, field="VmHWM"):
    """The process's peak resident memory since the last reset (field VmRSS: the current one)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def ours_consume(url, topic, count, stall):
    from pulsarwire import Client, InitialPosition
    async with Client(url) as client:
        consumer = await client.subscribe(topic, "bench", initial_position=InitialPosition.Earliest)
        got, start, last = 0, None, time.perf_counter()
        while got < count:
            batch = await consumer.receive_many(1000, timeout_millis=int(stall * 1000))
            if not batch:
                break
            if start is None:
                start = time.perf_counter()
            for message in batch:
                consumer.acknowledge(message)
            got += len(batch)
            last = time.perf_counter()
        await consumer.close()
    return got, (got / (last - start) if start and last > start else 0.0)


def official_consume(url, topic, count, stall):
    import pulsar
    client = official_client(url)
    consumer = client.subscribe(topic, "bench", initial_position=pulsar.InitialPosition.Earliest)
    got, start, last = 0, None, time.perf_counter()
    while got < count:
        try:
            message = consumer.receive(int(stall * 1000))
        except Exception:  # noqa: BLE001 - pulsar.Timeout: stalled
            break
        if start is None:
            start = time.perf_counter()
        consumer.acknowledge(message)
        got += 1
        last = time.perf_counter()
    client.close()
    return got, (got / (last - start) if start and last > start else 0.0)


# --- raw protocol driver: Send frames from a template, frames counted, not decoded ------

_U32 = struct.Struct(">I")
_SEND_RECEIPT, _MESSAGE, _PING = 7, 9, 18  # BaseCommand.Type values




class SendFrames:
    """Send frames of one producer, `per_entry` messages of `size` bytes each, from a template:
    the batch payload is built once and each frame adds only its head (command, metadata with
    the sequence id, checksum). Checked against the codec's encoder when made."""

    def __init__(self, producer_id: int, per_entry: int, size: int) -> None:
        from pulsarwire import codec
        from pulsarwire._proto import PulsarApi_pb2 as pb
        builder = codec.BatchBuilder()
        message = os.urandom(size)
        for _ in range(per_entry):
            builder.add(message)
        self.payload = bytes(builder.build())
        self._producer = b"\x08" + _varint(producer_id)
        self._count = _varint(per_entry)
        for sequence_id in (0, 1, 300, 1 << 33):
            cmd = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(
                producer_id=producer_id, sequence_id=sequence_id, num_messages=per_entry))
            md = pb.MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1,
                                    num_messages_in_batch=per_entry)
            assert self.head(sequence_id) + self.payload == \
                bytes(codec.encode_payload_command(cmd, md, self.payload))

    def head(self, sequence_id: int) -> bytes:
        seq = _varint(sequence_id)
        send = self._producer + b"\x10" + seq + b"\x18" + self._count
        cmd = b"\x08\x06\x32" + _varint(len(send)) + send
        md = b"\x0a\x03raw\x10" + seq + b"\x18\x01\x58" + self._count
        md = _U32.pack(len(md)) + md
        checksum = crc32c(self.payload, crc32c(md))
        return (_U32.pack(4 + len(cmd) + 2 + 4 + len(md) + len(self.payload)) + _U32.pack(len(cmd)) + cmd
                + b"\x0e\x01" + _U32.pack(checksum) + md)


class RawConnection(asyncio.Protocol):
    """One protocol connection that splits the byte stream into frames by their size field and
    counts receipts and messages by the command's type byte, without protobuf objects; other
    frames (handshake answers, errors) are queued whole and decoded by `expect`."""

    def __init__(self) -> None:
        self.transport = None
        self._rest = b""
        self.control: asyncio.Queue = asyncio.Queue()
        self.on_counts = None  # (receipts, messages) -> None, once per read that holds any
        self.last_message_command = b""  # the command of the last Message frame read (for acks)
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def data_received(self, data: bytes) -> None:
        if self._rest:
            data = self._rest + data
        pos, end = 0, len(data)
        receipts = messages = 0
        last_message = -1
        unpack = _U32.unpack_from
        while end - pos >= 10:
            stop = pos + 4 + unpack(data, pos)[0]
            if stop > end:
                break
            kind = data[pos + 9] if data[pos + 8] == 0x08 else -1  # BaseCommand.type: field 1, first
            if kind == _SEND_RECEIPT:
                receipts += 1
            elif kind == _MESSAGE:
                messages += 1
                last_message = pos
            elif kind == _PING:
                self.command("PONG", "pong")
            else:
                self.control.put_nowait(data[pos:stop])
            pos = stop
        if last_message >= 0:
            self.last_message_command = data[last_message + 8:last_message + 8 + unpack(data, last_message + 4)[0]]
        self._rest = data[pos:]
        if (receipts or messages) and self.on_counts is not None:
            self.on_counts(receipts, messages)

    def command(self, kind: str, field: str, **fields) -> None:
        from pulsarwire import codec
        from pulsarwire._proto import PulsarApi_pb2 as pb
        cmd = pb.BaseCommand(type=getattr(pb.BaseCommand, kind))
        sub = getattr(cmd, field)
        sub.SetInParent()
        for name, value in fields.items():
            setattr(sub, name, value)
        self.transport.write(codec.encode_command(cmd))

    async def expect(self, kind: str):
        """The next control frame, which must be of `kind` (ConnectionError otherwise)."""
        from pulsarwire import codec
        from pulsarwire._proto import PulsarApi_pb2 as pb
        getter = asyncio.ensure_future(self.control.get())
        await asyncio.wait([getter, self.lost], return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            raise ConnectionError("broker closed the connection")
        frame = codec.decode_frame(getter.result())
        if frame.command.type != getattr(pb.BaseCommand, kind):
            raise ConnectionError(f"expected {kind}, broker answered {frame.command}")
        return frame


async def _raw_connect(url) -> RawConnection:
    host, port = url.split("//")[1].split(":")
    _, conn = await asyncio.get_running_loop().create_connection(RawConnection, host, int(port))
    conn.command("CONNECT", "connect", client_version="bench-raw", protocol_version=21)
    await conn.expect("CONNECTED")
    return conn


async def raw_produce(url, topic, per_entry, size, min_messages, min_seconds, window=500):
    """Pipelined Send frames of `per_entry` messages, `window` in flight, until at least
    `min_messages` are sent and `min_seconds` have passed; (messages, messages/s until the last
    receipt). Any control frame (a SendError) ends it with ConnectionError."""
    conn = await _raw_connect(url)
    conn.command("PRODUCER", "producer", topic=topic, producer_id=1, request_id=1,
                 producer_name=f"raw-{time.time_ns()}")
    await conn.expect("PRODUCER_SUCCESS")
    frames = SendFrames(1, per_entry, size)
    payload, head = frames.payload, frames.head
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"sent": 0, "received": 0, "open": True}
    start = time.perf_counter()
    deadline = start + min_seconds

    def refill(receipts, _messages):
        state["received"] += receipts
        sent, received = state["sent"], state["received"]
        if state["open"] and sent * per_entry >= min_messages and time.perf_counter() >= deadline:
            state["open"] = False
        if state["open"]:
            buffers = []
            for sequence_id in range(sent, received + window):
                buffers.append(head(sequence_id))
                buffers.append(payload)
            state["sent"] = received + window
            conn.transport.writelines(buffers)
        elif received >= sent and not done.done():
            done.set_result(time.perf_counter())

    conn.on_counts = refill
    refill(0, 0)
    error = asyncio.ensure_future(conn.control.get())
    await asyncio.wait([done, conn.lost, error], return_when=asyncio.FIRST_COMPLETED)
    if error.done():
        from pulsarwire import codec
        raise ConnectionError(f"broker answered {codec.decode_frame(error.result()).command}")
    error.cancel()
    if not done.done():
        raise ConnectionError(f"broker closed the connection after {state['received']} receipts")
    conn.transport.close()
    messages = state["sent"] * per_entry
    return messages, messages / (done.result() - start)


async def raw_consume(url, topic, expected, per_entry, stall=10.0):
    """Subscribe from the earliest message with a 100k-message window; (messages, messages/s until
    the last). Each Message frame counts as `per_entry` messages (the raw producer's batches).
    Acknowledges cumulatively with each new grant of permits. Stops when no message came for
    `stall` seconds."""
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    conn = await _raw_connect(url)
    conn.command("SUBSCRIBE", "subscribe", topic=topic, subscription="raw", subType=0, consumer_id=1,
                 request_id=2, initialPosition=1)  # Exclusive, Earliest
    await conn.expect("SUCCESS")
    state = {"got": 0, "since_flow": 0, "last": time.perf_counter()}

    def count(_receipts, frames):
        got = frames * per_entry
        state["got"] += got
        state["since_flow"] += got
        state["last"] = time.perf_counter()
        if state["since_flow"] >= 50_000:
            conn.command("FLOW", "flow", consumer_id=1, messagePermits=state["since_flow"])
            state["since_flow"] = 0
            ack(pb.BaseCommand.FromString(conn.last_message_command).message.message_id)

    def ack(message_id):  # cumulative, up to the last message read, as a consumer keeping up does
        cmd = pb.BaseCommand(type=pb.BaseCommand.ACK)
        cmd.ack.consumer_id = 1
        cmd.ack.ack_type = pb.CommandAck.Cumulative
        cmd.ack.message_id.add().CopyFrom(message_id)
        conn.transport.write(codec.encode_command(cmd))

    conn.on_counts = count
    start = time.perf_counter()
    conn.command("FLOW", "flow", consumer_id=1, messagePermits=100_000)
    while state["got"] < expected and not conn.lost.done():
        await asyncio.sleep(0.05)
        if time.perf_counter() - state["last"] > stall:
            break  # stalled
    conn.transport.close()
    got, elapsed = state["got"], state["last"] - start
    return got, (got / elapsed if elapsed > 0 else 0.0)


def run(messages, size, stall, repeat, clients=CLIENTS, raw_messages=500_000, raw_seconds=2.0,
        brokers=("embedded", "pulsar-lite")):
    """Each (broker, client) pair is measured `repeat` times, rounds interleaved (the brokers
    take turns first each round, each round on a fresh broker and data directory); medians reported."""
    samples: dict[tuple, list] = {}
    payloads = payload_list(messages, size)
    for round_index in range(repeat):
        shift = round_index % len(brokers)
        for broker_kind in brokers[shift:] + brokers[:shift]:
            kind, extra = BROKERS[broker_kind]
            data_dir = tempfile.mkdtemp(prefix=f"bench-{broker_kind}-")
            try:
                with BrokerUnderTest(kind, data_dir, extra) as broker:
                    for client in clients:
                        samples.setdefault((broker_kind, client), []).append(
                            _measure(broker, client, payloads, messages, size, stall, raw_messages, raw_seconds))
            finally:
                shutil.rmtree(data_dir, ignore_errors=True)
    rows = []
    for (broker_kind, client), runs in sorted(samples.items(), key=lambda kv: (clients.index(kv[0][1]), kv[0][0])):
        rows.append({"broker": broker_kind, "client": client, "size": size,
                     "runs": len(runs), "produce_msg_per_s": statistics.median(r["produced_rate"] for r in runs),
                     "consumed": min(r["got"] for r in runs),
                     "consume_msg_per_s": statistics.median(r["consumed_rate"] for r in runs),
                     "produce_cpu_s_per_million": statistics.median(r["cpu_in"] for r in runs),
                     "consume_cpu_s_per_million": statistics.median(r["cpu_out"] for r in runs),
                     "driver_cpu_s_per_million": statistics.median(r["driver_cpu_in"] for r in runs),
                     "produce_seconds": statistics.median(r["produce_seconds"] for r in runs),
                     "consume_peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                     "consume_start_rss_mb": max(r["rss_before_mb"] for r in runs),
                     "produce_per_round": [r["produced_rate"] for r in runs],
                     "messages": min(r["sent"] for r in runs),
                     "stalled": any(r["got"] < r["sent"] for r in runs)})
    return rows


def _measure(broker, client, payloads, messages, size, stall, raw_messages, raw_seconds) -> dict:
    """One produce-then-consume of `client` against a running broker, with the broker's CPU time
    (and the driver's, for raw rows) over each phase and its peak RSS while the consumer reads."""
    pid = broker.process.pid
    # the raw driver names the topic in full: the broker knows no tenant "broker-bench-..."
    topic = f"persistent://public/default/broker-bench-{client}-{time.time_ns()}"
    os.sync()  # the previous run's dirty pages are written back now, not during this one
    cpu_start, driver_start, wall_start = cpu_seconds(pid), time.process_time(), time.perf_counter()
    if client.startswith("raw"):  # the broker's per-entry work dominates
        per_entry = int(client.split("-")[1])
        sent, produced = asyncio.run(raw_produce(broker.url, topic, per_entry, size, raw_messages, raw_seconds))
    elif client == "official":
        sent, (produced, _) = messages, official_produce(broker.url, topic, payloads, OFFICIAL_PRODUCE)
    else:
        sent, (produced, _) = messages, ours_produce(broker.url, topic, payloads, OURS_PRODUCE)
    cpu_produced, driver_produced, wall_produced = cpu_seconds(pid), time.process_time(), time.perf_counter()
    reset_peak_rss(pid)
    rss_before = peak_rss_mb(pid, "VmRSS")
    if client.startswith("raw"):
        got, consumed = asyncio.run(raw_consume(broker.url, topic, sent, per_entry, stall))
    elif client == "official":
        got, consumed = official_consume(broker.url, topic, messages, stall)
    else:
        got, consumed = asyncio.run(ours_consume(broker.url, topic, messages, stall))
    cpu_consumed = cpu_seconds(pid)
    return {"sent": sent, "produced_rate": produced, "got": got, "consumed_rate": consumed,
            "cpu_in": (cpu_produced - cpu_start) / sent * 1e6,
            "cpu_out": (cpu_consumed - cpu_produced) / max(got, 1) * 1e6,
            "driver_cpu_in": (driver_produced - driver_start) / sent * 1e6,
            "produce_seconds": wall_produced - wall_start, "peak_rss_mb": peak_rss_mb(pid),
            "rss_before_mb": rss_before}


def print_table(rows):
    print(f"{'broker':<17}{'client':<12}{'messages':>11}{'produce msg/s':>15}{'consume msg/s':>15}"
          f"{'CPU s/M in':>12}{'CPU s/M out':>12}{'RSS MB':>8}{'peak RSS MB':>12}"
          f"  note (medians of {rows[0]['runs']} runs; RSS as the consumer starts, peak while it reads)")
    for r in rows:
        note = f"stalled after {r['consumed']:,} of {r['messages']:,}" if r["stalled"] else ""
        if r["client"].startswith("raw"):
            note = f"driver CPU s/M in {r['driver_cpu_s_per_million']:.2f}; {note}"
        print(f"{r['broker']:<17}{r['client']:<12}{r['messages']:>11,}{r['produce_msg_per_s']:>15,.0f}"
              f"{r['consume_msg_per_s']:>15,.0f}{r['produce_cpu_s_per_million']:>12.3f}"
              f"{r['consume_cpu_s_per_million']:>12.3f}{r['consume_start_rss_mb']:>8.0f}{r['consume_peak_rss_mb']:>12.0f}"
              f"  {note}")
    for client in sorted({r["client"] for r in rows}, key=CLIENTS.index):
        by_broker = {r["broker"]: r for r in rows if r["client"] == client}
        for ours in ("embedded", "embedded-nosync", "embedded-keep"):
            if ours in by_broker and "pulsar-lite" in by_broker:
                ratios = produce_ratios(by_broker[ours], by_broker["pulsar-lite"])
                print(f"{client}: produce {ours} / pulsar-lite per round: " + ", ".join(f"{x:.2f}" for x in ratios)
                      + f" (median {statistics.median(ratios):.2f})")


def produce_ratios(ours: dict, peer: dict) -> list[float]:
    return [a / b for a, b in zip(ours["produce_per_round"], peer["produce_per_round"])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--stall", type=float, default=5.0, help="seconds without a message that count as a stall")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per pair; medians are reported")
    parser.add_argument("--raw-messages", type=int, default=500_000, help="at least this many messages in each raw run")
    parser.add_argument("--raw-seconds", type=float, default=2.0, help="each raw run sends for at least this long")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated: " + ", ".join(CLIENTS))
    parser.add_argument("--brokers", default="embedded,pulsar-lite",
                        help="comma-separated: " + ", ".join(BROKERS))
    parser.add_argument("--json", help="write rows as JSON here")
    args = parser.parse_args(argv)
    brokers = tuple(args.brokers.split(","))
    for name in brokers:
        if name not in BROKERS:
            parser.error(f"unknown broker {name!r}: one of {', '.join(BROKERS)}")
    rows = run(args.messages, args.size, args.stall, args.repeat, tuple(args.clients.split(",")),
               args.raw_messages, args.raw_seconds, brokers)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "broker", "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
