"""Broker throughput: the embedded broker vs pulsar-lite, each driven by the
official client and by pulsarwire, in the same run.

For each broker and client: produce N messages (batching on) as fast as the
client can, then consume them from the backlog. The "raw" rows take the client
out of the way: pre-encoded Send frames of 10 messages each, pipelined 500 deep,
then one consumer with a 100k-message window; they measure the broker itself. A consumer that stops getting
messages for --stall seconds is reported as stalled with what it got (pulsar-lite
is known to stall on long batched backlogs).

    python benchmarks/bench_broker.py [--messages 100000] [--size 100]
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
OURS_PRODUCE = dict(api="send_async", delay_ms=10, max_messages=1000, pending=5000)


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


async def raw_consume(url, topic, expected):
    """Subscribe from the earliest message with a large window; messages/s until all arrived."""
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
        data = await asyncio.wait_for(reader.read(1 << 20), 10)
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
    return got / elapsed


def run(messages, size, stall, repeat):
    """Each (broker, client) pair is measured `repeat` times, rounds interleaved; medians reported."""
    samples: dict[tuple, list] = {}
    for _ in range(repeat):
        for broker_kind in ("embedded", "pulsar-lite"):
            with BrokerUnderTest(broker_kind, tempfile.mkdtemp(prefix=f"bench-{broker_kind}-")) as broker:
                for client in ("official", "pulsarwire", "raw"):
                    topic = f"broker-bench-{client}-{time.time_ns()}"
                    if client == "raw":  # 10 messages per entry: the broker's per-entry work dominates
                        entries = max(1, messages // 10)
                        produced = asyncio.run(raw_produce(broker.url, topic, entries, 10, size))
                        consumed = asyncio.run(raw_consume(broker.url, topic, entries * 10))
                        got = messages
                    elif client == "official":
                        produced, _ = official_produce(broker.url, topic, payload_list(messages, size),
                                                       OFFICIAL_PRODUCE)
                        got, consumed = official_consume(broker.url, topic, messages, stall)
                    else:
                        produced, _ = ours_produce(broker.url, topic, payload_list(messages, size), OURS_PRODUCE)
                        got, consumed = asyncio.run(ours_consume(broker.url, topic, messages, stall))
                    samples.setdefault((broker_kind, client), []).append((produced, got, consumed))
    rows = []
    for (broker_kind, client), runs in samples.items():
        rows.append({"broker": broker_kind, "client": client, "messages": messages, "size": size,
                     "runs": len(runs), "produce_msg_per_s": statistics.median(r[0] for r in runs),
                     "consumed": min(r[1] for r in runs),
                     "consume_msg_per_s": statistics.median(r[2] for r in runs),
                     "stalled": any(r[1] < messages for r in runs)})
    return rows


def print_table(rows):
    print(f"{'broker':<13}{'client':<12}{'produce msg/s':>15}{'consume msg/s':>15}  note (medians of {rows[0]['runs']} runs)")
    for r in rows:
        note = f"stalled after {r['consumed']:,} of {r['messages']:,}" if r["stalled"] else ""
        print(f"{r['broker']:<13}{r['client']:<12}{r['produce_msg_per_s']:>15,.0f}{r['consume_msg_per_s']:>15,.0f}  {note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--stall", type=float, default=5.0, help="seconds without a message that count as a stall")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per pair; medians are reported")
    parser.add_argument("--json", help="write rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args.messages, args.size, args.stall, args.repeat)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "broker", "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
