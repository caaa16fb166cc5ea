"""Broker throughput: the embedded broker vs pulsar-lite, each driven by the
official client and by pulsarwire, in the same run.

For each broker and client: produce N messages (batching on) as fast as the
client can, then consume them from the backlog; each client at its best settings
from bench_client.py. The "raw-10" and "raw-100" rows take the client out of the
way: pre-encoded Send frames of 10 or 100 messages each, pipelined 500 deep, then
one consumer with a 100k-message window; they measure the broker itself. For each
row the broker process's CPU time (user + system, from /proc) is reported per
million messages produced and consumed, and its peak resident memory while the
consumer reads (VmHWM, reset before the consumer starts). A consumer that stops
getting messages for --stall seconds is reported as stalled with what it got.
Rounds are interleaved; medians are reported.

    python benchmarks/bench_broker.py [--messages 100000] [--size 100] [--repeat 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_client import official_client, official_produce, ours_produce, payload_list  # noqa: E402
from benchmarks.common import BrokerUnderTest  # noqa: E402

# Each client at a configuration bench_client.py finds among its best (no callback, 10 ms delay).
OFFICIAL_PRODUCE = dict(callback="none", delay_ms=10, max_messages=1000, pending=5000)
OURS_PRODUCE = dict(api="send_many", delay_ms=10, max_messages=1000, pending=5000)
CLIENTS = ("official", "pulsarwire", "raw-10", "raw-100")


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


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
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


# --- raw protocol driver: pre-encoded frames, no client library in the way ------------

async def _raw_connect(url):
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(codec.encode_command(pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=pb.CommandConnect(
        client_version="bench-raw", protocol_version=21))))
    frames = codec.FrameReader()
    await _raw_expect(reader, frames, pb.BaseCommand.CONNECTED)
    return reader, writer, frames


async def _raw_expect(reader, frames, kind):
    while True:
        for frame in frames:
            if frame.type == kind:
                return frame
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        frames.feed(data)


async def raw_produce(url, topic, entries, per_entry, size, window=500):
    """Pipelined Send frames of `per_entry` messages each; returns messages/s until the last receipt."""
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    reader, writer, frames = await _raw_connect(url)
    writer.write(codec.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=pb.CommandProducer(
        topic=topic, producer_id=1, request_id=1, producer_name=f"raw-{time.time_ns()}"))))
    await _raw_expect(reader, frames, pb.BaseCommand.PRODUCER_SUCCESS)
    payload = os.urandom(size)
    encoded = []
    for i in range(entries):
        builder = codec.BatchBuilder()
        for _ in range(per_entry):
            builder.add(payload)
        md = pb.MessageMetadata(producer_name="raw", sequence_id=i, publish_time=1, num_messages_in_batch=per_entry)
        cmd = pb.BaseCommand(type=pb.BaseCommand.SEND, send=pb.CommandSend(producer_id=1, sequence_id=i,
                                                                            num_messages=per_entry))
        encoded.append(codec.encode_payload_command(cmd, md, builder.build()))
    start = time.perf_counter()
    sent = received = 0
    while received < entries:
        while sent < entries and sent - received < window:
            writer.write(encoded[sent])
            sent += 1
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        frames.feed(data)
        received += sum(1 for f in frames if f.type == pb.BaseCommand.SEND_RECEIPT)
    elapsed = time.perf_counter() - start
    writer.close()
    return entries * per_entry / elapsed


async def raw_consume(url, topic, expected, stall=10.0):
    """Subscribe from the earliest message with a large window; (messages, messages/s until the last)."""
    from pulsarwire import codec
    from pulsarwire._proto import PulsarApi_pb2 as pb
    reader, writer, frames = await _raw_connect(url)
    writer.write(codec.encode_command(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
        topic=topic, subscription="raw", subType=pb.CommandSubscribe.Exclusive, consumer_id=1, request_id=2,
        initialPosition=pb.CommandSubscribe.Earliest))))
    await _raw_expect(reader, frames, pb.BaseCommand.SUCCESS)
    flow = codec.encode_command(pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(
        consumer_id=1, messagePermits=100_000)))
    writer.write(flow)
    start = time.perf_counter()
    got = since_flow = 0
    while got < expected:
        try:
            data = await asyncio.wait_for(reader.read(1 << 20), stall)
        except asyncio.TimeoutError:
            break  # stalled
        if not data:
            raise ConnectionError("broker closed the connection")
        frames.feed(data)
        for frame in frames:
            if frame.type == pb.BaseCommand.MESSAGE:
                n = frame.metadata.num_messages_in_batch if frame.metadata.HasField("num_messages_in_batch") else 1
                got += n
                since_flow += n
        if since_flow >= 50_000:
            writer.write(codec.encode_command(pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(
                consumer_id=1, messagePermits=since_flow))))
            since_flow = 0
    elapsed = time.perf_counter() - start
    writer.close()
    return got, got / elapsed


def run(messages, size, stall, repeat, clients=CLIENTS, raw_messages=1_000_000):
    """Each (broker, client) pair is measured `repeat` times, rounds interleaved; medians reported."""
    samples: dict[tuple, list] = {}
    payloads = payload_list(messages, size)
    for round_index in range(repeat):
        brokers = ("embedded", "pulsar-lite") if round_index % 2 == 0 else ("pulsar-lite", "embedded")
        for broker_kind in brokers:
            with BrokerUnderTest(broker_kind, tempfile.mkdtemp(prefix=f"bench-{broker_kind}-")) as broker:
                pid = broker.process.pid
                for client in clients:
                    topic = f"broker-bench-{client}-{time.time_ns()}"
                    cpu_start = cpu_seconds(pid)
                    if client.startswith("raw"):  # the broker's per-entry work dominates
                        per_entry = int(client.split("-")[1])
                        entries = max(1, raw_messages // per_entry)
                        produced = asyncio.run(raw_produce(broker.url, topic, entries, per_entry, size))
                    elif client == "official":
                        produced, _ = official_produce(broker.url, topic, payloads, OFFICIAL_PRODUCE)
                    else:
                        produced, _ = ours_produce(broker.url, topic, payloads, OURS_PRODUCE)
                    cpu_produced = cpu_seconds(pid)
                    reset_peak_rss(pid)
                    if client.startswith("raw"):
                        got, consumed = asyncio.run(raw_consume(broker.url, topic, entries * per_entry, stall))
                    elif client == "official":
                        got, consumed = official_consume(broker.url, topic, messages, stall)
                    else:
                        got, consumed = asyncio.run(ours_consume(broker.url, topic, messages, stall))
                    cpu_consumed = cpu_seconds(pid)
                    samples.setdefault((broker_kind, client), []).append(
                        (produced, got, consumed, (cpu_produced - cpu_start) / got * 1e6,
                         (cpu_consumed - cpu_produced) / got * 1e6, peak_rss_mb(pid)))
    rows = []
    for (broker_kind, client), runs in sorted(samples.items(), key=lambda kv: (clients.index(kv[0][1]), kv[0][0])):
        rows.append({"broker": broker_kind, "client": client, "size": size,
                     "runs": len(runs), "produce_msg_per_s": statistics.median(r[0] for r in runs),
                     "consumed": min(r[1] for r in runs),
                     "consume_msg_per_s": statistics.median(r[2] for r in runs),
                     "produce_cpu_s_per_million": statistics.median(r[3] for r in runs),
                     "consume_cpu_s_per_million": statistics.median(r[4] for r in runs),
                     "consume_peak_rss_mb": max(r[5] for r in runs),
                     "produce_per_round": [r[0] for r in runs],
                     "messages": raw_messages if client.startswith("raw") else messages,
                     "stalled": any(r[1] < (raw_messages if client.startswith("raw") else messages) for r in runs)})
    return rows


def print_table(rows):
    print(f"{'broker':<13}{'client':<12}{'produce msg/s':>15}{'consume msg/s':>15}{'CPU s/M in':>12}"
          f"{'CPU s/M out':>12}{'peak RSS MB':>12}  note (medians of {rows[0]['runs']} runs)")
    for r in rows:
        note = f"stalled after {r['consumed']:,} of {r['messages']:,}" if r["stalled"] else ""
        print(f"{r['broker']:<13}{r['client']:<12}{r['produce_msg_per_s']:>15,.0f}{r['consume_msg_per_s']:>15,.0f}"
              f"{r['produce_cpu_s_per_million']:>12.2f}{r['consume_cpu_s_per_million']:>12.2f}"
              f"{r['consume_peak_rss_mb']:>12.0f}  {note}")
    for client in sorted({r["client"] for r in rows}, key=CLIENTS.index):
        pair = {r["broker"]: r for r in rows if r["client"] == client}
        if len(pair) == 2:
            ratios = [a / b for a, b in zip(pair["embedded"]["produce_per_round"],
                                            pair["pulsar-lite"]["produce_per_round"])]
            print(f"{client}: produce embedded / pulsar-lite per round: " + ", ".join(f"{x:.2f}" for x in ratios))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--stall", type=float, default=5.0, help="seconds without a message that count as a stall")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per pair; medians are reported")
    parser.add_argument("--raw-messages", type=int, default=1_000_000, help="messages in each raw run")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated: " + ", ".join(CLIENTS))
    parser.add_argument("--json", help="write rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args.messages, args.size, args.stall, args.repeat, tuple(args.clients.split(",")),
               args.raw_messages)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "broker", "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
