"""Broker throughput: the embedded broker vs pulsar-lite, each driven by the
official client and by pulsarwire, in the same run.

For each broker and client: produce N messages (batching on) as fast as the
client can, then consume them from the backlog. A consumer that stops getting
messages for --stall seconds is reported as stalled with what it got (pulsar-lite
is known to stall on long batched backlogs).

    python benchmarks/bench_broker.py [--messages 100000] [--size 100]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_client import official_client, official_produce, ours_produce  # noqa: E402
from benchmarks.common import BrokerUnderTest  # noqa: E402


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


def run(messages, size, stall):
    rows = []
    for broker_kind in ("embedded", "pulsar-lite"):
        with BrokerUnderTest(broker_kind, tempfile.mkdtemp(prefix=f"bench-{broker_kind}-")) as broker:
            for client in ("official", "pulsarwire"):
                topic = f"broker-bench-{client}-{time.time_ns()}"
                if client == "official":
                    produced, _ = official_produce(broker.url, topic, messages, size)
                    got, consumed = official_consume(broker.url, topic, messages, stall)
                else:
                    produced, _ = asyncio.run(ours_produce(broker.url, topic, messages, size))
                    got, consumed = asyncio.run(ours_consume(broker.url, topic, messages, stall))
                rows.append({"broker": broker_kind, "client": client, "messages": messages, "size": size,
                             "produce_msg_per_s": produced, "consumed": got, "consume_msg_per_s": consumed,
                             "stalled": got < messages})
    return rows


def print_table(rows):
    print(f"{'broker':<13}{'client':<12}{'produce msg/s':>15}{'consume msg/s':>15}  note")
    for r in rows:
        note = f"stalled after {r['consumed']:,} of {r['messages']:,}" if r["stalled"] else ""
        print(f"{r['broker']:<13}{r['client']:<12}{r['produce_msg_per_s']:>15,.0f}{r['consume_msg_per_s']:>15,.0f}  {note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--stall", type=float, default=5.0, help="seconds without a message that count as a stall")
    parser.add_argument("--json", help="write rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args.messages, args.size, args.stall)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "broker", "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
