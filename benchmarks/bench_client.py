"""Client throughput and latency: pulsarwire vs the official `pulsar-client`.

Same broker (a separate process: the embedded broker, or pulsar-lite with
--broker pulsar-lite), same payloads, same run. For each client:

- produce: N messages as fast as the client allows (batching on), throughput
  and send-to-receipt latency;
- consume: the same N messages from a backlog, received one by one and
  acknowledged;
- e2e: producer and consumer live at a fixed rate; latency is send time
  (stamped in the payload) to receive time.

    python benchmarks/bench_client.py [--messages 100000] [--size 100] [--broker embedded|pulsar-lite]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import BrokerUnderTest, percentile  # noqa: E402

_STAMP = struct.Struct(">Q")


def _payload(size):
    return bytearray(os.urandom(max(size, 8)))


# --- pulsarwire --------------------------------------------------------------------

async def ours_produce(url, topic, count, size, delay_ms=1):
    from pulsarwire import Client
    async with Client(url) as client:
        producer = await client.create_producer(topic, batching_max_publish_delay_ms=delay_ms,
                                                max_pending_messages=5000)
        payload = _payload(size)
        latencies = []
        start = time.perf_counter()
        futures = []
        for _ in range(count):
            _STAMP.pack_into(payload, 0, time.time_ns())
            sent = time.perf_counter()
            future = await producer.send_async(bytes(payload))
            future.add_done_callback(lambda f, t=sent: latencies.append(time.perf_counter() - t))
            futures.append(future)
        await producer.flush()
        elapsed = time.perf_counter() - start
        await producer.close()
    return count / elapsed, latencies


async def ours_consume(url, topic, count):
    from pulsarwire import Client, InitialPosition
    async with Client(url) as client:
        consumer = await client.subscribe(topic, "bench-ours", initial_position=InitialPosition.Earliest,
                                          receiver_queue_size=1000)
        start = None
        for _ in range(count):
            message = await consumer.receive(30000)
            if start is None:
                start = time.perf_counter()
            consumer.acknowledge(message)
        elapsed = time.perf_counter() - start
        await consumer.close()
    return (count - 1) / elapsed


async def ours_e2e(url, topic, rate, seconds, size, delay_ms=1):
    from pulsarwire import Client, InitialPosition
    async with Client(url) as client:
        consumer = await client.subscribe(topic, "e2e", initial_position=InitialPosition.Latest)
        producer = await client.create_producer(topic, batching_max_publish_delay_ms=delay_ms)
        payload = _payload(size)
        total = int(rate * seconds)
        latencies = []

        async def receive():
            for _ in range(total):
                message = await consumer.receive(30000)
                latencies.append((time.time_ns() - _STAMP.unpack_from(message.payload_view())[0]) / 1e9)
                consumer.acknowledge(message)
        receiver = asyncio.ensure_future(receive())
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            _STAMP.pack_into(payload, 0, time.time_ns())
            await producer.send_async(bytes(payload))
        await producer.flush()
        await receiver
    return latencies


# --- official client ---------------------------------------------------------------

def official_client(url):
    import pulsar
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def official_produce(url, topic, count, size):
    client = official_client(url)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1,
                                      max_pending_messages=5000, block_if_queue_full=True)
    payload = _payload(size)
    latencies = []
    lock = threading.Lock()
    start = time.perf_counter()
    for _ in range(count):
        _STAMP.pack_into(payload, 0, time.time_ns())
        sent = time.perf_counter()

        def done(result, message_id, t=sent):
            with lock:
                latencies.append(time.perf_counter() - t)
        producer.send_async(bytes(payload), done)
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    client.close()
    return count / elapsed, latencies


def official_consume(url, topic, count):
    import pulsar
    client = official_client(url)
    consumer = client.subscribe(topic, "bench-official", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=1000)
    start = None
    for _ in range(count):
        message = consumer.receive(30000)
        if start is None:
            start = time.perf_counter()
        consumer.acknowledge(message)
    elapsed = time.perf_counter() - start
    consumer.close()
    client.close()
    return (count - 1) / elapsed


def official_e2e(url, topic, rate, seconds, size):
    import pulsar
    client = official_client(url)
    consumer = client.subscribe(topic, "e2e", initial_position=pulsar.InitialPosition.Latest)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1)
    total = int(rate * seconds)
    latencies = []

    def receive():
        for _ in range(total):
            message = consumer.receive(30000)
            latencies.append((time.time_ns() - _STAMP.unpack_from(message.data())[0]) / 1e9)
            consumer.acknowledge(message)
    receiver = threading.Thread(target=receive)
    receiver.start()
    payload = _payload(size)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        _STAMP.pack_into(payload, 0, time.time_ns())
        producer.send_async(bytes(payload), None)
    producer.flush()
    receiver.join()
    client.close()
    return latencies


# --- driver ------------------------------------------------------------------------

def run(broker_kind, messages, size, rate, seconds, repeat=1):
    """Each client is measured `repeat` times, rounds interleaved; medians are reported."""
    rounds = [_run_once(broker_kind, messages, size, rate, seconds) for _ in range(repeat)]
    rows = []
    for index, first in enumerate(rounds[0]):
        row = dict(first, runs=repeat)
        for key, value in first.items():
            if isinstance(value, float):
                row[key] = statistics.median(r[index][key] for r in rounds)
        rows.append(row)
    return rows


def _run_once(broker_kind, messages, size, rate, seconds):
    rows = []
    with BrokerUnderTest(broker_kind, tempfile.mkdtemp(prefix="bench-client-")) as broker:
        # batch delay 1 ms for both clients; "pulsarwire-d0" adds delay 0: a batch is what the
        # application sent in one event-loop turn (natural batching, flushed at once)
        for name in ("official", "pulsarwire", "pulsarwire-d0"):
            topic = f"bench-{name}-{time.time_ns()}"
            if name.startswith("pulsarwire"):
                delay = 0 if name.endswith("d0") else 1
                produced, send_lat = asyncio.run(ours_produce(broker.url, topic, messages, size, delay))
                consumed = asyncio.run(ours_consume(broker.url, topic, messages))
                e2e = asyncio.run(ours_e2e(broker.url, topic + "-e2e", rate, seconds, size, delay))
            else:
                produced, send_lat = official_produce(broker.url, topic, messages, size)
                consumed = official_consume(broker.url, topic, messages)
                e2e = official_e2e(broker.url, topic + "-e2e", rate, seconds, size)
            rows.append({"client": name, "broker": broker_kind, "messages": messages, "size": size,
                         "produce_msg_per_s": produced, "consume_msg_per_s": consumed,
                         "send_p50_ms": percentile(send_lat, 0.5) * 1000,
                         "send_p99_ms": percentile(send_lat, 0.99) * 1000,
                         "e2e_rate": rate, "e2e_p50_ms": percentile(e2e, 0.5) * 1000,
                         "e2e_p99_ms": percentile(e2e, 0.99) * 1000})
    return rows


def print_table(rows):
    print(f"{'client':<15}{'broker':<13}{'produce msg/s':>15}{'consume msg/s':>15}"
          f"{'send p50':>10}{'send p99':>10}{'e2e p50':>10}{'e2e p99':>10}")
    for r in rows:
        print(f"{r['client']:<15}{r['broker']:<13}{r['produce_msg_per_s']:>15,.0f}{r['consume_msg_per_s']:>15,.0f}"
              f"{r['send_p50_ms']:>10.2f}{r['send_p99_ms']:>10.2f}{r['e2e_p50_ms']:>10.2f}{r['e2e_p99_ms']:>10.2f}")
    print(f"(latencies in ms; medians of {rows[0]['runs']} runs)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=2000, help="e2e messages per second")
    parser.add_argument("--seconds", type=float, default=3, help="e2e duration")
    parser.add_argument("--broker", default="embedded", choices=["embedded", "pulsar-lite"])
    parser.add_argument("--repeat", type=int, default=3, help="measurements per client; medians are reported")
    parser.add_argument("--json", help="write rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args.broker, args.messages, args.size, args.rate, args.seconds, args.repeat)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "client", "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
