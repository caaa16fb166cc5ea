"""One official-client program, run by whichever module is `pulsar` (the official client, or
`pulsarwire.sync`): the drop-in surface's rows of bench_client.py. Prints one JSON line.

    python benchmarks/sync_surface.py MODULE URL TOPIC MODE COUNT SIZE [key=value ...]

MODE: send_async (a callback per message, then flush), send (a loop of send), receive
(receive + acknowledge), batch_receive (+ acknowledge each), listener (message_listener +
acknowledge), e2e (a consumer thread receiving and acknowledging while the main thread sends
COUNT messages at `rate` per second with send_async and no callback; latency from a send-time
stamp in the payload to its receipt). Options: batching=1, delay_ms, max_messages, pending,
queue (receiver queue), rate. Consumers read from the earliest message of their own
subscription (`sub`).
"""
from __future__ import annotations

import importlib
import json
import os
import struct
import sys
import threading
import time

STAMP = struct.Struct(">Q")


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def end_to_end(pulsar, client, topic, count, size, options):
    consumer = client.subscribe(topic, "e2e", receiver_queue_size=int(options.get("queue", 1000)),
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=options.get("batching", "1") == "1",
                                      batching_max_publish_delay_ms=int(options.get("delay_ms", 1)),
                                      max_pending_messages=int(options.get("pending", 1000)),
                                      block_if_queue_full=True)
    latencies = []

    def receive():
        for _ in range(count):
            message = consumer.receive(10_000)
            now = time.time_ns()
            latencies.append((now - STAMP.unpack_from(message.data())[0]) / 1e6)
            consumer.acknowledge(message)
    reader = threading.Thread(target=receive)
    reader.start()
    rate = float(options.get("rate", 1000))
    payload = bytearray(os.urandom(max(size, STAMP.size)))
    start = time.perf_counter()
    sent = 0
    while sent < count:
        due = min(count, int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            STAMP.pack_into(payload, 0, time.time_ns())
            producer.send_async(bytes(payload), None)
            sent += 1
        time.sleep(max(0.0, start + sent / rate - time.perf_counter()))
    producer.flush()
    reader.join(60)
    seconds = time.perf_counter() - start
    producer.close()
    consumer.close()
    return {"seconds": seconds, "received": len(latencies), "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99)}


def main(argv):
    module, url, topic, mode, count, size = argv[:6]
    count, size = int(count), int(size)
    options = dict(arg.split("=", 1) for arg in argv[6:])
    pulsar = importlib.import_module(module)
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)) \
        if module == "pulsar" else pulsar.Client(url)
    result = {"module": module, "mode": mode, "messages": count, "size": size}
    try:
        if mode == "e2e":
            result.update(end_to_end(pulsar, client, topic, count, size, options))
            seconds = result["seconds"]
        elif mode in ("send_async", "send"):
            batching = options.get("batching", "1") == "1"
            producer = client.create_producer(
                topic, batching_enabled=batching, block_if_queue_full=True,
                batching_max_publish_delay_ms=int(options.get("delay_ms", 10)),
                batching_max_messages=int(options.get("max_messages", 1000)),
                max_pending_messages=int(options.get("pending", 1000)))
            payload = os.urandom(size)
            acked = [0]
            if mode == "send_async":
                def callback(res, msg_id):
                    acked[0] += 1
                start = time.perf_counter()
                for _ in range(count):
                    producer.send_async(payload, callback)
                producer.flush()
            else:
                start = time.perf_counter()
                for _ in range(count):
                    producer.send(payload)
                acked[0] = count
            seconds = time.perf_counter() - start
            producer.close()
            result.update(seconds=seconds, acked=acked[0])
        else:
            queue = int(options.get("queue", 1000))
            sub = options.get("sub", "bench")
            got = [0]
            done = threading.Event()
            if mode == "listener":
                def listener(consumer, message):
                    consumer.acknowledge(message)
                    got[0] += 1
                    if got[0] == count:
                        done.set()
                start = time.perf_counter()
                consumer = client.subscribe(topic, sub, receiver_queue_size=queue, message_listener=listener,
                                            initial_position=pulsar.InitialPosition.Earliest)
                if not done.wait(120):
                    raise RuntimeError(f"listener got {got[0]} of {count}")
            else:
                extra = {}
                if "batch" in options:  # batch_receive's policy: up to this many, or 100 ms
                    extra["batch_receive_policy"] = pulsar.ConsumerBatchReceivePolicy(int(options["batch"]), -1, 100)
                consumer = client.subscribe(topic, sub, receiver_queue_size=queue,
                                            initial_position=pulsar.InitialPosition.Earliest, **extra)
                start = time.perf_counter()
                if mode == "receive":
                    receive, ack = consumer.receive, consumer.acknowledge
                    for _ in range(count):
                        ack(receive(10_000))
                else:
                    while got[0] < count:
                        batch = consumer.batch_receive()
                        for message in batch:
                            consumer.acknowledge(message)
                        got[0] += len(batch)
            seconds = time.perf_counter() - start
            consumer.close()
            result.update(seconds=seconds)
        result["msg_per_s"] = count / seconds
    finally:
        client.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
